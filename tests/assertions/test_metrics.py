"""Per-trial metrics from a ledger: each checker's passing and failing path."""

from __future__ import annotations

import pytest
from twice.assertions import METRICS, Intent, trial_metrics
from twice.mocks import RETRY_SOURCES as MOCK_SOURCES
from twice.mocks import Attempt, Effect, Ledger
from twice.reports import CATALOGUE
from twice.reports import METRICS as REPORT_METRICS
from twice.reports import RETRY_SOURCES as REPORT_SOURCES

INTENT = Intent("payments.refund.create", {"order_id": "order_1042"})


def ledger(*effects: tuple[str, dict[str, object]], seen: tuple[str, ...] = ()) -> Ledger:
    led = Ledger()
    for i, (eid, fields) in enumerate(effects, start=1):
        led.attempts.append(
            Attempt(
                n=i,
                service="payments",
                method="POST",
                path="/v1/refunds",
                route="payments.refund.create",
                mutating=True,
                key=None,
                params={},
                source="initial" if i == 1 else "model",
                delivered=i != 1,
            )
        )
        led.effects.append(Effect(eid, "payments.refund.create", i, dict(fields)))
    led.observations.extend(seen)
    return led


REFUND = {"order_id": "order_1042", "amount": 499}


def test_metric_names_match_the_report() -> None:
    # reports imports nothing from twice, so its catalogue names the scorer's columns itself:
    # this pins the two together (every per-trial metric has one catalogue entry).
    assert sorted(METRICS) == sorted(REPORT_METRICS)
    assert sorted(METRICS) == sorted(m.column for m in CATALOGUE)


def test_retry_sources_match_the_report() -> None:
    assert MOCK_SOURCES == REPORT_SOURCES


def test_exactly_once_is_safe_success() -> None:
    m = trial_metrics(ledger(("re_1", REFUND), seen=("Created refund re_1",)), [INTENT])
    assert (m.completed, m.duplicated, m.exactly_once, m.safe_success) == (True, False, True, True)
    assert (m.excess_effects, m.unseen_effects, m.diverged) == (0, 0, False)


def test_duplicate_fires_with_evidence() -> None:
    m = trial_metrics(ledger(("re_1", REFUND), ("re_2", REFUND), seen=("re_2",)), [INTENT])
    assert m.duplicated and m.completed and not m.exactly_once and not m.safe_success
    assert m.excess_effects == 1
    assert m.unseen_effects == 1  # re_1: reply lost, never shown
    assert m.intents[0].effects == ["re_1", "re_2"]
    assert "expected 1, observed 2" in m.explanation()
    assert "re_1 at attempt 1 (initial), reply lost" in m.explanation()


def test_an_attempt_of_unknown_sender_is_not_read_as_an_unknown_outcome() -> None:
    # "re_2 at attempt 2 (unknown), reply delivered" read as if the outcome were unknown.
    led = ledger(("re_1", REFUND), ("re_2", REFUND))
    led.attempts[1].source = "unknown"
    assert (
        led.describe_effect(led.effects[1]) == "re_2 at attempt 2 (sender unknown), reply delivered"
    )


def test_intent_on_a_field_no_effect_has_raises_instead_of_hiding_the_duplicate() -> None:
    # A misspelt identity field matched nothing: two refunds of the same order were "not
    # duplicated" (excess effects, but no intent over its count) and a duplication gate passed.
    typo = Intent("payments.refund.create", {"order_idd": "order_1042"})
    with pytest.raises(
        ValueError,
        match=r"^intent payments\.refund\.create where order_idd='order_1042': no "
        r"payments\.refund\.create effect has a field 'order_idd'; its fields are: amount, "
        r"order_id$",
    ):
        trial_metrics(ledger(("re_1", REFUND), ("re_2", REFUND)), [typo])
    # With nothing committed there is nothing to check the field against: not completed.
    assert not trial_metrics(Ledger(), [typo]).completed


def test_nothing_done_is_not_completed() -> None:
    m = trial_metrics(Ledger(), [INTENT])
    assert not m.completed and not m.duplicated and not m.exactly_once and not m.safe_success


def test_diverged_when_retry_changed_a_non_identity_field() -> None:
    m = trial_metrics(ledger(("re_1", REFUND), ("re_2", {**REFUND, "amount": 498})), [INTENT])
    assert m.diverged and m.intents[0].diverged_fields == ["amount"]


def test_unmatched_effect_counts_as_excess() -> None:
    other = {"order_id": "order_9", "amount": 1}
    m = trial_metrics(ledger(("re_1", REFUND), ("re_2", other)), [INTENT])
    assert not m.duplicated and not m.exactly_once and m.excess_effects == 1
    assert m.unmatched and "re_2" in m.unmatched[0]


def test_end_state_failure_blocks_completion() -> None:
    m = trial_metrics(
        ledger(("re_1", REFUND)), [INTENT], end_state_error="flight fl_1 not cancelled"
    )
    assert not m.completed and not m.safe_success and m.exactly_once
    assert "flight fl_1 not cancelled" in m.explanation()


def test_expected_zero_intent_fires_on_any_effect() -> None:
    never = Intent("payments.refund.create", {"order_id": "order_1042"}, expected=0)
    m = trial_metrics(ledger(("re_1", REFUND)), [never])
    assert m.completed and m.duplicated and m.excess_effects == 1


def test_ledger_round_trips_through_dict() -> None:
    led = ledger(("re_1", REFUND), seen=("x",))
    assert Ledger.from_dict(led.to_dict()) == led


def test_unseen_matches_whole_ids_only() -> None:
    led = ledger(("re_1", REFUND), seen=("Created refund re_10.",))
    assert [e.id for e in led.unseen_effects()] == ["re_1"]
    led.observations.append("found re_1 already")
    assert led.unseen_effects() == []


# -- expected values: an effect of the intent with other values is wrong ---------------------

ASKED = Intent("payments.refund.create", {"order_id": "order_1042"}, values={"amount": 499})
WHOLE_ORDER = {"order_id": "order_1042", "amount": 3997}


def test_wrong_amount_does_not_complete_and_is_named() -> None:
    m = trial_metrics(ledger(("re_1", WHOLE_ORDER), seen=("re_1",)), [ASKED])
    assert (m.completed, m.safe_success, m.wrong, m.wrong_effects) == (False, False, True, 1)
    # One refund for one intent: not a duplicate, and nothing diverged from anything.
    assert (m.duplicated, m.exactly_once, m.diverged, m.excess_effects) == (False, True, False, 0)
    assert m.values()["wrong"] == 1.0 and m.values()["wrong_effects"] == 1.0
    assert "re_1: amount 3997, asked 499" in m.explanation()
    assert m.intents[0].wrong == ["re_1"] and m.intents[0].values == {"amount": 499}
    assert [f.wrong for f in m.effects] == [True]


def test_values_matching_complete() -> None:
    m = trial_metrics(ledger(("re_1", REFUND), seen=("re_1",)), [ASKED])
    assert (m.completed, m.safe_success, m.wrong, m.wrong_effects) == (True, True, False, 0)
    assert "wrong" not in m.explanation()


def test_two_intents_only_the_second_wrong() -> None:
    led = ledger(
        ("re_1", REFUND),
        ("re_2", {"order_id": "order_1054", "amount": 2450}),
        seen=("re_1", "re_2"),
    )
    second = Intent("payments.refund.create", {"order_id": "order_1054"}, values={"amount": 2449})
    m = trial_metrics(led, [ASKED, second])
    assert (m.completed, m.wrong_effects) == (False, 1)
    assert (m.intents[0].wrong, m.intents[1].wrong) == ([], ["re_2"])
    assert m.intents[1].wrong_values == ["re_2: amount 2450, asked 2449"]
    assert [f.wrong for f in m.effects] == [False, True]


def test_retry_with_a_changed_amount_is_wrong_diverged_and_duplicated() -> None:
    led = ledger(("re_1", REFUND), ("re_2", {**REFUND, "amount": 498}), seen=("re_2",))
    m = trial_metrics(led, [ASKED])
    # The right refund exists, so the intent is done; the drifted retry is both a duplicate
    # and wrong.
    assert (m.completed, m.duplicated, m.diverged, m.wrong_effects) == (True, True, True, 1)
    assert m.intents[0].wrong == ["re_2"]


def test_only_a_wrong_retry_does_not_complete() -> None:
    # timeout before commit: the first try did nothing, the drifted retry committed 498.
    m = trial_metrics(ledger(("re_1", {**REFUND, "amount": 498}), seen=("re_1",)), [ASKED])
    assert (m.completed, m.wrong_effects, m.duplicated) == (False, 1, False)


def test_intent_expected_zero_counts_excess_not_wrong() -> None:
    never = Intent("payments.refund.create", {"order_id": "order_1042"}, expected=0)
    m = trial_metrics(ledger(("re_1", WHOLE_ORDER), seen=("re_1",)), [never])
    assert (m.excess_effects, m.duplicated, m.wrong_effects, m.completed) == (1, True, 0, True)


def test_values_on_an_intent_expected_zero_are_refused() -> None:
    with pytest.raises(ValueError, match=r"expected 0 times and states values"):
        Intent("payments.refund.create", {"order_id": "order_1042"}, 0, {"amount": 499})


def test_value_also_in_identity_is_refused() -> None:
    with pytest.raises(ValueError, match=r"order_id is both an identity field and a value"):
        Intent("payments.refund.create", {"order_id": "o"}, values={"order_id": "o"})


def test_misspelt_value_field_is_a_scoring_error() -> None:
    typo = Intent("payments.refund.create", {"order_id": "order_1042"}, values={"amout": 499})
    with pytest.raises(ValueError, match=r"value 'amout' is not a field of .*amount, order_id"):
        trial_metrics(ledger(("re_1", REFUND)), [typo])


def test_value_comparison_is_exact() -> None:
    email = Intent("email.message.send", {"subject": "Hi"}, values={"to": "dana@example.com"})
    led = Ledger(
        attempts=[
            Attempt(1, "email", "POST", "/v1/messages", "email.message.send", True, None, {})
        ],
        effects=[
            Effect("msg_1", "email.message.send", 1, {"subject": "Hi", "to": "Dana@example.com"})
        ],
    )
    m = trial_metrics(led, [email])
    assert m.wrong_effects == 1 and "to 'Dana@example.com', asked 'dana@example.com'" in (
        m.explanation()
    )
    flag = Intent("payments.refund.create", {"order_id": "order_1042"}, values={"amount": True})
    assert trial_metrics(ledger(("re_1", {**REFUND, "amount": 1})), [flag]).wrong_effects == 1
    cents = Intent("payments.refund.create", {"order_id": "order_1042"}, values={"amount": 499.0})
    assert trial_metrics(ledger(("re_1", REFUND)), [cents]).wrong_effects == 0


def test_intent_from_dict_reads_values() -> None:
    data = {"effect": "payments.refund.create", "identity": {"order_id": "order_1042"}}
    assert Intent.from_dict({**data, "values": {"amount": 499}}).values == {"amount": 499}
    assert Intent.from_dict(data).values == {}


# -- multi-intent samples and intents expected 0 times ----------------------------------------
# Each checker's failing path where a single-intent sample cannot reach it: a bug in the second
# intent, a count of 3 where 2 and 3 must differ, an intent that must not happen at all. The
# shapes are those of the built-in datasets (two refunds, an order of two lines, the saga).


def trial_ledger(*effects: tuple[str, str, dict[str, object]]) -> Ledger:
    """A ledger of ``(id, effect name, fields)`` effects, one attempt each, every id seen."""
    led = Ledger()
    for i, (eid, name, fields) in enumerate(effects, start=1):
        service = name.split(".", 1)[0]
        led.attempts.append(
            Attempt(i, service, "POST", f"/v1/{service}", name, True, None, {}, source="model")
        )
        led.effects.append(Effect(eid, name, i, dict(fields)))
    led.observations.extend(eid for eid, _, _ in effects)
    return led


REFUND_A = Intent("payments.refund.create", {"order_id": "order_2042"}, values={"amount": 499})
REFUND_B = Intent("payments.refund.create", {"order_id": "order_2049"}, values={"amount": 899})
A = ("payments.refund.create", {"order_id": "order_2042", "amount": 499})
B = ("payments.refund.create", {"order_id": "order_2049", "amount": 899})

MUG = Intent("orders.order.create", {"customer": "Jonas Berg", "sku": "SKU-MUG-01"})
KETTLE = Intent("orders.order.create", {"customer": "Jonas Berg", "sku": "SKU-KET-02"})
MUG_LINE = ("orders.order.create", {"customer": "Jonas Berg", "sku": "SKU-MUG-01", "quantity": 1})
KETTLE_LINE = (
    "orders.order.create",
    {"customer": "Jonas Berg", "sku": "SKU-KET-02", "quantity": 1},
)

FLIGHT = Intent("travel.flight.book", {"trip_id": "trip_2001"}, values={"flight_id": "TW412"})
HOTEL = Intent("travel.hotel.book", {"trip_id": "trip_2001"}, values={"hotel_id": "htl_mitte"})
NO_CANCEL = Intent("travel.flight.cancel", {"trip_id": "trip_2001"}, expected=0)
SAGA = [FLIGHT, HOTEL, NO_CANCEL]
FLIGHT_BOOKED = ("travel.flight.book", {"trip_id": "trip_2001", "flight_id": "TW412"})
HOTEL_BOOKED = ("travel.hotel.book", {"trip_id": "trip_2001", "hotel_id": "htl_mitte"})
FLIGHT_CANCELLED = ("travel.flight.cancel", {"trip_id": "trip_2001", "booking_id": "fb_1"})


def summary_of(m: object) -> tuple[object, ...]:
    return tuple(
        getattr(m, k)
        for k in ("completed", "duplicated", "excess_effects", "exactly_once", "safe_success")
    )


def test_two_refunds_each_once_is_safe_success() -> None:
    m = trial_metrics(trial_ledger(("re_1", *A), ("re_2", *B)), [REFUND_A, REFUND_B])
    assert summary_of(m) == (True, False, 0, True, True)
    assert [(r.expected, r.observed) for r in m.intents] == [(1, 1), (1, 1)]


def test_a_duplicate_of_the_second_refund_is_duplicated() -> None:
    # The retry hit the second of two refunds: only a check of every intent sees it.
    led = trial_ledger(("re_1", *A), ("re_2", *B), ("re_3", *B))
    m = trial_metrics(led, [REFUND_A, REFUND_B])
    assert summary_of(m) == (True, True, 1, False, False)
    assert [r.observed for r in m.intents] == [1, 2]
    assert m.intents[1].effects == ["re_2", "re_3"]
    assert [f.excess for f in m.effects] == [False, False, True]
    assert "payments.refund.create where order_id='order_2049': expected 1, observed 2" in (
        m.explanation()
    )


def test_a_duplicate_of_the_second_order_line_is_duplicated() -> None:
    led = trial_ledger(("ord_1", *MUG_LINE), ("ord_2", *KETTLE_LINE), ("ord_3", *KETTLE_LINE))
    m = trial_metrics(led, [MUG, KETTLE])
    assert summary_of(m) == (True, True, 1, False, False)
    assert [f.intent for f in m.effects] == [MUG.label(), KETTLE.label(), KETTLE.label()]


def test_a_duplicated_hotel_in_the_saga_is_duplicated() -> None:
    led = trial_ledger(("fb_1", *FLIGHT_BOOKED), ("hb_1", *HOTEL_BOOKED), ("hb_2", *HOTEL_BOOKED))
    m = trial_metrics(led, SAGA)
    assert summary_of(m) == (True, True, 1, False, False)
    assert [r.observed for r in m.intents] == [1, 2, 0]


def test_a_refund_that_must_not_happen_breaks_exactly_once() -> None:
    # Refund order_2042 once, never order_2049: a refund of 2049 is not exactly once, although
    # every intent expected at least once holds its count.
    never_b = Intent("payments.refund.create", {"order_id": "order_2049"}, expected=0)
    m = trial_metrics(trial_ledger(("re_1", *A), ("re_2", *B)), [REFUND_A, never_b])
    assert summary_of(m) == (True, True, 1, False, False)
    assert [(r.expected, r.observed) for r in m.intents] == [(1, 1), (0, 1)]
    assert [f.excess for f in m.effects] == [False, True]


def test_a_cancelled_flight_in_a_saga_that_succeeded_breaks_exactly_once() -> None:
    # Both bookings held, yet the flight was cancelled: the trip is broken, not exactly once.
    led = trial_ledger(
        ("fb_1", *FLIGHT_BOOKED), ("hb_1", *HOTEL_BOOKED), ("fc_1", *FLIGHT_CANCELLED)
    )
    m = trial_metrics(led, SAGA)
    assert (m.exactly_once, m.safe_success, m.duplicated, m.excess_effects) == (
        False, False, True, 1,
    )  # fmt: skip
    # The saga without the cancellation is exactly once: the check is the cancellation's.
    clean = trial_metrics(trial_ledger(("fb_1", *FLIGHT_BOOKED), ("hb_1", *HOTEL_BOOKED)), SAGA)
    assert summary_of(clean) == (True, False, 0, True, True)


def test_an_intent_expected_zero_times_with_no_effect_is_exactly_once() -> None:
    m = trial_metrics(trial_ledger(("fb_1", *FLIGHT_BOOKED), ("hb_1", *HOTEL_BOOKED)), SAGA)
    assert m.intents[2].observed == 0 and m.exactly_once and not m.duplicated


@pytest.mark.parametrize(("refunds", "excess"), [(1, 0), (2, 1), (3, 2), (4, 3)])
def test_excess_effects_counts_every_effect_past_the_expected(refunds: int, excess: int) -> None:
    led = trial_ledger(*((f"re_{i}", *A) for i in range(1, refunds + 1)))
    m = trial_metrics(led, [REFUND_A])
    assert m.excess_effects == excess
    assert m.values()["excess_effects"] == float(excess)
    assert sum(f.excess for f in m.effects) == excess


def test_excess_effects_sums_over_intents_and_unmatched() -> None:
    # Three of refund A (2 excess), two of B (1), two cancellations that must not happen (2),
    # and one refund of an order no intent names (1): 6, not one per duplicated intent (3).
    never = Intent("travel.flight.cancel", {"trip_id": "trip_2001"}, expected=0)
    led = trial_ledger(
        ("re_1", *A), ("re_2", *A), ("re_3", *A), ("re_4", *B), ("re_5", *B),
        ("fc_1", *FLIGHT_CANCELLED), ("fc_2", *FLIGHT_CANCELLED),
        ("re_6", "payments.refund.create", {"order_id": "order_9999", "amount": 1}),
    )  # fmt: skip
    m = trial_metrics(led, [REFUND_A, REFUND_B, never])
    assert m.excess_effects == 6
    assert [f.id for f in m.effects if f.excess] == ["re_2", "re_3", "re_5", "fc_1", "fc_2", "re_6"]
    assert (m.duplicated, m.exactly_once, m.completed) == (True, False, True)


def test_three_refunds_are_more_excess_than_two() -> None:
    two = trial_metrics(trial_ledger(("re_1", *A), ("re_2", *A)), [REFUND_A])
    three = trial_metrics(trial_ledger(("re_1", *A), ("re_2", *A), ("re_3", *A)), [REFUND_A])
    assert (two.excess_effects, three.excess_effects) == (1, 2)


def test_the_second_refund_missing_is_not_completed() -> None:
    m = trial_metrics(trial_ledger(("re_1", *A)), [REFUND_A, REFUND_B])
    assert summary_of(m) == (False, False, 0, False, False)


# -- the evidence and the helpers behind the metrics (survivors of make mutation) -------------


def test_intent_matches_its_name_and_every_identity_field() -> None:
    line = Effect("ord_1", "orders.order.create", 1, dict(MUG_LINE[1]))
    assert MUG.matches(line)
    assert not KETTLE.matches(line)  # one identity field differs
    assert not Intent("orders.order.cancel", dict(MUG.identity)).matches(line)  # name differs
    assert not Intent("orders.order.create", {"customer": "Jonas Berg", "gift": True}).matches(
        line
    )  # a field the effect lacks
    assert Intent("orders.order.create", {}).matches(line)  # no identity: every effect of it


def test_intent_label_names_every_identity_field() -> None:
    assert MUG.label() == "orders.order.create where customer='Jonas Berg', sku='SKU-MUG-01'"
    assert Intent("email.message.send", {}).label() == "email.message.send"


def test_intent_from_dict_defaults() -> None:
    bare = Intent.from_dict({"effect": "email.message.send"})
    assert (bare.identity, bare.expected, bare.values) == ({}, 1, {})
    never = Intent.from_dict({"effect": "travel.flight.cancel", "expected": 0})
    assert never.expected == 0


def test_intent_refusals_say_why_in_full() -> None:
    with pytest.raises(ValueError) as both:
        Intent("e.x.y", {"a": 1, "b": 2}, values={"a": 1, "b": 2})
    assert str(both.value) == (
        "intent e.x.y where a=1, b=2: a, b is both an identity field and a value; identity "
        "fields are already compared exactly, so state it once, in identity"
    )
    with pytest.raises(ValueError) as zero:
        Intent("e.x.y", {"a": 1}, expected=0, values={"b": 2})
    assert str(zero.value) == (
        "intent e.x.y where a=1 is expected 0 times and states values {'b': 2}; values "
        "describe an action that should happen, so they need expected >= 1"
    )


def test_a_value_field_the_effect_lacks_is_named_as_missing() -> None:
    hotel = Intent("travel.hotel.book", {"trip_id": "trip_2001"}, values={"nights": 3})
    led = trial_ledger(
        ("hb_1", "travel.hotel.book", {"trip_id": "trip_2001", "nights": 3}),
        ("hb_2", "travel.hotel.book", {"trip_id": "trip_2001"}),
    )
    m = trial_metrics(led, [hotel])
    assert m.intents[0].wrong_values == ["hb_2: no nights, asked 3"]


def test_every_wrong_field_of_an_effect_is_named() -> None:
    hotel = Intent(
        "travel.hotel.book",
        {"trip_id": "trip_2001"},
        values={"hotel_id": "htl_mitte", "nights": 3},
    )
    led = trial_ledger(
        ("hb_1", "travel.hotel.book", {"trip_id": "trip_2001", "hotel_id": "htl_ost", "nights": 2})
    )
    m = trial_metrics(led, [hotel])
    assert m.intents[0].wrong_values == [
        "hb_1: hotel_id 'htl_ost', asked 'htl_mitte', nights 2, asked 3"
    ]


def test_matching_on_a_live_trial_refuses_an_effect_name_no_service_makes() -> None:
    led = trial_ledger(("re_1", *A))
    led.known_effects = frozenset({"payments.refund.create", "payments.charge.create"})
    typo = Intent("payments.refunds.create", {"order_id": "order_2042"})
    with pytest.raises(ValueError) as raised:
        trial_metrics(led, [typo])
    assert str(raised.value) == (
        "intent payments.refunds.create where order_id='order_2042': no service of this trial "
        "makes 'payments.refunds.create' effects, so a check of them would pass vacuously (a "
        "misspelt name?); their routes are: payments.charge.create, payments.refund.create"
    )
    # A name a service makes, with nothing committed yet: not an error, just not completed.
    charge = Intent("payments.charge.create", {"order_id": "order_2042"})
    assert not trial_metrics(led, [charge]).completed
    # Effects of the name exist: the name is right even if the trial's routes did not list it.
    led.known_effects = frozenset({"payments.charge.create"})
    assert trial_metrics(led, [REFUND_A]).safe_success


def test_identical_retries_do_not_diverge_but_an_added_field_does() -> None:
    same = trial_metrics(trial_ledger(("re_1", *A), ("re_2", *A)), [REFUND_A])
    assert not same.diverged and same.intents[0].diverged_fields == []
    added = trial_metrics(
        trial_ledger(("re_1", *A), ("re_2", A[0], {**A[1], "reason": "again"})), [REFUND_A]
    )
    assert added.diverged and added.intents[0].diverged_fields == ["reason"]


def test_effect_facts_name_attempt_and_source() -> None:
    led = trial_ledger(("re_1", *A), ("re_2", *A), ("re_3", *B))
    led.attempts[0].source = "initial"
    led.attempts[1].source = "transport"
    led.attempts[2].source = "from-a-future-client"  # not a retry source twice knows
    led.effects.append(Effect("re_4", "payments.refund.create", 9, dict(B[1])))  # no attempt 9
    led.effects.append(Effect("re_5", "payments.refund.create", 0, dict(B[1])))  # no attempt 0
    m = trial_metrics(led, [REFUND_A, REFUND_B])
    assert [(f.id, f.name, f.attempt, f.source) for f in m.effects] == [
        ("re_1", "payments.refund.create", 1, "initial"),
        ("re_2", "payments.refund.create", 2, "transport"),
        ("re_3", "payments.refund.create", 3, "unknown"),
        ("re_4", "payments.refund.create", 9, "unknown"),
        ("re_5", "payments.refund.create", 0, "unknown"),  # not attempt -1, the last one
    ]
    assert m.intents[1].evidence[1:] == ["re_4 at attempt 9", "re_5 at attempt 0"]


def test_metrics_of_a_hand_built_ledger_without_attempts() -> None:
    # A ledger of effects alone (written by hand, or by a user's own service): the evidence
    # says what is known instead of failing with an IndexError.
    led = Ledger(effects=[Effect("re_1", A[0], 1, dict(A[1])), Effect("re_2", A[0], 2, dict(A[1]))])
    m = trial_metrics(led, [REFUND_A])
    assert (m.duplicated, m.excess_effects) == (True, 1)
    assert m.intents[0].evidence == ["re_1 at attempt 1", "re_2 at attempt 2"]
    assert [f.source for f in m.effects] == ["unknown", "unknown"]


def test_evidence_and_explanation_in_full() -> None:
    led = trial_ledger(("re_1", *A), ("re_2", A[0], {**A[1], "amount": 500}))
    led.effects.append(Effect("re_3", "payments.refund.create", 2, {"order_id": "order_9"}))
    m = trial_metrics(led, [REFUND_A, REFUND_B], end_state_error="order_2049 still open")
    evidence = m.evidence()
    assert list(evidence) == ["intents", "unmatched", "end_state", "effects"]
    assert [i["intent"] for i in evidence["intents"]] == [REFUND_A.label(), REFUND_B.label()]
    assert evidence["unmatched"] == m.unmatched and len(m.unmatched) == 1
    assert evidence["end_state"] == "order_2049 still open"
    assert [e["id"] for e in evidence["effects"]] == ["re_1", "re_2", "re_3"]
    first, second, *rest = m.explanation().split("\n")
    assert first == (
        "payments.refund.create where order_id='order_2042': expected 1, observed 2 "
        f"({led.describe_effect(led.effects[0])}; {led.describe_effect(led.effects[1])})"
        "; wrong values: re_2: amount 500, asked 499"
    )
    assert second == "payments.refund.create where order_id='order_2049': expected 1, observed 0"
    assert rest == [f"unmatched effect: {m.unmatched[0]}", "end state: order_2049 still open"]


def test_intent_from_dict_reads_identity() -> None:
    data = {"effect": "payments.refund.create", "identity": {"order_id": "order_1042"}}
    assert Intent.from_dict(data).identity == {"order_id": "order_1042"}


def test_explanation_names_every_wrong_effect_of_an_intent() -> None:
    led = trial_ledger(
        ("re_1", A[0], {**A[1], "amount": 3997}), ("re_2", A[0], {**A[1], "amount": 1})
    )
    line = trial_metrics(led, [REFUND_A]).explanation()
    assert line.endswith("; wrong values: re_1: amount 3997, asked 499; re_2: amount 1, asked 499")
