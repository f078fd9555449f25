"""The payments service, its idempotency-key rules (Stripe v1 / IETF) and the six faults."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from twice.mocks import (
    FAULTS,
    ErrorAfterCommit,
    LostReply,
    PaymentsService,
    Schedule,
    Services,
    TimeoutBeforeCommit,
    get_fault,
)

URL = "https://payments.twice.test/v1/refunds"
ORDER = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
BODY = {"order_id": "order_1042", "amount": 499}


def services(fault: object = None) -> Services:
    return Services([PaymentsService(orders=[ORDER])], fault=fault)  # type: ignore[arg-type]


async def post(
    s: Services, key: str | None = None, body: dict[str, object] = BODY
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    async with s.client() as client:
        return await client.post(URL, json=body, headers=headers)


def test_service_creates_refund_and_records_attempt_and_effect() -> None:
    s = services()
    r = asyncio.run(post(s))
    assert r.status_code == 200 and r.json()["id"] == "re_1"
    (attempt,) = s.ledger.attempts
    assert (attempt.route, attempt.mutating, attempt.outcome, attempt.delivered) == (
        "payments.refund.create", True, "ok", True,
    )  # fmt: skip
    assert [e.id for e in s.ledger.effects] == ["re_1"]
    assert s.ledger.effects[0].fields == {"order_id": "order_1042", "amount": 499, "reason": ""}


def test_service_rejects_refund_past_balance() -> None:
    s = services()
    r = asyncio.run(post(s, body={"order_id": "order_1042", "amount": 5000}))
    assert r.status_code == 400 and "refundable balance" in r.json()["error"]["message"]
    assert s.ledger.effects == []


def test_unknown_path_is_recorded_as_404() -> None:
    s = services()

    async def go() -> httpx.Response:
        async with s.client() as client:
            return await client.get("https://payments.twice.test/v2/nothing")

    assert asyncio.run(go()).status_code == 404
    assert s.ledger.attempts[0].route is None


def test_key_replays_saved_response_without_new_effect() -> None:
    s = services()
    first, second = asyncio.run(post(s, "k")), asyncio.run(post(s, "k"))
    assert first.json() == second.json()
    assert len(s.ledger.effects) == 1 and s.ledger.attempts[1].replayed


def test_key_with_different_parameters_is_422() -> None:
    s = services()
    asyncio.run(post(s, "k"))
    r = asyncio.run(post(s, "k", body={"order_id": "order_1042", "amount": 498}))
    assert r.status_code == 422 and "different parameters" in r.json()["error"]["message"]
    assert len(s.ledger.effects) == 1


def test_key_in_flight_is_409_and_not_saved() -> None:
    s = services()

    async def both() -> list[httpx.Response]:
        async with s.client() as client:
            return list(
                await asyncio.gather(
                    client.post(URL, json=BODY, headers={"Idempotency-Key": "k"}),
                    client.post(URL, json=BODY, headers={"Idempotency-Key": "k"}),
                )
            )

    statuses = sorted(r.status_code for r in asyncio.run(both()))
    assert statuses == [200, 409]
    assert len(s.ledger.effects) == 1
    # The 409 was not saved: a later retry gets the first request's saved response.
    assert asyncio.run(post(s, "k")).json()["id"] == "re_1"


def test_concurrent_without_key_commits_twice() -> None:
    s = services()

    async def both() -> None:
        async with s.client() as client:
            await asyncio.gather(client.post(URL, json=BODY), client.post(URL, json=BODY))

    asyncio.run(both())
    assert [e.id for e in s.ledger.effects] == ["re_1", "re_2"]


def test_key_over_255_characters_is_rejected() -> None:
    s = services()
    r = asyncio.run(post(s, "k" * 256))
    assert r.status_code == 400 and "at most 255" in r.json()["error"]["message"]
    assert s.ledger.effects == []
    assert asyncio.run(post(s, "k" * 255)).status_code == 200


def test_key_on_get_is_ignored() -> None:
    s = services()

    async def go() -> httpx.Response:
        async with s.client() as client:
            return await client.get(
                URL, params={"order_id": "order_1042"}, headers={"Idempotency-Key": "k"}
            )

    assert asyncio.run(go()).status_code == 200
    assert len(s["payments"].keys) == 0


def test_validation_failure_is_not_saved() -> None:
    s = services()
    bad = asyncio.run(post(s, "k", body={"order_id": "order_1042", "amount": 99999}))
    assert bad.status_code == 400
    assert len(s["payments"].keys) == 0


def test_saved_5xx_is_replayed() -> None:
    s = services(ErrorAfterCommit())
    first = asyncio.run(post(s, "k"))
    again = asyncio.run(post(s, "k"))
    assert first.status_code == again.status_code == 502
    assert again.json() == first.json() and s.ledger.attempts[1].replayed
    assert len(s.ledger.effects) == 1  # committed once, though the client never saw success


@pytest.mark.parametrize(
    ("name", "commits", "client_sees"),
    [
        ("none", True, 200),
        ("lost_reply", True, "timeout"),
        ("timeout_before_commit", False, "timeout"),
        ("error_after_commit", True, 502),
        ("error_before_commit", False, 503),
        ("rate_limited", False, 429),
    ],
)
def test_fault_commit_and_what_client_sees(name: str, commits: bool, client_sees: object) -> None:
    fault = get_fault(name)
    assert fault.commits is commits
    s = services(fault)
    try:
        seen: object = asyncio.run(post(s)).status_code
    except httpx.ReadTimeout:
        seen = "timeout"
    assert seen == client_sees
    assert len(s.ledger.effects) == (1 if commits else 0)
    (attempt,) = s.ledger.attempts
    assert attempt.fault == (None if name == "none" else name)
    assert attempt.outcome == {200: "ok", 429: "fail"}.get(seen, "unknown")  # type: ignore[call-overload]


def test_rate_limited_sends_retry_after() -> None:
    s = services(get_fault("rate_limited"))
    assert asyncio.run(post(s)).headers["Retry-After"] == "2"


def test_fault_hits_only_first_mutating_attempt_by_default() -> None:
    s = services(LostReply())
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s))
    assert asyncio.run(post(s)).status_code == 200
    assert [a.fault for a in s.ledger.attempts] == ["lost_reply", None]


def test_fault_schedule_every_and_route_filter() -> None:
    s = services(TimeoutBeforeCommit(schedule=Schedule(every=True, route="payments.refund.create")))
    for _ in range(3):
        with pytest.raises(httpx.ReadTimeout):
            asyncio.run(post(s))
    assert s.ledger.effects == [] and len(s.ledger.faults_fired()) == 3


def test_key_released_after_timeout_before_commit() -> None:
    s = services(TimeoutBeforeCommit())
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s, "k"))
    # Nothing began executing, so the key is free and the retry does the work.
    r = asyncio.run(post(s, "k"))
    assert r.status_code == 200 and not s.ledger.attempts[1].replayed


def test_sync_client_shares_the_ledger() -> None:
    s = services()
    with s.sync_client() as client:
        assert client.post(URL, json=BODY).status_code == 200
    assert len(s.ledger.effects) == 1


def test_trials_are_isolated() -> None:
    a, b = services(LostReply()), services()

    async def go() -> None:
        async with a.client() as ca, b.client() as cb:
            await asyncio.gather(
                ca.post(URL, json=BODY), cb.post(URL, json=BODY), return_exceptions=True
            )

    asyncio.run(go())
    assert len(a.ledger.attempts) == len(b.ledger.attempts) == 1
    assert a.ledger.effects[0].id == b.ledger.effects[0].id == "re_1"


def test_get_fault_names_accepted_values() -> None:
    with pytest.raises(ValueError, match=r"unknown fault 'lost'.*lost_reply"):
        get_fault("lost")
    assert set(FAULTS) == {
        "none", "lost_reply", "timeout_before_commit", "error_after_commit",
        "error_before_commit", "rate_limited", "crash_after_commit",
    }  # fmt: skip


def test_ledger_of_a_sample_without_a_ledger_says_so() -> None:
    from types import SimpleNamespace

    from twice.mocks import LEDGER_STORE_KEY, Ledger, ledger_of, ledgers

    good = SimpleNamespace(id="s1", store={LEDGER_STORE_KEY: Ledger().to_dict()})
    assert ledgers(SimpleNamespace(samples=[good, good])) == [Ledger(), Ledger()]
    with pytest.raises(LookupError, match="sample 's2' has no ledger"):
        ledger_of(SimpleNamespace(id="s2", store={}))
