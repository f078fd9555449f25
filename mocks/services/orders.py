"""A shop's orders API: a product catalogue, orders to place, search and fetch.

Placing an order is not idempotent (a second POST is a second order, shipped and charged
twice), and the API honours Idempotency-Key on it, as Stripe-style APIs do, so the keyed
protections apply. Orders can also be searched by customer and SKU.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from .._service import Call, Route, Service
from .._wire import error_response, not_found


class OrdersService(Service):
    """Products to look up and orders to place, list and fetch.

    Args:
        products: The catalogue, each with ``sku``, ``name``, ``price`` (cents) and ``stock``.
        orders: Orders that exist before the trial starts (not effects of the trial), each
            with ``id``, ``customer``, ``sku`` and ``quantity``.
        base_url: Where the API lives (default ``https://orders.twice.test``).
    """

    name: ClassVar[str] = "orders"
    default_base_url: ClassVar[str] = "https://orders.twice.test"

    def __init__(
        self,
        products: list[dict[str, Any]] | None = None,
        orders: list[dict[str, Any]] | None = None,
        base_url: str | None = None,
    ):
        super().__init__(base_url)
        self.products: dict[str, dict[str, Any]] = {p["sku"]: dict(p) for p in products or []}
        self.orders: list[dict[str, Any]] = [
            {"object": "order", "status": "confirmed", **o} for o in orders or []
        ]

    def routes(self) -> list[Route]:
        return [
            Route("GET", r"/v1/products/(?P<sku>[^/?]+)", "orders.product.get", self.get_product),
            Route("POST", r"/v1/orders", "orders.order.create", self.create, mutating=True),
            Route("GET", r"/v1/orders", "orders.order.list", self.search),
            Route("GET", r"/v1/orders/(?P<order_id>[^/?]+)", "orders.order.get", self.get),
        ]

    def get_product(self, call: Call) -> httpx.Response:
        product = self.products.get(call.params["sku"])
        if product is None:
            return error_response(404, f"No such product: {call.params['sku']!r}")
        return httpx.Response(200, json=product)

    def create(self, call: Call) -> httpx.Response:
        p = call.params
        sku = p.get("sku")
        product = self.products.get(str(sku)) if isinstance(sku, str | int) else None
        if product is None:
            return not_found("product", "sku", sku)
        customer = p.get("customer")
        if not isinstance(customer, str) or not customer.strip():
            return error_response(400, "customer must be a non-empty string")
        quantity = p.get("quantity")
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity <= 0:
            return error_response(400, f"quantity must be a positive integer, got {quantity!r}")
        if quantity > product["stock"]:
            return error_response(
                400,
                f"Only {product['stock']} of {product['sku']} in stock, {quantity} requested",
            )
        fields = {
            "customer": customer,
            "sku": product["sku"],
            "quantity": quantity,
            "shipping_address": str(p.get("shipping_address", "")),
            "total": product["price"] * quantity,
        }
        effect = call.commit("orders.order.create", "ord", fields)
        product["stock"] -= quantity
        order = {"id": effect.id, "object": "order", "status": "confirmed", **fields}
        self.orders.append(order)
        return httpx.Response(200, json=order)

    def search(self, call: Call) -> httpx.Response:
        """Filters: ``customer`` (exact, case-insensitive) and ``sku`` (exact)."""
        customer = str(call.params.get("customer") or "").lower()
        sku = call.params.get("sku")
        data = [
            o
            for o in self.orders
            if (not customer or o["customer"].lower() == customer)
            and (sku is None or o["sku"] == sku)
        ]
        return httpx.Response(200, json={"object": "list", "data": data})

    def get(self, call: Call) -> httpx.Response:
        for o in self.orders:
            if o["id"] == call.params["order_id"]:
                return httpx.Response(200, json=o)
        return error_response(404, f"No such order: {call.params['order_id']!r}")
