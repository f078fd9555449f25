"""The side-effect assertions: every built-in's passing path, failing path and message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from twice.assertions import (
    Assertion,
    Compensated,
    Count,
    NoUnseenEffects,
    Verdict,
    assert_side_effects,
    at_least,
    at_most,
    check_all,
    compensated,
    describe_attempt,
    exactly,
    never,
    no_unseen_effects,
    parse_assertion,
    parse_assertions,
)
from twice.mocks import Attempt, Effect, Ledger, Services, outcome_of

REFUND = "payments.refund.create"
ISSUE_LINE = (
    "payments.refund.create where order_id='order_1042': expected exactly 1, observed 2 "
    "(re_1 at attempt 1, reply lost; re_2 at attempt 2)"
)


def _record(
    ledger: Ledger,
    name: str,
    effect_id: str | None,
    fields: dict[str, Any],
    *,
    delivered: bool = True,
    status: int = 200,
    fault: str | None = None,
) -> None:
    """Append one attempt (and the effect it committed, if any) to a hand-built ledger."""
    n = len(ledger.attempts) + 1
    ledger.attempts.append(
        Attempt(
            n=n,
            service=name.split(".")[0],
            method="POST",
            path="/v1/" + name.split(".")[1],
            route=name,
            mutating=True,
            key=None,
            params=dict(fields),
            source="initial",
            status=status if delivered else None,
            delivered=delivered,
            outcome=outcome_of(status if delivered else None, delivered),
            fault=fault,
            effect_ids=[effect_id] if effect_id else [],
        )
    )
    if effect_id:
        ledger.effects.append(Effect(id=effect_id, name=name, attempt=n, fields=dict(fields)))


def _trip(*, cancels: int, hotel: bool = False, link_field: bool = False) -> Ledger:
    """A travel saga: book fl_1 on trip_1, optionally a hotel, then ``cancels`` cancellations."""
    ledger = Ledger()
    flight = {"trip_id": "trip_1", "flight": "BA117"}
    if link_field:
        flight["booking_id"] = "bk_9"
    _record(ledger, "travel.flight.book", "fl_1", flight)
    if hotel:
        _record(ledger, "travel.hotel.book", "ht_1", {"trip_id": "trip_1"})
    else:
        _record(ledger, "travel.hotel.book", None, {"trip_id": "trip_1"}, status=409)
    for i in range(1, cancels + 1):
        booking = "bk_9" if link_field else "fl_1"
        _record(
            ledger,
            "travel.flight.cancel",
            f"cx_{i}",
            {"booking_id": booking},
            delivered=i > 1,
            fault="lost_reply" if i == 1 else None,
        )
    return ledger


# -- counts -------------------------------------------------------------------------------


def test_exactly_passes_on_one_effect(payments: Callable[[str], Services], naive_refund) -> None:
    services = payments("none")
    naive_refund(services)
    verdict = exactly(1, REFUND, order_id="order_1042").check(services.ledger)
    assert verdict.ok
    assert verdict.observed == 1
    assert [e.id for e in verdict.effects] == ["re_1"]


def test_exactly_fails_on_duplicate_with_the_issue_message(duplicated: Ledger) -> None:
    verdict = exactly(1, REFUND, order_id="order_1042").check(duplicated)
    assert not verdict.ok
    assert (verdict.expected, verdict.observed) == ("exactly 1", 2)
    assert verdict.message == ISSUE_LINE
    assert [a.n for a in verdict.attempts] == [1, 2]
    assert verdict.evidence == ["re_1 at attempt 1, reply lost", "re_2 at attempt 2"]


def test_at_most_fails_above_the_bound(duplicated: Ledger) -> None:
    verdict = at_most(1, REFUND).check(duplicated)
    assert not verdict.ok
    assert verdict.message.startswith("payments.refund.create: expected at most 1, observed 2 (")
    assert at_most(2, REFUND).check(duplicated).ok


def test_at_least_fails_when_nothing_committed_and_shows_the_attempt(
    payments: Callable[[str], Services], naive_refund
) -> None:
    services = payments("timeout_before_commit")
    naive_refund(services, tries=1)
    verdict = at_least(1, REFUND, order_id="order_1042").check(services.ledger)
    assert not verdict.ok
    assert verdict.message == (
        "payments.refund.create where order_id='order_1042': expected at least 1, observed 0"
    )
    # The attempt that committed nothing is still evidence: it timed out before the commit.
    assert verdict.ledger_lines() == [
        "attempt 1 POST /v1/refunds (initial, no key, fault timeout_before_commit): "
        "nothing committed, timed out"
    ]


def test_never_fails_on_any_matching_effect(duplicated: Ledger) -> None:
    verdict = never(REFUND, order_id="order_1042").check(duplicated)
    assert not verdict.ok
    assert verdict.message == (
        "payments.refund.create where order_id='order_1042': expected none, observed 2 "
        "(re_1 at attempt 1, reply lost; re_2 at attempt 2)"
    )
    assert never(REFUND, order_id="order_1054").check(duplicated).ok


def test_count_where_filters_other_orders(payments, naive_refund) -> None:
    services = payments("none")
    naive_refund(services, order_id="order_1042")
    naive_refund(services, order_id="order_1054")
    assert exactly(1, REFUND, order_id="order_1054").check(services.ledger).ok
    assert exactly(2, REFUND).check(services.ledger).ok
    verdict = exactly(1, REFUND).check(services.ledger)
    assert not verdict.ok
    assert verdict.message.startswith("payments.refund.create: expected exactly 1, observed 2")


def test_count_misspelt_where_field_raises_naming_the_fields(duplicated: Ledger) -> None:
    with pytest.raises(ValueError, match=r"no payments.refund.create effect has a field 'order'"):
        never(REFUND, order="order_1042").check(duplicated)
    with pytest.raises(ValueError, match=r"its fields are: amount, order_id, reason"):
        exactly(1, REFUND, orderid="order_1042").check(duplicated)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: exactly(-1, REFUND), r"n must be a non-negative integer, got -1"),
        (lambda: exactly(True, REFUND), r"n must be a non-negative integer, got True"),
        (lambda: at_least(0, REFUND), r"at_least\(0, \.\.\.\) always holds"),
        (lambda: exactly(1, "refund"), r"'service.resource.verb' name .* got 'refund'"),
        (lambda: Count("twice", 1, REFUND), r"unknown bound 'twice'; expected one of: exactly"),
    ],
)
def test_count_bad_arguments_raise_naming_the_value(
    build: Callable[[], object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_count_where_may_use_the_names_n_and_effect() -> None:
    # n and effect are positional-only, so effect fields with those names stay usable.
    assert exactly(1, REFUND, n=3, effect="x").where == {"n": 3, "effect": "x"}


# -- compensation -------------------------------------------------------------------------


SAGA = {"by": "travel.flight.cancel", "on": "booking_id"}


def test_compensated_passes_with_one_compensation() -> None:
    verdict = compensated("travel.flight.book", **SAGA).check(_trip(cancels=1))
    assert verdict.ok
    assert verdict.observed == "1 travel.flight.book, each compensated as required"
    assert [e.id for e in verdict.effects] == ["fl_1", "cx_1"]


def test_compensated_fails_when_cancelled_twice() -> None:
    verdict = compensated("travel.flight.book", **SAGA).check(_trip(cancels=2))
    assert not verdict.ok
    assert verdict.message == (
        "travel.flight.book compensated by travel.flight.cancel on booking_id: expected exactly "
        "1 travel.flight.cancel per travel.flight.book, observed fl_1 compensated 2 times "
        "(fl_1 at attempt 1; cx_1 at attempt 3, reply lost; cx_2 at attempt 4)"
    )


def test_compensated_fails_when_never_cancelled() -> None:
    verdict = compensated("travel.flight.book", **SAGA).check(_trip(cancels=0))
    assert not verdict.ok
    assert "observed fl_1 compensated 0 times (fl_1 at attempt 1)" in verdict.message


def test_compensated_links_through_the_forward_effects_field() -> None:
    # The forward effect carries booking_id itself: the cancellation names bk_9, not fl_1.
    assert compensated("travel.flight.book", **SAGA).check(_trip(cancels=1, link_field=True)).ok


def test_compensated_unless_later_step_forbids_compensation() -> None:
    check = compensated("travel.flight.book", **SAGA, unless="travel.hotel.book", saga="trip_id")
    assert check.check(_trip(cancels=0, hotel=True)).ok
    assert check.check(_trip(cancels=1, hotel=False)).ok
    verdict = check.check(_trip(cancels=1, hotel=True))
    assert not verdict.ok
    assert "fl_1 compensated once although travel.hotel.book committed on its trip_id" in (
        verdict.message
    )
    assert not check.check(_trip(cancels=0, hotel=False)).ok


def test_compensated_with_nothing_to_compensate_passes() -> None:
    verdict = compensated("travel.flight.book", **SAGA).check(Ledger())
    assert verdict.ok
    assert verdict.observed == "no travel.flight.book"


def test_compensated_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match=r"unless='travel.hotel.book' needs saga=<field>"):
        compensated("travel.flight.book", **SAGA, unless="travel.hotel.book")
    with pytest.raises(ValueError, match=r"saga='trip_id' only means something together"):
        compensated("travel.flight.book", **SAGA, saga="trip_id")
    with pytest.raises(ValueError, match=r"by must be a 'service.resource.verb' name"):
        compensated("travel.flight.book", by="cancel", on="booking_id")
    check = compensated("travel.flight.book", **SAGA, unless="travel.hotel.book", saga="trip")
    with pytest.raises(ValueError, match=r"fl_1 has no field 'trip' \(fields: flight, trip_id\)"):
        check.check(_trip(cancels=1))


# -- unseen effects -----------------------------------------------------------------------


def test_no_unseen_effects_fails_on_the_silent_first_refund(duplicated: Ledger) -> None:
    duplicated.observations.append("Created refund re_2 of $4.99.")
    verdict = no_unseen_effects().check(duplicated)
    assert not verdict.ok
    assert verdict.message == (
        "effects the agent never saw: expected none, observed 1 (re_1 at attempt 1, reply lost)"
    )


def test_no_unseen_effects_passes_once_every_id_was_shown(duplicated: Ledger) -> None:
    duplicated.observations += ["Created re_2.", "found re_1 as well"]
    assert no_unseen_effects().check(duplicated).ok
    assert no_unseen_effects(REFUND, order_id="order_1042").check(duplicated).ok


@pytest.mark.parametrize(
    "check",
    [
        never("payments.refund.creat", order_id="order_1042"),
        at_most(1, "payments.refunds.create"),
        exactly(1, "payment.refund.create"),
        never("email.message.send"),  # no email service in this trial
    ],
    ids=lambda c: c.subject,
)
def test_an_effect_name_no_service_of_the_trial_makes_is_refused(
    duplicated: Ledger, check: Any
) -> None:
    # "at most 1 refund" with a typo in the name held over any ledger: two refunds passed.
    with pytest.raises(ValueError, match=r"no service of this trial makes .* pass vacuously"):
        check.check(duplicated)
    # A ledger read back from a log does not know its routes: nothing to check it against.
    assert check.check(Ledger.from_dict(duplicated.to_dict())).ok == (check.bound != "exactly")


def test_no_unseen_effects_filters_by_effect(duplicated: Ledger) -> None:
    verdict = no_unseen_effects(REFUND, order_id="order_1042").check(duplicated)
    assert verdict.subject == (
        "payments.refund.create where order_id='order_1042' the agent never saw"
    )
    assert verdict.observed == 2
    assert no_unseen_effects("payments.order.get").check(duplicated).ok
    with pytest.raises(ValueError, match=r"needs an effect name"):
        no_unseen_effects(order_id="order_1042")


# -- assert_side_effects ------------------------------------------------------------------


def test_assert_side_effects_lists_every_failure_with_ledger_lines(duplicated: Ledger) -> None:
    with pytest.raises(AssertionError) as info:
        assert_side_effects(
            duplicated,
            exactly(1, REFUND, order_id="order_1042"),
            never(REFUND, order_id="order_1054"),
            no_unseen_effects(),
        )
    assert str(info.value) == "\n".join(
        [
            "2 of 3 side-effect assertions failed:",
            ISSUE_LINE,
            "    attempt 1 POST /v1/refunds (initial, no key, fault lost_reply): "
            "committed re_1, reply lost",
            "    attempt 2 POST /v1/refunds (model, no key): committed re_2, HTTP 200",
            "effects the agent never saw: expected none, observed 2 "
            "(re_1 at attempt 1, reply lost; re_2 at attempt 2)",
            "    attempt 1 POST /v1/refunds (initial, no key, fault lost_reply): "
            "committed re_1, reply lost",
            "    attempt 2 POST /v1/refunds (model, no key): committed re_2, HTTP 200",
        ]
    )


def test_assert_side_effects_says_when_nothing_reached_the_services() -> None:
    with pytest.raises(AssertionError) as info:
        assert_side_effects(Ledger(), exactly(1, REFUND))
    assert str(info.value).splitlines() == [
        "1 of 1 side-effect assertion failed:",
        "payments.refund.create: expected exactly 1, observed 0",
        "    no attempt behind this (the ledger holds 0 attempt(s) and 0 effect(s))",
    ]


def test_assert_side_effects_returns_verdicts_when_all_hold(duplicated: Ledger) -> None:
    verdicts = assert_side_effects(duplicated, at_most(2, REFUND), at_least(1, REFUND))
    assert [v.ok for v in verdicts] == [True, True]


def test_assert_side_effects_rejects_no_assertions_and_non_assertions(duplicated: Ledger) -> None:
    with pytest.raises(ValueError, match=r"needs at least one assertion"):
        assert_side_effects(duplicated)
    with pytest.raises(TypeError, match=r"'exactly 1' is not an assertion"):
        assert_side_effects(duplicated, "exactly 1")  # type: ignore[arg-type]


class _Broken:
    def check(self, ledger: Ledger) -> bool:
        return True


def test_check_all_rejects_a_check_that_returns_no_verdict(duplicated: Ledger) -> None:
    with pytest.raises(TypeError, match=r"check\(\) returned True; it must return a Verdict"):
        check_all(duplicated, _Broken())  # type: ignore[arg-type]


class _AmountAtMost:
    """A user-written assertion: no base class, no registration."""

    def __init__(self, cents: int) -> None:
        self.cents = cents

    def check(self, ledger: Ledger) -> Verdict:
        refunds = ledger.effects_named(REFUND)
        total = sum(e.fields["amount"] for e in refunds)
        return Verdict.from_effects(
            ledger,
            refunds,
            ok=total <= self.cents,
            subject="refunded total",
            expected=f"at most {self.cents}",
            observed=total,
        )


def test_user_assertion_is_an_assertion_and_reports_like_builtins(duplicated: Ledger) -> None:
    mine = _AmountAtMost(499)
    assert isinstance(mine, Assertion)
    with pytest.raises(AssertionError) as info:
        assert_side_effects(duplicated, mine)
    assert str(info.value).splitlines()[1] == (
        "refunded total: expected at most 499, observed 998 "
        "(re_1 at attempt 1, reply lost; re_2 at attempt 2)"
    )


# -- JSON form ----------------------------------------------------------------------------


BUILT_INS = [
    exactly(1, REFUND, order_id="order_1042"),
    at_most(2, REFUND),
    at_least(1, REFUND, order_id="order_1054"),
    never(REFUND, order_id="order_9"),
    compensated("travel.flight.book", **SAGA),
    compensated("travel.flight.book", **SAGA, unless="travel.hotel.book", saga="trip_id"),
    no_unseen_effects(),
    no_unseen_effects(REFUND, order_id="order_1042"),
]


@pytest.mark.parametrize("assertion", BUILT_INS, ids=lambda a: a.to_dict()["assert"])
def test_parse_assertion_round_trips_every_built_in(
    assertion: Count | Compensated | NoUnseenEffects,
) -> None:
    assert parse_assertion(assertion.to_dict()) == assertion


def test_parse_assertion_reads_the_documented_form() -> None:
    data = {"assert": "exactly", "n": 1, "effect": REFUND, "where": {"order_id": "order_1042"}}
    assert parse_assertion(data) == exactly(1, REFUND, order_id="order_1042")
    assert parse_assertions([data, {"assert": "never", "effect": REFUND}]) == [
        exactly(1, REFUND, order_id="order_1042"),
        never(REFUND),
    ]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"assert": "once", "effect": REFUND},
            r"unknown assertion 'once'.*one of: exactly, at_most",
        ),
        ({"assert": "exactly", "effect": REFUND}, r"exactly assertion .* lacks n"),
        ({"assert": "never", "effect": REFUND, "n": 0}, r"unknown key\(s\) n; accepted: effect"),
        ({"assert": "never", "effect": REFUND, "where": ["x"]}, r"'where' must be an object"),
        ({"assert": "exactly", "n": "1", "effect": REFUND}, r"n must be a non-negative integer"),
        (["exactly"], r"an assertion must be a JSON object"),
    ],
)
def test_parse_assertion_bad_input_raises_naming_it(data: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_assertion(data)


def test_parse_assertions_rejects_a_single_object() -> None:
    with pytest.raises(ValueError, match=r"must be a list of JSON objects"):
        parse_assertions({"assert": "never", "effect": REFUND})


# -- rendering ----------------------------------------------------------------------------


def test_describe_attempt_renders_keys_replays_and_unknown_outcomes() -> None:
    attempt = Attempt(
        n=3,
        service="payments",
        method="POST",
        path="/v1/refunds",
        route=REFUND,
        mutating=True,
        key="k" * 40,
        params={},
        source="transport",
        status=502,
        outcome="unknown",
        replayed=True,
    )
    assert describe_attempt(attempt) == (
        f"attempt 3 POST /v1/refunds (transport, key {'k' * 31}…): "
        "replayed the saved response, HTTP 502 (outcome unknown)"
    )


def _attempt(**kw: Any) -> Attempt:
    fields: dict[str, Any] = {
        "n": 1,
        "service": "payments",
        "method": "POST",
        "path": "/v1/refunds",
        "route": REFUND,
        "mutating": True,
        "key": None,
        "params": {},
        "source": "model",
        "status": 200,
    }
    return Attempt(**(fields | kw))


def test_describe_attempt_shows_a_key_of_32_characters_whole_and_cuts_a_longer_one() -> None:
    assert describe_attempt(_attempt(key="k" * 32)).startswith(
        f"attempt 1 POST /v1/refunds (model, key {'k' * 32}): "
    )
    assert f"key {'k' * 31}…)" in describe_attempt(_attempt(key="k" * 33))


def test_describe_attempt_of_an_unknown_sender_with_two_effects_and_no_response() -> None:
    # "unknown": a client outside twice's tool layer, so no sender tag; a delivered attempt
    # with no status got no HTTP response at all.
    attempt = _attempt(source="unknown", effect_ids=["re_1", "re_2"], status=None)
    assert describe_attempt(attempt) == (
        "attempt 1 POST /v1/refunds (no key): committed re_1, re_2, no response"
    )
    assert describe_attempt(_attempt(source="initial")).startswith(
        "attempt 1 POST /v1/refunds (initial, no key): nothing committed, HTTP 200"
    )


def test_verdict_to_dict_is_json_ready(duplicated: Ledger) -> None:
    data = exactly(1, REFUND).check(duplicated).to_dict()
    assert list(data) == ["ok", "subject", "expected", "observed", "message", "effects", "ledger"]
    assert (data["subject"], data["expected"], data["observed"]) == (REFUND, "exactly 1", 2)
    assert data["ok"] is False
    assert data["effects"] == ["re_1", "re_2"]
    assert data["message"].startswith("payments.refund.create: expected exactly 1, observed 2")
    assert len(data["ledger"]) == 2


def test_verdict_evidence_for_an_error_after_commit(payments, naive_refund) -> None:
    services = payments("error_after_commit")
    naive_refund(services, tries=1)
    verdict = exactly(1, REFUND).check(services.ledger)
    assert verdict.ok
    assert verdict.evidence == ["re_1 at attempt 1, client saw HTTP 502"]


@pytest.mark.parametrize("ok", ["no", 1, 2, None, [False]])
def test_a_verdict_whose_ok_is_not_a_bool_is_refused(duplicated: Ledger, ok: Any) -> None:
    # The failing path: a custom assertion's Verdict.from_effects(ok="no") or ok=len(found) - 1
    # passed (truthy) although the ledger held two refunds.
    with pytest.raises(TypeError, match=r"ok must be True or False, got "):
        Verdict.from_effects(duplicated, duplicated.effects, ok=ok, subject="x", expected="1")


def test_a_numpy_bool_ok_is_taken_as_the_bool_it_is(duplicated: Ledger) -> None:
    import numpy as np

    verdict = Verdict(ok=np.bool_(False), subject="x", expected="1", observed=2)
    assert verdict.ok is False
    assert Verdict(ok=np.bool_(True), subject="x", expected="1", observed=1).ok is True
    # Another numpy scalar is a count, not a truth value: refused like an int.
    with pytest.raises(TypeError, match=r"\(int64\); compare explicitly"):
        Verdict(ok=np.int64(1), subject="x", expected="1", observed=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got 'no' \(str\); compare explicitly"):
        Verdict(ok="no", subject="x", expected="1", observed=2)  # type: ignore[arg-type]


def test_str_of_a_verdict_says_ok_or_failed_before_its_message(duplicated: Ledger) -> None:
    failed = exactly(1, REFUND, order_id="order_1042").check(duplicated)
    assert str(failed) == "FAILED: " + ISSUE_LINE
    held = at_most(2, REFUND).check(duplicated)
    assert str(held) == "ok: " + held.message


def test_an_assertions_evidence_says_what_the_ledgers_does(duplicated: Ledger) -> None:
    # Review M: the assertion's evidence line was a second copy of the ledger's that called a
    # run that crashed after the commit a "reply lost".
    data = duplicated.to_dict()
    data["attempts"][0].update(fault="crash_after_commit")
    crashed = Ledger.from_dict(data)
    verdict = exactly(1, REFUND, order_id="order_1042").check(crashed)
    seen = "run crashed before the agent saw the reply"
    assert verdict.evidence == [f"re_1 at attempt 1, {seen}", "re_2 at attempt 2"]
    assert crashed.describe_effect(crashed.effects[0]).endswith(f"), {seen}")


# -- counts with expected values --------------------------------------------------------------


def _refund(services: Services, amount: int) -> None:
    with services.sync_client(base_url="https://payments.twice.test") as client:
        client.post("/v1/refunds", json={"order_id": "order_1042", "amount": amount})


def test_exactly_with_values_fails_on_a_wrong_amount_naming_the_field(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    _refund(services, 3997)  # the whole order, where $4.99 was asked for
    check = exactly(1, REFUND, order_id="order_1042", values={"amount": 499})
    verdict = check.check(services.ledger)
    assert not verdict.ok
    assert verdict.message == (
        "payments.refund.create where order_id='order_1042': expected exactly 1 with "
        "amount=499, observed 1, wrong values: re_1: amount 3997, asked 499 (re_1 at attempt 1)"
    )
    # Without values, the same count holds: the wrong amount only shows with them.
    assert exactly(1, REFUND, order_id="order_1042").check(services.ledger).ok


def test_exactly_with_values_passes_on_the_asked_amount(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    _refund(services, 499)
    verdict = exactly(1, REFUND, order_id="order_1042", values={"amount": 499}).check(
        services.ledger
    )
    assert verdict.ok and verdict.observed == 1


def test_at_most_with_values_fails_on_a_wrong_effect_within_the_bound(
    payments: Callable[[str], Services],
) -> None:
    services = payments("none")
    _refund(services, 499)
    _refund(services, 498)
    verdict = at_most(2, REFUND, values={"amount": 499}).check(services.ledger)
    assert not verdict.ok and "re_2: amount 498, asked 499" in str(verdict.observed)


def test_count_values_misspelt_field_is_an_error(payments: Callable[[str], Services]) -> None:
    services = payments("none")
    _refund(services, 499)
    with pytest.raises(ValueError, match=r"value 'amout' is not a field of"):
        exactly(1, REFUND, values={"amout": 499}).check(services.ledger)


def test_count_values_refused_where_meaningless() -> None:
    with pytest.raises(ValueError, match=r"never\(\) with values"):
        Count("never", 0, REFUND, {}, {"amount": 499})
    with pytest.raises(ValueError, match=r"order_id is both a where filter and a value"):
        exactly(1, REFUND, order_id="o", values={"order_id": "o"})


def test_count_values_round_trip_through_json() -> None:
    check = exactly(1, REFUND, order_id="order_1042", values={"amount": 499})
    data = check.to_dict()
    assert data["values"] == {"amount": 499}
    assert parse_assertion(data) == check
    with pytest.raises(ValueError, match=r"'values' must be an object"):
        parse_assertion({"assert": "exactly", "n": 1, "effect": REFUND, "values": [499]})
