"""The built-in fake services, one module each."""

from .payments import PaymentsService

__all__ = ["PaymentsService"]
