"""``twice run --workers N``'s processes: N local workers, each running one shard of the
plan, with the run's signals passed on to them once.

A shard keeps its own inspect ``eval-set.json`` (two ``eval_set`` runs sharing a directory
undercount, because that file is last-writer-wins); :mod:`._workers` merges the shard
directories into one run afterwards, as ``twice report`` does for a cluster's shards.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
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
from typing import Any, TypeAlias

from twice.reports import LogRecords, Shard

from .._inspect_compat import import_eval_time_modules
from ..suite import usable_cpus
from ._hand_off import PARENT_ENV, load_records, new_hand_off_dir, stop_with
from ._plan import WorkerOutcome, WorkerPlan
from ._worker import work

MIN_CELLS_PER_WORKER = 8
"""Fewest cells a default worker gets: a worker process costs about as much CPU to start
(importing inspect) as a few stub cells take to run, so small suites stay in one process."""


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
    """The last lines the worker wrote to stderr: inspect's log display, or a traceback."""
    errors: tuple[str, ...] | None = None
    """What the worker said went wrong (:class:`WorkerOutcome`); None when it said nothing
    (killed, or crashed before it could)."""
    records: LogRecords = field(default_factory=dict)
    """What the worker read of its logs, still current (:func:`load_records`)."""
    interrupted: str | None = None
    """``SIGINT`` or ``SIGTERM`` when the parent received it while the workers ran (and passed
    it on to each worker still running)."""


def run_workers(
    plan: WorkerPlan,
    count: int,
    idle: Callable[[], object] | None = None,
    at_once: int | None = None,
) -> list[WorkerExit]:
    """Run shard ``i/count`` of ``plan`` for every i, each in a worker process, concurrently:
    all at once, or with ``at_once`` at most that many at a time (the next shard starts as
    one ends; a rerun of a directory split more ways than the machine has cores).

    The workers are local processes. Where the platform forks safely (Linux, and no thread
    started yet) each is a fork of this process, which has already imported inspect and
    twice: a fresh interpreter would spend seconds importing them again before its first
    trial, all on the run's critical path. Elsewhere each is a fresh interpreter running
    ``twice.evals.scale._worker`` on the pickled plan. Either way the worker is given the
    plan itself, never a command line to parse again, and says how it ended in a file
    (:class:`WorkerOutcome`), not in text on stderr for this process to parse.

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
    procs: list[_Running] = []
    private = new_hand_off_dir()
    received: list[int] = []

    def pass_on(signum: int, frame: FrameType | None) -> None:
        if received:
            raise KeyboardInterrupt  # a second signal: the user means it
        received.append(signum)
        for _, proc, *_ in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    limit = count if at_once is None else max(1, min(at_once, count))
    saved = _handle_stop_signals(pass_on)
    try:
        _start_workers(plan, count, limit, procs, received, private, saved)
        _wait_for_first(procs, idle)
        out = _collect(procs)
        if not received:
            return out
        name = signal.Signals(received[0]).name
        return [replace(w, interrupted=name) for w in out]
    except BaseException:
        _stop_workers(procs)
        raise
    finally:
        _restore_signals(saved)
        for _, _, _, err, _ in procs:
            err.close()
        shutil.rmtree(private, ignore_errors=True)


def _start_workers(
    plan: WorkerPlan,
    count: int,
    limit: int,
    procs: list[_Running],
    received: list[int],
    private: str,
    handlers: dict[int, Any],
) -> None:
    """Start shard ``i/count`` for every i, at most ``limit`` running at a time, appending
    each to ``procs``; stop starting once a stop signal was ``received`` (the shards not yet
    begun stay missing)."""
    pickled: list[str] = []  # the plan's file, once a worker is a fresh interpreter

    def running() -> int:
        return sum(1 for _, proc, *_ in procs if proc.poll() is None)

    for i in range(1, count + 1):
        while not received and running() >= limit:
            time.sleep(_FIRST_EXIT_POLL)  # signals reach their handler between looks
        if received:
            return
        shard = Shard(i, count)
        hand_off = os.path.join(private, f"records-{i}.pickle")
        # stderr to a file, not a pipe: a worker blocked on a full pipe would never end.
        err = tempfile.TemporaryFile()  # noqa: SIM115 (closed by run_workers)
        if _can_fork():  # asked each time: a thread started meanwhile rules it out
            proc: subprocess.Popen[bytes] | _ForkedWorker = _fork_worker(
                plan, shard, err, hand_off, handlers
            )
        else:
            if not pickled:
                pickled.append(_pickle_plan(plan, private))
            proc = _spawn_worker(pickled[0], shard, err, hand_off)
        procs.append((shard, proc, time.perf_counter(), err, hand_off))
        if received:  # a signal came while this worker was being started
            proc.send_signal(received[0])


def _collect(procs: Sequence[_Running]) -> list[WorkerExit]:
    """Wait for every worker and read how each ended: its code, its stderr's last lines,
    what it said in its outcome file and the records it handed back."""
    out = []
    for shard, proc, t0, err, hand_off in procs:
        code = proc.wait()
        seconds = time.perf_counter() - t0
        err.seek(0)
        tail = err.read().decode("utf-8", "replace").strip().splitlines()[-5:]
        said = WorkerOutcome.read(outcome_path(hand_off))
        errors = None if said is None else said.errors
        out.append(
            WorkerExit(shard, code, seconds, "\n".join(tail), errors, load_records(hand_off))
        )
    return out


def _stop_workers(procs: Sequence[_Running]) -> None:
    """Stop the workers still running when the parent stops waiting (a second signal, an
    error): SIGINT, then SIGKILL after 30 s, at once on yet another signal."""

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


_Running: TypeAlias = "tuple[Shard, subprocess.Popen[bytes] | _ForkedWorker, float, Any, str]"
"""A started worker: its shard, its process, when it started, its stderr file and the path
it hands its records back in."""


FORK_ENV = "TWICE_WORKERS_FORK"
"""Set to ``0`` to start workers as fresh interpreters even where they could be forks."""


def _can_fork() -> bool:
    # Forking copies only the calling thread: with other threads running (an event loop, a
    # server) their locks could be copied held. macOS and Windows get fresh interpreters.
    return (
        sys.platform == "linux"
        and not _threads_a_fork_could_break()
        and os.environ.get(FORK_ENV, "1").strip() != "0"
    )


def _threads_a_fork_could_break() -> list[threading.Thread]:
    """The threads besides this one that rule out forking a worker.

    fsspec's IO thread and the executor threads of its event loop are not among them. A run
    whose log directory is in object storage (``s3://``) starts them with its first call
    to the bucket, before any worker, and each call from this thread has returned by the
    time a worker is forked. A forked child starts a loop of its own at its first call
    (fsspec registers that with ``os.register_at_fork``) and never touches the parent's.
    Counted, they would make every such run's workers fresh interpreters, seconds of imports
    each.
    """
    harmless = _fsspec_io_threads()
    current = threading.current_thread()
    return [t for t in threading.enumerate() if t is not current and t.ident not in harmless]


def _fsspec_io_threads() -> set[int | None]:
    """The idents of fsspec's IO thread and of its loop's executor threads, if any run."""
    asyn = sys.modules.get("fsspec.asyn")  # not imported: no such thread
    if asyn is None:
        return set()
    try:
        thread, loop = asyn.iothread[0], asyn.loop[0]
        executor = getattr(loop, "_default_executor", None)
        threads = [thread, *getattr(executor, "_threads", ())]
    except (AttributeError, TypeError, LookupError):
        return set()  # another fsspec's layout: its threads count, as any other thread does
    return {t.ident for t in threads if isinstance(t, threading.Thread)}


def outcome_path(records: str) -> str:
    """Where the worker handing back ``records`` writes its :class:`WorkerOutcome`."""
    return f"{records}.outcome.json"


def _pickle_plan(plan: WorkerPlan, private: str) -> str:
    path = os.path.join(private, "plan.pickle")
    with open(path, "wb") as f:
        pickle.dump(plan, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _spawn_worker(plan_path: str, shard: Shard, err: Any, records: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "twice.evals.scale._worker", plan_path, str(shard)]
    cmd += [outcome_path(records), records]
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    # Its own process group: a terminal's Ctrl-C goes to the parent, which passes it on once.
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, process_group=0)


def _fork_worker(
    plan: WorkerPlan,
    shard: Shard,
    err: Any,
    records: str,
    handlers: dict[int, Any] | None = None,
) -> _ForkedWorker:
    import_eval_time_modules()  # once here, not once in every worker
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
    try:  # the worker: its shard of the plan in this copy of the process, then exit
        # Its own process group (a terminal's Ctrl-C goes to the parent, which passes it on
        # once: a second SIGINT would cut short the worker's orderly stop), and the signal
        # handlers the parent had before it took them over to pass signals on.
        os.setpgid(0, 0)
        _restore_signals(handlers or {})
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        stop_with(parent)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(err.fileno(), 2)
        # The inherited sys.stdout/sys.stderr may not write to fds 1 and 2 (a caller that
        # captures output replaces them): the worker's own streams are those fds.
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        code = work(plan, shard, outcome_path(records), records)
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
