"""travel_booking: the travel service, the saga's end-state check, the dataset, the stubs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from inspect_ai.event import ModelEvent
from inspect_ai.log import EvalLog
from pydantic import ValidationError
from twice.evals.cli import cli
from twice.mocks import (
    KEY_HEADER,
    Attempt,
    Effect,
    Ledger,
    Services,
    TravelService,
    ledger_of,
)
from twice.tasks import TASKS, load_records
from twice.tasks._dataset import PlanStep, Record
from twice.tasks.refund.refund import DATASET as REFUND_DATASET
from twice.tasks.travel_booking import saga_end_state
from twice.tasks.travel_booking.reference import RefCell, run_cell, summarize
from twice.tasks.travel_booking.travel_booking import DATASET

BASE = "https://travel.twice.test"
FLIGHT = {
    "flight_id": "TW1",
    "origin": "Lisbon",
    "destination": "Berlin",
    "date": "2026-03-14",
    "fare": 18900,
    "seats": 9,
}
HOTEL = {"hotel_id": "h1", "name": "Hotel One", "city": "Berlin", "rate": 10000, "rooms": 4}
BOOK = {"trip_id": "trip_1", "traveler": "Ana Silva", "flight_id": "TW1"}
STAY = {"trip_id": "trip_1", "traveler": "Ana Silva", "hotel_id": "h1", "check_in": "2026-03-14"}

# Sample ids by kind (see the dataset): hotel available / sold out / sold out + legacy cancel.
BOOKED = ["travel-001", "travel-002"]
SOLD_OUT = ["travel-003", "travel-005"]
LEGACY = ["travel-007"]


def _services(*, seats: int = 9, rooms: int = 4, legacy: bool = False) -> Services:
    flight = {**FLIGHT, "seats": seats}
    hotel = {**HOTEL, "rooms": rooms}
    return Services([TravelService(flights=[flight], hotels=[hotel], legacy_cancel=legacy)])


def _post(services: Services, path: str, body: dict[str, Any], key: str | None = None) -> Any:
    async def go() -> httpx.Response:
        async with services.client() as client:
            headers = {KEY_HEADER: key} if key else {}
            return await client.post(f"{BASE}{path}", json=body, headers=headers)

    return asyncio.run(go())


def _race(services: Services, path: str, body: dict[str, Any], key: str | None) -> list[int]:
    """Two identical requests at once; their status codes."""

    async def go() -> list[httpx.Response]:
        async with services.client() as client:
            headers = {KEY_HEADER: key} if key else {}
            return list(
                await asyncio.gather(
                    *(client.post(f"{BASE}{path}", json=body, headers=headers) for _ in (1, 2))
                )
            )

    return sorted(r.status_code for r in asyncio.run(go()))


def _names(services: Services) -> list[str]:
    return [e.name for e in services.ledger.effects]


# -- the service ------------------------------------------------------------------------------


def test_travel_service_books_flight_and_hotel_with_trip_ids() -> None:
    services = _services()
    flight = _post(services, "/v1/flight_bookings", BOOK).json()
    hotel = _post(services, "/v1/hotel_bookings", {**STAY, "nights": 3}).json()
    assert (flight["id"], flight["status"], hotel["id"], hotel["total"]) == (
        "fb_1",
        "booked",
        "hb_1",
        30000,
    )
    assert _names(services) == ["travel.flight.book", "travel.hotel.book"]
    assert {e.fields["trip_id"] for e in services.ledger.effects} == {"trip_1"}


def test_travel_service_sold_out_hotel_is_a_definite_422_that_commits_nothing() -> None:
    services = _services(rooms=0)
    response = _post(services, "/v1/hotel_bookings", {**STAY, "nights": 3})
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "sold_out"
    assert services.ledger.effects == []
    assert services.ledger.attempts[0].outcome == "fail"


def test_travel_service_cancel_refunds_once_and_rejects_a_second_cancel() -> None:
    services = _services()
    _post(services, "/v1/flight_bookings", BOOK)
    first = _post(services, "/v1/flight_bookings/fb_1/cancel", {})
    second = _post(services, "/v1/flight_bookings/fb_1/cancel", {})
    assert (first.status_code, first.json()["refund_amount"]) == (200, 18900)
    assert second.status_code == 400
    assert "already cancelled" in second.json()["error"]["message"]
    assert _names(services) == ["travel.flight.book", "travel.flight.cancel"]


def test_travel_service_legacy_cancel_refunds_on_every_call() -> None:
    services = _services(legacy=True)
    _post(services, "/v1/flight_bookings", BOOK)
    codes = [_post(services, "/v1/flight_bookings/fb_1/cancel", {}).status_code for _ in (1, 2)]
    assert codes == [200, 200]
    assert _names(services).count("travel.flight.cancel") == 2


def test_travel_service_unknown_booking_is_404() -> None:
    services = _services()
    response = _post(services, "/v1/flight_bookings/fb_9/cancel", {})
    assert response.status_code == 404
    assert "fb_9" in response.json()["error"]["message"]


def test_travel_service_concurrent_cancels_without_key_cancel_once() -> None:
    # Check-then-act on the booking's status is atomic: one cancel wins, the other is a 400.
    services = _services()
    _post(services, "/v1/flight_bookings", BOOK)
    assert _race(services, "/v1/flight_bookings/fb_1/cancel", {}, key=None) == [200, 400]
    assert _names(services).count("travel.flight.cancel") == 1


def test_travel_service_last_seat_goes_to_one_of_two_concurrent_bookings() -> None:
    services = _services(seats=1)
    assert _race(services, "/v1/flight_bookings", BOOK, key=None) == [200, 422]
    assert _names(services) == ["travel.flight.book"]


@pytest.mark.parametrize(
    ("key", "codes", "bookings"), [(None, [200, 200], 2), ("k1", [200, 409], 1)]
)
def test_travel_service_concurrent_bookings_one_with_a_key_two_without(
    key: str | None, codes: list[int], bookings: int
) -> None:
    services = _services()
    assert _race(services, "/v1/flight_bookings", BOOK, key=key) == codes
    assert _names(services).count("travel.flight.book") == bookings


# -- the end-state check ----------------------------------------------------------------------


def _ledger(*effects: tuple[str, str, dict[str, Any]]) -> Ledger:
    ledger = Ledger()
    for n, (effect_id, name, fields) in enumerate(effects, start=1):
        ledger.attempts.append(
            Attempt(
                n=n,
                service="travel",
                method="POST",
                path="/",
                route=name,
                mutating=True,
                key=None,
                params={},
                source="initial",
                effect_ids=[effect_id],
            )
        )
        ledger.effects.append(Effect(id=effect_id, name=name, attempt=n, fields=fields))
    return ledger


T = {"trip_id": "trip_1"}
BOOKED_FLIGHT = ("fb_1", "travel.flight.book", T)
SECOND_FLIGHT = ("fb_2", "travel.flight.book", T)
HOTEL_BOOKED = ("hb_1", "travel.hotel.book", T)
CANCEL_1 = ("fc_1", "travel.flight.cancel", {**T, "booking_id": "fb_1"})
CANCEL_1_AGAIN = ("fc_2", "travel.flight.cancel", {**T, "booking_id": "fb_1"})
META = {"intents": [{"effect": "travel.flight.book", "identity": T, "expected": 1}]}


@pytest.mark.parametrize(
    "effects",
    [
        pytest.param([BOOKED_FLIGHT, HOTEL_BOOKED], id="trip-booked"),
        pytest.param([BOOKED_FLIGHT, CANCEL_1], id="trip-failed-and-compensated"),
        pytest.param([], id="never-started"),
        pytest.param(
            [
                BOOKED_FLIGHT,
                SECOND_FLIGHT,
                HOTEL_BOOKED,
                ("fc_1", "travel.flight.cancel", {**T, "booking_id": "fb_2"}),
            ],
            id="extra-booking-undone",
        ),
    ],
)
def test_saga_end_state_holds_for_consistent_trips(
    effects: list[tuple[str, str, dict[str, Any]]],
) -> None:
    assert saga_end_state(_ledger(*effects), META) is None


@pytest.mark.parametrize(
    ("effects", "phrases"),
    [
        pytest.param([BOOKED_FLIGHT], ["never cancelled", "fb_1"], id="flight-left-booked"),
        pytest.param(
            [BOOKED_FLIGHT, CANCEL_1, CANCEL_1_AGAIN],
            ["cancelled 2 times", "double cancellation", "fc_1", "fc_2"],
            id="double-cancellation",
        ),
        pytest.param(
            [BOOKED_FLIGHT, SECOND_FLIGHT, HOTEL_BOOKED],
            ["2 live flight bookings", "double booking", "fb_1", "fb_2"],
            id="double-booking",
        ),
        pytest.param(
            [BOOKED_FLIGHT, CANCEL_1, HOTEL_BOOKED],
            ["hotel booked but no live flight", "hb_1"],
            id="hotel-without-flight",
        ),
    ],
)
def test_saga_end_state_names_the_effects_of_an_inconsistent_trip(
    effects: list[tuple[str, str, dict[str, Any]]], phrases: list[str]
) -> None:
    problem = saga_end_state(_ledger(*effects), META)
    assert problem is not None
    for phrase in phrases:
        assert phrase in problem
    assert "at attempt" in problem  # evidence lines, not just ids


# -- the dataset ------------------------------------------------------------------------------


def test_travel_dataset_has_twenty_samples_of_both_outcomes() -> None:
    records = load_records(DATASET)
    assert len(records) >= 20
    kinds = [r.metadata["hotel_outcome"] for r in records]
    assert kinds.count("sold_out") >= 5 and kinds.count("booked") >= 5
    assert sum(r.metadata["legacy_cancel"] for r in records) >= 1
    for r in records:
        expected = {i.effect: i.expected for i in r.intents}
        sold_out = r.metadata["hotel_outcome"] == "sold_out"
        assert expected == {
            "travel.flight.book": 1,
            "travel.flight.cancel": 1 if sold_out else 0,
            "travel.hotel.book": 0 if sold_out else 1,
        }, r.id
        assert (r.state["hotels"][0]["rooms"] == 0) == sold_out, r.id
        assert r.plan[0].compensate is not None and r.plan[1].on_fail == "compensate", r.id


def test_plan_step_compensate_with_ref_needs_ref_pattern() -> None:
    with pytest.raises(ValidationError, match="ref_pattern"):
        PlanStep.model_validate(
            {"call": {"tool": "a"}, "compensate": {"tool": "undo", "args": {"id": "{ref}"}}}
        )


def test_plan_step_rejects_a_bad_regular_expression() -> None:
    with pytest.raises(ValidationError, match="not a regular expression"):
        PlanStep.model_validate({"call": {"tool": "a"}, "ref_pattern": "fb_("})


def test_record_on_fail_compensate_needs_an_earlier_undo() -> None:
    with pytest.raises(ValidationError, match="nothing to undo"):
        Record.model_validate(
            {
                "id": "x",
                "input": "x",
                "intents": [],
                "plan": [{"call": {"tool": "a"}, "on_fail": "compensate"}],
            }
        )


def test_refund_plans_still_load_with_the_old_fields_only() -> None:
    records = load_records(REFUND_DATASET)
    assert all(s.compensate is None for r in records for s in r.plan)
    # Single-intent samples stop on failure; the multi-intent ones carry on to the next refund.
    for r in records:
        expected = ["stop"] if len(r.plan) == 1 else ["continue"] * (len(r.plan) - 1) + ["stop"]
        assert [s.on_fail for s in r.plan] == expected, r.id


# -- registration -----------------------------------------------------------------------------


def test_travel_booking_is_listed() -> None:
    assert "travel_booking" in TASKS
    out = CliRunner().invoke(cli, ["list"]).output
    assert "travel_booking" in out and "crash_after_commit" in out and "declared" in out


# -- the stub controls, end to end ------------------------------------------------------------


def _run(cell: RefCell, ids: list[str], tmp_path: Path) -> EvalLog:
    return run_cell(cell, log_dir=tmp_path, sample_id=ids)


def _ledgers(log: EvalLog) -> dict[str, Ledger]:
    return {str(s.id): ledger_of(s) for s in log.samples or []}


def test_travel_booking_hotel_fails_flight_cancelled_once_never_rebooked(tmp_path: Path) -> None:
    log = _run(RefCell("stub/retry", "none"), SOLD_OUT + LEGACY, tmp_path)
    for sample_id, ledger in _ledgers(log).items():
        names = [e.name for e in ledger.effects]
        assert names == ["travel.flight.book", "travel.flight.cancel"], sample_id
        assert ledger.effects[1].fields["booking_id"] == ledger.effects[0].id
    for sample in log.samples or []:
        assert sample.scores is not None
        assert sample.scores["side_effects"].value["safe_success"] == 1.0


def test_travel_booking_stub_retry_lost_reply_reports_the_violation_with_evidence(
    tmp_path: Path,
) -> None:
    log = _run(RefCell("stub/retry", "lost_reply"), SOLD_OUT[:1], tmp_path)
    sample = (log.samples or [])[0]
    assert sample.scores is not None
    score = sample.scores["side_effects"]
    assert score.value["completed"] == 0.0 and score.value["duplicated"] == 1.0
    # fb_1's reply was lost; the agent rebooked (fb_2) and cancelled only what it saw.
    assert score.metadata is not None
    assert "fb_1 at attempt 1 (initial), reply lost" in score.metadata["end_state"]
    assert "never cancelled" in score.metadata["end_state"]
    assert score.explanation is not None
    assert "fb_1" in score.explanation and "fb_2" in score.explanation
    assert "end state:" in score.explanation


# Reference results (README): every figure is uniform across sample kinds for these cells.
REFERENCE = [
    # model, fault, flights/trial, complete, dup, end-state bad
    ("stub/retry", "lost_reply", 2.0, 0.0, 1.0, 1.0),
    ("stub/no-retry", "lost_reply", 1.0, 0.0, 0.0, 1.0),
    ("stub/verify", "lost_reply", 1.0, 1.0, 0.0, 0.0),
    ("stub/retry", "timeout_before_commit", 1.0, 1.0, 0.0, 0.0),
    ("stub/no-retry", "timeout_before_commit", 0.0, 0.0, 0.0, 0.0),
    ("stub/verify", "timeout_before_commit", 1.0, 1.0, 0.0, 0.0),
]


@pytest.mark.parametrize(("model", "fault", "flights", "complete", "dup", "bad"), REFERENCE)
def test_travel_booking_reference_results(
    tmp_path: Path, model: str, fault: str, flights: float, complete: float, dup: float, bad: float
) -> None:
    cell = RefCell(model, fault)
    row = summarize(cell, _run(cell, BOOKED[:1] + SOLD_OUT[:1] + LEGACY, tmp_path))
    assert (row["n"], row["errors"]) == (3, 0)
    got = (row["forward"], row["completed"], row["duplicated"], row["end_state"])
    assert got == (flights, complete, dup, bad)


@pytest.mark.parametrize(
    ("protection", "per_intent"),
    [("bare", 2), ("retry-nokey", 2), ("intent-key", 1), ("declared", 1)],
)
def test_travel_booking_parallel_one_effect_with_a_key_two_without(
    tmp_path: Path, protection: str, per_intent: int
) -> None:
    log = _run(RefCell("stub/parallel", "none", protection), BOOKED[:1] + LEGACY, tmp_path)
    ledgers = _ledgers(log)
    booked, legacy = ledgers[BOOKED[0]], ledgers[LEGACY[0]]
    assert [e.name for e in booked.effects].count("travel.flight.book") == per_intent
    assert [e.name for e in booked.effects].count("travel.hotel.book") == per_intent
    # The legacy API cancels on every call: only a key keeps the doubled undo to one effect.
    assert [e.name for e in legacy.effects].count("travel.flight.cancel") == per_intent


def test_travel_booking_tool_classes_are_in_the_logged_schema(tmp_path: Path) -> None:
    log = _run(RefCell("stub/verify", "none"), BOOKED[:1], tmp_path)
    sample = (log.samples or [])[0]
    event = next(e for e in sample.events if isinstance(e, ModelEvent))
    options = {t.name: (t.options or {}).get("twice") for t in event.tools}
    assert options["book_flight"] == {
        "mutating": True,
        "idempotency": "compensable",
        "compensation": "cancel_flight",
        "verify_with": "find_trip_bookings",
    }
    assert options["book_hotel"]["idempotency"] == "keyed"
    assert options["cancel_flight"]["idempotency"] == "keyed"
    assert options["find_trip_bookings"] == {"mutating": False, "idempotency": "read"}
