"""Raw ASGI: read a bounded body, send a reply, or close the connection with none.

A lost reply needs a server that can close a connection *without answering* (ASGI servers
answer 500 when an application ends without a response). uvicorn's HTTP protocol exposes its
asyncio transport on the ``send`` callable it hands the application; :func:`drop_connection`
closes that transport, so the client sees the connection end with no response at all, as
when a gateway dies after the upstream committed. The server is pinned to uvicorn's ``h11``
protocol, where that holds.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ._errors import ControlError

MAX_CONTROL_BODY = 64 * 1024
"""Bytes a control request body may have."""
MAX_SERVICE_BODY = 1024 * 1024
"""Bytes a service (or MCP) request body may have."""


def drop_connection(send: Any) -> bool:
    """Close the client's connection without a response; False if the server cannot."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        return False
    transport.close()
    return True


async def drop_reply(send: Any) -> None:
    """Close the connection with no response (what a reset after the commit looks like)."""
    if not drop_connection(send):
        # Not uvicorn's protocol: the nearest honest thing is a gateway timeout.
        await send_json(send, 504, error_body("upstream timed out", type="api_error"))
        return
    # Let the protocol see the connection is gone, so it does not answer 500 for us.
    for _ in range(3):
        await asyncio.sleep(0)


async def client_gone(receive: Any) -> None:
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


def _content_length(scope: dict[str, Any]) -> int | None:
    raw = dict(scope["headers"]).get(b"content-length")
    return int(raw) if raw is not None and raw.isdigit() else None


async def body_within(scope: dict[str, Any], receive: Any, limit: int) -> bytes:
    """The request body.

    Raises:
        ControlError: 413 when it is over ``limit`` bytes (by its Content-Length or as read).
    """
    length = _content_length(scope)
    if length is not None and length > limit:
        raise ControlError(413, f"request body of {length} bytes; at most {limit} allowed")
    body = await _read_body(receive, limit)
    if body is None:
        raise ControlError(413, f"request body over {limit} bytes; at most {limit} allowed")
    return body


async def send_reply(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a whole response, with its own Content-Length."""
    hdrs = [(k, v) for k, v in headers or [] if k.lower() != b"content-length"]
    hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Any, status: int, data: Any) -> None:
    """Send ``data`` as a JSON response."""
    body = json.dumps(data).encode()
    await send_reply(send, status, body, [(b"content-type", b"application/json")])


def error_body(message: str, type: str = "invalid_request_error", field: str | None = None) -> Any:
    """An error reply's JSON body, in the shape the services use."""
    err: dict[str, Any] = {"type": type, "message": message}
    if field is not None:
        err["param"] = field
    return {"error": err}
