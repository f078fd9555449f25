"""The two errors of ``twice serve``: a request it refuses, and bad usage of the command."""

from __future__ import annotations

from twice.mocks import UsageError


class ControlError(UsageError):
    """A control request the server refuses: HTTP status and one line naming the bad field."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


class ServeError(UsageError):
    """Bad ``twice serve`` usage (exit 2): one line naming the bad value."""
