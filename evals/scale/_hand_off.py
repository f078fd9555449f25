"""What a ``--workers`` run and its workers share outside the plan: the private directory a
worker hands its log records back through, and the worker's watch on its parent (a worker
stops when the run that started it dies)."""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time

from twice.reports import LogRecords, file_stamp, known_headers, remember_headers

PARENT_ENV = "TWICE_WORKER_PARENT"
"""The pid of the run that started a worker as a fresh interpreter (:func:`stop_with_parent`)."""


def save_records(path: str, records: LogRecords) -> None:
    """Write a worker's log records and headers, each with its log's size and modification
    time.

    Best effort: the records only spare the parent a second read, so a file that cannot be
    written (the parent gone and its directory with it) is skipped, never the run's failure.
    """
    if _parent_gone.is_set():
        # Nobody is left to read it, and the run died without its ``finally``: the first
        # worker to get here takes the run's whole private directory with it.
        remove_hand_off_dir(os.path.dirname(path))
        return
    stamped = {key: (file_stamp(key), recs) for key, recs in records.items()}
    hand_off = {"records": stamped, "headers": known_headers(records)}
    try:
        with open(f"{path}.tmp", "wb") as f:
            pickle.dump(hand_off, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f"{path}.tmp", path)
    except OSError:
        return


def load_records(path: str) -> LogRecords:
    """The records :func:`save_records` wrote whose logs are unchanged since (none if the file
    is missing or unreadable): a log changed since, or remote, is read again. The headers it
    wrote are kept for :func:`twice.reports.read_header`, which checks them the same way."""
    try:
        with open(path, "rb") as f:
            hand_off = pickle.load(f)  # written by this run's own worker, into a 0700 dir
        stamped, headers = hand_off["records"], hand_off["headers"]
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError, KeyError):
        return {}
    remember_headers(headers)
    return {
        key: recs
        for key, (stamp, recs) in stamped.items()
        if stamp is not None and stamp == file_stamp(key)
    }


_HAND_OFF_PREFIX = "twice-workers-"


def new_hand_off_dir() -> str:
    """A private (0700) temporary directory for the workers' record files, named after this
    process; first removes those a dead run left (:func:`remove_orphaned_hand_offs`)."""
    remove_orphaned_hand_offs()
    return tempfile.mkdtemp(prefix=f"{_HAND_OFF_PREFIX}{os.getpid()}-")


def remove_orphaned_hand_offs(root: str | None = None) -> list[str]:
    """Remove the hand-off directories of ``--workers`` runs that died without cleaning up
    (killed outright, so their ``finally`` never ran, after their workers had ended); returns
    what was removed.

    Only this user's directories named after a process that no longer exists are taken. One
    named after a pid that has since been reused is kept until that process ends too, which
    costs a few kilobytes; removing a live run's would only cost it a second read of its logs
    (:func:`load_records` treats a missing file as nothing handed off).
    """
    removed: list[str] = []
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return removed
    root = root or tempfile.gettempdir()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        pid, _, rest = entry.name.removeprefix(_HAND_OFF_PREFIX).partition("-")
        if not entry.name.startswith(_HAND_OFF_PREFIX) or not pid.isdigit() or not rest:
            continue
        try:
            mine = entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == os.getuid()
        except OSError:  # gone meanwhile
            continue
        if mine and not _alive(int(pid)):
            remove_hand_off_dir(entry.path)
            removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (PermissionError), or no way to tell
        return True
    return True


def remove_hand_off_dir(path: str) -> None:
    if os.path.basename(path).startswith(_HAND_OFF_PREFIX):  # never anything else
        shutil.rmtree(path, ignore_errors=True)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_DEATH_SIGNAL = signal.SIGUSR1 if os.name == "posix" else None
"""What the kernel sends a worker when its run dies; the worker turns it into one SIGTERM."""

_parent_gone = threading.Event()


def stop_with(parent: int) -> None:
    """Stop this worker as a SIGTERM would when ``parent`` (the run) dies, so a run killed
    outright (SIGKILL, the OOM killer) does not leave it running into its log directory.

    On Linux the kernel signals the death (``prctl(PR_SET_PDEATHSIG)``); elsewhere on POSIX a
    daemon thread notices the worker was re-parented (macOS has no parent-death signal).
    Windows does not re-parent, so there it does nothing.

    The kernel does not signal the death once: it signals again for every thread of the
    run the worker is handed to while the run's threads die (a run has inspect's threads). A
    second SIGTERM would cut the orderly stop short (asyncio's runner raises
    KeyboardInterrupt on a second interrupt, wherever the stop is) or, arriving after the stop
    left its handler, kill the worker before it writes its shard's summary. So the kernel
    sends SIGUSR1 instead, and only the first one becomes a SIGTERM (:func:`_parent_died`).
    Must be called from the main thread (it installs a signal handler)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        if os.name == "posix":
            watcher = threading.Thread(target=_watch, args=(parent,), daemon=True)
            watcher.start()
        return
    signal.signal(_PARENT_DEATH_SIGNAL, _parent_died)  # type: ignore[arg-type]
    prctl(_PR_SET_PDEATHSIG, _PARENT_DEATH_SIGNAL)
    if os.getppid() != parent:  # it died before the request was in place
        _parent_died()


def _parent_died(*_: object) -> None:
    """The run died: send this worker one SIGTERM, however often the death is reported."""
    if threading.current_thread() is threading.main_thread() and _PARENT_DEATH_SIGNAL:
        # Later reports are ignored by the kernel itself: one that came as the interpreter
        # exits, when Python has put back the default action (terminate), would kill it.
        signal.signal(_PARENT_DEATH_SIGNAL, signal.SIG_IGN)
    if not _parent_gone.is_set():
        _parent_gone.set()
        os.kill(os.getpid(), signal.SIGTERM)


def _watch(parent: int, every: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    _parent_died()


def stop_with_parent() -> None:
    """In a worker started as a fresh interpreter (:data:`PARENT_ENV` set by the run): stop as
    a SIGTERM would when the run dies (:func:`stop_with`). A forked worker arranges this
    itself. The variable is taken out of the environment, so no process this one starts
    mistakes the run for its own parent."""
    parent = os.environ.pop(PARENT_ENV, "")
    if parent.isdigit():
        stop_with(int(parent))
