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
