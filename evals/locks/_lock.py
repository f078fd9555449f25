"""File locks: one ``twice run`` per log directory, and :func:`wait_for_lock` for a lock that
is waited for rather than refused.

Two runs writing one directory both run every cell and leave twice the logs. The lock is an
``fcntl`` lock on ``LOG_DIR/.twice.lock``, which names its holder (pid, host, start time).
The kernel drops the lock when its holder dies, even by SIGKILL, so a lock file left behind
by a dead run is stale by construction and the next run takes it over.

Object storage (``s3://``, ``gs://``) has no such lock, and no holder's death to watch: there a
run holds a *lease* instead (:func:`hold_lease`), an object created only if absent and renewed
while the run lives. A run killed outright stops renewing it, and the next run takes it over
once it has seen no renewal for :data:`LEASE_TTL` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twice.reports import Location, is_remote

from ..suite import SuiteError

LOCK_NAME = ".twice.lock"


class LogDirLockedError(SuiteError):
    """Another live ``twice run`` holds the log directory (the message names it)."""


def _this_process() -> dict[str, Any]:
    """How a lock or lease names its holder."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _holder(path: Path) -> str:
    try:
        return _holder_of(path.read_bytes())
    except OSError:
        return _holder_of(None)


@contextmanager
def lock_log_dir(log_dir: Location) -> Iterator[Location | None]:
    """Hold ``log_dir``'s lock for the duration of the block (the directory must exist): an
    ``fcntl`` lock on a local directory, a lease (:func:`hold_lease`) in object storage.

    Raises:
        LogDirLockedError: another live process holds it, naming that process.
    """

    def busy(holder: str) -> LogDirLockedError:
        return LogDirLockedError(
            f"log directory {str(log_dir)!r} is in use by another twice run ({holder}); wait "
            "for it to finish, stop it, or pass another --log-dir"
        )

    if not is_remote(log_dir):
        with hold_lock(Path(log_dir) / LOCK_NAME, busy) as path:
            yield path
        return

    def waiting(holder: str) -> None:
        print(
            f"twice: log directory {str(log_dir)!r} is leased to {holder}; watching the lease "
            f"for up to {LEASE_TTL:.0f} s to see whether that run is alive",
            file=sys.stderr,
        )

    def lost() -> None:
        # From the lease's thread. The run stops as a SIGTERM stops it (finished trials kept):
        # another run owns the directory now, and both would run the same cells.
        print(
            f"twice: the lease of log directory {str(log_dir)!r} lapsed (this run was stalled "
            f"for over {LEASE_TTL:.0f} s) and another twice run took the directory over; "
            "stopping this run",
            file=sys.stderr,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    with hold_lease(str(log_dir), busy, lost, waiting) as lease:
        yield lease


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
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(_this_process()) + "\n").encode())
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


# -- object storage: a lease ------------------------------------------------------------------

LEASE_PREFIX = ".twice-lease-"
"""A remote log directory's lease objects: ``.twice-lease-<generation>``."""

LEASE_RENEW = 10.0
"""Seconds between a lease holder's renewals."""

LEASE_TTL = 30.0
"""Seconds without a renewal after which a lease's holder counts as dead (three renewals
missed): the longest a run killed outright keeps the next run of its directory waiting."""

LEASE_POLL = 1.0
"""Seconds between a waiting run's looks at a lease."""

LEASE_STORES = frozenset({"s3", "s3a"})
"""Protocols whose stores create an object only if it is absent, atomically: S3's conditional
write (``If-None-Match: *``), which s3fs sends for mode ``xb``. fsspec leaves mode ``x`` to
each backend, checked up front or not at all, so elsewhere a run holds no lease (and says so)."""

LEASE_STALE = 300.0
"""A lease last written longer ago than ``LEASE_TTL`` plus this, by the store's clock read
against this machine's, is taken over without watching it (a run killed yesterday). The
margin is for the two clocks' skew; a lease within it is watched instead, which needs no
clock but this process's own."""


@dataclass
class _Lease:
    fs: Any
    root: str
    generation: int
    holder: dict[str, Any]

    def path(self) -> str:
        return _lease_path(self.root, self.generation)

    def uri(self) -> str:
        return str(self.fs.unstrip_protocol(self.path()))


def _lease_path(root: str, generation: int) -> str:
    return f"{root.rstrip('/')}/{LEASE_PREFIX}{generation}"


def _generations(fs: Any, root: str) -> list[int]:
    """The lease generations present in ``root``, oldest first."""
    fs.invalidate_cache(root)  # a listing s3fs cached would never show a newer generation
    try:
        # Not s3fs's prefix filter: it caches the filtered listing as the whole directory's.
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        tail = str(name).rstrip("/").rsplit("/", 1)[-1]
        number = tail.removeprefix(LEASE_PREFIX)
        if tail.startswith(LEASE_PREFIX) and number.isdigit():
            found.append(int(number))
    return sorted(found)


def _create(fs: Any, path: str, body: bytes) -> bool:
    """Create ``path`` holding ``body`` only if it does not exist; False if it does."""
    try:
        with fs.open(path, "xb") as f:
            f.write(body)
    except FileExistsError:
        return False
    return True


def _read(fs: Any, path: str) -> bytes | None:
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError:
        return None


def _holder_of(body: bytes | None) -> str:
    """The holder a lock file or lease names (pid, host, start time)."""
    try:
        info = json.loads(body or b"")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def _long_dead(fs: Any, path: str) -> bool:
    """Whether the store says ``path`` was last written long enough ago that no clock skew
    makes its holder alive (False when the store cannot say)."""
    try:
        written = fs.modified(path)
    except (NotImplementedError, FileNotFoundError, OSError, AttributeError):
        return False
    if written.tzinfo is None:
        written = written.replace(tzinfo=dt.UTC)
    age = (dt.datetime.now(dt.UTC) - written).total_seconds()
    return bool(age > LEASE_TTL + LEASE_STALE)


def acquire_lease(
    log_dir: str,
    busy: Callable[[str], Exception],
    holder: dict[str, Any],
    waiting: Callable[[str], None] | None = None,
) -> _Lease | None:
    """Take ``log_dir``'s lease: the next generation's object, created only if absent.

    A lease already there and not released is watched: rewritten (its holder renews it)
    means a live run, and ``busy(holder)`` is raised; left as it is for :data:`LEASE_TTL`
    seconds means its holder died, and the lease is taken over. Of two runs taking over one
    dead lease, exactly one creates the next generation; the other sees it renewed, and is
    refused. ``waiting(holder)`` is called once if the lease has to be watched.

    Returns None when the store cannot create an object only if absent (then nothing keeps
    two runs apart; a warning on standard error says so).
    """
    from fsspec.core import url_to_fs  # inspect's dependency; only object storage needs it

    # A filesystem of the lease's own: its listings, cached by s3fs as it lists, are never
    # what the run's own reads (or inspect's, which share the cached instance) find.
    fs, root = url_to_fs(log_dir, skip_instance_cache=True)
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & LEASE_STORES:
        _unleased(log_dir, f"{sorted(protocols)[0]}:// has no atomic create-if-absent")
        return None
    body = json.dumps(holder).encode()
    seen: tuple[int, bytes] | None = None
    since = 0.0
    while True:
        generations = _generations(fs, root)
        current = generations[-1] if generations else 0
        if current:
            text = _read(fs, _lease_path(root, current))
            if text is None:  # taken over and removed while we looked: look again
                continue
            if _released(text):
                pass
            elif seen is None or seen[0] != current:
                seen, since = (current, text), time.monotonic()
                if not _long_dead(fs, _lease_path(root, current)):
                    if waiting is not None:
                        waiting(_holder_of(text))
                        waiting = None
                    time.sleep(LEASE_POLL)
                    continue
            elif seen[1] != text:  # renewed: its holder lives
                raise busy(_holder_of(text))
            elif time.monotonic() - since < LEASE_TTL:
                time.sleep(LEASE_POLL)
                continue
        try:
            created = _create(fs, _lease_path(root, current + 1), body)
        except NotImplementedError as ex:  # an S3-compatible store without conditional writes
            _unleased(log_dir, f"the store refused a conditional write: {ex}")
            return None
        if not created:  # another run took this generation first: watch it
            continue
        # The earlier generations are no one's now. The newest file always stays (released
        # at the end of a run), so generations only grow: a holder that stalled past its
        # lease finds a newer one, never its own number reused by a later run.
        for old in generations:
            with contextlib.suppress(OSError):
                fs.rm_file(_lease_path(root, old))
        return _Lease(fs, root, current + 1, holder)


def _unleased(log_dir: str, why: str) -> None:
    print(
        f"warning: log directory {log_dir!r} cannot be leased ({why}): two twice runs into "
        "it at once are not kept apart",
        file=sys.stderr,
    )


def _released(body: bytes) -> bool:
    try:
        return json.loads(body).get("released") is True
    except (ValueError, AttributeError):
        return False


def _renew(lease: _Lease, stop: threading.Event, lost: Callable[[], None]) -> None:
    """Rewrite the lease every :data:`LEASE_RENEW` seconds until ``stop``; call ``lost`` (once)
    on finding a newer generation, whose creator took the lease over after this process
    stalled for longer than :data:`LEASE_TTL`."""
    renewals = 0
    while not stop.wait(LEASE_RENEW):
        renewals += 1
        try:
            if any(g > lease.generation for g in _generations(lease.fs, lease.root)):
                lost()
                return
            body = json.dumps({**lease.holder, "renewals": renewals}).encode()
            lease.fs.pipe_file(lease.path(), body)
        except Exception:  # the store failing now and then: try again at the next renewal
            continue


@contextmanager
def hold_lease(
    log_dir: str,
    busy: Callable[[str], Exception],
    lost: Callable[[], None],
    waiting: Callable[[str], None] | None = None,
) -> Iterator[str | None]:
    """Hold ``log_dir``'s lease (:func:`acquire_lease`; ``busy``, ``waiting`` as there) for
    the block, renewed by a daemon thread; ``lost`` is called from that thread if the lease
    lapses. At the end the lease is marked released, for the next run to take at once.
    Yields the lease object's URI (None for a store that cannot be leased)."""
    holder = _this_process()
    lease = acquire_lease(log_dir, busy, holder, waiting)
    if lease is None:
        yield None
        return
    stop = threading.Event()
    taken = threading.Event()

    def on_lost() -> None:
        taken.set()
        lost()

    renewer = threading.Thread(
        target=_renew, args=(lease, stop, on_lost), name="twice-lease", daemon=True
    )
    renewer.start()
    try:
        yield lease.uri()
    finally:
        stop.set()
        renewer.join(timeout=LEASE_RENEW)
        if not taken.is_set():
            with contextlib.suppress(Exception):
                body = json.dumps({**holder, "released": True}).encode()
                lease.fs.pipe_file(lease.path(), body)
