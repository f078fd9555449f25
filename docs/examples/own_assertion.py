"""Write your own assertion: any object with check(ledger) -> Verdict."""

from dataclasses import dataclass

import httpx
from twice.assertions import Verdict, assert_side_effects, exactly
from twice.mocks import Ledger, LostReply, PaymentsService, Services


@dataclass(frozen=True)
class RefundedAtMost:
    """The refunds of one order add up to at most `cents`."""

    order_id: str
    cents: int

    def check(self, ledger: Ledger) -> Verdict:
        refunds = ledger.effects_named("payments.refund.create", order_id=self.order_id)
        total = sum(refund.fields["amount"] for refund in refunds)
        return Verdict.from_effects(
            ledger,
            refunds,
            ok=total <= self.cents,
            subject=f"refunded total of {self.order_id}",
            expected=f"at most {self.cents} cents",
            observed=f"{total} cents",
        )


# A trial where the first reply is lost and a naive client retries without a key.
order = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
services = Services([PaymentsService(orders=[order])], fault=LostReply())
with services.sync_client(base_url="https://payments.twice.test") as client:
    for _ in range(2):
        try:
            client.post("/v1/refunds", json={"order_id": "order_1042", "amount": 499})
            break
        except httpx.TimeoutException:
            continue  # the bug: retry without an idempotency key

try:
    assert_side_effects(
        services.ledger,
        RefundedAtMost("order_1042", 499),
        exactly(1, "payments.refund.create", order_id="order_1042"),
    )
except AssertionError as failure:
    print(failure)
else:
    raise SystemExit("the duplicate refund went unnoticed")
