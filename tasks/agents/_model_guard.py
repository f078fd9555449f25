"""Refuse, with what to do instead, model requests the in-process agent bridge would not route.

Sync clients, streaming, ``previous_response_id`` and model names other than ``inspect`` would
otherwise go to the network; a ``requests`` call to a trial's host would reach production
uncounted. A refusal marks the trial(s) it may belong to, so each errors even when the agent
catches the exception.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import httpx

from .._inspect_compat import init_bridge_request_patch
from ._context import BRIDGE_MODEL, AgentLimitError
from ._trials import _TRIAL, _live, _owners, _refuse, _refuse_late, _refuse_without_trial

MODEL_PATHS = ("/chat/completions", "/responses", "/v1/messages")
"""Client paths that carry a model request (OpenAI Chat Completions/Responses, Anthropic)."""


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
