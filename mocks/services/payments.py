"""A payments API in the shape of Stripe's refunds: orders, refunds, and a lookup by order.

Amounts are integer cents, as in Stripe. Refunds may be partial; a refund that would take an
order's refunded total past what was paid is rejected (400), so a duplicate refund is possible
only while the order still has a refundable balance, as with a real processor.

Stripe compatibility, so the official SDKs work unchanged against it (``twice serve``): bodies
may be form-encoded (amounts then arrive as digit strings); ``POST /v1/refunds`` and
``GET /v1/refunds`` accept ``payment_intent`` or ``charge`` naming the order, as well as
``order_id``; refunds carry Stripe's fields (``amount``, ``currency``, ``payment_intent``,
``charge``, ``created``, ``metadata``, ...) and lists carry ``has_more`` and ``url``. Error
bodies are already Stripe's ``{"error": {"type", "message"}}``. As in Stripe, a refund without
``amount`` refunds what is left of the order (400 once nothing is), and ``metadata``
(``metadata[key]=value`` in a form body) is kept and returned.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from .._service import Call, Route, Service
from .._wire import error_response, not_found

ORDER_PARAMS = ("order_id", "payment_intent", "charge")
"""Parameters that name the order a refund is for: twice's own, then Stripe's two."""
CREATED_EPOCH = 1_767_225_600
"""``created`` of refund ``re_N`` is this plus N: Stripe-shaped, and the same on every run."""


def _order_param(params: dict[str, Any]) -> Any:
    return next((params[k] for k in ORDER_PARAMS if params.get(k) is not None), None)


def _order_name(params: dict[str, Any]) -> str:
    """Which of :data:`ORDER_PARAMS` named the order."""
    return next((k for k in ORDER_PARAMS if params.get(k) is not None), ORDER_PARAMS[0])


def _metadata(params: dict[str, Any]) -> dict[str, Any]:
    """Stripe's ``metadata``: a JSON object, or a form body's ``metadata[key]=value`` pairs."""
    given = params.get("metadata")
    if isinstance(given, dict):
        return dict(given)
    return {k[len("metadata[") : -1]: v for k, v in params.items() if k.startswith("metadata[")
            and k.endswith("]")}  # fmt: skip


def _cents(value: Any) -> Any:
    """A form body's ``"499"`` is 499 cents; anything else is returned as given."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


class PaymentsService(Service):
    """Orders to look up and refunds to create, list and fetch.

    Args:
        orders: The orders this trial knows, each with ``order_id``, ``customer`` and
            ``amount`` (cents paid); other fields are returned as given.
        base_url: Where the API lives (default ``https://payments.twice.test``).
    """

    name: ClassVar[str] = "payments"
    default_base_url: ClassVar[str] = "https://payments.twice.test"

    def __init__(self, orders: list[dict[str, Any]] | None = None, base_url: str | None = None):
        super().__init__(base_url)
        self.orders: dict[str, dict[str, Any]] = {o["order_id"]: dict(o) for o in orders or []}
        self.refunds: list[dict[str, Any]] = []

    def routes(self) -> list[Route]:
        return [
            Route("GET", r"/v1/orders/(?P<order_id>[^/?]+)", "payments.order.get", self.get_order),
            Route(
                "POST", r"/v1/refunds", "payments.refund.create", self.create_refund, mutating=True
            ),
            Route("GET", r"/v1/refunds", "payments.refund.list", self.list_refunds),
            Route(
                "GET",
                r"/v1/refunds/(?P<refund_id>re_[0-9]+)",
                "payments.refund.get",
                self.get_refund,
            ),
        ]

    def refunded(self, order_id: str) -> int:
        """Cents refunded so far on an order."""
        return sum(r["amount"] for r in self.refunds if r["order_id"] == order_id)

    def get_order(self, call: Call) -> httpx.Response:
        order = self.orders.get(call.params["order_id"])
        if order is None:
            return error_response(404, f"No such order: {call.params['order_id']!r}")
        return httpx.Response(
            200, json={**order, "amount_refunded": self.refunded(order["order_id"])}
        )

    def create_refund(self, call: Call) -> httpx.Response:
        p = call.params
        named = _order_param(p)
        if named is None:  # Stripe answers 400 naming the params, not a 404 for "None"
            return error_response(
                400, f"Missing required param: one of {', '.join(ORDER_PARAMS)} names the order"
            )
        order = self.orders.get(str(named)) if isinstance(named, str | int) else None
        if order is None:
            return not_found("order", _order_name(p), named)
        remaining = order["amount"] - self.refunded(order["order_id"])
        if p.get("amount") is None:  # Stripe: what is left of the charge
            if remaining <= 0:
                return error_response(
                    400, f"Order {order['order_id']} has already been refunded in full"
                )
            amount = remaining
        else:
            amount = _cents(p.get("amount"))
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return error_response(
                400, f"amount must be a positive integer of cents, got {amount!r}"
            )
        if amount > remaining:
            return error_response(
                400,
                f"Refund of {amount} cents exceeds the refundable balance of order "
                f"{order['order_id']} ({remaining} cents left)",
            )
        fields = {"order_id": order["order_id"], "amount": amount, "reason": p.get("reason", "")}
        effect = call.commit("payments.refund.create", "re", fields)
        refund = {
            "id": effect.id,
            "object": "refund",
            "status": "succeeded",
            **fields,
            "currency": order.get("currency", "usd"),
            "payment_intent": order["order_id"],
            "charge": order["order_id"],
            "created": CREATED_EPOCH + int(effect.id.rsplit("_", 1)[1]),
            "metadata": _metadata(p),
            "balance_transaction": None,
            "receipt_number": None,
        }
        self.refunds.append(refund)
        return httpx.Response(200, json=refund)

    def list_refunds(self, call: Call) -> httpx.Response:
        order_id = _order_param(call.params)
        data = [r for r in self.refunds if order_id is None or r["order_id"] == order_id]
        return httpx.Response(
            200, json={"object": "list", "data": data, "has_more": False, "url": "/v1/refunds"}
        )

    def get_refund(self, call: Call) -> httpx.Response:
        for r in self.refunds:
            if r["id"] == call.params["refund_id"]:
                return httpx.Response(200, json=r)
        return error_response(404, f"No such refund: {call.params['refund_id']!r}")
