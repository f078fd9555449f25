"""What the tools of the tasks the framework agents also run show a model, written once.

The refund, send_email and create_ticket tasks each have two implementations of their tools:
twice's own (through the tool layer, ``tasks/<task>/``) and the built-in framework agents'
(plain ``httpx``, ``tasks/agents/_apis.py``). A model must be offered the same tools by both,
or a comparison across agents compares tool descriptions. So each tool's name, signature and
docstring live here, as an interface stub, and both implementations take them with
:func:`implements`; the texts the tools return about what they found use the ``describe_*``
helpers here, and every task formats money with :func:`dollars`. This module imports nothing
of twice (both sides import it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def shape_key(fn: Callable[..., Any]) -> tuple[object, ...]:
    """What a function's name, signature and docstring depend on: the same key, the same ones.

    Tools are closures made afresh for every trial; what is worked out from their signature
    (a check, a schema) is worked out once per key instead.
    """
    return (
        fn.__code__,
        fn.__name__,
        fn.__doc__,
        repr(fn.__defaults__),
        repr(fn.__kwdefaults__),
        repr(fn.__annotations__),
    )


_MATCHED: set[tuple[object, ...]] = set()
"""(interface, shape_key(fn)) of every function already checked against its interface."""


def implements(interface: Callable[..., Any]) -> Callable[[F], F]:
    """Give a tool function its interface's docstring, after checking it has its signature.

    Raises:
        TypeError: when the function's name or signature differs from the interface's.
    """

    def take(fn: F) -> F:
        # Runs for every tool of every trial; two signatures cost a tenth of a trial's setup.
        key = (interface, shape_key(fn))
        if key not in _MATCHED:
            want, got = inspect.signature(interface), inspect.signature(fn)
            if fn.__name__ != interface.__name__ or got != want:
                raise TypeError(
                    f"tool {fn.__name__}{got} does not match its interface "
                    f"{interface.__name__}{want} ({interface.__module__})"
                )
            _MATCHED.add(key)
        fn.__doc__ = interface.__doc__
        return fn

    return take


# -- refund -----------------------------------------------------------------------------------


def dollars(cents: int) -> str:
    """``499`` → ``"$4.99"``."""
    return f"${cents / 100:.2f}"


def describe_refund(refund: dict[str, Any]) -> str:
    """A refund as the refund task's tools describe it."""
    return (
        f"refund {refund['id']} of {dollars(refund['amount'])} on order {refund['order_id']} "
        f"(status {refund['status']})"
    )


def describe_order(order: dict[str, Any]) -> str:
    """An order as ``get_order`` describes it."""
    items = ", ".join(f"{i['name']} {dollars(i['amount'])}" for i in order.get("items", []))
    return (
        f"Order {order['order_id']} for {order['customer']}: paid {dollars(order['amount'])}, "
        f"refunded so far {dollars(order['amount_refunded'])}. Items: {items}."
    )


async def issue_refund(order_id: str, amount: float, reason: str = "") -> str:
    """Refund money to the customer for an order. This moves real money.

    Args:
        order_id: The order to refund, e.g. "order_1042".
        amount: Amount to refund in US dollars, e.g. 4.99.
        reason: Short reason for the refund, shown to the customer.
    """
    raise NotImplementedError


async def find_refunds(order_id: str) -> str:
    """List the refunds already made on an order. Read-only and safe to call any time.

    Args:
        order_id: The order to look up, e.g. "order_1042".
    """
    raise NotImplementedError


async def get_order(order_id: str) -> str:
    """Look up an order: customer, amount paid, items, and how much was refunded so far.

    Args:
        order_id: The order to look up, e.g. "order_1042".
    """
    raise NotImplementedError


# -- send_email -------------------------------------------------------------------------------


def describe_email(message: dict[str, Any]) -> str:
    """A sent email as the send_email task's tools describe it."""
    return f"email {message['id']} to {message['to']} with subject {message['subject']!r}"


async def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a customer. This really sends it: an email cannot be unsent.

    Args:
        to: The recipient's email address, e.g. "dana.ortiz@example.com".
        subject: The subject line.
        body: The plain-text message body.
    """
    raise NotImplementedError


async def find_sent_emails(to: str, subject: str = "") -> str:
    """Search the sent folder. Read-only and safe to call any time.

    Args:
        to: The recipient's email address.
        subject: Optional text the subject contains (case-insensitive).
    """
    raise NotImplementedError


# -- create_ticket ----------------------------------------------------------------------------


def describe_ticket(ticket: dict[str, Any]) -> str:
    """A ticket as the create_ticket task's tools describe it."""
    return (
        f"ticket {ticket['id']} for {ticket['customer_id']}: {ticket['subject']!r} "
        f"({ticket['status']}, {ticket['priority']} priority)"
    )


def describe_customer(customer: dict[str, Any]) -> str:
    """A customer as ``get_customer`` describes them."""
    open_tickets = ", ".join(customer["open_tickets"]) or "none"
    return (
        f"Customer {customer['customer_id']}: {customer['name']} <{customer.get('email', '')}>, "
        f"plan {customer.get('plan', 'unknown')}. Open tickets: {open_tickets}."
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
    raise NotImplementedError


async def find_tickets(customer_id: str, subject: str = "") -> str:
    """List a customer's tickets. Read-only and safe to call any time.

    Args:
        customer_id: The customer, e.g. "cus_1042".
        subject: Optional text the subject contains (case-insensitive).
    """
    raise NotImplementedError


async def get_customer(customer_id: str) -> str:
    """Look up a customer: name, email, plan and open tickets.

    Args:
        customer_id: The customer, e.g. "cus_1042".
    """
    raise NotImplementedError
