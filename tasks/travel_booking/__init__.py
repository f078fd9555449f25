"""The travel booking task: a two-step saga with a declared compensation."""

from .travel_booking import saga_end_state, travel_booking, travel_tools

__all__ = ["saga_end_state", "travel_booking", "travel_tools"]
