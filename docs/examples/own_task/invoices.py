"""A mock service of your own: an invoicing API whose POST sends an invoice (an effect)."""

from typing import Any, ClassVar

import httpx
from twice.mocks import Call, Route, Service, not_found


class InvoicesService(Service):
    name: ClassVar[str] = "invoices"  # ctx.api("invoices"), and the key in a sample's state
    api_name: ClassVar[str | None] = "billing API"  # what messages to the model call it
    default_base_url: ClassVar[str] = "https://billing.example.test"

    def __init__(self, customers: list[dict[str, Any]] | None = None, base_url: str | None = None):
        super().__init__(base_url)  # a sample's state keys arrive as these arguments
        self.customers = {c["customer_id"]: dict(c) for c in customers or []}
        self.invoices: list[dict[str, Any]] = []

    def routes(self) -> list[Route]:
        return [
            # mutating=True: the route makes effects, its name is theirs (intents name it),
            # faults hit it and Idempotency-Key applies to it.
            Route("POST", r"/v1/invoices", "invoices.invoice.send", self.send, mutating=True),
            Route("GET", r"/v1/invoices", "invoices.invoice.list", self.search),
        ]

    def send(self, call: Call) -> httpx.Response:
        customer_id = call.params.get("customer_id")
        if not isinstance(customer_id, str) or customer_id not in self.customers:
            return not_found("customer", "customer_id", customer_id)  # a 4xx: no effect
        fields = {"customer_id": customer_id, "period": str(call.params.get("period", ""))}
        effect = call.commit("invoices.invoice.send", "inv", fields)  # the route's own name
        invoice = {"id": effect.id, **fields}
        self.invoices.append(invoice)
        return httpx.Response(200, json=invoice)

    def search(self, call: Call) -> httpx.Response:
        customer_id = call.params.get("customer_id")
        data = [i for i in self.invoices if i["customer_id"] == customer_id]
        return httpx.Response(200, json={"object": "list", "data": data})
