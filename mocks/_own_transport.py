"""Run tool code's own httpx transport (a retrying wrapper) under twice's interception.

respx intercepts an httpx client by swapping the transport it sends through for a mock one,
which answers before the client's own transport runs. For most clients that transport is
httpx's own and nothing is lost. But tool code can wrap it (``RetryTransport(
httpx.HTTPTransport())``, the pattern of httpx-retries): the wrapper is where its retries
live, so swapping it out hides exactly the retry that makes a second refund, and twice would
count one attempt where production makes two.

So when a request meant for a mock service comes from a client whose transport wraps httpx's
own, twice sends it through the client's transport instead, and answers it where that
transport hands it to httpx's (``HTTPTransport.handle_request``): every attempt the wrapper
makes reaches the services and the ledger. A transport with no httpx transport inside
(``MockTransport``, an aiohttp-based one) is still swapped out as before, so a request of
it never goes to the network.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import httpx

Answer = Callable[[httpx.Request], httpx.Response]
"""Serves one request from the mock services (raises a fault's exception)."""

_HTTPX_TRANSPORTS = (httpx.HTTPTransport, httpx.AsyncHTTPTransport)
_BELOW: ContextVar[Answer | None] = ContextVar("twice_below_own_transport", default=None)
_lock = threading.Lock()
_users = 0
_originals: dict[type, Callable[..., Any]] = {}


def through_own_transport(
    request: httpx.Request, answer: Answer
) -> httpx.Response | Awaitable[httpx.Response]:
    """Answer ``request`` with ``answer``: through its client's own transport when that
    wraps httpx's, with ``answer`` serving each attempt below it; directly otherwise.

    Returns:
        The response (an awaitable when it goes through an async client's transport).
        Exceptions (a fault's timeout, once the wrapper gives up) propagate as the client
        would see them.
    """
    found = None if _BELOW.get() is not None else _own_transport(request)
    if found is None:  # httpx's own transport, one that wraps none, or already below
        return answer(request)
    own, is_async = found
    # Sync or async from the client, not from the transport's bases: httpx-retries'
    # RetryTransport is both a sync and an async transport.
    if is_async:
        return _send_async(own, request, answer)
    token = _BELOW.set(answer)
    try:
        response: httpx.Response = own.handle_request(request)
        return response
    finally:
        _BELOW.reset(token)


async def _send_async(
    own: httpx.AsyncBaseTransport, request: httpx.Request, answer: Answer
) -> httpx.Response:
    token = _BELOW.set(answer)
    try:
        return await own.handle_async_request(request)
    finally:
        _BELOW.reset(token)


def _own_transport(request: httpx.Request) -> tuple[Any, bool] | None:
    """The transport of the client sending ``request`` when it wraps httpx's own, with
    whether that client is async; None otherwise.

    The client is found on the stack (httpx's ``_send_single_request``): respx has already
    replaced its ``_transport_for_url``, so the mounts are read as httpx reads them.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_send_single_request":
            client = frame.f_locals.get("self")
            if isinstance(client, httpx.Client | httpx.AsyncClient):
                break
        frame = frame.f_back  # type: ignore[assignment]
    else:
        return None
    transport = client._transport
    for pattern, mounted in client._mounts.items():
        if pattern.matches(request.url):
            transport = transport if mounted is None else mounted
            break
    if isinstance(transport, _HTTPX_TRANSPORTS):
        if not _overrides_sending(transport):
            return None  # httpx's own: swapping it out loses nothing
    elif not _wraps_httpx(transport, depth=3):
        return None
    return transport, isinstance(client, httpx.AsyncClient)


def _overrides_sending(transport: Any) -> bool:
    """Whether a subclass of httpx's transport sends its own way (retrying around
    ``super().handle_request``, which then reaches httpx's method, answered below)."""
    for base, name in ((httpx.HTTPTransport, "handle_request"),
                       (httpx.AsyncHTTPTransport, "handle_async_request")):  # fmt: skip
        if isinstance(transport, base) and type(transport) is not base:
            return getattr(type(transport), name) is not getattr(base, name)
    return False


def _wraps_httpx(obj: Any, depth: int) -> bool:
    """Whether an httpx transport is among ``obj``'s attributes, or in a list, tuple or dict
    of them (or theirs), ``depth`` levels deep."""
    if depth == 0:
        return False
    values: Any
    if isinstance(obj, list | tuple):
        values = obj
    elif isinstance(obj, dict):
        values = obj.values()
    else:
        values = [*getattr(obj, "__dict__", {}).values(), *_slot_values(obj)]
    for value in values:
        if isinstance(value, _HTTPX_TRANSPORTS) or (
            not isinstance(value, type | str | bytes | int | float)
            and _wraps_httpx(value, depth - 1)
        ):
            return True
    return False


def _slot_values(obj: Any) -> list[Any]:
    """The values in ``obj``'s ``__slots__`` (a class made with attrs' ``@define`` or
    ``slots=True`` keeps its attributes there, not in a ``__dict__``)."""
    out = []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                value = getattr(obj, name, None)  # an unset slot raises AttributeError
                if value is not None:
                    out.append(value)
    return out


def _handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
    answer = _BELOW.get()
    if answer is None:
        response: httpx.Response = _originals[httpx.HTTPTransport](self, request)
        return response
    return answer(request)


async def _handle_async_request(
    self: httpx.AsyncHTTPTransport, request: httpx.Request
) -> httpx.Response:
    answer = _BELOW.get()
    if answer is None:
        response: httpx.Response = await _originals[httpx.AsyncHTTPTransport](self, request)
        return response
    return answer(request)


def start() -> None:
    """Let :func:`through_own_transport` answer below httpx's transports (counted: every
    :func:`start` needs a :func:`stop`). Outside its calls the transports behave as ever."""
    global _users
    with _lock:
        if _users == 0:
            _originals[httpx.HTTPTransport] = httpx.HTTPTransport.handle_request
            _originals[httpx.AsyncHTTPTransport] = httpx.AsyncHTTPTransport.handle_async_request
            httpx.HTTPTransport.handle_request = _handle_request  # type: ignore[method-assign]
            httpx.AsyncHTTPTransport.handle_async_request = _handle_async_request  # type: ignore[method-assign]
        _users += 1


def stop() -> None:
    """Undo one :func:`start` (a stop with none to undo does nothing)."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            httpx.HTTPTransport.handle_request = _originals.pop(httpx.HTTPTransport)  # type: ignore[method-assign]
            httpx.AsyncHTTPTransport.handle_async_request = _originals.pop(  # type: ignore[method-assign]
                httpx.AsyncHTTPTransport
            )
