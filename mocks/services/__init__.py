"""The built-in fake services, one module each."""

from .email import EmailService
from .orders import OrdersService
from .payments import PaymentsService
from .records import RecordsService
from .tickets import TicketsService
from .travel import TravelService

__all__ = [
    "EmailService",
    "OrdersService",
    "PaymentsService",
    "RecordsService",
    "TicketsService",
    "TravelService",
]
