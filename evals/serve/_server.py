"""``twice serve``: the mock services, faults and idempotency store over real HTTP and MCP.

A *trial* is made by the control API from a task's sample (its initial state), a fault and a
protection; its services answer at ``/t/<id>/<service>/...`` and its tools over MCP at
``/t/<id>/mcp``. Every request that can change a trial is written ahead to SQLite (WAL) before
it is served; on start the server replays that log, so after ``kill -9`` every trial comes
back exactly as it was (the services are deterministic).

Why uvicorn, driven as a raw ASGI app: the MCP transport is an ASGI application, and a lost
reply needs a server that can close a connection *without answering* (ASGI servers answer 500
when an application ends without a response). uvicorn's HTTP protocol exposes its asyncio
transport on the ``send`` callable it hands the application; :func:`drop_connection` closes
that transport, so the client sees the connection end with no response at all, as when a
gateway dies after the upstream committed. The server is pinned to uvicorn's ``h11``
protocol, where that holds.

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

A web page the user visits can reach a loopback server too: by DNS rebinding (its own name
resolved to 127.0.0.1, so the browser sends ``Host: evil.example``) or by a cross-origin
"simple" request (a ``text/plain`` or form POST needs no preflight). Every request (control
API, services and MCP alike) passes one check, :func:`check_origin`: on a loopback bind the
``Host`` must name a loopback address (421 otherwise), and an ``Origin``, when a browser sends
one, must be a loopback origin or the server's own (403 otherwise). SDKs send no ``Origin``
and the ``Host`` of the URL they were given, so they pass. A control POST must say
``Content-Type: application/json`` (415), which no cross-origin page can send without a
preflight the server never grants.

A connection may wait at most :data:`IDLE_SECONDS` for a whole request head, from when it is
opened or its last reply ends: one opened and left silent, or fed a header a byte at a time,
is closed then. A request being served (a ``hang`` reply held open) is not idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

import httpx
from twice.assertions import score_trial
from twice.mocks import FAULTS, KEY_HEADER, Services, UsageError, get_fault
from twice.tasks import (
    AGENT_FAULTS_REFUSED,
    PROTECTIONS,
    TASKS,
    ActionLog,
    ActionRecord,
    TaskParts,
    TrialContext,
    Undo,
    get_protection,
    task_parts,
)

from ..suite import DEFAULT_HANG_SECONDS, check_hang_seconds
from ._log import DamagedLog, RequestLog

if TYPE_CHECKING:
    from ._mcp import TrialMcp

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_DB = "twice-serve.sqlite"
MAX_CONTROL_BODY = 64 * 1024
"""Bytes a control request body may have."""
MAX_SERVICE_BODY = 1024 * 1024
"""Bytes a service (or MCP) request body may have."""
IDLE_SECONDS = 5.0
"""Seconds a connection may wait for a whole request head, from when it opens or its last
reply ends (uvicorn's own keep-alive bound counts only from a reply)."""
TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")
"""What a ``--token`` may be: visible ASCII, no spaces (it travels in an HTTP header)."""
LOST_REPLY_MODES = ("hang",)
"""Accepted values of the deprecated ``lost_reply`` trial field (every timeout fault hangs;
the old ``drop`` is the fault ``reset_after_commit``)."""
TRIAL_FIELDS = ("task", "sample", "fault", "protection", "lost_reply", "hang_seconds")
LOGGED_HEADERS = (
    "content-type",
    KEY_HEADER.lower(),
    "x-twice-source",
    "x-twice-call",
    "x-twice-backoff",
)
"""The only request headers written to the log: the ones the services read. Never
``Authorization``."""

_TRIAL_PATH = re.compile(r"^/t/(?P<id>[^/]+)/(?P<service>[^/]+)(?P<rest>/.*)?$")
_CONTROL_PATH = re.compile(r"^/_twice/trials(?:/(?P<id>[^/]+)(?:/(?P<what>ledger|verdict))?)?/?$")


class ControlError(UsageError):
    """A control request the server refuses: HTTP status and one line naming the bad field."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


@dataclass(frozen=True)
class TrialConfig:
    """What a trial is made from (the body of ``POST /_twice/trials``, validated)."""

    task: str
    sample: str
    fault: str = "none"
    protection: str = "bare"
    hang_seconds: float = DEFAULT_HANG_SECONDS
    """Seconds a lost reply (a timeout fault) is held open before its connection is closed."""


def _json(value: Any) -> str:
    """A request's value as the client wrote it (``null``, ``true``, ``"x"``), not Python's."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


SERVE_FAULTS = tuple(f for f in FAULTS if f not in AGENT_FAULTS_REFUSED)
"""The faults a served trial takes: all but those only twice's own agent loop can run."""


def parse_trial_config(
    body: Any, tasks: Sequence[str] = (), hang_seconds: float = DEFAULT_HANG_SECONDS
) -> TrialConfig:
    """Validate a ``POST /_twice/trials`` body.

    ``task`` is a built-in task or one of ``tasks``: the tasks of your own the server was
    started with (``twice serve --task path.py:function``). A request never names a file for
    the server to load: that would run code a client chose. ``hang_seconds`` is the server's
    default for a body that gives none.

    The ``lost_reply`` field is deprecated: a timeout fault always holds the reply open, so
    ``"hang"`` is accepted and changes nothing, and ``"drop"`` (a connection closed at once)
    is refused with a pointer to the fault that does it, ``reset_after_commit``.

    Raises:
        ControlError: 400, naming the bad field and what is accepted.
    """
    if not isinstance(body, dict):
        raise ControlError(400, "the body must be a JSON object with at least 'task'")
    unknown = sorted(set(body) - set(TRIAL_FIELDS))
    if unknown:
        raise ControlError(
            400,
            f"unknown field(s) {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(TRIAL_FIELDS)}",
            unknown[0],
        )

    def given(name: str, default: Any) -> Any:
        # JSON null is "not given": the field's default, as when it is left out.
        value = body.get(name)
        return default if value is None else value

    def choice(name: str, allowed: Any, default: str | None) -> str:
        value = given(name, default)
        if value is None:
            raise ControlError(400, f"{name} is required; one of: {', '.join(allowed)}", name)
        if not isinstance(value, str) or value not in allowed:
            raise ControlError(
                400, f"{name} {_json(value)} is not one of: {', '.join(allowed)}", name
            )
        return value

    task = given("task", None)
    if isinstance(task, str) and ":" in task and task not in tasks:
        raise ControlError(
            400,
            f"task {_json(task)} is not one this server was started with; a task of your own "
            f"is named when it starts (twice serve --task {task}) and then exactly as there; "
            + (f"started with: {', '.join(map(_json, tasks))}; " if tasks else "")
            + f"built-in: {', '.join(TASKS)}",
            "task",
        )
    task = choice("task", (*TASKS, *tasks), None)
    parts = task_parts(task)
    samples = [str(s.id) for s in parts.dataset]
    sample = given("sample", samples[0])
    if not isinstance(sample, str) or sample not in samples:
        raise ControlError(
            400,
            f"sample {_json(sample)} is not in task {task!r}; its samples are "
            f"{samples[0]} ... {samples[-1]} ({len(samples)})",
            "sample",
        )
    try:
        hang = check_hang_seconds(given("hang_seconds", hang_seconds))
    except ValueError as ex:
        raise ControlError(400, str(ex), "hang_seconds") from None
    if given("lost_reply", "hang") == "drop":
        # Closing the connection at once is a connection error, which clients retry on
        # grounds a timeout does not give: its own fault, so the two are measured apart.
        raise ControlError(
            400,
            'lost_reply "drop" is the fault "reset_after_commit" (the connection closed with '
            'no reply); fault "lost_reply" always holds the reply open until the client times '
            "out (lost_reply is deprecated; leave it out)",
            "lost_reply",
        )
    choice("lost_reply", LOST_REPLY_MODES, "hang")
    fault = given("fault", "none")
    if fault in AGENT_FAULTS_REFUSED:
        # A served trial's agent is the client's own: nothing restarts its run from twice's
        # checkpoints, so the fault would act as "none" while its evidence said "crashed".
        raise ControlError(
            400,
            f"fault {_json(fault)} restarts twice's own agent loop from its checkpoints, which "
            f"a served trial's agent does not have; one of: {', '.join(SERVE_FAULTS)}",
            "fault",
        )
    return TrialConfig(
        task=task,
        sample=sample,
        fault=choice("fault", SERVE_FAULTS, "none"),
        protection=choice("protection", PROTECTIONS, "bare"),
        hang_seconds=hang,
    )


@dataclass
class ServeContext(TrialContext):
    """The tool layer's context of a served trial: what the agent is shown is logged too."""

    on_observe: Callable[[str], None] | None = None

    def observe(self, text: str) -> str:
        if self.on_observe is not None:
            self.on_observe(text)
        self.services.ledger.observations.append(text)
        return text

    def sync(self) -> None:
        """No inspect sample store here: the request log is what keeps the trial."""

    def snapshot(self) -> dict[str, Any]:
        """The tool layer's own state (counters, intents, action log), JSON-ready."""
        return {
            "calls": self.calls,
            "intents_seen": sorted(self.intents_seen),
            "dispatched": [list(d) for d in self.dispatched],
            "resume_pending": sorted(self.resume_pending),
            "restarts": self.restarts,
            "action_log": self.action_log.to_list() if self.action_log is not None else None,
            "compensations": [asdict(u) for u in self.compensations],
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Set the state :meth:`snapshot` returned."""
        self.calls = int(data["calls"])
        self.intents_seen = set(data["intents_seen"])
        self.dispatched = [(int(n), str(i)) for n, i in data["dispatched"]]
        self.resume_pending = set(data["resume_pending"])
        self.restarts = int(data["restarts"])
        if data["action_log"] is not None and self.action_log is not None:
            self.action_log.records = [ActionRecord(**r) for r in data["action_log"]]
        self.compensations = [Undo(**u) for u in data["compensations"]]


def request_record(method: str, url: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """What the log keeps of one service request (never an Authorization header)."""
    return {
        "method": method,
        "url": url,
        "headers": {k: v for k, v in headers.items() if k.lower() in LOGGED_HEADERS},
        # latin-1 maps every byte to one character: any body survives JSON unchanged.
        "body": body.decode("latin-1"),
    }


@dataclass
class ServedTrial:
    """One trial: its services and ledger, its tool layer, and (once used) its MCP endpoint."""

    id: str
    config: TrialConfig
    parts: TaskParts
    metadata: dict[str, Any]
    services: Services
    ctx: ServeContext
    log: Callable[[str, dict[str, Any]], None]
    mcp: TrialMcp | None = None
    _tools: list[Any] = field(default_factory=list)

    @classmethod
    def create(
        cls, trial_id: str, config: TrialConfig, log: Callable[[str, dict[str, Any]], None]
    ) -> ServedTrial:
        """Build a trial from its sample's initial state."""
        parts = task_parts(config.task)
        sample = next((s for s in parts.dataset if str(s.id) == config.sample), None)
        if sample is None:
            raise ValueError(f"task {config.task!r} has no sample {config.sample!r}")
        metadata = dict(sample.metadata or {})
        services = Services(
            parts.services(metadata.get("state", {})), fault=get_fault(config.fault)
        )
        protection = get_protection(config.protection)
        ctx = ServeContext(
            services,
            protection,
            run_id=f"run_{trial_id}",
            action_log=ActionLog() if protection.action_log else None,
        )
        trial = cls(trial_id, config, parts, metadata, services, ctx, log)
        ctx.on_observe = lambda text: log("observe", {"text": text})
        # The tool layer's requests go through the same log-then-serve path as HTTP clients'.
        ctx.client = httpx.AsyncClient(
            transport=httpx.MockTransport(trial.tool_request), timeout=httpx.Timeout(10.0)
        )
        trial._tools = parts.tools(ctx)
        ctx.check_tools()
        return trial

    def apply(self, record: dict[str, Any]) -> httpx.Response:
        """Serve a logged request (live or replayed); raises the fault's transport error."""
        request = httpx.Request(
            record["method"],
            record["url"],
            # As bytes: httpx encodes str values as ASCII, and a client's header need not be
            # (a non-ASCII Idempotency-Key is the key rules' 400, not a 500 here).
            headers=[
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in record["headers"].items()
            ],
            content=record["body"].encode("latin-1"),
        )
        return self.services.dispatch(request)

    def serve(self, record: dict[str, Any]) -> httpx.Response:
        """Log a request, then serve it: nothing is answered that is not in the log."""
        self.log("request", record)
        return self.apply(record)

    def tool_request(self, request: httpx.Request) -> httpx.Response:
        """The tool layer's transport (MCP tool calls): the same log-then-serve path."""
        return self.serve(
            request_record(request.method, str(request.url), dict(request.headers), request.content)
        )

    def mcp_endpoint(self) -> TrialMcp:
        """The trial's MCP endpoint, made on first use."""
        if self.mcp is None:
            # Imported here: mcp is an optional extra ("twice[serve]"), needed only for MCP.
            from ._mcp import TrialMcp

            self.mcp = TrialMcp(
                f"twice-{self.config.task}",
                self._tools,
                self.ctx.tool_specs,
                self.config.protection,
                lambda: self.log("context", self.ctx.snapshot()),
            )
        return self.mcp

    def verdict(self) -> dict[str, Any]:
        """The task's per-trial metrics, from the same code the scorer uses."""
        m = score_trial(self.services.ledger, self.metadata, self.parts.end_state)
        return {
            "id": self.id,
            "task": self.config.task,
            "sample": self.config.sample,
            "fault": self.config.fault,
            "protection": self.config.protection,
            "metrics": m.values(),
            "explanation": m.explanation(),
            "evidence": m.evidence(),
        }


def drop_connection(send: Any) -> bool:
    """Close the client's connection without a response; False if the server cannot."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        return False
    transport.close()
    return True


async def _drop_reply(send: Any) -> None:
    """Close the connection with no response (what a reset after the commit looks like)."""
    if not drop_connection(send):
        # Not uvicorn's protocol: the nearest honest thing is a gateway timeout.
        await _send_json(send, 504, _error("upstream timed out", type="api_error"))
        return
    # Let the protocol see the connection is gone, so it does not answer 500 for us.
    for _ in range(3):
        await asyncio.sleep(0)


async def _client_gone(receive: Any) -> None:
    """Return once the client has closed its connection (its body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The request body, or None when it exceeds ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    hdrs = [(k, v) for k, v in headers or [] if k.lower() != b"content-length"]
    hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Any, status: int, data: Any) -> None:
    body = json.dumps(data).encode()
    await _send(send, status, body, [(b"content-type", b"application/json")])


def _error(message: str, type: str = "invalid_request_error", field: str | None = None) -> Any:
    err: dict[str, Any] = {"type": type, "message": message}
    if field is not None:
        err["param"] = field
    return {"error": err}


class TwiceServer:
    """The ASGI application behind ``twice serve``.

    Args:
        log: The write-ahead request log; trials in it are rebuilt at once.
        base_url: ``http://HOST:PORT`` as clients reach the server (trial URLs start with it).
        token: Bearer token the control API requires (None: no token).
        host: The bound host (on loopback, :func:`check_origin` also checks ``Host``).
        tasks: Tasks of your own (``path.py:function``) trials may be made of, beside the
            built-in ones; each is loaded and built here.
        hang_seconds: How long a trial that gives no ``hang_seconds`` holds a lost reply open.

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
    ) -> None:
        self.request_log = log
        self.hang_seconds = hang_seconds
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.host = host
        self.tasks = own_tasks(tasks)
        self.trials: dict[str, ServedTrial] = {}
        self.replayed = self._replay()
        self.stopping = asyncio.Event()
        """Set when the server begins to stop: held lost replies are dropped at once (they
        were never going to be answered) instead of holding the stop up."""
        self._closed = False

    # -- durability ------------------------------------------------------------------------

    def _logger(self, trial_id: str) -> Callable[[str, dict[str, Any]], None]:
        def write(kind: str, data: dict[str, Any]) -> None:
            self.request_log.append(trial_id, kind, data)

        return write

    def _replay(self) -> int:
        """Rebuild every trial from the log; returns the number of records replayed."""
        n = 0
        for record in self.request_log.records():
            n += 1
            if record.kind == "create":
                # A log of an older twice may hold the retired lost_reply mode: the services'
                # state never depended on it.
                data = {k: v for k, v in record.data.items() if k != "lost_reply"}
                config = TrialConfig(**data)
                if config.task not in TASKS and config.task not in self.tasks:
                    raise ServeError(
                        f"{self.request_log.path} cannot be replayed: trial {record.trial} is "
                        f"of task {config.task!r}, a task of your own; start the server with "
                        f"--task {config.task}"
                    )
                try:
                    self.trials[record.trial] = ServedTrial.create(
                        record.trial, config, self._logger(record.trial)
                    )
                except ValueError as ex:
                    raise ServeError(
                        f"{self.request_log.path} cannot be replayed: trial {record.trial} "
                        f"was made from something this twice does not have ({ex})"
                    ) from None
                continue
            trial = self.trials.get(record.trial)
            if trial is None:
                continue
            if record.kind == "request":
                # A fault's error (a lost reply) happened the same way when it was first served.
                with contextlib.suppress(Exception):
                    trial.apply(record.data)
            elif record.kind == "observe":
                trial.services.ledger.observations.append(record.data["text"])
            elif record.kind == "context":
                trial.ctx.restore(record.data)
            elif record.kind == "delete":
                del self.trials[record.trial]
        return n

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        try:
            check_origin(dict(scope["headers"]), self.host)
            if path.startswith("/_twice/"):
                await self._control(scope, receive, send)
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
        except ControlError as err:
            # A 401 names the scheme it wants (RFC 9110 11.6.1).
            extra = [(b"www-authenticate", b'Bearer realm="twice"')] if err.status == 401 else []
            body = json.dumps(_error(err.message, field=err.field)).encode()
            await _send(send, err.status, body, [(b"content-type", b"application/json"), *extra])

    async def _mcp(
        self, trial: ServedTrial, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        # Read here, within the services' limit, and handed on whole: checking only the
        # Content-Length let a chunked body past, up to the MCP SDK's own 4 MB.
        body = await _body_within(scope, receive, MAX_SERVICE_BODY)
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
        svc = trial.services.services.get(service)
        if svc is None:
            raise ControlError(
                404,
                f"trial {trial.id} has no service {service!r}; it has: "
                + ", ".join([*trial.services.services, "mcp"]),
            )
        body = await _body_within(scope, receive, MAX_SERVICE_BODY)
        query = scope.get("query_string", b"").decode("latin-1")
        url = svc.base_url + rest + (f"?{query}" if query else "")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        record = request_record(scope["method"], url, headers, body)
        try:
            response = trial.serve(record)
        except httpx.TimeoutException:
            await self._hold_reply(trial, receive, send)
            return
        except httpx.TransportError:  # reset_after_commit: the connection ends, no reply
            await _drop_reply(send)
            return
        # What an HTTP client is shown is its replies: an effect id in a delivered body is
        # seen (``unseen_effects``); a lost reply shows nothing.
        trial.ctx.observe(response.content.decode("utf-8", "replace"))
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
        await _send(send, response.status_code, response.content, out)

    async def _hold_reply(self, trial: ServedTrial, receive: Any, send: Any) -> None:
        """Hold a lost reply open, so the client times out on its own clock; then close the
        connection with no reply: when the client leaves, after the trial's ``hang_seconds``,
        or at once when the server stops."""
        waits = [
            asyncio.ensure_future(_client_gone(receive)),
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
        await _drop_reply(send)

    # -- control API -----------------------------------------------------------------------

    def _authorize(self, scope: dict[str, Any]) -> None:
        if self.token is None:
            return
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1").strip()
        scheme, _, credentials = given.partition(" ")
        # The scheme is case-insensitive (RFC 9110 11.1); the token is compared in constant time.
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            credentials.strip().encode(), self.token.encode()
        ):
            raise ControlError(401, "the control API needs 'Authorization: Bearer <token>'")

    async def _control(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        match = _CONTROL_PATH.match(scope["path"])
        if match is None:
            raise ControlError(404, f"no such endpoint: {scope['path']}")
        self._authorize(scope)
        method = scope["method"]
        trial_id, what = match["id"], match["what"]
        if trial_id is None:
            if method == "POST":
                _require_json(scope)
                body = await _body_within(scope, receive, MAX_CONTROL_BODY)
                try:
                    data = json.loads(body or b"null")
                except (ValueError, RecursionError):  # nested past Python's stack
                    raise ControlError(400, "the body is not JSON") from None
                config = parse_trial_config(data, self.tasks, self.hang_seconds)
                await _send_json(send, 201, self.create_trial(config))
                return
            if method == "GET":
                await _send_json(
                    send, 200, {"trials": [self.describe(t) for t in self.trials.values()]}
                )
                return
            raise ControlError(405, f"{method} is not allowed on /_twice/trials (POST, GET)")
        trial = self.trials.get(trial_id)
        if trial is None:
            raise ControlError(404, f"no such trial: {trial_id!r}", "id")
        if what == "ledger" and method == "GET":
            await _send_json(send, 200, trial.services.ledger.to_dict())
        elif what == "verdict" and method == "GET":
            await _send_json(send, 200, trial.verdict())
        elif what is None and method == "GET":
            await _send_json(send, 200, self.describe(trial))
        elif what is None and method == "DELETE":
            await self.delete_trial(trial)
            await _send_json(send, 200, {"id": trial.id, "deleted": True})
        else:
            raise ControlError(405, f"{method} is not allowed on {scope['path']}")

    def create_trial(self, config: TrialConfig) -> dict[str, Any]:
        """Make a trial (logged first) and return its id and URLs."""
        trial_id = secrets.token_hex(8)
        self.request_log.append(trial_id, "create", asdict(config))
        trial = ServedTrial.create(trial_id, config, self._logger(trial_id))
        self.trials[trial_id] = trial
        return self.describe(trial)

    async def delete_trial(self, trial: ServedTrial) -> None:
        """Forget a trial (logged first)."""
        self.request_log.append(trial.id, "delete", {})
        del self.trials[trial.id]
        if trial.mcp is not None:
            await trial.mcp.stop()

    def describe(self, trial: ServedTrial) -> dict[str, Any]:
        """A trial's id, configuration and URLs."""
        base = f"{self.base_url}/t/{trial.id}"
        urls = {name: f"{base}/{name}" for name in trial.services.services}
        urls["mcp"] = f"{base}/mcp"
        return {"id": trial.id, **asdict(trial.config), "urls": urls}

    async def close(self) -> None:
        """Stop every MCP endpoint, then close the request log (folding its WAL into the
        ``--db`` file and letting go of its lock). Once: later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            for trial in self.trials.values():
                if trial.mcp is not None:
                    await trial.mcp.stop()
        finally:
            self.request_log.close()


def _require_json(scope: dict[str, Any]) -> None:
    """A control POST says its body is JSON: a cross-origin page can send ``text/plain`` or a
    form without a preflight, never ``application/json``."""
    given = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
    media = given.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ControlError(
            415,
            f"Content-Type {_clip(given)!r} is not accepted: the control API takes a JSON "
            "body with 'Content-Type: application/json'",
        )


def _content_length(scope: dict[str, Any]) -> int | None:
    raw = dict(scope["headers"]).get(b"content-length")
    return int(raw) if raw is not None and raw.isdigit() else None


async def _body_within(scope: dict[str, Any], receive: Any, limit: int) -> bytes:
    length = _content_length(scope)
    if length is not None and length > limit:
        raise ControlError(413, f"request body of {length} bytes; at most {limit} allowed")
    body = await _read_body(receive, limit)
    if body is None:
        raise ControlError(413, f"request body over {limit} bytes; at most {limit} allowed")
    return body


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _authority_host(authority: str) -> str | None:
    """The host of ``host[:port]`` (brackets of an IPv6 literal dropped, lower case), or None
    when ``authority`` is not one (a path, user info, a port that is not a number)."""
    try:
        parts = urlsplit(f"//{authority}")
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    except ValueError:
        return None
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return parts.hostname or None


def _clip(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def check_origin(headers: dict[bytes, bytes], bound_host: str) -> None:
    """Refuse a request a web page made on the user's behalf: every route runs this one check.

    On a loopback bind the ``Host`` must name a loopback address (``127.0.0.1``,
    ``localhost``, ``[::1]``, any port): a DNS-rebinding page sends its own name. An
    ``Origin`` (browsers send one on cross-origin requests) must be a loopback origin, or
    this server's own when it is bound off loopback. No ``Origin`` (SDKs, curl) passes.

    Raises:
        ControlError: 421 for a ``Host`` that is not loopback, 403 for a foreign ``Origin``.
    """
    host = headers.get(b"host", b"").decode("latin-1").strip()
    on_loopback = is_loopback(bound_host)
    if on_loopback:
        name = _authority_host(host)
        if name is None or not is_loopback(name):
            raise ControlError(
                421,
                f"Host {_clip(host)!r} is not a name of this server: bound to loopback, it "
                "answers only Host 127.0.0.1, localhost or [::1] (any port), so a web page "
                "cannot reach it by DNS rebinding",
            )
    raw = headers.get(b"origin")
    if raw is None:
        return
    origin = raw.decode("latin-1").strip()
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018
    except ValueError:
        parts = None
    allowed = (
        parts is not None
        and parts.scheme in ("http", "https")
        and not parts.path.strip("/")
        and parts.hostname is not None
        and (
            is_loopback(parts.hostname)
            or (not on_loopback and parts.netloc.lower() == host.lower())
        )
    )
    if not allowed:
        raise ControlError(
            403,
            f"Origin {_clip(origin)!r} may not call this server: only pages served from "
            "loopback (http://127.0.0.1:PORT, http://localhost:PORT, http://[::1]:PORT)"
            + ("" if on_loopback else " or from this server itself")
            + " may; clients other than browsers send no Origin",
        )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class ServeError(UsageError):
    """Bad ``twice serve`` usage (exit 2): one line naming the bad value."""


@dataclass
class Running:
    """A started server: where it listens, its app, and how to stop it."""

    url: str
    app: TwiceServer
    stop: Callable[[], None]


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as ex:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {ex.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def own_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    """The tasks of your own among ``tasks`` (``path.py:function``), each loaded and built.

    Raises:
        ServeError: naming a task that cannot be loaded or was not built with ``twice_task``.
    """
    own = tuple(dict.fromkeys(t for t in tasks if t not in TASKS))
    for spec in own:
        try:
            task_parts(spec)
        except ValueError as ex:
            raise ServeError(f"--task {spec!r}: {ex}") from None
    return own


def check_options(db: str | Path, token: str | None) -> None:
    """Refuse a ``--db`` or ``--token`` that would quietly turn a safeguard off.

    An empty ``--db`` would keep nothing and take no one-server lock; an empty ``--token``
    would mean no authentication at all. ``:memory:`` is the way to ask for a log that is not
    kept.

    Raises:
        ServeError: naming the option, its value (never a token's) and what is accepted.
    """
    if not str(db).strip():
        raise ServeError(
            f"--db {str(db)!r} is not a file: give the request log's path (default "
            f"{DEFAULT_DB}), or ':memory:' for one that is not kept (no restore, no lock)"
        )
    if token is not None and not TOKEN_CHARS.fullmatch(token):
        shown = repr(token) if not token.strip() else "(not shown)"
        raise ServeError(
            f"--token {shown} is not a usable bearer token: give one or more visible ASCII "
            "characters, no spaces (or leave --token out for no authentication, which only a "
            "loopback bind allows)"
        )


def _prepare(
    host: str,
    port: int,
    db: str | Path,
    token: str | None,
    tasks: Sequence[str],
    hang_seconds: float = DEFAULT_HANG_SECONDS,
) -> tuple[socket.socket, TwiceServer]:
    check_options(db, token)
    if not is_loopback(host) and not token:
        raise ServeError(
            f"refusing to bind {host!r} without --token: off loopback the control API needs a "
            "bearer token (or bind 127.0.0.1)"
        )
    try:
        check_hang_seconds(hang_seconds, "--hang-seconds")
    except ValueError as ex:
        raise ServeError(str(ex)) from None
    own_tasks(tasks)  # before the database and the port are touched
    sock = _bind(host, port)  # first: a busy port leaves no database or lock behind
    try:
        log = RequestLog(db)
    except ValueError as ex:
        sock.close()
        raise ServeError(str(ex)) from None
    except BaseException:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    shown = host if host not in ("0.0.0.0", "::") else socket.gethostname()
    try:
        app = TwiceServer(
            log,
            f"http://{_url_host(shown)}:{bound_port}",
            token=token,
            host=host,
            tasks=tasks,
            hang_seconds=hang_seconds,
        )
    except BaseException as ex:
        sock.close()
        log.close()
        if isinstance(ex, DamagedLog):
            raise ServeError(str(ex)) from None
        raise
    return sock, app


def _protocol() -> type[Any]:
    """uvicorn's h11 protocol, with a bound (the config's ``timeout_keep_alive``, by default
    :data:`IDLE_SECONDS`) on the time a connection waits for a whole request head."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        # uvicorn arms its keep-alive timer only when a reply ends, and any byte cancels it:
        # by itself it holds a connection opened and left silent, or fed a header slowly,
        # for ever.
        _idle: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._serving():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # (A pipelined request may be being served already.)
            if not self._serving() and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _serving(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._idle = self.loop.call_later(self.timeout_keep_alive, self._expire)

        def _disarm(self) -> None:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None

        def _expire(self) -> None:
            self._idle = None
            # A request being served (a held reply included) is not idle.
            if not self._serving() and not self.transport.is_closing():
                self.transport.close()

    return Protocol


def _uvicorn_server(config: Any, app: TwiceServer) -> Any:
    """uvicorn's server, which also tells ``app`` when it begins to stop and keeps the signal
    that stopped it (``stopped_by``)."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.stopped_by is None:
                self.stopped_by = sig
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.stopping.set()  # before uvicorn waits for the open requests
            await super().shutdown(sockets)
            # Here, not after serve() returns: uvicorn then raises the signal that stopped it
            # again, and its default action (SIGTERM's, or SIGINT's KeyboardInterrupt) ends
            # the process before any later line runs, leaving every record in the -wal
            # file beside an empty --db.
            await app.close()

    return Server(config)


async def _serve_async(
    sock: socket.socket,
    app: TwiceServer,
    started: Callable[[], None],
    stop: asyncio.Event | None,
    idle_seconds: float = IDLE_SECONDS,
) -> int | None:
    """Serve until a stop signal (or ``stop``); returns the signal that stopped it, if any."""
    import uvicorn

    config = uvicorn.Config(
        app,
        http=_protocol(),  # uvicorn's h11: drop_connection relies on this protocol's transport
        # Typed int by uvicorn; it is only handed to loop.call_later, which takes a float.
        timeout_keep_alive=idle_seconds,  # type: ignore[arg-type]
        lifespan="off",
        log_level="warning",
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=2,
    )
    server = _uvicorn_server(config, app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        started()
    if stop is not None:
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopper.cancel()
    await task
    await app.close()  # when it stopped before it started (and so never shut down)
    stopped_by: int | None = server.stopped_by
    return stopped_by


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    db: str | Path = DEFAULT_DB,
    token: str | None = None,
    out: TextIO | None = None,
    tasks: Sequence[str] = (),
    hang_seconds: float = DEFAULT_HANG_SECONDS,
) -> int | None:
    """Run ``twice serve`` in the foreground until a stop signal.

    Prints ``listening on http://HOST:PORT`` once it accepts connections, as the first line
    on ``out`` (standard output): a client may read it for the port. ``tasks``: tasks of your
    own (``path.py:function``) trials may be made of, beside the built-in ones.
    ``hang_seconds``: how long a trial that gives none holds a lost reply open.

    Returns:
        The signal that stopped it, when that signal's own action did not end the process
        (one the process was started ignoring); the caller exits with the shell's code for
        it. A SIGINT otherwise raises ``KeyboardInterrupt``.

    Raises:
        ServeError: for a non-loopback host without a token, an empty ``db`` or a token that
            is empty or has spaces, a busy port, a file that is not a twice serve database,
            a task of your own that cannot be loaded, or a ``hang_seconds`` out of range.
    """
    stream = out or sys.stdout
    sock, app = _prepare(host, port, db, token, tasks, hang_seconds)

    def started() -> None:
        if app.replayed:  # on stderr: the first line of stdout is the address
            print(
                f"replayed {app.replayed} logged records: {len(app.trials)} trial(s) restored",
                file=sys.stderr,
            )
        print(f"listening on {app.base_url}", file=stream, flush=True)

    return asyncio.run(_serve_async(sock, app, started, None))


@contextmanager
def running_server(
    db: str | Path = ":memory:",
    host: str = DEFAULT_HOST,
    port: int = 0,
    token: str | None = None,
    tasks: Sequence[str] = (),
    idle_seconds: float = IDLE_SECONDS,
    hang_seconds: float = DEFAULT_HANG_SECONDS,
) -> Iterator[Running]:
    """Run a twice server in a background thread (tests, benches, ``--agent-cmd``).

    ``tasks``: tasks of your own (``path.py:function``) it hosts beside the built-in ones.
    ``idle_seconds``: how long a connection may wait for a whole request (see
    :data:`IDLE_SECONDS`).
    ``hang_seconds``: how long a trial that gives none holds a lost reply open.

    Yields:
        The running server; it stops when the block ends.
    """
    sock, app = _prepare(host, port, db, token, tasks, hang_seconds)
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop_event: asyncio.Event | None = None
    failure: list[BaseException] = []

    def main() -> None:
        nonlocal stop_event
        asyncio.set_event_loop(loop)
        stop_event = asyncio.Event()
        try:
            loop.run_until_complete(_serve_async(sock, app, ready.set, stop_event, idle_seconds))
        except BaseException as ex:
            failure.append(ex)
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="twice-serve", daemon=True)
    thread.start()
    ready.wait(30)
    if failure:
        raise failure[0]

    def stop() -> None:
        if stop_event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop_event.set)
        thread.join(15)

    try:
        yield Running(app.base_url, app, stop)
    finally:
        stop()
