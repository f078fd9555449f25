"""An email API with a searchable sent folder and no idempotency keys.

Like many transactional mail APIs, it has no Idempotency-Key support: the header is ignored
entirely, so a repeated send is a second email whatever key the client sends. What it does
have is a sent folder that can be searched by recipient, subject and the client reference a
sender may attach to a message, so a client can look before it retries.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from .._service import Call, Route, Service
from .._wire import error_response


class EmailService(Service):
    """Send messages and search the sent folder.

    Args:
        sent: Messages already in the sent folder when the trial starts, each with ``id``,
            ``to``, ``subject`` and ``body`` (they are not effects of the trial).
        base_url: Where the API lives (default ``https://email.twice.test``).
    """

    name: ClassVar[str] = "email"
    default_base_url: ClassVar[str] = "https://email.twice.test"
    idempotency_keys: ClassVar[bool] = False

    def __init__(self, sent: list[dict[str, Any]] | None = None, base_url: str | None = None):
        super().__init__(base_url)
        self.sent: list[dict[str, Any]] = [
            {"object": "message", "status": "sent", "client_reference": None, **m}
            for m in sent or []
        ]

    def routes(self) -> list[Route]:
        return [
            Route("POST", r"/v1/messages", "email.message.send", self.send, mutating=True),
            Route("GET", r"/v1/messages", "email.message.list", self.search),
            Route("GET", r"/v1/messages/(?P<message_id>[^/?]+)", "email.message.get", self.get),
        ]

    def send(self, call: Call) -> httpx.Response:
        p = call.params
        missing = [
            f for f in ("to", "subject", "body") if not isinstance(p.get(f), str) or not p[f]
        ]
        if missing:
            return error_response(400, f"missing or empty field(s): {', '.join(missing)}")
        if "@" not in p["to"]:
            return error_response(400, f"'to' is not an email address: {p['to']!r}")
        fields = {
            "to": p["to"],
            "subject": p["subject"],
            "body": p["body"],
            "client_reference": p.get("client_reference"),
        }
        effect = call.commit("email.message.send", "msg", fields)
        message = {"id": effect.id, "object": "message", "status": "sent", **fields}
        self.sent.append(message)
        return httpx.Response(200, json=message)

    def search(self, call: Call) -> httpx.Response:
        """Filters: ``to`` (exact, case-insensitive), ``subject`` (case-insensitive substring),
        ``client_reference`` (exact)."""
        to = str(call.params.get("to") or "").lower()
        subject = str(call.params.get("subject") or "").lower()
        ref = call.params.get("client_reference")
        data = [
            m
            for m in self.sent
            if (not to or m["to"].lower() == to)
            and (not subject or subject in m["subject"].lower())
            and (ref is None or m.get("client_reference") == ref)
        ]
        return httpx.Response(200, json={"object": "list", "data": data})

    def get(self, call: Call) -> httpx.Response:
        for m in self.sent:
            if m["id"] == call.params["message_id"]:
                return httpx.Response(200, json=m)
        return error_response(404, f"No such message: {call.params['message_id']!r}")
