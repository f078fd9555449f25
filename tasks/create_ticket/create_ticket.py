"""Open a support ticket through a helpdesk API that may lose the reply.

``create_ticket`` is the mutating tool. Its class is ``keyed``: opening a ticket is not
idempotent (a retry opens a second ticket for one complaint), and the helpdesk honours
Idempotency-Key on ticket creation, as Zendesk's ticketing API documents, so a key the tool
layer makes is what makes a retry safe. Tickets can also be searched by customer and subject
(``find_tickets``, the ``lookup`` protection), the look-before-retry fallback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from inspect_ai import Task, task
from inspect_ai.tool import Tool
from twice.mocks import Service, TicketsService, services_from_state
from twice.tasks import _interfaces as api
from twice.tasks._dataset import load_dataset
from twice.tasks._interfaces import describe_customer, describe_ticket, implements
from twice.tasks._toolkit import TrialContext, make_tool
from twice.tasks._trial import twice_task

DATASET = Path(__file__).parent / "dataset.jsonl"


def _services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, TicketsService)


def create_ticket_tools(ctx: TrialContext) -> list[Tool]:
    """The create_ticket task's tools, bound to one trial."""
    helpdesk = ctx.api("tickets")

    async def lookup(customer_id: str, subject: str) -> dict[str, Any] | None:
        found = await helpdesk.get(
            "/v1/tickets", params={"customer_id": customer_id, "subject": subject}
        )
        for ticket in found["data"]:
            if ticket["subject"] == subject:
                return dict(ticket)
        return None

    @implements(api.create_ticket)
    async def create_ticket(
        customer_id: str,
        subject: str,
        description: str,
        priority: Literal["low", "normal", "high", "urgent"] = "normal",
    ) -> str:
        result = await helpdesk.mutate(
            "tickets.ticket.create",
            "/v1/tickets",
            payload={
                "customer_id": customer_id,
                "subject": subject,
                "description": description,
                "priority": priority,
            },
            identity={"customer_id": customer_id, "subject": subject},
            noun="ticket",
            lookup=lambda: lookup(customer_id, subject),
        )
        return result.say("Opened", describe_ticket(result.body))

    @implements(api.find_tickets)
    async def find_tickets(customer_id: str, subject: str = "") -> str:
        params = {"customer_id": customer_id}
        if subject:
            params["subject"] = subject
        found = await helpdesk.get("/v1/tickets", params=params)
        tickets = found["data"]
        if not tickets:
            what = f" with subject containing {subject!r}" if subject else ""
            return f"No tickets for {customer_id}{what}."
        return f"{len(tickets)} ticket(s) for {customer_id}: " + "; ".join(
            describe_ticket(t) for t in tickets
        )

    @implements(api.get_customer)
    async def get_customer(customer_id: str) -> str:
        return describe_customer(await helpdesk.get(f"/v1/customers/{customer_id}"))

    return [
        make_tool(ctx, create_ticket, idempotency="keyed", parallel=True),
        make_tool(ctx, find_tickets),
        make_tool(ctx, get_customer),
    ]


@task
def create_ticket(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    """Open one support ticket for a complaint through a helpdesk API with key support.

    Args:
        fault: What the helpdesk API does wrong (``twice list`` shows the faults).
        protection: What the tool layer does about retries.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test (``react``: twice's own loop; ``twice list`` shows more).
        mocks: Production URL by service name, served by the trial's services (user agents).
    """
    return twice_task(
        name="create_ticket",
        dataset=load_dataset(DATASET, "create_ticket"),
        services=_services,
        tools=create_ticket_tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        action_log=action_log,
        agent=agent,
        mocks=mocks,
    )
