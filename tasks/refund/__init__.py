"""The refund task."""

from .refund import refund, refund_tools

__all__ = ["refund", "refund_tools"]
