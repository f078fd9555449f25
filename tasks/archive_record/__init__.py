"""The archive_record task."""

from .archive_record import archive_end_state, archive_loops, archive_record, archive_record_tools

__all__ = ["archive_end_state", "archive_loops", "archive_record", "archive_record_tools"]
