from .refund import refund  # noqa: F401  (registers tasks/refund)
from .travel_booking import travel_booking  # noqa: F401  (registers tasks/travel_booking)
