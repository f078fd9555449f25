"""The payments service speaks enough Stripe for the official SDKs (form bodies, aliases)."""

from __future__ import annotations

from collections.abc import Callable

from twice.mocks import Services

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_payments_accepts_a_form_body_naming_the_payment_intent(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    with services.sync_client(base_url="https://payments.twice.test") as client:
        r = client.post(
            "/v1/refunds", content=b"payment_intent=order_1042&amount=499", headers=FORM
        )
    assert r.status_code == 200
    refund = r.json()
    assert (refund["id"], refund["object"], refund["amount"]) == ("re_1", "refund", 499)
    assert refund["payment_intent"] == refund["charge"] == "order_1042"
    assert refund["currency"] == "usd" and refund["created"] == 1_767_225_601
    # The effect is the same as twice's own JSON form makes: intents still match it.
    effect = services.ledger.effects[0]
    assert effect.fields == {"order_id": "order_1042", "amount": 499, "reason": ""}


def test_payments_form_body_with_a_bad_amount_is_400_without_effect(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    with services.sync_client(base_url="https://payments.twice.test") as client:
        r = client.post("/v1/refunds", content=b"charge=order_1042&amount=4.99", headers=FORM)
    assert r.status_code == 400 and "positive integer of cents" in r.json()["error"]["message"]
    assert services.ledger.effects == []


def test_payments_list_filters_by_charge_in_the_stripe_list_shape(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    with services.sync_client(base_url="https://payments.twice.test") as client:
        client.post("/v1/refunds", json={"order_id": "order_1042", "amount": 100})
        client.post("/v1/refunds", json={"order_id": "order_1054", "amount": 200})
        listed = client.get("/v1/refunds", params={"charge": "order_1054"}).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    assert listed["url"] == "/v1/refunds"
    assert [r["id"] for r in listed["data"]] == ["re_2"]


def test_payments_json_metadata_is_kept_and_no_amount_refunds_the_rest(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    with services.sync_client(base_url="https://payments.twice.test") as client:
        partial = client.post("/v1/refunds", json={"order_id": "order_1054", "amount": 850})
        rest = client.post(
            "/v1/refunds", json={"order_id": "order_1054", "metadata": {"why": "late"}}
        )
        again = client.post("/v1/refunds", json={"order_id": "order_1054"})
    assert (partial.json()["amount"], rest.json()["amount"]) == (850, 9000)
    assert rest.json()["metadata"] == {"why": "late"}
    assert again.status_code == 400 and "already been refunded" in again.text
    assert [e.fields["amount"] for e in services.ledger.effects] == [850, 9000]
