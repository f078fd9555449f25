"""Stop signals during a run: the first SIGINT or SIGTERM stops it in order (inspect's eval
cancelled, ``summary.json`` marked incomplete, exit 130/143), a second stops it at once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from twice.reports import Location

EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143}
"""Exit codes of an interrupted run: 128 + the signal number, as a shell reports it."""


@dataclass
class Interrupts:
    """Which signal stopped the run, if one did, and what a second one does.

    The first SIGINT is left to inspect (asyncio's handler cancels the run, inspect marks
    unfinished logs ``cancelled`` and returns); SIGTERM, which would otherwise kill the
    process without a word, is turned into the same orderly stop and remembered, so the run
    exits 143. An orderly stop still unwinds inspect's tasks and reads every log back, which
    can take seconds, or never end if a task waits on what the stop cancelled; a second
    Ctrl-C means "now". So while ``stop_now`` is set (by a run that has written its
    "running" summary), a second SIGINT or SIGTERM calls it: the run's last words, then the
    process exits at once.
    """

    signal: str | None = None
    stop_now: Callable[[str], None] | None = None
    """What a second stop signal does (it must not return); None: Python's default, a
    ``KeyboardInterrupt`` wherever the program is."""
    at_once: list[Callable[[], object]] = field(default_factory=list)
    """Things to do before a stop at once (a model server to signal: it would outlive us)."""

    def first(self, name: str) -> None:
        """Record a stop signal, and arm the second (when a run asked for it)."""
        self.signal = self.signal or name
        if self.stop_now is not None:
            self.arm()

    def arm(self) -> None:
        """From now on a SIGINT or SIGTERM stops at once (main thread only; a SIGINT a
        shell made its background job ignore stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def again(signum: int, frame: FrameType | None) -> None:
            name = self.signal or signal.Signals(signum).name
            if self.stop_now is None:
                raise KeyboardInterrupt
            self.stop_now(name)

        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, again)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_signals(state: Interrupts, stop_now: Callable[[str], None]) -> Iterator[None]:
    """For the block (a run from its "running" summary to its last one): a first SIGINT or
    SIGTERM is recorded in ``state`` and the run goes on to stop in order (inspect's eval,
    in :func:`evaluate`, is cancelled); a second calls ``stop_now``. The handlers found are
    put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals can only be handled in the main thread
        return
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def on_first(signum: int, frame: FrameType | None) -> None:
        if state.signal is not None and state.stop_now is not None:
            state.stop_now(state.signal)  # the second, wherever the first was handled
        state.first(signal.Signals(signum).name)

    state.stop_now = stop_now
    try:
        for sig, handler in saved.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, on_first)
        yield
    finally:
        state.stop_now = None
        state.at_once.clear()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@contextmanager
def sigint_to_the_eval(state: Interrupts) -> Iterator[None]:
    """For the block (inspect's eval), the first SIGINT goes to asyncio's runner, which
    cancels the eval in order, and is recorded in ``state`` (arming the second).

    asyncio's runner takes SIGINT only when Python's default handler is in place, so that
    is put back for the block; its handler is asked to record the signal first. (A runner
    that finds another handler, or an event loop other than asyncio's, records nothing
    here: the interrupt is then known from the cancelled logs, as before.)
    """
    import asyncio

    if threading.current_thread() is not threading.main_thread() or not callable(
        getattr(asyncio.Runner, "_on_sigint", None)
    ):
        yield  # another asyncio: its runner's handler as it is (the cancelled logs tell)
        return
    before = signal.getsignal(signal.SIGINT)
    if before is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    original = asyncio.Runner._on_sigint  # type: ignore[attr-defined]

    def on_sigint(runner: Any, signum: int, frame: FrameType | None, main_task: Any) -> None:
        state.first("SIGINT")  # arms the second: the runner's own would raise into its tasks
        original(runner, signum, frame, main_task)

    asyncio.Runner._on_sigint = on_sigint  # type: ignore[attr-defined]
    try:
        yield
    finally:
        asyncio.Runner._on_sigint = original  # type: ignore[attr-defined]
        if state.signal and state.stop_now is not None:
            state.arm()
        else:
            signal.signal(signal.SIGINT, before)


@contextmanager
def stop_on_sigterm(state: Interrupts) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals can only be handled in the main thread
        return

    def on_term(signum: int, frame: FrameType | None) -> None:
        state.signal = state.signal or "SIGTERM"
        # Whatever handles Ctrl-C now (asyncio's runner cancels the run; Python's default
        # raises KeyboardInterrupt) handles this too. A shell starts background jobs with
        # SIGINT ignored: then stop as Python's default would.
        on_int = signal.getsignal(signal.SIGINT)
        if callable(on_int):
            on_int(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


LAST_INTERRUPT = Interrupts()
"""The signal that stopped the last run in this process (the CLI's exit code reads it)."""


def exit_at_once(name: str, state: Interrupts, summary_path: Location) -> None:
    """End the process now, after a second stop signal: say so on stderr, signal what would
    outlive it (``state.at_once``), exit 130/143. Nothing is unwound: the logs written so far
    stay (inspect writes each whole), the log directory's lock dies with the process."""
    import sys

    for thing in state.at_once:
        with contextlib.suppress(Exception):
            thing()
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"\ntwice: interrupted by {name} again: stopped at once; {summary_path} is marked "
            "incomplete, without counts; run the same command again to resume\n"
        )
        sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED.get(name, 130))
