"""Serve an agent's own HTTP traffic from the trial's mock services, and guard the bridge.

An agent under test makes its tool requests with its own ``httpx`` clients, to the base URLs
twice gives it or to its production URLs. While any agent trial runs, one process-wide respx
mock on ``httpx`` (not ``httpx2``: openai 3.x sends model traffic over httpx2, so model calls
never pass through here) looks up the *current* trial in a context variable and serves the
request from that trial's :class:`~twice.mocks.Services`; a request for any other host passes
through untouched. Trials run concurrently in one event loop: the context variable, copied
into every task the agent starts, keeps their traffic apart.

The same context variable lets twice refuse, with a clear message, model requests the
in-process agent bridge would not route (sync clients, streaming, ``previous_response_id``,
a model name other than ``inspect``) instead of letting them go to the network.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import respx
from twice.mocks import Services
from twice.mocks import _own_transport as own_transport
from twice.mocks._own_transport import through_own_transport

from ._context import BRIDGE_MODEL, AgentError, AgentLimitError

MODEL_PATHS = ("/chat/completions", "/responses", "/v1/messages")
"""Client paths that carry a model request (OpenAI Chat Completions/Responses, Anthropic)."""


@dataclass(frozen=True)
class _Trial:
    services: Services
    hosts: tuple[tuple[str, str], ...]
    """``(production URL prefix, mock base URL)`` pairs from ``--mock SERVICE=URL``."""
    refused: list[str] = field(default_factory=list, compare=False)
    """Requests for its hosts refused because they came from outside any trial's context."""

    def serve(self, request: httpx.Request) -> httpx.Response | None:
        """The trial's services' answer to ``request``, or None for a host they do not mock.

        A client whose own transport wraps httpx's (a retrying transport) sends through it,
        so every attempt it makes is served (:func:`twice.mocks.through_own_transport`)."""
        if not self.owns(request):
            return None
        return through_own_transport(request, self._dispatch)  # type: ignore[return-value]

    def owns(self, request: httpx.Request) -> bool:
        """Whether ``request`` is for a host this trial's services serve."""
        url = str(request.url)
        return any(_under(url, s.base_url) for s in self.services.services.values()) or any(
            _under(url, prefix) for prefix, _ in self.hosts
        )

    def _dispatch(self, request: httpx.Request) -> httpx.Response:
        target = self._target(request)
        assert target is not None  # checked by serve() for the same URL
        return self.services.dispatch(target)

    def _target(self, request: httpx.Request) -> httpx.Request | None:
        """``request`` as the services take it (a ``--mock`` production URL moved onto the
        service's base URL), or None for a host no service mocks."""
        url = str(request.url)
        for service in self.services.services.values():
            if _under(url, service.base_url):
                return request
        for prefix, base in self.hosts:
            if _under(url, prefix):
                return httpx.Request(
                    request.method,
                    base + url[len(prefix) :],
                    headers=request.headers,
                    content=request.content,
                )
        return None


_TRIAL: ContextVar[_Trial | None] = ContextVar("twice_agent_trial", default=None)
_mock: respx.MockRouter | None = None
_live: dict[int, _Trial] = {}
"""The trials running now, by id: whose hosts a request with no trial context may be for."""


def _under(url: str, prefix: str) -> bool:
    p = prefix.rstrip("/")
    return url == p or url.startswith((p + "/", p + "?"))


def _side_effect(request: httpx.Request) -> httpx.Response | httpx.Request:
    trial = _TRIAL.get()
    if trial is None:
        _refuse_without_context(request)
        return request
    served = trial.serve(request)
    # Returning the request tells respx to pass it through to the real transport.
    return served if served is not None else request


def _refuse_without_context(request: httpx.Request) -> None:
    """Refuse a request for a running trial's host that carries no trial context.

    A thread started with ``loop.run_in_executor`` or ``threading.Thread`` does not copy
    context variables, so which trial sent the request is unknown. Passed through, it went to
    the production URL behind ``--mock`` (or a ``*.twice.test`` name) while the trial counted
    no effect. Every running trial the host belongs to is marked (any of them may have sent
    it), so each errors even when the agent catches this exception.
    """
    url = str(request.url)
    mine = [t for t in list(_live.values()) if t.owns(request)]
    if not mine:
        return  # another host: pass through
    message = (
        f"the agent sent {request.method} {url} from outside its trial's context (a thread "
        "started with loop.run_in_executor or threading.Thread does not carry context "
        "variables), so no trial's services could serve it: use asyncio.to_thread, or run "
        "the call with contextvars.copy_context().run"
    )
    _mark(mine, message)
    raise AgentLimitError(message)


def _mark(trials: list[_Trial], message: str) -> None:
    for trial in trials:
        trial.refused.append(message)


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
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise AgentError(
                f"--mock {name}={url}: expected an http(s) URL such as https://api.example.com "
                "(optionally with a path prefix, no query)"
            )
        pairs.append((url.rstrip("/"), services[name].rstrip("/")))
    return tuple(sorted(pairs, key=lambda p: -len(p[0])))


@contextmanager
def serve_trial(services: Services, hosts: tuple[tuple[str, str], ...] = ()) -> Iterator[None]:
    """While the block runs, ``httpx`` requests from this context go to the trial's services."""
    global _mock
    _guard_model_clients()
    if not _live:
        mock = respx.mock(using="httpx", assert_all_called=False, assert_all_mocked=False)
        mock.route(name="twice-agent-services").mock(side_effect=_side_effect)
        own_transport.start()
        mock.start()
        _mock = mock
    trial = _Trial(services, hosts)
    _live[id(trial)] = trial
    token = _TRIAL.set(trial)
    try:
        yield
    except Exception:
        if trial.refused:  # whatever the agent made of the refusal, the trial is unscored
            raise AgentLimitError(trial.refused[0]) from None
        raise
    finally:
        _TRIAL.reset(token)
        del _live[id(trial)]
        if not _live and _mock is not None:
            _mock.stop()
            own_transport.stop()
            _mock = None
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
    if not (model == BRIDGE_MODEL or model.startswith(BRIDGE_MODEL + "/")):
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


def _guard_model_clients() -> None:
    """Wrap the openai (and anthropic) clients' ``request`` once, after inspect's own patch."""
    global _guarded
    if _guarded:
        return
    from inspect_ai.agent._bridge.bridge import init_bridge_request_patch

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
            # Also with no trial context while trials run: a thread an agent started (with
            # run_in_executor) would otherwise send the request, the user's text, to the
            # network.
            if _TRIAL.get() is not None or _live:
                try:
                    check_model_request(
                        options.url, _json(options), stream=bool(kw.get("stream")), sync=True
                    )
                except AgentLimitError as ex:
                    if _TRIAL.get() is None:
                        _mark(list(_live.values()), str(ex))
                    raise
            return original(self, cast_to, options, *args, **kw)

        cls.request = request_sync
        return

    @functools.wraps(original)
    async def request_async(self: Any, cast_to: Any, options: Any, *args: Any, **kw: Any) -> Any:
        if _TRIAL.get() is not None:
            check_model_request(
                options.url, _json(options), stream=bool(kw.get("stream")), sync=False
            )
        return await original(self, cast_to, options, *args, **kw)

    cls.request = request_async


def _json(options: Any) -> Mapping[str, Any] | None:
    data = getattr(options, "json_data", None)
    return data if isinstance(data, Mapping) else None
