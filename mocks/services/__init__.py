"""The built-in fake services, one module each."""

from .payments import PaymentsService
from .travel import TravelService

__all__ = ["PaymentsService", "TravelService"]
