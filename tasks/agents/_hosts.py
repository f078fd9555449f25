"""Serve an agent's own HTTP traffic from the trial's mock services.

An agent under test makes its tool requests with its own ``httpx`` clients, to the base URLs
twice gives it or to its production URLs. While any agent trial runs, one process-wide respx
mock on ``httpx`` (not ``httpx2``: openai 3.x sends model traffic over httpx2, so model calls
never pass through here) looks up the *current* trial in a context variable and serves the
request from that trial's :class:`~twice.mocks.Services`; a request for any other host passes
through untouched. Trials run concurrently in one event loop: the context variable, copied
into every task the agent starts, keeps their traffic apart. A thread the agent starts
(``threading.Thread``, ``loop.run_in_executor``, any ``ThreadPoolExecutor``) carries the
trial's context too, as threads do under Python 3.14's ``-X thread_inherit_context=1``:
without it, which trial sent the thread's request would be unknown.

The running trials themselves live in :mod:`._trials`; the refusal of model requests the
in-process agent bridge would not route, in :mod:`._model_guard`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import thread as _futures_thread
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import respx
from twice.mocks import Services, start_own_transport, stop_own_transport

from ._context import AgentError, AgentLimitError
from ._model_guard import _guard_model_clients, _guard_requests
from ._trials import (
    _TRIAL,
    _live,
    _open_child_pipe,
    _refuse_in_child,
    _refuse_late,
    _refuse_without_context,
    _take_child_refusals,
    _Trial,
)

_mock: respx.MockRouter | None = None


def _side_effect(request: httpx.Request) -> httpx.Response | httpx.Request:
    trial = _TRIAL.get()
    if os.getpid() != _mock_pid:
        _refuse_in_child(request, trial)
        return request
    if trial is None:
        _refuse_without_context(request)
        return request
    if trial.ended and trial.owns(request):
        _refuse_late(f"{request.method} {request.url}")
    served = trial.serve(request)
    # Returning the request tells respx to pass it through to the real transport.
    return served if served is not None else request


# -- threads carry the trial's context --------------------------------------------------------

_carrying = False
_trial_threads: list[weakref.ref[threading.Thread]] = []
"""Threads started from a trial (executor workers aside), by weak reference: a thread
subclass may be unhashable, and a long-lived one must not keep its trial's ledger alive."""
_threads_lock = threading.Lock()
_trial_tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
"""asyncio tasks created from a trial (a fire-and-forget task may outlive it)."""
_in_flight: dict[int, int] = {}
"""Executor work submitted from a trial and not yet finished, counted by trial id."""
_in_flight_lock = threading.Lock()


def _carry_trial_context() -> None:
    """From now on, a thread started, or executor work submitted, from a trial runs in a copy
    of the trial's context (once per process; outside trials, nothing changes); and what a
    trial starts (threads, executor work, asyncio tasks) is tracked, so the interception
    outlives the trial while any of it may still send a request.

    Without it a thread's request came with no trial, so none could be served; and the
    threads of two concurrent trials could not be told apart. Executor worker threads are
    shared between trials, so they are not given one: each piece of work carries its own.
    """
    global _carrying
    if _carrying:
        return
    start = threading.Thread.start
    submit: Any = concurrent.futures.ThreadPoolExecutor.submit
    create_task: Any = asyncio.BaseEventLoop.create_task

    @functools.wraps(start)
    def start_in_context(self: threading.Thread) -> None:
        trial = _TRIAL.get()
        if trial is not None and getattr(self, "_target", None) is not _futures_thread._worker:
            run, ctx = self.run, contextvars.copy_context()

            def run_in_trial() -> None:
                try:
                    ctx.run(run)
                finally:
                    _stop_when_done(this_thread=self)

            self.run = run_in_trial  # type: ignore[method-assign]
            with _threads_lock:  # not _mock_lock: a thread may start while that is held
                _trial_threads[:] = [r for r in _trial_threads if r() is not None]
                _trial_threads.append(weakref.ref(self))
        start(self)

    @functools.wraps(create_task)
    def create_task_in_trial(self: asyncio.BaseEventLoop, coro: Any, *a: Any, **kw: Any) -> Any:
        task = create_task(self, coro, *a, **kw)
        if _TRIAL.get() is not None:
            _trial_tasks.add(task)
            task.add_done_callback(lambda _: _stop_when_done())
        return task

    @functools.wraps(submit)
    def submit_in_context(
        self: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any], /, *a: Any, **kw: Any
    ) -> Any:  # a Future
        trial = _TRIAL.get()
        if trial is None:
            return submit(self, fn, *a, **kw)
        key = id(trial)
        _count_in_flight(key, 1)
        try:
            future = submit(self, contextvars.copy_context().run, fn, *a, **kw)
        except BaseException:  # never submitted (the pool was shut down): never in flight
            _count_in_flight(key, -1)
            raise

        def done(_: Any) -> None:  # also for work cancelled before it ran
            _count_in_flight(key, -1)
            _stop_when_done()

        future.add_done_callback(done)
        return future

    threading.Thread.start = start_in_context  # type: ignore[method-assign]
    setattr(concurrent.futures.ThreadPoolExecutor, "submit", submit_in_context)  # noqa: B010
    setattr(asyncio.BaseEventLoop, "create_task", create_task_in_trial)  # noqa: B010
    _carrying = True


def _count_in_flight(key: int, step: int) -> None:
    with _in_flight_lock:
        left = _in_flight.get(key, 0) + step
        if left > 0:
            _in_flight[key] = left
        else:
            _in_flight.pop(key, None)


def _outlived(this_thread: threading.Thread | None = None) -> bool:
    """Whether a thread (other than ``this_thread``, which is ending), executor work or an
    asyncio task a trial started may still send requests."""
    with _in_flight_lock:
        if _in_flight:
            return True
    if any(not t.done() for t in list(_trial_tasks)):
        return True
    with _threads_lock:
        threads = [r() for r in _trial_threads]
    return any(t is not None and t.is_alive() and t is not this_thread for t in threads)


_mock_lock = threading.Lock()
"""Guards starting and stopping the interception (a trial's thread may stop it)."""
_mock_pid = os.getpid()
"""The process the interception serves trials in (a forked child's requests are refused)."""


def _start_mock(trial: _Trial) -> None:
    """Register ``trial`` as running and make sure the interception is up, in one step: a
    thread of an earlier trial that ends in between must not stop it under the new trial."""
    global _mock, _mock_pid
    with _mock_lock:
        _live[id(trial)] = trial
        if _mock is not None:
            # Running here, or copied into a process forked from one where it ran, which now
            # runs trials of its own (a --workers worker): it serves this process from now on.
            _mock_pid = os.getpid()
            return
        mock = respx.mock(using="httpx", assert_all_called=False, assert_all_mocked=False)
        mock.route(name="twice-agent-services").mock(side_effect=_side_effect)
        start_own_transport()
        mock.start()
        _mock, _mock_pid = mock, os.getpid()
        _open_child_pipe()


def _stop_when_done(this_thread: threading.Thread | None = None) -> None:
    """Stop the interception once no trial runs and nothing a trial started may still send
    a request (until then a late request is refused, never let through to the network)."""
    global _mock
    with _mock_lock:
        if _live or _mock is None or _outlived(this_thread):
            return
        _mock.stop()
        stop_own_transport()
        _mock = None


def parse_hosts(
    mocks: Mapping[str, str] | None, services: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """Check ``--mock SERVICE=URL`` declarations against a trial's services.

    Args:
        mocks: Production URL by service name (``{"payments": "https://api.example.com"}``).
        services: The trial's base URLs by service name.

    Returns:
        ``(production URL prefix, mock base URL)`` pairs, longest prefix first.

    Raises:
        AgentError: for a service the task does not have or a URL that is not http(s).
    """
    pairs = []
    for name, url in (mocks or {}).items():
        if name not in services:
            raise AgentError(
                f"--mock {name}={url}: this task has no service {name!r}; its services are: "
                + ", ".join(sorted(services))
            )
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            # The URL is logged (the task's arguments): a password or key in it would be too.
            shown = f"{parts.scheme}://…@{parts.hostname}"
            raise AgentError(
                f"--mock {name}={shown}: the URL carries credentials (user:password@), which "
                "would be written to every log; give the production URL without them (the "
                "mock service needs none)"
            )
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.query
            or parts.fragment
        ):
            raise AgentError(
                f"--mock {name}={url}: expected an http(s) URL such as https://api.example.com "
                "(optionally with a path prefix, no query or fragment)"
            )
        try:
            # As httpx spells a request's URL (host in lower case, no default port), or
            # http://LocalHost:8000 and https://api.stripe.com:443 would match nothing.
            prefix = str(httpx.URL(url)).rstrip("/")
        except httpx.InvalidURL as ex:
            raise AgentError(f"--mock {name}={url}: not a valid URL ({ex})") from None
        pairs.append((prefix, services[name].rstrip("/")))
    return tuple(sorted(pairs, key=lambda p: -len(p[0])))


@contextmanager
def serve_trial(services: Services, hosts: tuple[tuple[str, str], ...] = ()) -> Iterator[None]:
    """While the block runs, ``httpx`` requests from this context go to the trial's services."""
    _guard_model_clients()
    _guard_requests()
    _carry_trial_context()
    trial = _Trial(services, hosts)
    _start_mock(trial)
    token = _TRIAL.set(trial)
    try:
        yield
    except Exception:
        if trial.refused:  # whatever the agent made of the refusal, the trial is unscored
            raise AgentLimitError(trial.refused[0]) from None
        raise
    finally:
        _TRIAL.reset(token)
        trial.ended = True
        with _mock_lock:
            trial.refused.extend(_take_child_refusals(id(trial)))
            del _live[id(trial)]
        # A task or thread the agent did not wait for may still send its request: the mock
        # stays to refuse it (until the last of them ends), rather than let it through.
        _stop_when_done()
    if trial.refused:
        raise AgentLimitError(trial.refused[0])


def in_agent_trial() -> bool:
    """True inside :func:`serve_trial`."""
    return _TRIAL.get() is not None
