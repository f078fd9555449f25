"""The Python command agents' tools: plain async functions over a trial's services, with httpx.

The twin of ``services.mjs`` for agents that run in a venv of their own (a framework whose pins
cannot sit beside inspect-ai's), so it imports nothing of twice: the same tool names,
arguments, docstrings and result texts as twice's own tools (``tasks/_interfaces.py``) and the
built-in agents' (``tasks/agents/_apis.py``). Nothing here retries, sends an idempotency key or
softens an error: a timeout or a reply that is not 2xx is raised as the ``httpx`` exception it
is. What the model (or the framework) does about it is the agent's own behaviour.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx

ApiTool = Callable[..., Awaitable[str]]

# A lost reply is held open until the client gives up: a short read timeout keeps a trial
# cheap (docs/guides/any-language.md, "Keep the agent's own timeout short").
TIMEOUT = float(os.environ.get("TWICE_TOOL_TIMEOUT_MS", "2000")) / 1000


def dollars(cents: int) -> str:
    """``499`` → ``"$4.99"``."""
    return f"${cents / 100:.2f}"


def _refund(r: dict[str, Any]) -> str:
    return (
        f"refund {r['id']} of {dollars(r['amount'])} on order {r['order_id']} "
        f"(status {r['status']})"
    )


def _order(o: dict[str, Any]) -> str:
    items = ", ".join(f"{i['name']} {dollars(i['amount'])}" for i in o.get("items", []))
    return (
        f"Order {o['order_id']} for {o['customer']}: paid {dollars(o['amount'])}, "
        f"refunded so far {dollars(o['amount_refunded'])}. Items: {items}."
    )


def _email(m: dict[str, Any]) -> str:
    return f"email {m['id']} to {m['to']} with subject {m['subject']!r}"


def _ticket(t: dict[str, Any]) -> str:
    return (
        f"ticket {t['id']} for {t['customer_id']}: {t['subject']!r} "
        f"({t['status']}, {t['priority']} priority)"
    )


def _customer(c: dict[str, Any]) -> str:
    open_tickets = ", ".join(c["open_tickets"]) or "none"
    return (
        f"Customer {c['customer_id']}: {c['name']} <{c.get('email', '')}>, "
        f"plan {c.get('plan', 'unknown')}. Open tickets: {open_tickets}."
    )


def service_tools(client: httpx.AsyncClient, env: dict[str, str] | None = None) -> list[ApiTool]:
    """The tools of the trial's services (twice sets ``TWICE_<SERVICE>_URL`` for each).

    Raises:
        SystemExit: when the trial has no service these tools know.
    """
    env = dict(os.environ) if env is None else env
    tools: list[ApiTool] = []

    async def get(url: str, params: dict[str, str] | None = None) -> Any:
        response = await client.get(url, params=params)
        response.raise_for_status()
        return response.json()

    async def post(url: str, payload: dict[str, Any]) -> Any:
        response = await client.post(url, json=payload)
        response.raise_for_status()
        return response.json()

    if payments := env.get("TWICE_PAYMENTS_URL"):

        async def issue_refund(order_id: str, amount: float, reason: str = "") -> str:
            """Refund money to the customer for an order. This moves real money.

            Args:
                order_id: The order to refund, e.g. "order_1042".
                amount: Amount to refund in US dollars, e.g. 4.99.
                reason: Short reason for the refund, shown to the customer.
            """
            payload = {"order_id": order_id, "amount": round(amount * 100), "reason": reason}
            return f"Created {_refund(await post(f'{payments}/v1/refunds', payload))}."

        async def find_refunds(order_id: str) -> str:
            """List the refunds already made on an order. Read-only and safe to call any time.

            Args:
                order_id: The order to look up, e.g. "order_1042".
            """
            found = await get(f"{payments}/v1/refunds", {"order_id": order_id})
            if not found["data"]:
                return f"No refunds found for order {order_id}."
            listed = "; ".join(_refund(r) for r in found["data"])
            return f"{len(found['data'])} refund(s) on order {order_id}: {listed}"

        async def get_order(order_id: str) -> str:
            """Look up an order: customer, amount paid, items, and how much was refunded so far.

            Args:
                order_id: The order to look up, e.g. "order_1042".
            """
            return _order(await get(f"{payments}/v1/orders/{order_id}"))

        tools += [issue_refund, find_refunds, get_order]

    if email := env.get("TWICE_EMAIL_URL"):

        async def send_email(to: str, subject: str, body: str) -> str:
            """Send an email to a customer. This really sends it: an email cannot be unsent.

            Args:
                to: The recipient's email address, e.g. "dana.ortiz@example.com".
                subject: The subject line.
                body: The plain-text message body.
            """
            sent = await post(f"{email}/v1/messages", {"to": to, "subject": subject, "body": body})
            return f"Sent {_email(sent)}."

        async def find_sent_emails(to: str, subject: str = "") -> str:
            """Search the sent folder. Read-only and safe to call any time.

            Args:
                to: The recipient's email address.
                subject: Optional text the subject contains (case-insensitive).
            """
            params = {"to": to, "subject": subject} if subject else {"to": to}
            found = await get(f"{email}/v1/messages", params)
            if not found["data"]:
                return f"No sent emails to {to}."
            listed = "; ".join(_email(m) for m in found["data"])
            return f"{len(found['data'])} sent email(s) to {to}: {listed}"

        tools += [send_email, find_sent_emails]

    if tickets := env.get("TWICE_TICKETS_URL"):

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
            return f"Opened {_ticket(await post(f'{tickets}/v1/tickets', payload))}."

        async def find_tickets(customer_id: str, subject: str = "") -> str:
            """List a customer's tickets. Read-only and safe to call any time.

            Args:
                customer_id: The customer, e.g. "cus_1042".
                subject: Optional text the subject contains (case-insensitive).
            """
            params = {"customer_id": customer_id, **({"subject": subject} if subject else {})}
            found = await get(f"{tickets}/v1/tickets", params)
            if not found["data"]:
                return f"No tickets for {customer_id}."
            listed = "; ".join(_ticket(t) for t in found["data"])
            return f"{len(found['data'])} ticket(s) for {customer_id}: {listed}"

        async def get_customer(customer_id: str) -> str:
            """Look up a customer: name, email, plan and open tickets.

            Args:
                customer_id: The customer, e.g. "cus_1042".
            """
            return _customer(await get(f"{tickets}/v1/customers/{customer_id}"))

        tools += [create_ticket, find_tickets, get_customer]

    if not tools:
        raise SystemExit(
            "no service this agent has tools for: set one of TWICE_PAYMENTS_URL, "
            "TWICE_EMAIL_URL, TWICE_TICKETS_URL"
        )
    return tools


def client() -> httpx.AsyncClient:
    """The tools' HTTP client, with the short timeout."""
    return httpx.AsyncClient(timeout=TIMEOUT)


TRIAL = {
    "system": os.environ.get("TWICE_SYSTEM_PROMPT", ""),
    "input": os.environ.get("TWICE_INPUT", ""),
    "base_url": os.environ.get("OPENAI_BASE_URL", ""),
    "api_key": os.environ.get("OPENAI_API_KEY", ""),
    "model": os.environ.get("OPENAI_MODEL", "inspect"),
}
"""What the agent is given: the system prompt, the user's request and the model endpoint."""
