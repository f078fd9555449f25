"""One writer at a time: the lock of a log directory (a lease in object storage) and of a
file."""

from ._lock import LOCK_NAME, LogDirLockedError, hold_lock, lock_log_dir, wait_for_lock

__all__ = [
    "LOCK_NAME",
    "LogDirLockedError",
    "hold_lock",
    "lock_log_dir",
    "wait_for_lock",
]
