"""The catalogue's mock services on their own: keys, lookups, atomic check-then-act."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from twice.mocks import (
    KEY_HEADER,
    EmailService,
    LostReply,
    OrdersService,
    PaymentsService,
    RecordsService,
    Service,
    Services,
    TicketsService,
    TravelService,
)

EMAIL = {"to": "dana@example.com", "subject": "Your order", "body": "It ships tomorrow."}
TICKET = {"customer_id": "cus_1", "subject": "Charged twice", "description": "Two charges."}
ORDER = {"customer": "Dana Ortiz", "sku": "SKU-MUG-01", "quantity": 1, "shipping_address": "1 Elm"}


def _email() -> EmailService:
    return EmailService()


def _tickets() -> TicketsService:
    return TicketsService(customers=[{"customer_id": "cus_1", "name": "Dana Ortiz"}])


def _orders() -> OrdersService:
    return OrdersService(products=[{"sku": "SKU-MUG-01", "name": "mug", "price": 1299, "stock": 5}])


def _records() -> RecordsService:
    return RecordsService(records=[{"record_id": "rec_1", "title": "Old", "status": "active"}])


CREATES: dict[str, tuple[Any, str, dict[str, Any]]] = {
    "email": (_email, "/v1/messages", EMAIL),
    "tickets": (_tickets, "/v1/tickets", TICKET),
    "orders": (_orders, "/v1/orders", ORDER),
    "records": (_records, "/v1/records/rec_1/archive", {"reason": "done"}),
}


def _post(services: Services, name: str, key: str | None = None) -> httpx.Response:
    _, path, body = CREATES[name]
    headers = {KEY_HEADER: key} if key else {}
    with services.sync_client() as client:
        return client.post(services[name].base_url + path, json=body, headers=headers)


async def _post_twice_concurrently(name: str, key: str | None) -> Services:
    factory, path, body = CREATES[name]
    services = Services([factory()])
    headers = {KEY_HEADER: key} if key else {}
    url = services[name].base_url + path
    async with services.client() as client:
        await asyncio.gather(*(client.post(url, json=body, headers=headers) for _ in range(2)))
    return services


def test_email_service_ignores_idempotency_key() -> None:
    services = Services([_email()])
    first, second = _post(services, "email", "k1"), _post(services, "email", "k1")
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] != second.json()["id"]
    assert [e.id for e in services.ledger.effects] == ["msg_1", "msg_2"]
    # The key is recorded as sent, and nothing was replayed: the service ignored it.
    assert [(a.key, a.replayed) for a in services.ledger.attempts] == [("k1", False)] * 2


def test_email_service_ignores_key_reused_with_other_parameters() -> None:
    services = Services([_email()])
    _post(services, "email", "k1")
    with services.sync_client() as client:
        other = client.post(
            services["email"].base_url + "/v1/messages",
            json={**EMAIL, "body": "changed"},
            headers={KEY_HEADER: "k1"},
        )
    assert other.status_code == 200  # a keyed service would say 422
    assert len(services.ledger.effects) == 2


def test_email_service_sent_folder_is_searchable() -> None:
    email = EmailService(sent=[{"id": "msg_prev_1", "to": "dana@example.com", "subject": "Hi"}])
    services = Services([email])
    with services.sync_client() as client:
        client.post(
            email.base_url + "/v1/messages", json={**EMAIL, "client_reference": "run_1:abc"}
        )
        base = email.base_url + "/v1/messages"
        by_subject = client.get(base, params={"to": "DANA@example.com", "subject": "your"}).json()
        by_ref = client.get(base, params={"client_reference": "run_1:abc"}).json()
        none = client.get(base, params={"client_reference": "run_1:zzz"}).json()
    assert [m["id"] for m in by_subject["data"]] == ["msg_1"]
    assert [m["id"] for m in by_ref["data"]] == ["msg_1"]
    assert none["data"] == []


def test_email_service_rejects_bad_address_without_effect() -> None:
    services = Services([_email()])
    with services.sync_client() as client:
        bad = client.post(services["email"].base_url + "/v1/messages", json={**EMAIL, "to": "x"})
    assert bad.status_code == 400
    assert "'x'" in bad.json()["error"]["message"]
    assert services.ledger.effects == []


def test_keyed_services_replay_a_repeated_key() -> None:
    for name in ("tickets", "orders"):
        services = Services([CREATES[name][0]()])
        first, second = _post(services, name, "k1"), _post(services, name, "k1")
        assert first.json() == second.json(), name
        assert len(services.ledger.effects) == 1, name
        assert services.ledger.attempts[1].replayed, name


def test_keyed_services_commit_twice_without_key() -> None:
    for name in ("tickets", "orders"):
        services = Services([CREATES[name][0]()])
        _post(services, name)
        _post(services, name)
        assert len(services.ledger.effects) == 2, name


def test_tickets_service_search_by_customer_and_subject() -> None:
    tickets = TicketsService(
        customers=[{"customer_id": "cus_1", "name": "Dana"}],
        tickets=[
            {"id": "tkt_old_1", "customer_id": "cus_1", "subject": "Shipping", "status": "solved"}
        ],
    )
    services = Services([tickets])
    _post(services, "tickets")
    with services.sync_client() as client:
        found = client.get(
            tickets.base_url + "/v1/tickets", params={"customer_id": "cus_1", "subject": "charged"}
        ).json()
        customer = client.get(tickets.base_url + "/v1/customers/cus_1").json()
    assert [t["id"] for t in found["data"]] == ["tkt_1"]
    assert customer["open_tickets"] == ["tkt_1"]


def test_tickets_service_rejects_unknown_priority() -> None:
    services = Services([_tickets()])
    with services.sync_client() as client:
        bad = client.post(
            services["tickets"].base_url + "/v1/tickets", json={**TICKET, "priority": "asap"}
        )
    assert bad.status_code == 400
    assert "'asap'" in bad.json()["error"]["message"]


def test_orders_service_rejects_more_than_stock() -> None:
    services = Services([_orders()])
    with services.sync_client() as client:
        bad = client.post(services["orders"].base_url + "/v1/orders", json={**ORDER, "quantity": 6})
    assert bad.status_code == 400
    assert "Only 5" in bad.json()["error"]["message"]
    assert services.ledger.effects == []


def test_records_service_archive_twice_is_success_without_new_effect() -> None:
    services = Services([_records()])
    first, second = _post(services, "records"), _post(services, "records")
    assert first.status_code == second.status_code == 200
    assert first.json()["already_archived"] is False
    assert second.json()["already_archived"] is True
    assert second.json()["archive_id"] == first.json()["archive_id"] == "arc_1"
    assert [e.name for e in services.ledger.effects] == ["records.record.archive"]


def test_records_service_archive_after_lost_reply_reports_the_first_archive() -> None:
    services = Services([_records()], fault=LostReply())
    with services.sync_client() as client:
        url = services["records"].base_url + "/v1/records/rec_1/archive"
        try:
            client.post(url, json={"reason": "done"})
        except httpx.ReadTimeout:
            pass
        else:  # pragma: no cover - the fault must fire
            raise AssertionError("LostReply did not fire")
        again = client.post(url, json={"reason": "done"})
    assert again.json()["already_archived"] is True
    assert again.json()["archive_id"] == "arc_1"
    assert len(services.ledger.effects) == 1


def test_records_service_unknown_record_is_404() -> None:
    services = Services([_records()])
    with services.sync_client() as client:
        missing = client.post(services["records"].base_url + "/v1/records/rec_9/archive", json={})
    assert missing.status_code == 404
    assert "'rec_9'" in missing.json()["error"]["message"]


def test_services_concurrent_creates_with_one_key_commit_once() -> None:
    for name in ("tickets", "orders", "records"):
        services = asyncio.run(_post_twice_concurrently(name, key="k1"))
        assert len(services.ledger.effects) == 1, name
        assert sorted(a.status or 0 for a in services.ledger.attempts) == [200, 409], name


def test_services_concurrent_creates_without_key() -> None:
    expected = {"email": 2, "tickets": 2, "orders": 2, "records": 1}
    for name, n in expected.items():
        services = asyncio.run(_post_twice_concurrently(name, key=None))
        assert len(services.ledger.effects) == n, name


def test_services_concurrent_email_with_one_key_still_sends_twice() -> None:
    services = asyncio.run(_post_twice_concurrently("email", key="k1"))
    assert len(services.ledger.effects) == 2


def test_services_declare_key_support() -> None:
    support: dict[type[Service], bool] = {
        EmailService: False,
        TicketsService: True,
        OrdersService: True,
        RecordsService: True,
    }
    assert {cls: cls.idempotency_keys for cls in support} == support


@pytest.mark.parametrize(
    ("factory", "path", "body", "status", "message"),
    [
        # An array or object where an id goes read as a lookup that failed, in Python's repr:
        # a 404 "No such product: ['SKU-MUG-01']".
        (_orders, "/v1/orders", {**ORDER, "sku": ["SKU-MUG-01"]}, 400,
         "Invalid sku: must be a string id, got an array"),
        (_tickets, "/v1/tickets", {**TICKET, "customer_id": {"id": "cus_1"}}, 400,
         "Invalid customer_id: must be a string id, got an object"),
        (lambda: PaymentsService(orders=[{"order_id": "o_1", "amount": 100}]), "/v1/refunds",
         {"payment_intent": ["o_1"], "amount": 100}, 400,
         "Invalid payment_intent: must be a string id, got an array"),
        (lambda: TravelService(flights=[], hotels=[]), "/v1/hotel_bookings",
         {"hotel_id": 1.5}, 400, "Invalid hotel_id: must be a string id, got a number"),
        # "No such product: None" named neither what was missing nor its name.
        (_orders, "/v1/orders", {k: v for k, v in ORDER.items() if k != "sku"}, 400,
         "Missing required param: sku"),
        (_orders, "/v1/orders", {**ORDER, "sku": "SKU-NONE"}, 404, "No such product: 'SKU-NONE'"),
    ],
)  # fmt: skip
def test_a_body_id_that_is_no_id_is_a_400_naming_the_param(
    factory: Any, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    services = Services([factory()])
    (service,) = services.services.values()
    with services.sync_client() as client:
        r = client.post(service.base_url + path, json=body)
    assert (r.status_code, r.json()["error"]["message"]) == (status, message)
    assert services.ledger.effects == []
