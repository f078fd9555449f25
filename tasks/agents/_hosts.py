"""Serve an agent's own HTTP traffic from the trial's mock services, and guard the bridge.

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

The same context variable lets twice refuse, with a clear message, model requests the
in-process agent bridge would not route (sync clients, streaming, ``previous_response_id``,
a model name other than ``inspect``) instead of letting them go to the network.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import select
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import thread as _futures_thread
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import respx
from twice.mocks import Services, start_own_transport, stop_own_transport, through_own_transport

from .._inspect_compat import init_bridge_request_patch
from ._context import BRIDGE_MODEL, AgentError, AgentLimitError

MODEL_PATHS = ("/chat/completions", "/responses", "/v1/messages")
"""Client paths that carry a model request (OpenAI Chat Completions/Responses, Anthropic)."""


@dataclass(eq=False)
class _Trial:
    services: Services
    hosts: tuple[tuple[str, str], ...]
    """``(production URL prefix, mock base URL)`` pairs from ``--mock SERVICE=URL``."""
    refused: list[str] = field(default_factory=list)
    """Requests twice refused that this trial's agent may have sent: whatever the agent made
    of the exception, the trial errors."""
    ended: bool = False
    """Its agent has returned: a request in its context now comes from a thread that
    outlived it."""

    def serve(self, request: httpx.Request) -> httpx.Response | None:
        """The trial's services' answer to ``request``, or None for a host they do not mock.

        A client whose own transport wraps httpx's (a retrying transport) sends through it,
        so every attempt it makes is served (:func:`twice.mocks.through_own_transport`)."""
        if not self.owns(request):
            return None
        return through_own_transport(request, self._dispatch)  # type: ignore[return-value]

    def owns(self, request: httpx.Request) -> bool:
        """Whether ``request`` is for a host this trial's services serve."""
        return self._target(str(request.url)) is not None

    def _dispatch(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        target = self._target(url)
        assert target is not None  # checked by serve() for the same URL
        if target != url:  # a --mock production URL, moved onto the service's base URL
            request = httpx.Request(
                request.method, target, headers=request.headers, content=request.content
            )
        return self.services.dispatch(request)

    def _target(self, url: str) -> str | None:
        """The URL the services take ``url`` as (a ``--mock`` production URL moved onto the
        service's base URL), or None for a host no service mocks."""
        for service in self.services.services.values():
            if _under(url, service.base_url):
                return url
        for prefix, base in self.hosts:
            if _under(url, prefix):
                return base + url[len(prefix) :]
        return None


_TRIAL: ContextVar[_Trial | None] = ContextVar("twice_agent_trial", default=None)
_mock: respx.MockRouter | None = None
_live: dict[int, _Trial] = {}
"""The trials running now, by id: whose hosts a request with no trial context may be for."""


def _under(url: str, prefix: str) -> bool:
    p = prefix.rstrip("/")
    return url == p or url.startswith((p + "/", p + "?"))


def _owners(url: str, trial: _Trial | None) -> list[_Trial]:
    """The trials a request for ``url`` may belong to: its own trial if it carries one, else
    any running trial (which sent it is unknown); only those whose services mock ``url``."""
    candidates = [trial] if trial is not None else list(_live.values())
    return [t for t in candidates if t._target(url) is not None]


def _refuse(trials: list[_Trial], message: str) -> None:
    """Refuse a request: mark ``trials`` (each errors, whatever the agent makes of the
    exception) and raise."""
    for t in trials:
        t.refused.append(message)
    raise AgentLimitError(message)


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


_late: list[str] = []
"""Requests refused because their trial had ended (:func:`take_late_requests`)."""
_late_lock = threading.Lock()


def _refuse_late(what: str) -> None:
    message = (
        f"{what} was sent after its trial ended, from a task or thread the agent started and "
        "did not wait for; it was not served (nor sent on), and the trial was scored without "
        "it: await the task, join the thread (or await the executor's future) before the "
        "agent returns"
    )
    with _late_lock:
        _late.append(message)
    raise AgentLimitError(message)


def take_late_requests() -> list[str]:
    """The requests refused since the last call because they came after their trial ended
    (each trial was scored without its request), or from a child process of a trial that
    has ended: a run reports them and exits 1."""
    with _late_lock:
        out = list(_late) + _take_child_refusals()
        _late.clear()
    return out


def _refuse_in_child(request: httpx.Request, trial: _Trial | None) -> None:
    """Refuse a trial's request from a process forked from the eval's (a ``multiprocessing``
    or ``ProcessPoolExecutor`` worker): its effect would be recorded in the child's copy of
    the ledger and lost with it, while the agent saw it succeed."""
    # A child forked from a thread without the trial's context has the trials that ran at
    # the fork (its copy of them): a request for one of their hosts is refused all the same.
    owners = _owners(str(request.url), trial)
    if not owners:
        return
    message = (
        f"{request.method} {request.url} came from a child process (multiprocessing, a "
        "ProcessPoolExecutor): the trial's ledger lives in the eval's process, so its effect "
        "could not be counted; it was not served (nor sent on): make the call from the "
        "agent's process (a thread, or asyncio.to_thread)"
    )
    for t in owners:  # the eval's process errors the trial, whatever the agent makes of it
        _tell_parent(id(t), message)
    raise AgentLimitError(message)


_PIPE_BUF: int = getattr(select, "PIPE_BUF", 512)
"""Bytes one pipe write is atomic up to (a child's line is cut to fit)."""
_from_children: tuple[int, int] | None = None
"""A pipe (read end, write end) on which forked children report their refusals."""
_child_refusals: dict[int, list[str]] = {}
"""Refusals children reported, by trial id, not yet taken by their trial."""


def _open_child_pipe() -> None:
    global _from_children
    if _from_children is None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)  # a child never waits on a full pipe: it drops the line
        _from_children = (read, write)


def _tell_parent(trial_id: int, message: str) -> None:
    if _from_children is None:
        return
    line = f"{trial_id}\t{' '.join(message.split())}"[: _PIPE_BUF - 1] + "\n"
    with contextlib.suppress(OSError):  # one write under PIPE_BUF is atomic
        os.write(_from_children[1], line.encode("utf-8", "replace"))


def _take_child_refusals(trial_id: int | None = None) -> list[str]:
    """Read what children reported; return (and forget) ``trial_id``'s refusals, or, with
    None, those of every trial no longer running (their requests came late)."""
    if _from_children is not None:
        chunks = []
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(_from_children[0], 65536):
                chunks.append(chunk)
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            tid, _, message = line.partition("\t")
            if tid.isdigit() and message:
                _child_refusals.setdefault(int(tid), []).append(message)
    if trial_id is not None:
        return _child_refusals.pop(trial_id, [])
    gone = [tid for tid in _child_refusals if tid not in _live]
    return [m for tid in gone for m in _child_refusals.pop(tid)]


def _refuse_without_context(request: httpx.Request) -> None:
    """Refuse a request for a running trial's host that carries no trial context.

    A thread the agent starts carries its trial's context (:func:`_carry_trial_context`);
    one started outside any trial (a pool an agent module made when imported) does not, so
    which trial sent the request is unknown. Passed through, it went to the production URL
    behind ``--mock`` (or a ``*.twice.test`` name) while the trial counted no effect. Every
    running trial the host belongs to is marked (any of them may have sent it), so each
    errors even when the agent catches this exception.
    """
    mine = _owners(str(request.url), None)
    if mine:
        _refuse_without_trial(mine, f"{request.method} {request.url}")


def _refuse_without_trial(trials: list[_Trial], what: str) -> None:
    _refuse(
        trials,
        f"{what} came from a thread that carries no trial's context (one started outside "
        f"any trial, such as a pool made when the agent's module was imported), so twice "
        f"cannot tell which of the {len(trials)} running trial(s) it belongs to; it was not "
        "served (nor sent on): start threads and executors from within the agent, or use "
        "asyncio.to_thread",
    )


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


# -- model client guards -------------------------------------------------------------------

_guarded = False


def check_model_request(
    path: str, body: Mapping[str, Any] | None, *, stream: bool, sync: bool
) -> None:
    """Refuse a model request the agent bridge would not route, with what to do instead.

    Raises:
        AgentLimitError: for a sync client, streaming, ``previous_response_id`` or a model
            name other than ``inspect``.
    """
    if path not in MODEL_PATHS:
        return
    body = body or {}
    model = str(body.get("model", ""))
    if sync:
        raise AgentLimitError(
            f"the agent called the model ({model!r}, {path}) through a synchronous client; "
            "inspect's in-process agent bridge routes only the async clients: use "
            "openai.AsyncOpenAI or anthropic.AsyncAnthropic"
        )
    if not _is_bridge_model(model):
        raise AgentLimitError(
            f"the agent asked for model {model!r}; only model {BRIDGE_MODEL!r} (ctx.model) is "
            "routed to the eval's model, anything else would go to the network"
        )
    if stream or body.get("stream"):
        raise AgentLimitError(
            "the agent asked for a streamed response (stream=True); the agent bridge refuses "
            "streaming: call the model without streaming"
        )
    if body.get("previous_response_id") is not None:
        raise AgentLimitError(
            "the agent sent previous_response_id; the agent bridge keeps no server-side "
            "conversation: send the whole input each turn (openai-agents: do not pass "
            "previous_response_id or auto_previous_response_id)"
        )


_requests_guarded = False


def _guard_requests() -> None:
    """Refuse a ``requests`` call to a trial's host (once per process, if it is installed).

    twice serves ``httpx`` only: a tool that uses ``requests`` for a ``--mock`` production URL
    would send its refund to production, uncounted. So it is refused, and its trial errors."""
    global _requests_guarded
    if _requests_guarded:
        return
    _requests_guarded = True
    try:
        from requests.adapters import HTTPAdapter
    except ImportError:
        return
    send = HTTPAdapter.send

    @functools.wraps(send)
    def send_unless_mocked(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        trial = _TRIAL.get()
        if _live or trial is not None:
            try:
                url = str(httpx.URL(request.url))
            except (httpx.InvalidURL, TypeError):
                url = ""
            owners = _owners(url, trial) if url else []
            if owners and trial is not None and trial.ended:
                _refuse_late(f"{request.method} {url} (sent with requests)")
            if owners:
                _refuse(
                    owners,
                    f"{request.method} {url} was sent with requests; twice serves only httpx "
                    "clients (sync or async), so it was not served (nor sent on): make the "
                    "tool's HTTP calls with httpx",
                )
        return send(self, request, *args, **kwargs)

    HTTPAdapter.send = send_unless_mocked  # type: ignore[method-assign]


def _is_bridge_model(model: str) -> bool:
    """Whether ``model`` is the name the agent bridge routes to the eval's model."""
    return model == BRIDGE_MODEL or model.startswith(BRIDGE_MODEL + "/")


def _guard_model_clients() -> None:
    """Wrap the openai (and anthropic) clients' ``request`` once, after inspect's own patch."""
    global _guarded
    if _guarded:
        return
    # inspect patches AsyncAPIClient.request on first use; patch on top of it so a request
    # twice refuses never reaches the bridge (or the network).
    init_bridge_request_patch()
    for module in ("openai._base_client", "anthropic._base_client"):
        try:
            base = __import__(module, fromlist=["AsyncAPIClient", "SyncAPIClient"])
        except ImportError:
            continue
        _wrap(base.AsyncAPIClient, sync=False)
        _wrap(base.SyncAPIClient, sync=True)
    _guarded = True


def _wrap(cls: Any, *, sync: bool) -> None:
    original = cls.request

    if sync:

        @functools.wraps(original)
        def request_sync(self: Any, cast_to: Any, options: Any, *args: Any, **kw: Any) -> Any:
            # Also with no trial context while trials run: a thread started outside any trial
            # would otherwise send the request, the user's text, to the network.
            _check_model_request(options, stream=bool(kw.get("stream")), sync=True)
            return original(self, cast_to, options, *args, **kw)

        cls.request = request_sync
        return

    @functools.wraps(original)
    async def request_async(self: Any, cast_to: Any, options: Any, *args: Any, **kw: Any) -> Any:
        _check_model_request(options, stream=bool(kw.get("stream")), sync=False)
        return await original(self, cast_to, options, *args, **kw)

    cls.request = request_async


def _check_model_request(options: Any, *, stream: bool, sync: bool) -> None:
    """:func:`check_model_request` for an openai/anthropic client's request while agent
    trials run; a refusal marks the trial(s) it may belong to, so each errors even when the
    agent catches the exception."""
    trial = _TRIAL.get()
    if trial is None and not _live:
        return  # no agent trial running: inspect's own model calls, say
    path, body = options.url, _json(options)
    if trial is None:
        # No trial's context (a thread started outside any trial): the async client's
        # request for the bridge's model, or any sync one, would go to the network. Model
        # calls of inspect's own (the eval's model, by its real name) pass.
        model = str((body or {}).get("model", ""))
        if path in MODEL_PATHS and (sync or _is_bridge_model(model)):
            _refuse_without_trial(list(_live.values()), f"a model request ({model!r}, {path})")
        return
    if trial.ended and path in MODEL_PATHS:
        _refuse_late(f"a model request ({path})")
    try:
        check_model_request(path, body, stream=stream, sync=sync)
    except AgentLimitError as ex:
        _refuse([trial], str(ex))


def _json(options: Any) -> Mapping[str, Any] | None:
    data = getattr(options, "json_data", None)
    return data if isinstance(data, Mapping) else None
