"""The ASGI application behind ``twice serve``: its routes, and each fault on a real socket.

A *trial* is made by the control API from a task's sample (its initial state), a fault and a
protection; its services answer at ``/t/<id>/<service>/...`` and its tools over MCP at
``/t/<id>/mcp``. Every route first passes :func:`check_origin`.

Why uvicorn, driven as a raw ASGI app: the MCP transport is an ASGI application, and a lost
reply needs a server that can close a connection without answering (:func:`drop_connection`).

Each fault means on a socket what it means in process:

* ``lost_reply`` and ``timeout_before_commit`` are read timeouts. The service commits (or
  not), then holds the reply open until the client gives up on its own clock: it sees a real
  read timeout (httpx ``ReadTimeout``, requests ``ReadTimeout``, Node's fetch ``TimeoutError``
  from ``AbortSignal.timeout``) after its timeout's worth of wall time. The held connection is
  closed with no response once the client leaves, after the trial's ``hang_seconds`` (default
  :data:`DEFAULT_HANG_SECONDS`, the server's ``--hang-seconds``), or at once when the server
  stops. A client that waits longer than ``hang_seconds`` sees the connection closed instead.
* ``reset_after_commit`` is a connection error. The service commits, then the connection is
  closed with no response at once: httpx ``RemoteProtocolError``, requests
  ``ConnectionError``, the Stripe SDK ``APIConnectionError``, Node's fetch ``UND_ERR_SOCKET``.

Every request of one trial is served atomically on the event loop (log, then the service's
whole pipeline, with no await in between), so the log's order is the order of execution and
the replay is exact; a concurrent request with the same Idempotency-Key sees the first one
done and gets its saved response.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

import httpx

from ..suite import DEFAULT_HANG_SECONDS
from ._asgi import (
    MAX_SERVICE_BODY,
    body_within,
    client_gone,
    drop_connection,
    drop_reply,
    error_body,
    send_reply,
)
from ._control import control
from ._errors import ControlError
from ._guard import check_origin
from ._log import RequestLog
from ._registry import TrialRegistry
from ._trial import ServedTrial, request_record
from ._upstream import Upstream, scrub

DEFAULT_HOST = "127.0.0.1"

_TRIAL_PATH = re.compile(r"^/t/(?P<id>[^/]+)/(?P<service>[^/]+)(?P<rest>/.*)?$")


class TwiceServer(TrialRegistry):
    """The ASGI application behind ``twice serve``.

    Args:
        log: The write-ahead request log; trials in it are rebuilt at once.
        base_url: ``http://HOST:PORT`` as clients reach the server (trial URLs start with it).
        token: Bearer token the control API requires (None: no token).
        host: The bound host (on loopback, :func:`check_origin` also checks ``Host``).
        tasks: Tasks of your own (``path.py:function``) trials may be made of, beside the
            built-in ones; each is loaded and built here.
        hang_seconds: How long a trial that gives no ``hang_seconds`` holds a lost reply open.
        upstreams: Real services a trial's requests to their name are forwarded to
            (``--upstream``), in place of a mock service of the same name.

    Raises:
        ServeError: for a task of your own that cannot be loaded, or a logged trial of a task
            this server does not have.
    """

    def __init__(
        self,
        log: RequestLog,
        base_url: str,
        token: str | None = None,
        host: str = DEFAULT_HOST,
        tasks: Sequence[str] = (),
        hang_seconds: float = DEFAULT_HANG_SECONDS,
        upstreams: Sequence[Upstream] = (),
    ) -> None:
        super().__init__(log, base_url, tasks=tasks, hang_seconds=hang_seconds, upstreams=upstreams)
        self.token = token
        self.host = host
        self.stopping = asyncio.Event()
        """Set when the server begins to stop: held lost replies are dropped at once (they
        were never going to be answered) instead of holding the stop up."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            return
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except ControlError as err:
            # A 401 names the scheme it wants (RFC 9110 11.6.1).
            extra = [(b"www-authenticate", b'Bearer realm="twice"')] if err.status == 401 else []
            body = json.dumps(error_body(err.message, field=err.field)).encode()
            await send_reply(
                send, err.status, body, [(b"content-type", b"application/json"), *extra]
            )

    async def _route(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path: str = scope["path"]
        check_origin(dict(scope["headers"]), self.host)
        if path.startswith("/_twice/"):
            await control(self, self.token, scope, receive, send)
            return
        match = _TRIAL_PATH.match(path)
        if match is None:
            raise ControlError(
                404,
                f"no such endpoint: {path}; trials live under /t/<id>/<service>, "
                "the control API under /_twice/trials",
            )
        trial = self.trials.get(match["id"])
        if trial is None:
            raise ControlError(404, f"no such trial: {match['id']!r}", "id")
        if match["service"] == "mcp" and not match["rest"]:
            await self._mcp(trial, scope, receive, send)
            return
        await self._service(trial, match["service"], match["rest"] or "/", scope, receive, send)

    async def _mcp(
        self, trial: ServedTrial, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        # Read here, within the services' limit, and handed on whole: checking only the
        # Content-Length let a chunked body past, up to the MCP SDK's own 4 MB.
        body = await body_within(scope, receive, MAX_SERVICE_BODY)
        given = False

        async def replay() -> Any:
            nonlocal given
            if given:
                return await receive()  # e.g. the client's disconnect, for a stream
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        await trial.mcp_endpoint().handle(scope, replay, send)

    async def _service(
        self,
        trial: ServedTrial,
        service: str,
        rest: str,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
    ) -> None:
        proxied = trial.proxy is not None and service in trial.proxy.upstreams
        svc = trial.services.services.get(service)
        if svc is None and not proxied:
            upstreams = [*trial.proxy.upstreams] if trial.proxy is not None else []
            raise ControlError(
                404,
                f"trial {trial.id} has no service {service!r}; it has: "
                + ", ".join([*trial.services.services, *upstreams, "mcp"]),
            )
        body = await body_within(scope, receive, MAX_SERVICE_BODY)
        query = scope.get("query_string", b"").decode("latin-1")
        try:
            if trial.proxy is not None and proxied:
                raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
                response = await trial.proxy.forward(
                    service, scope["method"], rest, query, raw, body
                )
            else:
                assert svc is not None
                response = trial.serve(_service_record(svc, scope, rest, query, body))
        except httpx.TimeoutException:
            await self._hold_reply(trial, receive, send)
            return
        except httpx.TransportError:  # reset_after_commit: the connection ends, no reply
            await drop_reply(send)
            return
        # What an HTTP client is shown is its replies: an effect id in a delivered body is
        # seen (``unseen_effects``); a lost reply shows nothing.
        shown = response.content.decode("utf-8", "replace")
        if proxied and trial.proxy is not None:
            shown = scrub(shown, trial.proxy.secrets)
        trial.ctx.observe(shown)
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
        await send_reply(send, response.status_code, response.content, out)

    async def _hold_reply(self, trial: ServedTrial, receive: Any, send: Any) -> None:
        """Hold a lost reply open, so the client times out on its own clock; then close the
        connection with no reply: when the client leaves, after the trial's ``hang_seconds``,
        or at once when the server stops."""
        waits = [
            asyncio.ensure_future(client_gone(receive)),
            asyncio.ensure_future(self.stopping.wait()),
        ]
        try:
            await asyncio.wait(
                waits, timeout=trial.config.hang_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            # Cut short (a forced stop): the client still sees the reply lost, never the 500
            # the server would answer for a cancelled request.
            drop_connection(send)
            raise
        finally:
            for wait in waits:
                wait.cancel()
        await drop_reply(send)


def _service_record(
    svc: Any, scope: dict[str, Any], rest: str, query: str, body: bytes
) -> dict[str, Any]:
    """The request log's record of a request to a (mock or generated) service.

    Raises:
        ControlError: 414 or 400 for a URL httpx cannot build; it never reached a service.
    """
    # ASGI gives the path percent-decoded: quoted again, a %09 or a non-ASCII character in
    # a path parameter stays a valid URL (httpx refuses a raw tab: a 500).
    path = urllib.parse.quote(rest, safe="/!$&'()*+,;=:@~")
    url = svc.base_url + path + (f"?{query}" if query else "")
    try:
        httpx.URL(url)
    except httpx.InvalidURL as ex:
        status = 414 if "too long" in str(ex) else 400
        raise ControlError(status, f"the request URL cannot be served: {ex}") from None
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    return request_record(scope["method"], url, headers, body, svc.read_headers)
