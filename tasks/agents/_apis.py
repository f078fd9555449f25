"""The built-in framework agents' tools: plain async functions over the services' HTTP APIs.

Written the way a team writes tools for its own agent: an ``httpx`` call, ``raise_for_status``
and a short text result. Nothing here retries, sends an idempotency key or softens an error:
a timeout is raised as the ``httpx`` exception it is, so what the model (or the framework)
does about it is the agent's own behaviour. Names, arguments and docstrings match the react
agent's tools, so the stub models' plans drive both. Each framework wraps these functions in
its own tool decorator (see ``_builtin``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import httpx

ApiTool = Callable[..., Awaitable[str]]
ToolFactory = Callable[[httpx.AsyncClient, Mapping[str, str]], list[ApiTool]]


def _dollars(cents: int) -> str:
    return f"${cents / 100:.2f}"


async def _get(client: httpx.AsyncClient, url: str, params: dict[str, Any] | None = None) -> Any:
    response = await client.get(url, params=params)
    response.raise_for_status()
    return response.json()


async def _post(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> Any:
    response = await client.post(url, json=payload)
    response.raise_for_status()
    return response.json()


def refund_tools(client: httpx.AsyncClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """Tools of the refund task: ``issue_refund``, ``find_refunds``, ``get_order``."""
    base = urls["payments"]

    def describe(r: dict[str, Any]) -> str:
        return (
            f"refund {r['id']} of {_dollars(r['amount'])} on order {r['order_id']} "
            f"(status {r['status']})"
        )

    async def issue_refund(order_id: str, amount: float, reason: str = "") -> str:
        """Refund money to the customer for an order. This moves real money.

        Args:
            order_id: The order to refund, e.g. "order_1042".
            amount: Amount to refund in US dollars, e.g. 4.99.
            reason: Short reason for the refund, shown to the customer.
        """
        payload = {"order_id": order_id, "amount": round(amount * 100), "reason": reason}
        refund = await _post(client, f"{base}/v1/refunds", payload)
        return f"Created {describe(refund)}."

    async def find_refunds(order_id: str) -> str:
        """List the refunds already made on an order. Read-only and safe to call any time.

        Args:
            order_id: The order to look up, e.g. "order_1042".
        """
        found = await _get(client, f"{base}/v1/refunds", {"order_id": order_id})
        if not found["data"]:
            return f"No refunds found for order {order_id}."
        return f"{len(found['data'])} refund(s) on order {order_id}: " + "; ".join(
            describe(r) for r in found["data"]
        )

    async def get_order(order_id: str) -> str:
        """Look up an order: customer, amount paid, items, and how much was refunded so far.

        Args:
            order_id: The order to look up, e.g. "order_1042".
        """
        o = await _get(client, f"{base}/v1/orders/{order_id}")
        items = ", ".join(f"{i['name']} {_dollars(i['amount'])}" for i in o.get("items", []))
        return (
            f"Order {o['order_id']} for {o['customer']}: paid {_dollars(o['amount'])}, "
            f"refunded so far {_dollars(o['amount_refunded'])}. Items: {items}."
        )

    return [issue_refund, find_refunds, get_order]


def send_email_tools(client: httpx.AsyncClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """Tools of the send_email task: ``send_email``, ``find_sent_emails``."""
    base = urls["email"]

    def describe(m: dict[str, Any]) -> str:
        return f"email {m['id']} to {m['to']} with subject {m['subject']!r}"

    async def send_email(to: str, subject: str, body: str) -> str:
        """Send an email to a customer. This really sends it: an email cannot be unsent.

        Args:
            to: The recipient's email address, e.g. "dana.ortiz@example.com".
            subject: The subject line.
            body: The plain-text message body.
        """
        sent = await _post(
            client, f"{base}/v1/messages", {"to": to, "subject": subject, "body": body}
        )
        return f"Sent {describe(sent)}."

    async def find_sent_emails(to: str, subject: str = "") -> str:
        """Search the sent folder. Read-only and safe to call any time.

        Args:
            to: The recipient's email address.
            subject: Optional text the subject contains (case-insensitive).
        """
        params = {"to": to, "subject": subject} if subject else {"to": to}
        found = await _get(client, f"{base}/v1/messages", params)
        if not found["data"]:
            return f"No sent emails to {to}."
        return f"{len(found['data'])} sent email(s) to {to}: " + "; ".join(
            describe(m) for m in found["data"]
        )

    return [send_email, find_sent_emails]


def create_ticket_tools(client: httpx.AsyncClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """Tools of the create_ticket task: ``create_ticket``, ``find_tickets``, ``get_customer``."""
    base = urls["tickets"]

    def describe(t: dict[str, Any]) -> str:
        return (
            f"ticket {t['id']} for {t['customer_id']}: {t['subject']!r} "
            f"({t['status']}, {t['priority']} priority)"
        )

    async def create_ticket(
        customer_id: str,
        subject: str,
        description: str,
        priority: Literal["low", "normal", "high", "urgent"] = "normal",
    ) -> str:
        """Open a new support ticket for a customer. Each call opens a new ticket.

        Args:
            customer_id: The customer, e.g. "cus_1042".
            subject: One-line summary of the problem.
            description: What happened, in a few sentences.
            priority: How urgent the problem is.
        """
        payload = {
            "customer_id": customer_id,
            "subject": subject,
            "description": description,
            "priority": priority,
        }
        ticket = await _post(client, f"{base}/v1/tickets", payload)
        return f"Opened {describe(ticket)}."

    async def find_tickets(customer_id: str, subject: str = "") -> str:
        """List a customer's tickets. Read-only and safe to call any time.

        Args:
            customer_id: The customer, e.g. "cus_1042".
            subject: Optional text the subject contains (case-insensitive).
        """
        params = {"customer_id": customer_id, **({"subject": subject} if subject else {})}
        found = await _get(client, f"{base}/v1/tickets", params)
        if not found["data"]:
            return f"No tickets for {customer_id}."
        return f"{len(found['data'])} ticket(s) for {customer_id}: " + "; ".join(
            describe(t) for t in found["data"]
        )

    async def get_customer(customer_id: str) -> str:
        """Look up a customer: name, email, plan and open tickets.

        Args:
            customer_id: The customer, e.g. "cus_1042".
        """
        c = await _get(client, f"{base}/v1/customers/{customer_id}")
        open_tickets = ", ".join(c["open_tickets"]) or "none"
        return (
            f"Customer {c['customer_id']}: {c['name']} <{c.get('email', '')}>, "
            f"plan {c.get('plan', 'unknown')}. Open tickets: {open_tickets}."
        )

    return [create_ticket, find_tickets, get_customer]


API_TOOLS: dict[str, ToolFactory] = {
    "refund": refund_tools,
    "send_email": send_email_tools,
    "create_ticket": create_ticket_tools,
}
"""The tasks the built-in framework agents can run, with their tools."""


def api_tools(task: str, client: httpx.AsyncClient, urls: Mapping[str, str]) -> list[ApiTool]:
    """The built-in agents' tools for ``task``.

    Raises:
        KeyError: for a task without framework tools (checked earlier, with a clear message).
    """
    return API_TOOLS[task](client, urls)
