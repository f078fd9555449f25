"""A task of your own, outside twice: run it with `twice run --task courtesy.py:courtesy_refund`."""

from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.tool import Tool
from twice.mocks import PaymentsService, Service, services_from_state
from twice.tasks import TrialContext, load_dataset, make_tool, twice_task


def services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, PaymentsService)


def tools(ctx: TrialContext) -> list[Tool]:
    payments = ctx.api("payments")

    async def refund_order(order_id: str, cents: int) -> str:
        """Refund part of an order as a courtesy. This moves real money.

        Args:
            order_id: The order, e.g. "order_1042".
            cents: The amount in US cents, e.g. 500.
        """

        async def existing() -> dict[str, Any] | None:
            # For the `lookup` protection: the refund, if an earlier attempt made it.
            found = await payments.get("/v1/refunds", params={"order_id": order_id})
            return next((r for r in found["data"] if r["amount"] == cents), None)

        result = await payments.mutate(
            "payments.refund.create",
            "/v1/refunds",
            payload={"order_id": order_id, "amount": cents, "reason": "courtesy"},
            identity={"order_id": order_id},
            noun="refund",
            lookup=existing,
        )
        return result.say("Created", f"refund {result.body['id']}")

    async def list_refunds(order_id: str) -> str:
        """List the refunds already made on an order.

        Args:
            order_id: The order, e.g. "order_1042".
        """
        found = await payments.get("/v1/refunds", params={"order_id": order_id})
        return ", ".join(r["id"] for r in found["data"]) or "none"

    return [
        make_tool(ctx, refund_order, idempotency="keyed"),
        make_tool(ctx, list_refunds),
    ]


@task
def courtesy_refund(
    fault: str = "none", protection: str = "bare", prompt: str = "baseline"
) -> Task:
    """A courtesy refund through a payments API that may lose the reply."""
    return twice_task(
        name="courtesy_refund",
        dataset=load_dataset(Path(__file__).parent / "courtesy.jsonl", "courtesy_refund"),
        services=services,
        tools=tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
    )
