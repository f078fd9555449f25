"""Services made from three published OpenAPI documents (Stripe, Twilio, Adyen), each used as
a built-in service is: requests validated, replies valid against the document, effects,
idempotency keys and faults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from twice.mocks import (
    OpenAPIError,
    Services,
    get_fault,
    openapi_service,
    services_from_state,
)

DOCS = Path(__file__).parent / "openapi_docs"
STRIPE = DOCS / "stripe.json"
TWILIO = DOCS / "twilio_messages.json"
ADYEN = DOCS / "adyen_checkout.json"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
ACCOUNT = "AC" + "0" * 31 + "1"
EXAMPLES = Path(__file__).parents[2] / "docs" / "examples" / "openapi"
ADYEN_OVERRIDES = EXAMPLES / "adyen_overrides.yaml"
STRIPE_OVERRIDES = EXAMPLES / "stripe_overrides.yaml"


def response_valid(doc_path: Path, schema_ref: str, body: Any) -> None:
    """``body`` is valid against ``schema_ref`` of the document (jsonschema, not twice's own
    builder: what a client checking the document would see)."""
    doc = json.loads(doc_path.read_text())
    nullable = doc["openapi"].startswith("3.0")

    def conv(node: Any) -> Any:
        if isinstance(node, list):
            return [conv(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: conv(v) for k, v in node.items()}
        if nullable and out.pop("nullable", False):
            return {"anyOf": [out, {"type": "null"}]}
        return out

    root = conv(doc)
    cls = jsonschema.Draft4Validator if nullable else jsonschema.Draft202012Validator
    cls({**root, "$ref": schema_ref}).validate(body)


def stripe(fault: str = "none", **state: Any) -> Services:
    kind = openapi_service(STRIPE, overrides=STRIPE_OVERRIDES)
    return Services(services_from_state(state, kind), fault=get_fault(fault))


def test_openapi_stripe_infers_effect_kinds_from_paths() -> None:
    kind = openapi_service(STRIPE)
    assert kind.plan.resources["refund"].prefix == "refund"  # the document does not say
    routes = {(r.method, r.name, r.mutating) for r in kind().routes()}
    assert ("POST", "stripe.refund.create", True) in routes
    assert ("GET", "stripe.refund.list", False) in routes
    assert ("GET", "stripe.refund.get", False) in routes
    assert ("POST", "stripe.refund.update", True) in routes
    assert ("GET", "stripe.charge.get", False) in routes
    assert kind.name == "stripe" and kind.default_base_url == "https://stripe.twice.test"


def test_openapi_stripe_refund_from_a_form_body_is_valid_and_one_effect() -> None:
    services = stripe()
    with services.sync_client(base_url="https://stripe.twice.test") as client:
        r = client.post(
            "/v1/refunds",
            content=b"charge=ch_1&amount=499&metadata[ticket]=T-7",
            headers=FORM,
        )
        assert r.status_code == 200, r.text
        refund = r.json()
        assert (refund["id"], refund["object"], refund["amount"]) == ("re_1", "refund", 499)
        assert refund["charge"] == "ch_1" and refund["metadata"] == {"ticket": "T-7"}
        response_valid(STRIPE, "#/components/schemas/refund", refund)
        listed = client.get("/v1/refunds", params={"charge": "ch_1"}).json()
        response_valid(STRIPE, "#/paths/~1v1~1refunds/get/responses/200/content/"
                       "application~1json/schema", listed)  # fmt: skip
        assert [x["id"] for x in listed["data"]] == ["re_1"]
        assert client.get("/v1/refunds/re_1").json()["amount"] == 499
    (effect,) = services.ledger.effects
    assert effect.name == "stripe.refund.create"
    assert effect.fields["charge"] == "ch_1" and effect.fields["amount"] == 499


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"charge=ch_1&amount=4.99", "amount"),
        (b"charge=ch_1&reason=because", "reason"),
        (b"charge=ch_1&nonsense=1", "nonsense"),
    ],
)
def test_openapi_stripe_invalid_request_is_400_in_stripe_shape_without_effect(
    body: bytes, says: str
) -> None:
    services = stripe()
    with services.sync_client(base_url="https://stripe.twice.test") as client:
        r = client.post("/v1/refunds", content=body, headers=FORM)
    assert r.status_code == 400
    assert says in r.json()["error"]["message"]
    response_valid(STRIPE, "#/components/schemas/error", r.json())
    assert services.ledger.effects == []


def test_openapi_unknown_object_is_404_without_effect() -> None:
    services = stripe()
    with services.sync_client(base_url="https://stripe.twice.test") as client:
        r = client.post("/v1/refunds/re_404", content=b"metadata[a]=b", headers=FORM)
    assert r.status_code == 404 and "re_404" in r.json()["error"]["message"]
    assert services.ledger.effects == []


def test_openapi_idempotency_key_replays_and_conflicts() -> None:
    services = stripe()
    with services.sync_client(base_url="https://stripe.twice.test") as client:
        key = {**FORM, "Idempotency-Key": "k1"}
        first = client.post("/v1/refunds", content=b"charge=ch_1&amount=5", headers=key)
        again = client.post("/v1/refunds", content=b"charge=ch_1&amount=5", headers=key)
        other = client.post("/v1/refunds", content=b"charge=ch_1&amount=6", headers=key)
    assert first.json() == again.json() and again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 422
    assert [e.id for e in services.ledger.effects] == ["re_1"]


def test_openapi_lost_reply_commits_and_a_keyless_retry_duplicates() -> None:
    services = stripe("lost_reply")
    with services.sync_client(base_url="https://stripe.twice.test") as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/refunds", content=b"charge=ch_1&amount=5", headers=FORM)
        client.post("/v1/refunds", content=b"charge=ch_1&amount=5", headers=FORM)
    assert [e.id for e in services.ledger.effects] == ["re_1", "re_2"]


def test_openapi_timeout_before_commit_makes_no_effect() -> None:
    services = stripe("timeout_before_commit")
    with (
        services.sync_client(base_url="https://stripe.twice.test") as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/refunds", content=b"charge=ch_1&amount=5", headers=FORM)
    assert services.ledger.effects == []


def test_openapi_starting_state_from_a_sample() -> None:
    services = stripe(refunds=[{"id": "re_old", "amount": 100, "charge": "ch_9"}])
    with services.sync_client(base_url="https://stripe.twice.test") as client:
        r = client.get("/v1/refunds/re_old")
        assert r.status_code == 200 and r.json()["amount"] == 100
        response_valid(STRIPE, "#/components/schemas/refund", r.json())
        r = client.post("/v1/refunds/re_old", content=b"metadata[why]=late", headers=FORM)
    assert r.json()["metadata"] == {"why": "late"}
    assert [(e.name, e.fields["id"]) for e in services.ledger.effects] == [
        ("stripe.refund.update", "re_old")
    ]


def test_openapi_misspelt_state_key_is_named() -> None:
    with pytest.raises(ValueError, match=r"'refund'.*refunds"):
        stripe(refund=[{"id": "re_1"}])


def test_openapi_twilio_message_from_a_form_body_has_a_patterned_sid() -> None:
    kind = openapi_service(TWILIO)
    services = Services([kind()])
    with services.sync_client(base_url=kind.default_base_url) as client:
        r = client.post(
            f"/2010-04-01/Accounts/{ACCOUNT}/Messages.json",
            content=b"To=%2B15551234567&From=%2B15557654321&Body=Your+order+shipped",
            headers=FORM,
        )
        assert r.status_code == 201, r.text
        message = r.json()
        bad = client.post(f"/2010-04-01/Accounts/{ACCOUNT}/Messages.json", content=b"Body=x",
                          headers=FORM)  # fmt: skip
    assert message["sid"] == "SM" + "0" * 31 + "1"
    assert message["to"] == "+15551234567" and message["body"] == "Your order shipped"
    response_valid(TWILIO, "#/components/schemas/api.v2010.account.message", message)
    assert bad.status_code == 400 and "To" in bad.text
    (effect,) = services.ledger.effects
    assert effect.name == "twilio.message.create" and effect.fields["AccountSid"] == ACCOUNT


def test_openapi_twilio_delete_with_a_key_is_kept_as_a_post_is() -> None:
    # A document's DELETE commits an effect as its POST does: a retry with the same key gets
    # the saved reply, not a second effect (built-in services keep keys on POST only).
    kind = openapi_service(TWILIO)
    sid = "SM" + "0" * 31 + "9"
    state = {"messages": [{"sid": sid, "body": "Your order shipped"}]}
    services = Services(services_from_state(state, kind), fault=get_fault("lost_reply"))
    url = f"/2010-04-01/Accounts/{ACCOUNT}/Messages/{sid}.json"
    with services.sync_client(base_url=kind.default_base_url) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.delete(url, headers={"Idempotency-Key": "del-1"})
        again = client.delete(url, headers={"Idempotency-Key": "del-1"})
    assert again.status_code == 204 and again.headers["Idempotent-Replayed"] == "true"
    assert [e.name for e in services.ledger.effects] == ["twilio.message.delete"]


def test_openapi_adyen_refund_with_overrides_and_its_declared_key_header() -> None:
    kind = openapi_service(ADYEN, overrides=ADYEN_OVERRIDES)
    assert kind.key_header == "Idempotency-Key"
    assert kind.default_base_url == "https://adyen.twice.test/v71"
    services = Services([kind()], fault=get_fault("lost_reply"))
    body = {"merchantAccount": "ShopNL", "amount": {"currency": "EUR", "value": 1500}}
    url = "/payments/PSP0001/refunds"
    with services.sync_client(base_url=kind.default_base_url) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(url, json=body, headers={"Idempotency-Key": "ref-1"})
        r = client.post(url, json=body, headers={"Idempotency-Key": "ref-1"})
        bad = client.post(url, json={"amount": {"currency": "EUR", "value": 1}})
    assert r.status_code == 201 and r.headers["Idempotent-Replayed"] == "true"
    refund = r.json()
    assert refund["pspReference"] == "RF_1" and refund["paymentPspReference"] == "PSP0001"
    assert refund["amount"] == {"currency": "EUR", "value": 1500}
    response_valid(ADYEN, "#/components/schemas/PaymentRefundResponse", refund)
    # Adyen's own error shape (ServiceError), not Stripe's.
    assert bad.status_code == 400 and "merchantAccount" in bad.json()["message"]
    response_valid(ADYEN, "#/components/schemas/ServiceError", bad.json())
    assert [e.name for e in services.ledger.effects] == ["adyen.refund.create"]


def test_openapi_overrides_rename_an_operation() -> None:
    kind = openapi_service(
        STRIPE, overrides={"operations": {"PostRefunds": {"name": "payments.refund.create"}}}
    )
    assert "payments.refund.create" in {r.name for r in kind().routes()}


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"colour": "red"}, "unknown overrides key"),
        ({"operations": {"NoSuchOp": {"verb": "create"}}}, "NoSuchOp"),
        ({"resources": {"widget": {"id_field": "x"}}}, "widget"),
    ],
)
def test_openapi_bad_overrides_are_named(overrides: dict[str, Any], says: str) -> None:
    with pytest.raises(OpenAPIError, match=says):
        openapi_service(STRIPE, overrides=overrides)


def test_openapi_not_a_v3_document_is_named(tmp_path: Path) -> None:
    swagger = tmp_path / "old.yaml"
    swagger.write_text("swagger: '2.0'\npaths: {}\n")
    with pytest.raises(OpenAPIError, match=r"not an OpenAPI 3\.0 or 3\.1"):
        openapi_service(swagger)
    with pytest.raises(OpenAPIError, match="cannot read"):
        openapi_service(tmp_path / "missing.json")
