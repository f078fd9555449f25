"""The built-in framework agents' tools: plain async functions over the services' HTTP APIs.

Written the way a team writes tools for its own agent: an ``httpx`` call, ``raise_for_status``
and a short text result. Nothing here retries, sends an idempotency key or softens an error:
a timeout is raised as the ``httpx`` exception it is, so what the model (or the framework)
does about it is the agent's own behaviour. Names, arguments, docstrings and the texts about
what was found are the react agent's tools' own (``tasks/_interfaces.py``), so the stub
models' plans drive both and a model is offered the same tools by every agent. Each
framework wraps these functions in its own tool decorator (see ``_builtin``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import httpx

from .. import _interfaces as api
from .._interfaces import (
    describe_customer,
    describe_email,
    describe_order,
    describe_refund,
    describe_ticket,
    implements,
)

ApiTool = Callable[..., Awaitable[str]]
HttpClient = httpx.AsyncClient | Callable[[], httpx.AsyncClient]
"""The client a set of tools sends with: the client itself, or a function that returns the
client to use at each call (tools made once and shared by many trials, each trial sending
with its own client)."""
ToolFactory = Callable[[HttpClient, Mapping[str, str]], list[ApiTool]]


def _client(client: HttpClient) -> httpx.AsyncClient:
    return client if isinstance(client, httpx.AsyncClient) else client()


async def _get(client: HttpClient, url: str, params: dict[str, Any] | None = None) -> Any:
    response = await _client(client).get(url, params=params)
    response.raise_for_status()
    return response.json()


async def _post(client: HttpClient, url: str, payload: dict[str, Any]) -> Any:
    response = await _client(client).post(url, json=payload)
    response.raise_for_status()
    return response.json()


def refund_tools(client: HttpClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """Tools of the refund task: ``issue_refund``, ``find_refunds``, ``get_order``."""
    base = urls["payments"]

    @implements(api.issue_refund)
    async def issue_refund(order_id: str, amount: float, reason: str = "") -> str:
        payload = {"order_id": order_id, "amount": round(amount * 100), "reason": reason}
        refund = await _post(client, f"{base}/v1/refunds", payload)
        return f"Created {describe_refund(refund)}."

    @implements(api.find_refunds)
    async def find_refunds(order_id: str) -> str:
        found = await _get(client, f"{base}/v1/refunds", {"order_id": order_id})
        if not found["data"]:
            return f"No refunds found for order {order_id}."
        return f"{len(found['data'])} refund(s) on order {order_id}: " + "; ".join(
            describe_refund(r) for r in found["data"]
        )

    @implements(api.get_order)
    async def get_order(order_id: str) -> str:
        return describe_order(await _get(client, f"{base}/v1/orders/{order_id}"))

    return [issue_refund, find_refunds, get_order]


def send_email_tools(client: HttpClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """Tools of the send_email task: ``send_email``, ``find_sent_emails``."""
    base = urls["email"]

    @implements(api.send_email)
    async def send_email(to: str, subject: str, body: str) -> str:
        sent = await _post(
            client, f"{base}/v1/messages", {"to": to, "subject": subject, "body": body}
        )
        return f"Sent {describe_email(sent)}."

    @implements(api.find_sent_emails)
    async def find_sent_emails(to: str, subject: str = "") -> str:
        params = {"to": to, "subject": subject} if subject else {"to": to}
        found = await _get(client, f"{base}/v1/messages", params)
        if not found["data"]:
            return f"No sent emails to {to}."
        return f"{len(found['data'])} sent email(s) to {to}: " + "; ".join(
            describe_email(m) for m in found["data"]
        )

    return [send_email, find_sent_emails]


def create_ticket_tools(client: HttpClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """Tools of the create_ticket task: ``create_ticket``, ``find_tickets``, ``get_customer``."""
    base = urls["tickets"]

    @implements(api.create_ticket)
    async def create_ticket(
        customer_id: str,
        subject: str,
        description: str,
        priority: Literal["low", "normal", "high", "urgent"] = "normal",
    ) -> str:
        payload = {
            "customer_id": customer_id,
            "subject": subject,
            "description": description,
            "priority": priority,
        }
        ticket = await _post(client, f"{base}/v1/tickets", payload)
        return f"Opened {describe_ticket(ticket)}."

    @implements(api.find_tickets)
    async def find_tickets(customer_id: str, subject: str = "") -> str:
        params = {"customer_id": customer_id, **({"subject": subject} if subject else {})}
        found = await _get(client, f"{base}/v1/tickets", params)
        if not found["data"]:
            return f"No tickets for {customer_id}."
        return f"{len(found['data'])} ticket(s) for {customer_id}: " + "; ".join(
            describe_ticket(t) for t in found["data"]
        )

    @implements(api.get_customer)
    async def get_customer(customer_id: str) -> str:
        return describe_customer(await _get(client, f"{base}/v1/customers/{customer_id}"))

    return [create_ticket, find_tickets, get_customer]


API_TOOLS: dict[str, ToolFactory] = {
    "refund": refund_tools,
    "send_email": send_email_tools,
    "create_ticket": create_ticket_tools,
}
"""The tasks the built-in framework agents can run, with their tools."""


def api_tools(task: str, client: HttpClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """The built-in agents' tools for ``task``.

    Args:
        task: The task name (a key of :data:`API_TOOLS`).
        client: The ``httpx`` client the tools send with, or a function returning the client
            to use at each call (for tools made once and used by many trials).
        urls: Base URL of each service of the task, by service name.

    Raises:
        KeyError: for a task without framework tools (checked earlier, with a clear message).
    """
    return API_TOOLS[task](client, urls)
