"""The place_order task."""

from .place_order import IDENTITY_FIELDS, place_order, place_order_tools

__all__ = ["IDENTITY_FIELDS", "place_order", "place_order_tools"]
