"""What a mock service reads from the wire and writes back: twice's request headers, error
bodies in the Stripe shape, a request's parameters, and the refusals of the idempotency-key
rules."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx

from ._idempotency import MAX_KEY_LENGTH

SOURCE_HEADER = "X-Twice-Source"
"""Request header naming the retry source of an attempt (see :data:`RETRY_SOURCES`)."""
CALL_HEADER = "X-Twice-Call"
"""Request header carrying the tool layer's call number."""
BACKOFF_HEADER = "X-Twice-Backoff"
"""Request header carrying the virtual seconds the client waited before this attempt."""
KEY_HEADER = "Idempotency-Key"
FORM_TYPE = "application/x-www-form-urlencoded"
"""The content type of a form body (what Stripe's SDKs send)."""
REPLAYED_HEADER = "Idempotent-Replayed"
"""Response header set to ``true`` on a response replayed from the idempotency store (Stripe's
name): the client can tell "this call made it" from "an earlier request with this key did"."""


def error_response(
    status: int, message: str, type: str = "invalid_request_error"
) -> httpx.Response:
    """A JSON error body in the Stripe shape: ``{"error": {"type", "message"}}``."""
    return httpx.Response(status, json={"error": {"type": type, "message": message}})


_JSON_TYPES = {dict: "an object", list: "an array", float: "a number", bool: "a boolean"}


def not_found(kind: str, param: str, value: Any) -> httpx.Response:
    """The answer to a body parameter that names nothing: 404 ``No such <kind>: 'x'`` for an
    id that names nothing, 400 naming ``param`` for a missing value or one that is no id at
    all (a JSON array or object: "No such product: ['a']" read like a lookup that failed)."""
    if value is None or value == "":
        return error_response(400, f"Missing required param: {param}")
    if not isinstance(value, str | int) or isinstance(value, bool):
        what = _JSON_TYPES.get(type(value), type(value).__name__)
        return error_response(400, f"Invalid {param}: must be a string id, got {what}")
    return error_response(404, f"No such {kind}: {str(value)!r}")


def request_params(
    request: httpx.Request, path_params: dict[str, str]
) -> tuple[dict[str, Any], str | None]:
    """The request's parameters (query, then form or JSON body, then path), and why its body
    could not be read as parameters (None when it could, or is empty): a handler given none
    would answer as if a field were missing ("No such order: None")."""
    params: dict[str, Any] = dict(request.url.params)
    problem = None
    if request.content and request.headers.get("content-type", "").startswith(FORM_TYPE):
        # Stripe's SDKs send form bodies; values stay strings, as on the wire.
        try:
            form = request.content.decode()
        except UnicodeDecodeError:  # raw bytes where percent-escapes belong
            form = ""
            problem = "the form body is not UTF-8 (encode its values with percent-escapes)"
        params.update(urllib.parse.parse_qsl(form, keep_blank_values=True))
    elif request.content:
        try:
            body = json.loads(request.content)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            body = None
            problem = (
                "the request body is neither JSON nor form data (application/x-www-form-urlencoded)"
            )
        else:
            if _may_hold_surrogates(request.content) and _has_lone_surrogate(body):
                # Committed, its reply (and every later list holding it) could not be encoded.
                body = None
                problem = "the request body holds a \\u escape of half a surrogate pair"
        if isinstance(body, dict):
            params.update(body)
        elif problem is None:
            problem = (
                f"the request body must be a JSON object of parameters, not {type(body).__name__}"
            )
    params.update(path_params)
    return params, problem


_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a surrogate code point: a cheap screen before the exact check."""


def _may_hold_surrogates(content: bytes) -> bool:
    """Whether a JSON body needs the exact check: it escapes a surrogate, or it is UTF-16 or
    UTF-32 (which json.loads reads too, and whose escapes the byte screen cannot see; their
    ASCII characters carry NUL bytes, which UTF-8 JSON never does)."""
    return b"\x00" in content or _LONE_SURROGATE.search(content) is not None


def _has_lone_surrogate(body: Any) -> bool:
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def key_rejection(
    kind: str, key: str, error: Callable[..., httpx.Response] = error_response
) -> httpx.Response:
    """The response to a keyed request that must not run (Stripe v1 / IETF rules), made by
    ``error`` (``error(status, message, type=...)``: the service's own error shape)."""
    if kind == "too_long":
        return error(
            400, f"Idempotency-Key is {len(key)} characters; at most {MAX_KEY_LENGTH} allowed"
        )
    if kind == "malformed":
        what = "empty" if not key else f"{key!r}, not printable ASCII"
        return error(400, f"Idempotency-Key is {what}; give a unique key per operation")
    if kind == "conflict":
        return error(
            422,
            "Keys for idempotent requests can only be used with the same parameters they were "
            f"first used with. Key {key!r} was used with different parameters.",
            type="idempotency_error",
        )
    # In flight: not saved, so a retry with the same key gets the first request's response.
    return error(
        409,
        f"A request with key {key!r} is already in progress; it has not finished yet. "
        "Do not repeat it: retry with the same key shortly.",
        type="idempotency_error",
    )


HANDLER_FAILED = {
    "error": {"type": "api_error", "message": "The service failed while handling the request"}
}
