"""A helpdesk API in the shape of Zendesk's tickets: create, search by customer and subject.

Creating a ticket is not idempotent: a second POST for the same complaint opens a second
ticket (the seed's "three tickets for one complaint"). The API honours Idempotency-Key on
ticket creation, as Zendesk's ticketing API documents, so keyed protections apply; tickets can
also be searched by customer and subject, so a client can look before it retries.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from .._service import Call, Route, Service
from .._wire import error_response, not_found

PRIORITIES = ("low", "normal", "high", "urgent")


class TicketsService(Service):
    """Customers, and tickets to open, search and fetch.

    Args:
        customers: The customers this trial knows, each with ``customer_id`` and ``name``;
            other fields are returned as given.
        tickets: Tickets that exist before the trial starts (not effects of the trial), each
            with ``id``, ``customer_id``, ``subject`` and ``status``.
        base_url: Where the API lives (default ``https://tickets.twice.test``).
    """

    name: ClassVar[str] = "tickets"
    api_name: ClassVar[str | None] = "helpdesk API"
    default_base_url: ClassVar[str] = "https://tickets.twice.test"

    def __init__(
        self,
        customers: list[dict[str, Any]] | None = None,
        tickets: list[dict[str, Any]] | None = None,
        base_url: str | None = None,
    ):
        super().__init__(base_url)
        self.customers: dict[str, dict[str, Any]] = {
            c["customer_id"]: dict(c) for c in customers or []
        }
        self.tickets: list[dict[str, Any]] = [
            {"object": "ticket", "description": "", "priority": "normal", **t}
            for t in tickets or []
        ]

    def routes(self) -> list[Route]:
        return [
            Route(
                "GET",
                r"/v1/customers/(?P<customer_id>[^/?]+)",
                "tickets.customer.get",
                self.get_customer,
            ),
            Route("POST", r"/v1/tickets", "tickets.ticket.create", self.create, mutating=True),
            Route("GET", r"/v1/tickets", "tickets.ticket.list", self.search),
            Route("GET", r"/v1/tickets/(?P<ticket_id>[^/?]+)", "tickets.ticket.get", self.get),
        ]

    def get_customer(self, call: Call) -> httpx.Response:
        customer = self.customers.get(call.params["customer_id"])
        if customer is None:
            return error_response(404, f"No such customer: {call.params['customer_id']!r}")
        open_tickets = [
            t["id"]
            for t in self.tickets
            if t["customer_id"] == customer["customer_id"] and t["status"] == "open"
        ]
        return httpx.Response(200, json={**customer, "open_tickets": open_tickets})

    def create(self, call: Call) -> httpx.Response:
        p = call.params
        given = p.get("customer_id")
        customer_id = str(given)
        if not isinstance(given, str | int) or customer_id not in self.customers:
            return not_found("customer", "customer_id", given)
        subject = p.get("subject")
        if not isinstance(subject, str) or not subject.strip():
            return error_response(400, "subject must be a non-empty string")
        priority = p.get("priority", "normal")
        if priority not in PRIORITIES:
            return error_response(
                400, f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}"
            )
        fields = {
            "customer_id": customer_id,
            "subject": subject,
            "description": str(p.get("description", "")),
            "priority": priority,
        }
        effect = call.commit("tickets.ticket.create", "tkt", fields)
        ticket = {"id": effect.id, "object": "ticket", "status": "open", **fields}
        self.tickets.append(ticket)
        return httpx.Response(200, json=ticket)

    def search(self, call: Call) -> httpx.Response:
        """Filters: ``customer_id`` (exact), ``subject`` (case-insensitive substring)."""
        customer_id = call.params.get("customer_id")
        subject = str(call.params.get("subject") or "").lower()
        data = [
            t
            for t in self.tickets
            if (customer_id is None or t["customer_id"] == customer_id)
            and (not subject or subject in t["subject"].lower())
        ]
        return httpx.Response(200, json={"object": "list", "data": data})

    def get(self, call: Call) -> httpx.Response:
        for t in self.tickets:
            if t["id"] == call.params["ticket_id"]:
                return httpx.Response(200, json=t)
        return error_response(404, f"No such ticket: {call.params['ticket_id']!r}")
