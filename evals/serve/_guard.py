"""The one check every request passes: a web page may not call a ``twice serve`` on the user's
behalf.

A web page the user visits can reach a loopback server too: by DNS rebinding (its own name
resolved to 127.0.0.1, so the browser sends ``Host: evil.example``) or by a cross-origin
"simple" request (a ``text/plain`` or form POST needs no preflight). Every request (control
API, services and MCP alike) passes one check, :func:`check_origin`: on a loopback bind the
``Host`` must name a loopback address (421 otherwise), and an ``Origin``, when a browser sends
one, must be a loopback origin or the server's own (403 otherwise). SDKs send no ``Origin``
and the ``Host`` of the URL they were given, so they pass. A control POST must say
``Content-Type: application/json`` (415, :func:`require_json`), which no cross-origin page can
send without a preflight the server never grants.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from ._errors import ControlError


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


def clip(text: str, limit: int = 100) -> str:
    """``text``, cut to ``limit`` characters for an error message."""
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
                f"Host {clip(host)!r} is not a name of this server: bound to loopback, it "
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
            f"Origin {clip(origin)!r} may not call this server: only pages served from "
            "loopback (http://127.0.0.1:PORT, http://localhost:PORT, http://[::1]:PORT)"
            + ("" if on_loopback else " or from this server itself")
            + " may; clients other than browsers send no Origin",
        )


def require_json(scope: dict[str, Any]) -> None:
    """A control POST says its body is JSON: a cross-origin page can send ``text/plain`` or a
    form without a preflight, never ``application/json``.

    Raises:
        ControlError: 415 for any other ``Content-Type``.
    """
    given = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
    media = given.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ControlError(
            415,
            f"Content-Type {clip(given)!r} is not accepted: the control API takes a JSON "
            "body with 'Content-Type: application/json'",
        )
