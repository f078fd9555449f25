"""The create_ticket task."""

from .create_ticket import create_ticket, create_ticket_tools

__all__ = ["create_ticket", "create_ticket_tools"]
