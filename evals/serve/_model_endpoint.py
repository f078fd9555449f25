"""The model endpoint an agent command is given: the eval's model over HTTP, in this process.

An agent command (``twice run --agent-cmd``) calls its model over HTTP. Each trial gets a
key of its own; one loopback server per event loop (started by the first trial that needs
it, closed when the last one ends) answers every trial's requests:

- ``POST /v1/chat/completions`` (OpenAI Chat Completions), ``POST /v1/responses`` (OpenAI
  Responses), ``POST /v1/messages`` (Anthropic Messages), each also with ``"stream": true``
  (server-sent events as the official SDKs parse them), and ``GET /v1/models`` (``inspect``);
- the trial is named by the ``/t/KEY/`` prefix of the base URL it was given, or else by its
  key as ``Authorization: Bearer KEY`` or ``x-api-key: KEY``: a request that names no
  running trial is a 401, so concurrent trials never reach each other's model.

A request is answered inside its trial's sample (a task of the trial's own task group):
inspect's bridge converters turn it into a generate on the eval's model (stub models
included), with the trial's transcript, limits and :class:`~inspect_ai.agent.AgentBridge`
state (messages, output, the generate filter), and errors are forwarded as inspect's
sandbox bridge forwards them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import anyio
from anyio.abc import TaskGroup
from inspect_ai.agent import AgentBridge, AgentState
from inspect_ai.model import GenerateFilter
from twice.tasks import cache_installed_versions

from .._inspect_compat import (
    anthropic_request,
    completions_request,
    forward_provider_errors,
    provider_error_key,
    responses_request,
)
from ._model_sse import stream_body

MODEL_NAME = "inspect"
"""The model name the endpoint lists; any name a request gives is answered by the eval's
model (as inspect's sandbox bridge does)."""

ROUTES = {
    ("POST", "/v1/chat/completions"): "completions",
    ("POST", "/v1/responses"): "responses",
    ("POST", "/v1/messages"): "anthropic",
    ("GET", "/v1/models"): "models",
}
"""What the endpoint serves (method, path) and the dialect of each."""

ROUTES_TEXT = ", ".join(f"{method} {path}" for method, path in ROUTES)

KEY_PREFIX = "twice-trial-"
"""How a trial's key starts: it names the trial, it is no credential."""

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
"""A request's head and body at most (an agent's whole conversation is in each body)."""

_CONVERTERS: dict[str, Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]] = {
    "completions": completions_request,
    "responses": responses_request,
    "anthropic": anthropic_request,
}


@dataclass(frozen=True)
class ModelAccess:
    """How an agent command reaches the eval's model for one trial.

    Attributes:
        key: The trial's key (``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``).
        openai_base_url: ``http://127.0.0.1:PORT/t/KEY/v1`` (``OPENAI_BASE_URL``).
        anthropic_base_url: ``http://127.0.0.1:PORT/t/KEY`` (``ANTHROPIC_BASE_URL``: the
            Anthropic SDKs add ``/v1/messages``).
    """

    key: str
    openai_base_url: str
    anthropic_base_url: str


class _Reply:
    """An HTTP reply: status, content type and body."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.status = status
        self.body = body
        self.content_type = content_type


def _json_reply(status: int, data: Any) -> _Reply:
    return _Reply(status, json.dumps(data).encode())


def _error_reply(status: int, dialect: str, message: str, kind: str) -> _Reply:
    """An error in the shape the dialect's SDKs read (their exception carries ``message``)."""
    if dialect == "anthropic":
        return _json_reply(status, {"type": "error", "error": {"type": kind, "message": message}})
    return _json_reply(status, {"error": {"message": message, "type": kind, "code": None}})


_STATUS_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def _provider_error_reply(dialect: str, payload: dict[str, Any]) -> _Reply:
    """The reply to a generate that failed: the provider's status (500 when it had none: a
    failure of the conversion itself) and its message, or its own OpenAI error body."""
    status = payload.get("status")
    if not isinstance(status, int) or not 400 <= status <= 599:
        status = 500
    body = payload.get("body")
    if dialect != "anthropic" and isinstance(body, dict) and "message" in body:
        return _json_reply(status, {"error": body})
    kind = _STATUS_KINDS.get(status, "api_error")
    return _error_reply(status, dialect, str(payload.get("message") or "model error"), kind)


def _stream_reply(dialect: str, result: dict[str, Any], request: dict[str, Any]) -> _Reply:
    """The answer as server-sent events, in one body with its length (it is whole)."""
    return _Reply(200, stream_body(dialect, result, request), "text/event-stream")


# --- one trial's side: answered inside its sample ----------------------------------------


@dataclass
class _Trial:
    """A trial's model: its bridge, its answers' task group, and what ended it."""

    bridge: AgentBridge
    key: str
    tg: TaskGroup
    failure: BaseException | None = None
    pending: set[asyncio.Future[_Reply]] = field(default_factory=set)
    queue: asyncio.Queue[tuple[str, dict[str, Any], asyncio.Future[_Reply]]] = field(
        default_factory=asyncio.Queue
    )

    def fail(self, ex: BaseException) -> None:
        """End the trial's sample with ``ex`` (a limit, a termination, a refusal)."""
        if self.failure is None:
            self.failure = ex
        self.tg.cancel_scope.cancel()

    async def serve(self) -> None:
        """Start an answer for each request, as a task of the sample (its transcript,
        limits and model are the trial's own)."""
        while True:
            dialect, body, reply = await self.queue.get()
            self.tg.start_soon(self._answer, dialect, body, reply)

    async def _answer(
        self, dialect: str, body: dict[str, Any], reply: asyncio.Future[_Reply]
    ) -> None:
        generate = forward_provider_errors(
            lambda data, _: _CONVERTERS[dialect](data, self.bridge), self.fail
        )
        try:
            result = await generate(body, None)
        except asyncio.CancelledError:
            raise
        except BaseException as ex:  # a limit or a termination: it ends the sample
            _settle(reply, _error_reply(500, dialect, f"the trial ended: {ex}", "api_error"))
            self.fail(ex)
            return
        error = result.get(provider_error_key())
        if isinstance(error, dict):
            _settle(reply, _provider_error_reply(dialect, error))
        elif body.get("stream") is True:
            _settle(reply, _stream_reply(dialect, result, body))
        else:
            _settle(reply, _json_reply(200, result))

    def close(self) -> None:
        for reply in self.pending:
            _settle(reply, _error_reply(503, "openai", "the trial has ended", "api_error"))


def _settle(reply: asyncio.Future[_Reply], answer: _Reply) -> None:
    if not reply.done():
        reply.set_result(answer)


# --- the server: one per event loop --------------------------------------------------------


class _BadRequest(Exception):
    """A request that cannot be read: answered 400 (or 413), then the connection closes."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


class _Endpoint:
    """The loopback server of one event loop and the trials it answers."""

    def __init__(self) -> None:
        self.trials: dict[str, _Trial] = {}
        self.users = 0
        self.port = 0
        self.server: asyncio.Server | None = None
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        # Accepted connections run in the context the server started in: an empty one,
        # never a trial's (each request is answered in its own trial's sample instead).
        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._connection, "127.0.0.1", 0)

        loop = asyncio.get_running_loop()
        try:
            self.server = await loop.create_task(listen(), context=contextvars.Context())
            self.port = int(self.server.sockets[0].getsockname()[1])
            self.started.set_result(None)
        except BaseException as ex:
            self.started.set_exception(ex)
            raise

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        # Closed, not cancelled: a connection's reader then ends as at the client's close
        # (asyncio logs a cancelled connection task as an error).
        for writer in self.connections:
            writer.transport.abort()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            while True:
                try:
                    request = await _read_request(reader, writer)
                except _BadRequest as ex:
                    reply = _error_reply(ex.status, "openai", str(ex), "invalid_request_error")
                    writer.write(_reply_bytes(reply, keep_alive=False))
                    await writer.drain()
                    return
                if request is None:
                    return
                reply = await self._answer(request)
                writer.write(_reply_bytes(reply, keep_alive=request.keep_alive))
                await writer.drain()
                if not request.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _answer(self, request: _Request) -> _Reply:
        path, key = request.path.split("?", 1)[0], None
        if path.startswith("/t/"):
            key, _, rest = path[3:].partition("/")
            path = "/" + rest
        dialect = ROUTES.get((request.method, path))
        if dialect is None:
            shown = path if len(path) <= 200 else path[:200] + "…"
            message = f"no route {request.method} {shown}: this endpoint serves {ROUTES_TEXT}"
            return _error_reply(404, "openai", message, "not_found_error")
        trial = self.trials.get(key or _request_key(request.headers) or "")
        if trial is None:
            message = (
                "unknown key: this endpoint answers a running trial's agent command, named by "
                "the /t/KEY/ prefix of the OPENAI_BASE_URL or ANTHROPIC_BASE_URL it was given, "
                "or by its OPENAI_API_KEY or ANTHROPIC_API_KEY (Authorization: Bearer KEY, "
                "x-api-key: KEY)"
            )
            return _error_reply(401, dialect, message, "authentication_error")
        if dialect == "models":
            model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "twice"}
            return _json_reply(200, {"object": "list", "data": [model]})
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None
        if not isinstance(body, dict) or "model" not in body:
            message = f"the body of {request.method} {path} must be a JSON object with a model"
            return _error_reply(400, dialect, message, "invalid_request_error")
        if dialect == "completions":
            # As inspect's sandbox proxy does: an agent that streams parallel tool calls
            # may join their arguments, so a Chat Completions request asks for one at a time.
            body["parallel_tool_calls"] = False
        reply: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
        trial.pending.add(reply)
        try:
            trial.queue.put_nowait((dialect, body, reply))
            return await reply
        finally:
            trial.pending.discard(reply)


def _request_key(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key") or headers.get("api-key")


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> _Request | None:
    """The next request on the connection, or None when the client closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as ex:
        if ex.partial.strip():
            raise _BadRequest("the request head ended early") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest(f"request head over {MAX_HEAD_BYTES} bytes", 431) from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(f"not an HTTP/1.x request line: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise _BadRequest(f"not a header line: {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":  # curl's way with a long body
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise _BadRequest("Content-Length is not a number") from None
        if length > MAX_BODY_BYTES:
            raise _BadRequest(f"body over {MAX_BODY_BYTES} bytes", 413)
        body = await reader.readexactly(length) if length > 0 else b""
    return _Request(parts[0].upper(), parts[1], headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(line, 16)
        except ValueError:
            raise _BadRequest("a chunk size is not hexadecimal") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return bytes(body)
        if len(body) + size > MAX_BODY_BYTES:
            raise _BadRequest(f"body over {MAX_BODY_BYTES} bytes", 413)
        body += await reader.readexactly(size)
        await reader.readexactly(2)


def _reply_bytes(reply: _Reply, keep_alive: bool) -> bytes:
    head = (
        f"HTTP/1.1 {reply.status} {_reason(reply.status)}\r\n"
        f"Content-Type: {reply.content_type}\r\n"
        f"Content-Length: {len(reply.body)}\r\n"
        "Cache-Control: no-cache\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + reply.body


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


_endpoints: dict[asyncio.AbstractEventLoop, _Endpoint] = {}
"""The server of each running event loop (inspect runs each eval in a loop of its own)."""


async def _enter_endpoint() -> _Endpoint:
    loop = asyncio.get_running_loop()
    endpoint = _endpoints.get(loop)
    if endpoint is None:  # the first trial starts it; the others wait for that start
        endpoint = _endpoints[loop] = _Endpoint()
        started: Awaitable[object] = endpoint.start()
    else:
        started = asyncio.shield(endpoint.started)
    endpoint.users += 1
    try:
        await started
    except BaseException:
        _leave_endpoint(endpoint)
        raise
    return endpoint


def _leave_endpoint(endpoint: _Endpoint) -> None:
    endpoint.users -= 1
    if endpoint.users == 0:
        endpoint.close()
        loop = asyncio.get_running_loop()
        if _endpoints.get(loop) is endpoint:
            del _endpoints[loop]


def _unwrap(ex: BaseException) -> BaseException:
    """The one exception inside task-group wrappers (anyio wraps even the body's)."""
    while isinstance(ex, BaseExceptionGroup) and len(ex.exceptions) == 1:
        ex = ex.exceptions[0]
    return ex


@contextlib.asynccontextmanager
async def model_endpoint(
    filter: GenerateFilter | None = None,
) -> AsyncIterator[tuple[ModelAccess, AgentBridge]]:
    """The eval's model over HTTP for one trial, while the block runs.

    Enter it in the trial's sample: each request is answered there. A limit the model's
    generate hits (the sample's message limit) or a termination cancels the block and is
    raised from it, ending the sample as it would in twice's own loop.

    The bridge is inspect's public :class:`~inspect_ai.agent.AgentBridge`, built as the
    sandbox bridge builds its own rather than by ``agent_bridge()``: that one lets the
    client pick any model by name, reach remote MCP servers and media, and patches this
    task's provider SDKs, which is right for an agent in this process and wrong for a
    command outside it (any name it sends gets the eval's model).

    Yields:
        How the command reaches the model (:class:`ModelAccess`), and the bridge whose
        ``state`` holds the conversation and output the model saw.
    """
    cache_installed_versions()  # the converters check openai's version on every request
    bridge = AgentBridge(AgentState(messages=[]), filter, allow_remote_mcp=False)
    key = KEY_PREFIX + secrets.token_hex(16)
    endpoint = await _enter_endpoint()
    trial: _Trial | None = None
    try:
        async with anyio.create_task_group() as tg:
            trial = _Trial(bridge, key, tg)
            endpoint.trials[key] = trial
            tg.start_soon(trial.serve)
            root = f"http://127.0.0.1:{endpoint.port}/t/{key}"
            try:
                yield ModelAccess(key, f"{root}/v1", root), bridge
            finally:
                tg.cancel_scope.cancel()
    except BaseException as ex:
        if trial is not None and trial.failure is not None:
            raise trial.failure from None  # what ended the block, its cancel included
        inner = _unwrap(ex)
        if inner is ex:
            raise
        raise inner from None
    finally:
        endpoint.trials.pop(key, None)
        if trial is not None:
            trial.close()
        _leave_endpoint(endpoint)
    if trial is not None and trial.failure is not None:
        raise trial.failure
