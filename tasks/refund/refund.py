"""Refund, end to end: an agent refunds an order through a payments API that may lose the reply.

The seeds' own scenario. ``issue_refund`` is the mutating tool (``keyed``: the payments API
honours Idempotency-Key); ``find_refunds`` and ``get_order`` are reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.tool import Tool, ToolError
from twice.mocks import PaymentsService, Service, services_from_state
from twice.tasks import _interfaces as api
from twice.tasks._dataset import load_dataset
from twice.tasks._interfaces import describe_order, describe_refund, implements
from twice.tasks._toolkit import TrialContext, make_tool
from twice.tasks._trial import twice_task

DATASET = Path(__file__).parent / "dataset.jsonl"


def _services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, PaymentsService)


def refund_tools(ctx: TrialContext) -> list[Tool]:
    """The refund task's tools, bound to one trial."""
    payments = ctx.api("payments")

    async def lookup(order_id: str, cents: int) -> dict[str, Any] | None:
        found = await payments.get("/v1/refunds", params={"order_id": order_id})
        for refund in found["data"]:
            if refund["amount"] == cents:
                return dict(refund)
        return None

    @implements(api.issue_refund)
    async def issue_refund(order_id: str, amount: float, reason: str = "") -> str:
        cents = round(amount * 100)
        if cents <= 0:
            why = "is less than one cent" if amount > 0 else "must be positive"
            raise ToolError(f"amount {why}, got {amount!r}. No refund was made.")
        result = await payments.mutate(
            "payments.refund.create",
            "/v1/refunds",
            payload={"order_id": order_id, "amount": cents, "reason": reason},
            identity={"order_id": order_id},
            noun="refund",
            lookup=lambda: lookup(order_id, cents),
        )
        return result.say("Created", describe_refund(result.body))

    @implements(api.find_refunds)
    async def find_refunds(order_id: str) -> str:
        found = await payments.get("/v1/refunds", params={"order_id": order_id})
        refunds = found["data"]
        if not refunds:
            return f"No refunds found for order {order_id}."
        return f"{len(refunds)} refund(s) on order {order_id}: " + "; ".join(
            describe_refund(r) for r in refunds
        )

    @implements(api.get_order)
    async def get_order(order_id: str) -> str:
        return describe_order(await payments.get(f"/v1/orders/{order_id}"))

    return [
        make_tool(ctx, issue_refund, idempotency="keyed", parallel=True),
        make_tool(ctx, find_refunds),
        make_tool(ctx, get_order),
    ]


@task
def refund(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    """Refund one order through a payments API that may lose the reply.

    Args:
        fault: What the payments API does wrong (``twice list`` shows the faults).
        protection: What the tool layer does about retries.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test (``react``: twice's own loop; ``twice list`` shows more).
        mocks: Production URL by service name, served by the trial's services (user agents).
    """
    return twice_task(
        name="refund",
        dataset=load_dataset(DATASET, "refund"),
        services=_services,
        tools=refund_tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        action_log=action_log,
        agent=agent,
        mocks=mocks,
    )
