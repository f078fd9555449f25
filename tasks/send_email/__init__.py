"""The send_email task."""

from .send_email import client_reference, send_email, send_email_tools

__all__ = ["client_reference", "send_email", "send_email_tools"]
