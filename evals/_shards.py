"""Shards: a deterministic share of a suite's cells per process or machine, merged afterwards.

``twice run --shard i/n`` runs the cells dealt to shard ``i`` into ``LOG_DIR/shard-i-of-n/``.
Each shard keeps its own inspect ``eval-set.json``: two ``eval_set`` runs sharing a directory
undercount, because that file is last-writer-wins. ``twice report`` and ``twice gate`` on
``LOG_DIR`` read every ``shard-*-of-n`` directory as one run, and refuse (exit 2) when a shard
is missing. ``twice run --workers N`` is the same mechanism on one machine: N local shard
processes, then the merge.

The deal: cells are ordered by the SHA-256 of their axes (model, prompt, task, fault,
protection) and dealt round-robin, so every process and machine computes the same split from
the same suite (Python's ``hash()`` is salted per process and would not), and shard sizes
differ by at most one cell.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any

from twice.reports import (
    MAX_SHARDS,
    Location,
    LogRecords,
    Shard,
    ShardSet,
    file_stamp,
    join,
    known_headers,
    remember_headers,
)

from ._suite import Cell, SuiteError

MIN_CELLS_PER_WORKER = 8
"""Fewest cells a default worker gets: a worker process costs about as much CPU to start
(importing inspect) as a few stub cells take to run, so small suites stay in one process."""


def parse_shard(text: str) -> Shard:
    """``"2/3"`` → ``Shard(2, 3)``.

    Raises:
        SuiteError: unless the text is ``i/n`` with ``1 <= i <= n``.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if m and int(m[2]) > MAX_SHARDS:
        raise SuiteError(
            f"--shard {text!r}: at most {MAX_SHARDS} shards (a shard beyond the suite's cell "
            "count would be empty)"
        )
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise SuiteError(
            f"--shard {text!r} is not i/n with 1 <= i <= n (e.g. 1/4 ... 4/4; in a Kubernetes "
            "Indexed Job: --shard $((JOB_COMPLETION_INDEX + 1))/N)"
        )
    return Shard(int(m[1]), int(m[2]))


def cell_digest(cell: Cell) -> str:
    """A stable hex digest of the cell's axes (the same in every process and on every machine)."""
    axes = [cell.model, cell.prompt, cell.task, cell.fault, cell.protection]
    if cell.agent != "react":  # react cells keep the digests they had before the agent axis
        axes.append(cell.agent)
    return hashlib.sha256(json.dumps(axes).encode("utf-8")).hexdigest()


def suite_digest(cells: Sequence[Cell], epochs: int, limit: int | None, model_args: Any) -> str:
    """A stable hex digest of what a sharded run runs: every cell of the whole suite, its epochs,
    limit and recorded model args. Each shard records it in its summary (``run.shard.suite``);
    ``twice report``/``gate`` refuse to merge shards that ran different suites, whose cells would
    otherwise be counted twice or lost (``twice.reports.read_log_dir``)."""
    what = {
        "cells": sorted(cell_digest(c) for c in cells),
        "epochs": epochs,
        "limit": limit,
        "model_args": model_args,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8")).hexdigest()


def shard_cells(cells: Sequence[Cell], shard: Shard) -> list[Cell]:
    """The cells dealt to ``shard``, in suite order.

    Cells sorted by :func:`cell_digest` are dealt round-robin: the shards of one suite are
    disjoint, cover it, and differ in size by at most one cell.
    """
    ranked = sorted(range(len(cells)), key=lambda i: cell_digest(cells[i]))
    mine = {i for rank, i in enumerate(ranked) if rank % shard.count == shard.index - 1}
    return [c for i, c in enumerate(cells) if i in mine]


def shard_dir(log_dir: Location, shard: Shard) -> Location:
    """``LOG_DIR/shard-i-of-n``."""
    return join(log_dir, shard.name)


def merged_run(runs: Sequence[dict[str, Any]], shards: ShardSet) -> dict[str, Any]:
    """One ``run`` record for the merged shards: the axes are the union of the shards' axes."""
    merged: dict[str, Any] = dict(runs[0]) if runs else {}
    for key in ("models", "tasks", "faults", "protections"):
        merged[key] = list(dict.fromkeys(v for r in runs for v in r.get(key) or []))
    prompts: dict[str, Any] = {}
    for r in runs:
        prompts.update(r.get("prompts") or {})
    if runs:
        merged["prompts"] = prompts
    merged.pop("shard", None)
    merged["shards"] = shards.record()
    return merged


# -- local workers ----------------------------------------------------------------------------


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(n_cells: int, cpus: int | None = None) -> int:
    """The fastest worker count here: one per usable CPU, each with at least
    :data:`MIN_CELLS_PER_WORKER` cells (one process when the suite is smaller than that)."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(cpus, n_cells // MIN_CELLS_PER_WORKER))


@dataclass(frozen=True)
class WorkerExit:
    """How one worker process ended."""

    shard: Shard
    returncode: int
    seconds: float
    stderr_tail: str
    records: LogRecords = field(default_factory=dict)
    """What the worker read of its logs, still current (:func:`load_records`)."""
    interrupted: str | None = None
    """``SIGINT`` or ``SIGTERM`` when the parent received it while the workers ran (and passed
    it on to each worker still running)."""


RECORDS_ENV = "TWICE_WORKER_RECORDS"
"""Where a ``--workers`` worker leaves what it read of its logs for its summary: the parent
merges from these instead of reading every log again (about a second of the default suite's
serial end). A file in the parent's private temporary directory."""

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
        _remove_hand_off_dir(os.path.dirname(path))
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


def run_workers(
    args: Sequence[str],
    log_dir: Location,
    count: int,
    idle: Callable[[], object] | None = None,
    at_once: int | None = None,
) -> list[WorkerExit]:
    """Run ``twice run ARGS --shard i/count --log-dir LOG_DIR`` for every i, concurrently:
    all at once, or with ``at_once`` at most that many at a time (the next shard starts as
    one ends; a rerun of a directory split more ways than the machine has cores).

    The workers are local processes. Where the platform forks safely (Linux, and no thread
    started yet) each is a fork of this process, which has already imported inspect and
    twice: a fresh interpreter would spend seconds importing them again before its first
    trial, all on the run's critical path. Elsewhere each is ``python -m twice.evals.cli``.

    Each worker has its own process group, so a terminal's Ctrl-C reaches this process only.
    A SIGINT or SIGTERM this process receives while the workers run is passed on to each of
    them once: each stops like an interrupted run (its finished samples kept, its shard's
    summary marked incomplete) and the caller learns it from :attr:`WorkerExit.interrupted`.
    A second signal stops waiting: each worker still running gets SIGINT again, then
    SIGKILL after 30 s (at once on a third signal), and this raises ``KeyboardInterrupt``.
    A shard not yet started when the first signal comes is not started (it has no
    :class:`WorkerExit`; its cells are missing from the merge).

    ``idle`` is called once, in this process, as soon as one worker has ended while another
    still runs: the caller's chance to do ahead what it needs after the run (the merged
    report's imports) on the core the first worker freed, not after the last. Its errors are
    ignored: whatever it prepares is done again, and any error raised then, when needed.
    """
    procs: list[tuple[Shard, subprocess.Popen[bytes] | _ForkedWorker, float, Any, str]] = []
    base = ["run", *args, "--log-dir", str(log_dir)]
    private = _new_hand_off_dir()
    received: list[int] = []

    def pass_on(signum: int, frame: FrameType | None) -> None:
        if received:
            raise KeyboardInterrupt  # a second signal: the user means it
        received.append(signum)
        for _, proc, *_ in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def running() -> int:
        return sum(1 for _, proc, *_ in procs if proc.poll() is None)

    limit = count if at_once is None else max(1, min(at_once, count))
    saved = _handle_stop_signals(pass_on)
    try:
        for i in range(1, count + 1):
            while not received and running() >= limit:
                time.sleep(_FIRST_EXIT_POLL)  # signals reach their handler between looks
            if received:  # stopping: the shards not yet begun stay missing
                break
            shard = Shard(i, count)
            # The parent renders the one merged report; a report per shard would only cost
            # each worker seconds on the run's critical path.
            argv = [*base, "--shard", str(shard), "--workers", "1", "--no-report"]
            hand_off = os.path.join(private, f"records-{i}.pickle")
            # stderr to a file, not a pipe: a worker blocked on a full pipe would never end.
            err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in finally)
            if _can_fork():  # asked each time: a thread started meanwhile rules it out
                proc: subprocess.Popen[bytes] | _ForkedWorker = _fork_worker(
                    argv, err, hand_off, saved
                )
            else:
                proc = _spawn_worker(argv, err, hand_off)
            procs.append((shard, proc, time.perf_counter(), err, hand_off))
            if received:  # a signal came while this worker was being started
                proc.send_signal(received[0])
        _wait_for_first(procs, idle)
        out = []
        for shard, proc, t0, err, hand_off in procs:
            code = proc.wait()
            seconds = time.perf_counter() - t0
            err.seek(0)
            tail = err.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            out.append(WorkerExit(shard, code, seconds, "\n".join(tail), load_records(hand_off)))
        if not received:
            return out
        name = signal.Signals(received[0]).name
        return [replace(w, interrupted=name) for w in out]
    except BaseException:

        def kill_now(signum: int, frame: FrameType | None) -> None:
            for _, proc, *_ in procs:  # yet another signal: the user will not wait 30 s
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

        _handle_stop_signals(kill_now)
        for _, proc, *_ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, proc, *_ in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
    finally:
        _restore_signals(saved)
        for _, _, _, err, _ in procs:
            err.close()
        shutil.rmtree(private, ignore_errors=True)


_HAND_OFF_PREFIX = "twice-workers-"


def _new_hand_off_dir() -> str:
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
            _remove_hand_off_dir(entry.path)
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


def _remove_hand_off_dir(path: str) -> None:
    if os.path.basename(path).startswith(_HAND_OFF_PREFIX):  # never anything else
        shutil.rmtree(path, ignore_errors=True)


_FIRST_EXIT_POLL = 0.05
"""Seconds between looks for the first worker to end (only while ``idle`` is pending)."""


def _wait_for_first(procs: Sequence[tuple[Any, ...]], idle: Callable[[], object] | None) -> None:
    """Wait until a worker has ended, then, if another still runs, call ``idle`` (once).

    A poll, not a blocking wait on one worker: which ends first is not known (the deal's
    shards differ in cost). Signals reach their handler between looks, as in a blocking wait.
    """
    if idle is None or len(procs) < 2:
        return
    while all(proc.poll() is None for _, proc, *_ in procs):
        time.sleep(_FIRST_EXIT_POLL)
    if any(proc.poll() is None for _, proc, *_ in procs):
        with contextlib.suppress(Exception):  # a head start only: see run_workers
            idle()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_DEATH_SIGNAL = signal.SIGUSR1 if os.name == "posix" else None
"""What the kernel sends a worker when its run dies; the worker turns it into one SIGTERM."""

_parent_gone = threading.Event()


def _stop_with(parent: int) -> None:
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
    a SIGTERM would when the run dies (:func:`_stop_with`). A forked worker arranges this
    itself. The variable is taken out of the environment, so no process this one starts
    mistakes the run for its own parent."""
    parent = os.environ.pop(PARENT_ENV, "")
    if parent.isdigit():
        _stop_with(int(parent))


def _handle_stop_signals(handler: Any) -> dict[int, Any]:
    """Install ``handler`` for SIGINT and SIGTERM (main thread only; a SIGINT a shell set to
    be ignored stays ignored); returns the handlers it replaced, for the workers and for
    :func:`_restore_signals`."""
    saved: dict[int, Any] = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    if threading.current_thread() is not threading.main_thread():
        return saved
    for sig in _STOP_SIGNALS:
        if saved[sig] is not signal.SIG_IGN:
            signal.signal(sig, handler)
    return saved


def _restore_signals(saved: dict[int, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, old in saved.items():
        if old is not None:
            signal.signal(sig, old)


class _ForkedWorker:
    """A forked worker, with the part of ``subprocess.Popen``'s interface the runner uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: killed by that signal).

        Raises:
            subprocess.TimeoutExpired: when ``timeout`` runs out first, as ``Popen.wait``.
        """
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout)
            time.sleep(0.1)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


FORK_ENV = "TWICE_WORKERS_FORK"
"""Set to ``0`` to start workers as fresh interpreters even where they could be forks."""


def _can_fork() -> bool:
    # Forking copies only the calling thread: with other threads running (an event loop, a
    # server) their locks could be copied held. macOS and Windows get fresh interpreters.
    return (
        sys.platform == "linux"
        and threading.active_count() == 1
        and os.environ.get(FORK_ENV, "1").strip() != "0"
    )


def _spawn_worker(argv: list[str], err: Any, records: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "twice.evals.cli", *argv]
    env = {**os.environ, RECORDS_ENV: records, PARENT_ENV: str(os.getpid())}
    # Its own process group: a terminal's Ctrl-C goes to the parent, which passes it on once.
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, process_group=0)


def _fork_worker(
    argv: list[str], err: Any, records: str, handlers: dict[int, Any] | None = None
) -> _ForkedWorker:
    sys.stdout.flush()
    sys.stderr.flush()
    # What the worker inherits stays out of its collector's reach: its collections neither walk
    # the parent's objects (inspect's imports) nor write to their pages, which would copy them
    # (the gc module's advice for fork without exec). The parent, which may live on (a notebook
    # calling run_parallel), thaws its own copy at once.
    gc.freeze()
    parent = os.getpid()
    # A stop signal that reaches the worker before it has its own handlers back would run the
    # parent's (which waits on the worker's siblings): held until then, in both processes.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        gc.unfreeze()
        return _ForkedWorker(pid)
    code = 1
    try:  # the worker: `twice run ARGV` in this copy of the process, then exit
        # Its own process group (a terminal's Ctrl-C goes to the parent, which passes it on
        # once: a second SIGINT would cut short the worker's orderly stop), and the signal
        # handlers the parent had before it took them over to pass signals on.
        os.setpgid(0, 0)
        _restore_signals(handlers or {})
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        _stop_with(parent)
        os.environ[RECORDS_ENV] = records
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(err.fileno(), 2)
        # The inherited sys.stdout/sys.stderr may not write to fds 1 and 2 (a caller that
        # captures output replaces them): the worker's own streams are those fds.
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        from .cli import batch_gc, cli

        batch_gc()
        cli.main(args=argv, prog_name="twice", standalone_mode=True)
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Not sys.exit: the parent's atexit handlers and finally blocks are not the worker's.
        os._exit(code)
