"""Place an order through a shop's orders API that honours idempotency keys.

``place_order`` is the mutating tool. Its class is ``keyed``: a second order is shipped and
charged twice, and the orders API honours Idempotency-Key, so the keyed protections apply.
The intent is named by the customer and the SKU: some samples ask for two different products
in one request (two intents), so a key that names too little (the customer alone) merges the
two orders into one key, and a key that names too much (the free-text shipping address too)
splits one order's retries across keys. :func:`place_order_tools` takes the identity fields
so tests can show both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.tool import Tool, ToolError
from twice.mocks import OrdersService, Service, services_from_state
from twice.tasks._dataset import load_dataset
from twice.tasks._interfaces import dollars
from twice.tasks._toolkit import TrialContext, make_tool
from twice.tasks._trial import twice_task

DATASET = Path(__file__).parent / "dataset.jsonl"
IDENTITY_FIELDS: tuple[str, ...] = ("customer", "sku")
"""What names an order intent: who ordered which product (not quantity or address)."""


def _services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, OrdersService)


def _describe(order: dict[str, Any]) -> str:
    return (
        f"order {order['id']}: {order['quantity']} × {order['sku']} for {order['customer']}, "
        f"total {dollars(order['total'])}, ship to {order['shipping_address']!r} "
        f"({order['status']})"
    )


def place_order_tools(
    ctx: TrialContext, *, identity_fields: Sequence[str] = IDENTITY_FIELDS
) -> list[Tool]:
    """The place_order task's tools, bound to one trial.

    Args:
        ctx: The trial context.
        identity_fields: Which ``place_order`` arguments name the intent (and so the
            ``intent-key``); the default names the customer and the SKU.
    """
    shop = ctx.api("orders")

    async def lookup(customer: str, sku: str) -> dict[str, Any] | None:
        found = await shop.get("/v1/orders", params={"customer": customer, "sku": sku})
        return dict(found["data"][-1]) if found["data"] else None

    async def place_order(customer: str, sku: str, quantity: int, shipping_address: str) -> str:
        """Place an order for a customer. Each call places a new order, shipped and charged.

        Args:
            customer: The customer's full name, e.g. "Dana Ortiz".
            sku: The product's SKU, e.g. "SKU-MUG-01".
            quantity: How many units.
            shipping_address: Where to ship, as one line.
        """
        if quantity <= 0:
            raise ToolError(f"quantity must be positive, got {quantity!r}. No order was placed.")
        payload = {
            "customer": customer,
            "sku": sku,
            "quantity": quantity,
            "shipping_address": shipping_address,
        }
        result = await shop.mutate(
            "orders.order.create",
            "/v1/orders",
            payload=payload,
            identity={f: payload[f] for f in identity_fields},
            noun="order",
            lookup=lambda: lookup(customer, sku),
        )
        return result.say("Placed", _describe(result.body))

    async def find_orders(customer: str, sku: str = "") -> str:
        """List a customer's orders. Read-only and safe to call any time.

        Args:
            customer: The customer's full name.
            sku: Optional SKU to filter by.
        """
        params = {"customer": customer, "sku": sku} if sku else {"customer": customer}
        found = await shop.get("/v1/orders", params=params)
        orders = found["data"]
        if not orders:
            what = f" for {sku}" if sku else ""
            return f"No orders by {customer}{what}."
        return f"{len(orders)} order(s) by {customer}: " + "; ".join(_describe(o) for o in orders)

    async def get_product(sku: str) -> str:
        """Look up a product: name, price and stock.

        Args:
            sku: The product's SKU, e.g. "SKU-MUG-01".
        """
        p = await shop.get(f"/v1/products/{sku}")
        return f"{p['sku']}: {p['name']}, {dollars(p['price'])} each, {p['stock']} in stock."

    return [
        make_tool(ctx, place_order, idempotency="keyed", parallel=True),
        make_tool(ctx, find_orders),
        make_tool(ctx, get_product),
    ]


@task
def place_order(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    """Place one or two orders through an orders API with key support.

    Args:
        fault: What the orders API does wrong (``twice list`` shows the faults).
        protection: What the tool layer does about retries.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test (``react``: twice's own loop; ``twice list`` shows more).
        mocks: Production URL by service name, served by the trial's services (user agents).
    """
    return twice_task(
        name="place_order",
        dataset=load_dataset(DATASET, "place_order"),
        services=_services,
        tools=place_order_tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        action_log=action_log,
        agent=agent,
        mocks=mocks,
    )
