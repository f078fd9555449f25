"""File locks: one ``twice run`` per log directory, and :func:`wait_for_lock` for a lock that
is waited for rather than refused.

Two runs writing one directory both run every cell and leave twice the logs. The lock is an
``fcntl`` lock on ``LOG_DIR/.twice.lock``, which names its holder (pid, host, start time).
The kernel drops the lock when its holder dies, even by SIGKILL, so a lock file left behind
by a dead run is stale by construction and the next run takes it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ._suite import SuiteError

LOCK_NAME = ".twice.lock"


class LogDirLockedError(SuiteError):
    """Another live ``twice run`` holds the log directory (the message names it)."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


@contextmanager
def lock_log_dir(log_dir: Path) -> Iterator[Path]:
    """Hold ``log_dir``'s lock for the duration of the block (the directory must exist).

    Raises:
        LogDirLockedError: another live process holds it, naming that process.
    """
    with hold_lock(
        log_dir / LOCK_NAME,
        lambda holder: LogDirLockedError(
            f"log directory {str(log_dir)!r} is in use by another twice run ({holder}); wait "
            "for it to finish, stop it, or pass another --log-dir"
        ),
    ) as path:
        yield path


@contextmanager
def hold_lock(path: Path, busy: Callable[[str], Exception]) -> Iterator[Path]:
    """Hold an ``fcntl`` lock on the file ``path`` (created, and removed when released) for the
    duration of the block, with this process named in it.

    Raises:
        Exception: ``busy(holder)`` when another live process holds it (``holder`` names it).
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise busy(_holder(path)) from None
        # The file may have been removed (by a holder releasing it) between open and lock:
        # then this lock guards nothing, so start again on the current file.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)  # closing drops the lock, after the file is gone


async def wait_for_lock(path: Path, poll: float = 0.05) -> int:
    """A descriptor of ``path`` (created if missing, never removed) holding its exclusive
    ``flock``, once no other holder has it; close the descriptor to release it.

    Polled rather than blocking in a thread: a task cancelled while it waits (a timeout,
    Ctrl-C) leaves no thread behind to take the lock later and hold it for good. Opened
    read-only, so a lock file another user created still serves as the lock.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                await asyncio.sleep(poll)
    except BaseException:
        os.close(fd)
        raise
