"""The anytime-valid bounds behind ``twice run --until-decided`` and ``twice gate`` on a
sequential run: validity under peeking, the stopping rule, and the gate's verdicts."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint
from twice.evals import Check, evaluate_gate, parse_gate
from twice.evals.gate._sequential_rules import NO_GUARANTEE, rule_state
from twice.reports.stats import (
    Bounds,
    bounds,
    log_wealth,
    peeking_wilson_false_pass,
    proves,
    simulate_max_rule,
)

Trials = Callable[..., pd.DataFrame]
SEQ = {"method": "betting", "batch": None, "max_trials": 480}


def gate(**kw: object) -> dict[str, object]:
    rule = {"name": "dup", "metric": "duplication_rate", "max": 0.05, "min_trials": 73, **kw}
    return {"rule": [rule]}


# -- validity ------------------------------------------------------------------------------


def test_false_pass_at_the_threshold_stays_below_alpha_when_looking_after_every_trial() -> None:
    # Ville: a rate exactly at the bound passes with probability ≤ α however often we look.
    # Betting wealth crosses 1/α with little overshoot, so the true rate sits just under α:
    # allow three standard errors of the simulation (bench/ measures it on 20,000 gates).
    gates = 4000
    sim = simulate_max_rule(
        0.05, 0.05, alpha=0.05, batch=1, max_trials=300, gates=gates, min_trials=1, seed=7
    )
    assert (sim.verdict == "pass").mean() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / gates)


def test_a_rule_that_would_pass_by_peeking_at_a_wilson_bound_does_not() -> None:
    # The failing path: recomputing the fixed gate's Wilson bound after every trial and
    # stopping at the first pass passes a rate sitting on the threshold far more than α.
    peek = peeking_wilson_false_pass(
        0.05, 0.05, alpha=0.05, batch=1, max_trials=300, gates=4000, seed=7
    )
    assert peek > 0.07  # vs ≤ 0.05 for the confidence sequence above
    # One concrete sequence: 1 duplicate in 110 trials. At n=110 the Wilson upper bound is
    # 4.97% ≤ 5%, so a peeking gate passes; the confidence sequence has not proved it.
    x = np.zeros(110)
    x[0] = 1
    _, hi = proportion_confint(1, 110, alpha=0.05, method="wilson")
    assert hi <= 0.05
    assert not proves(x, 0.05, 0.05, "below")


@pytest.mark.parametrize("rate", [0.0, 0.02, 0.3, 0.9])
def test_the_sequence_covers_the_true_rate_at_every_look(rate: float) -> None:
    # Neither side ever rejects the true rate, in ≥ 1 - 2α of runs (each side ≤ α).
    rng = np.random.default_rng(3)
    x = (rng.random((800, 300)) < rate).astype(float)
    level = math.log(1 / 0.05)
    below = log_wealth(x, rate, 0.05, "below").max(axis=1) >= level
    above = log_wealth(x, rate, 0.05, "above").max(axis=1) >= level
    assert below.mean() <= 0.05 and above.mean() <= 0.05


def test_bounds_contain_the_point_and_stay_in_the_unit_interval() -> None:
    rng = np.random.default_rng(5)
    for n in (1, 5, 40, 200):
        x = (rng.random(n) < 0.3).astype(float)
        b = bounds(x, 0.05)
        assert 0 <= b.lower <= b.point <= b.upper <= 1
    assert bounds([], 0.05).upper == 1.0


def test_all_clean_trials_prove_below_five_percent_after_65_and_not_before() -> None:
    assert not proves(np.zeros(64), 0.05, 0.05, "below")
    assert proves(np.zeros(65), 0.05, 0.05, "below")


def test_simulated_gates_stop_fast_far_from_the_threshold() -> None:
    for rate, verdict, most in ((0.0, "pass", 72), (0.5, "fail", 24), (1.0, "fail", 24)):
        sim = simulate_max_rule(rate, 0.05, alpha=0.05, batch=24, max_trials=480, gates=200, seed=1)
        assert (sim.verdict == verdict).all()
        assert sim.trials.max() <= most


# -- the arithmetic against a plain re-computation of WSR's formulas ----------------------------


def _plain_log_wealth(x: list[float], m: float, alpha: float, side: str) -> list[float]:
    """WSR's predictable plug-in bets (eq. 26-27), truncated at c = 0.9, one trial at a time:
    the bet on trial t uses the mean and variance of trials 1..t-1 with a prior of one
    pseudo-observation (mean 1/2, variance 1/4)."""
    out, total, sum_x, sum_sq, var_prev = [], 0.0, 0.0, 0.0, 0.25
    for t, xt in enumerate(x, start=1):
        lam = math.sqrt(2 * math.log(1 / alpha) / (var_prev * t * math.log(1 + t)))
        if side == "below":
            lam = min(lam, 0.9 / (1 - m)) if m < 1 else lam
            total += math.log1p(lam * (m - xt))
        else:
            lam = min(lam, 0.9 / m) if m > 0 else lam
            total += math.log1p(lam * (xt - m))
        out.append(total)
        sum_x += xt
        mu = (0.5 + sum_x) / (t + 1)
        sum_sq += (xt - mu) ** 2
        var_prev = (0.25 + sum_sq) / (t + 1)
    return out


SEQUENCES = [
    [0.0] * 30,
    [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0] * 4,
    [1.0] * 12 + [0.0] * 3,
]


@pytest.mark.parametrize("x", SEQUENCES)
@pytest.mark.parametrize("side", ["below", "above"])
@pytest.mark.parametrize("m", [0.0, 0.05, 0.3, 0.8, 1.0])
def test_log_wealth_is_the_plain_betting_product(x: list[float], side: str, m: float) -> None:
    got = log_wealth(np.array(x), m, 0.05, side)  # type: ignore[arg-type]
    assert got == pytest.approx(_plain_log_wealth(x, m, 0.05, side), rel=1e-12, abs=1e-12)


def _plain_bounds(x: list[float], alpha: float) -> tuple[float, float]:
    """The rates of the 0.05-point grid neither side has rejected, widened by one step."""
    level = math.log(1 / alpha)
    alive = [
        i / 2000
        for i in range(2001)
        if max(_plain_log_wealth(x, i / 2000, alpha, "below")) < level
        and max(_plain_log_wealth(x, i / 2000, alpha, "above")) < level
    ]
    return max(0.0, alive[0] - 0.0005), min(1.0, alive[-1] + 0.0005)


@pytest.mark.parametrize(
    ("x", "alpha"), [(SEQUENCES[1], 0.05), (SEQUENCES[1], 0.2), ([0.0] * 80, 0.05)]
)
def test_bounds_are_the_grid_rates_no_side_rejected_widened_by_a_step(
    x: list[float], alpha: float
) -> None:
    b = bounds(x, alpha)
    lo, hi = _plain_bounds(x, alpha)
    assert (b.n, b.successes) == (len(x), int(sum(x)))
    assert b.lower == pytest.approx(min(lo, b.point), abs=1e-12)
    assert b.upper == pytest.approx(max(hi, b.point), abs=1e-12)
    assert 0 < b.upper < 1 and (b.lower > 0 or sum(x) == 0)


def test_bounds_of_no_trials_are_the_whole_unit_interval() -> None:
    assert bounds([], 0.05) == Bounds(0, 0, 0.0, 1.0)


def test_bounds_where_both_sides_rejected_every_rate_show_the_point() -> None:
    # 40 clean trials then 40 duplicates: the clean start rejects every rate from 10 % up
    # ("below"), the duplicates every rate up to 5 % ("above"); the running intersection is
    # empty (an event of probability ≤ 2α), and the bounds fall back to the point.
    x = [0.0] * 40 + [1.0] * 40
    assert proves(x, 0.1, 0.05, "below") and proves(x, 0.05, 0.05, "above")
    assert bounds(x, 0.05) == Bounds(80, 40, 0.5, 0.5)


def test_proves_nothing_without_trials() -> None:
    assert not proves([], 0.05, 0.05, "below") and not proves([], 0.05, 0.05, "above")


def _plain_gates(
    rate: float,
    threshold: float,
    alpha: float,
    batch: int,
    max_trials: int,
    gates: int,
    min_trials: int,
    seed: int,
) -> tuple[list[int], list[str]]:
    """Each gate looked at after every batch with proves(), as --until-decided does."""
    n = max(batch, (max_trials // batch) * batch)
    x = np.random.default_rng(seed).random((gates, n)) < rate
    trials, verdicts = [], []
    for row in x.astype(float):
        for look in range(batch, n + 1, batch):
            if proves(row[:look], threshold, alpha, "above"):
                verdict = "fail"
            elif look >= min_trials and proves(row[:look], threshold, alpha, "below"):
                verdict = "pass"
            else:
                verdict = "undecided"
            if verdict != "undecided" or look + batch > n:
                break
        trials.append(look)
        verdicts.append(verdict)
    return trials, verdicts


@pytest.mark.parametrize(
    ("rate", "threshold", "batch", "min_trials"),
    [
        (0.05, 0.1, 7, 1),
        (0.02, 0.1, 5, 40),
        (0.02, 0.1, 5, 41),
        (0.4, 0.1, 3, 1),
        (0.1, 0.1, 10, 1),
    ],
)
def test_simulated_gates_are_the_plain_loop_of_looks(
    rate: float, threshold: float, batch: int, min_trials: int
) -> None:
    kw = {"alpha": 0.1, "batch": batch, "max_trials": 64, "gates": 40, "seed": 11}
    sim = simulate_max_rule(rate, threshold, min_trials=min_trials, **kw)  # type: ignore[arg-type]
    trials, verdicts = _plain_gates(rate, threshold, 0.1, batch, 64, 40, min_trials, 11)
    assert sim.trials.dtype == np.int64
    assert list(sim.trials) == trials
    assert list(sim.verdict) == verdicts


def test_simulated_gates_repeat_from_seed_0_and_need_no_minimum_by_default() -> None:
    # At alpha 0.5 one clean trial proves "below 90 %": with no min_trials the gate stops there.
    kw = {"alpha": 0.5, "batch": 1, "max_trials": 5, "gates": 3}
    sim = simulate_max_rule(0.0, 0.9, **kw)  # type: ignore[arg-type]
    assert list(sim.trials) == [1, 1, 1] and set(sim.verdict) == {"pass"}
    a = simulate_max_rule(0.3, 0.3, alpha=0.1, batch=4, max_trials=40, gates=50)
    b = simulate_max_rule(0.3, 0.3, alpha=0.1, batch=4, max_trials=40, gates=50, seed=0)
    assert list(a.trials) == list(b.trials) and list(a.verdict) == list(b.verdict)


@pytest.mark.parametrize(("batch", "alpha"), [(1, 0.05), (10, 0.2)])
def test_peeking_wilson_false_pass_is_the_plain_loop_of_looks(batch: int, alpha: float) -> None:
    got = peeking_wilson_false_pass(
        0.2, 0.3, alpha=alpha, batch=batch, max_trials=105, gates=60, seed=4
    )
    n = (105 // batch) * batch
    x = np.random.default_rng(4).random((60, n)) < 0.2
    passed = 0
    for row in x:
        his = [
            proportion_confint(int(row[:look].sum()), look, alpha=alpha, method="wilson")[1]
            for look in range(batch, n + 1, batch)
        ]
        passed += any(hi <= 0.3 for hi in his)
    assert got == passed / 60
    # Runs repeat: the default seed is 0.
    kw = {"alpha": alpha, "batch": batch, "max_trials": 105, "gates": 400}
    assert peeking_wilson_false_pass(0.2, 0.3, **kw) == peeking_wilson_false_pass(  # type: ignore[arg-type]
        0.2,
        0.3,
        seed=0,
        **kw,  # type: ignore[arg-type]
    )


# -- the gate on a sequential run ------------------------------------------------------------


def test_sequential_gate_fails_28_of_28_regardless_of_min_trials(make_trials: Trials) -> None:
    result = evaluate_gate(make_trials(28, duplicated=28), parse_gate(gate()), sequential=SEQ)
    (check,) = result.failures
    assert "fails regardless of more trials" in check.message
    assert "anytime-valid" in check.message
    assert any("anytime-valid" in n for n in result.notes)


def test_fixed_gate_fails_28_of_28_regardless_of_min_trials(make_trials: Trials) -> None:
    (check,) = evaluate_gate(make_trials(28, duplicated=28), parse_gate(gate())).failures
    assert check.message.startswith("fails regardless of more trials")
    assert "needs at least" not in check.message
    # 0 of 28 is not certain: more trials could pass, so the gate still asks for them.
    (check,) = evaluate_gate(make_trials(28), parse_gate(gate())).failures
    assert "the rule needs at least 73" in check.message


def test_sequential_gate_check_says_its_verdict_in_full(make_trials: Trials) -> None:
    # Each cell's check on a sequential run: the rule and the cell it names, the verdict of
    # the anytime-valid bound at the gate's own confidence, and the errored trials left out
    # where there were some (here in the first cell only).
    cfg = parse_gate({**gate(min_trials=1), "confidence": 0.9})
    trials = pd.concat([make_trials(70, errors=2), make_trials(20, duplicated=20, model="m/b")])
    result = evaluate_gate(trials, cfg, sequential=SEQ)
    a, b = (
        "m/a / baseline / refund / lost_reply / bare",
        "m/b / baseline / refund / lost_reply / bare",
    )
    assert result.checks == [
        Check("rule", "dup", a, "pass",
              "upper anytime-valid 90% bound of duplication_rate = 3.6% ≤ max 5.0% (0 of 70 "
              "trials duplicated: duplication_rate 0.0%, anytime-valid one-sided 90% bounds "
              "[0.0%, 3.6%]; 2 errored trial(s) excluded)"),
        Check("rule", "dup", b, "fail",
              "the lower anytime-valid bound is already past max 5.0%: the rate is above it (20 "
              "of 20 trials duplicated: duplication_rate 100.0%, anytime-valid one-sided 90% "
              "bounds [88.1%, 100.0%])"),
    ]  # fmt: skip
    assert result.notes == [
        "sequential run: rules on rates use anytime-valid bounds (betting), valid at every "
        "look; rounds of one epoch per cell, at most 480 trials a cell",
        "2 errored trial(s) were excluded from the rates",
    ]


def test_sequential_gate_is_stricter_than_wilson_where_peeking_would_pass(
    make_trials: Trials,
) -> None:
    # 1 of 110 duplicated passes the fixed Wilson gate but is not settled sequentially.
    frame = make_trials(110, duplicated=1)
    assert evaluate_gate(frame, parse_gate(gate())).passed
    result = evaluate_gate(frame, parse_gate(gate()), sequential=SEQ)
    assert not result.passed
    assert "not settled yet" in result.failures[0].message


def test_sequential_gate_passes_clean_cells_with_enough_trials(make_trials: Trials) -> None:
    assert evaluate_gate(make_trials(73), parse_gate(gate()), sequential=SEQ).passed
    # Proved below 5% at 65 trials, but the rule's floor of 73 still applies to a pass.
    frame = make_trials(70)
    result = evaluate_gate(frame, parse_gate(gate()), sequential=SEQ)
    assert not result.passed
    assert "of the 73 the rule needs" in result.failures[0].message
    state = rule_state(parse_gate(gate()).rules[0], frame, 0.95)
    assert not state.settled


@pytest.mark.parametrize(
    "rule",
    [
        {"name": "p", "metric": "duplication_rate", "max": 0.05, "statistic": "point"},
        {"name": "m", "metric": "excess_effects_mean", "max": 0.1},
    ],
)
def test_a_rule_without_a_bound_to_settle_it_says_so(
    make_trials: Trials, rule: dict[str, object]
) -> None:
    # It passed as "settled" after the first round (2 trials), with nothing in the verdict
    # to say that no anytime-valid bound stood behind it.
    state = rule_state(parse_gate({"rule": [rule]}).rules[0], make_trials(2), 0.95)
    assert state.settled and state.status == "pass"
    assert "no anytime-valid guarantee" in state.message
    cautious = rule_state(parse_gate(gate()).rules[0], make_trials(73), 0.95)
    assert "no anytime-valid guarantee" not in cautious.message


@pytest.mark.parametrize(
    ("rule", "duplicated", "completed"),
    [
        ({"metric": "duplication_rate", "max": 1.0}, 28, 28),
        ({"metric": "completion_rate", "min": 0.0}, 0, 0),
    ],
)
def test_a_bound_every_rate_meets_passes_at_once_as_the_fixed_gate_does(
    make_trials: Trials, rule: dict[str, object], duplicated: int, completed: int
) -> None:
    # The failing path: no bet proves a rate below 1 (or above 0), so 'max = 1.0' ran every
    # cell to the trial cap and failed it ("100.0% > max 100.0%"), where the fixed gate on the
    # same trials passed.
    cfg = parse_gate({"rule": [{"name": "edge", **rule}]})
    trials = make_trials(28, duplicated=duplicated, completed=completed)
    state = rule_state(cfg.rules[0], trials, 0.95)
    assert (state.status, state.settled) == ("pass", True), state.message
    assert evaluate_gate(trials, cfg).passed


def test_min_rules_settle_both_ways(make_trials: Trials) -> None:
    cfg = parse_gate({"rule": [{"name": "done", "metric": "completion_rate", "min": 0.8}]})
    rule = cfg.rules[0]
    assert rule_state(rule, make_trials(40, completed=40), 0.95).settled
    low = rule_state(rule, make_trials(40, completed=5), 0.95)
    assert low.settled and low.status == "fail"


def test_a_wrong_values_rule_settles_both_ways(make_trials: Trials) -> None:
    # --until-decided stops a cell whose wrong-values rule is settled, as for duplicates.
    cfg = parse_gate({"rule": [{"name": "asked", "metric": "wrong_rate", "max": 0.05}]})
    rule = cfg.rules[0]
    bad = rule_state(rule, make_trials(20, wrong=20), 0.95)
    assert (bad.status, bad.settled) == ("fail", True)
    assert "20 of 20 trials wrong" in bad.message
    good = rule_state(rule, make_trials(400), 0.95)
    assert (good.status, good.settled) == ("pass", True), good.message


# -- rule_state: what decides a verdict, rule by rule ------------------------------------------


def _state(rule: dict[str, object], trials: pd.DataFrame) -> tuple[str, bool, str]:
    state = rule_state(parse_gate({"rule": [{"name": "r", **rule}]}).rules[0], trials, 0.95)
    return state.status, state.settled, state.message


def test_a_point_or_mean_rule_waits_for_its_min_trials(make_trials: Trials) -> None:
    for rule in (
        {"metric": "excess_effects_mean", "max": 0.1, "min_trials": 10},
        {"metric": "duplication_rate", "max": 0.5, "statistic": "point", "min_trials": 10},
    ):
        status, settled, message = _state(rule, make_trials(5))
        assert (status, settled) == ("fail", False), rule
        assert "the rule needs at least 10 to pass" in message
        assert _state(rule, make_trials(10))[:2] == ("pass", True), rule


def test_a_point_rule_passes_at_its_bound_and_fails_past_it(make_trials: Trials) -> None:
    at_max = {"metric": "duplication_rate", "max": 0.5, "statistic": "point"}
    assert _state(at_max, make_trials(4, duplicated=2))[0] == "pass"
    status, _, message = _state(at_max, make_trials(4, duplicated=3))
    assert status == "fail" and message.startswith("point of duplication_rate = 75.0% > max 50.0%")
    at_min = {"metric": "completion_rate", "min": 0.5, "statistic": "point"}
    assert _state(at_min, make_trials(4, completed=2))[0] == "pass"
    status, _, message = _state(at_min, make_trials(4, completed=1))
    assert status == "fail" and message.startswith("point of completion_rate = 25.0% < min 50.0%")
    mean = {"metric": "excess_effects_mean", "max": 0.5}
    assert _state(mean, make_trials(4, duplicated=2))[0] == "pass"
    assert _state(mean, make_trials(4, duplicated=3))[0] == "fail"
    assert _state({"metric": "excess_effects_mean", "min": 0.5}, make_trials(4))[0] == "fail"


def test_a_lenient_bound_is_read_from_its_own_side(make_trials: Trials) -> None:
    # max on the lower bound, min on the upper one: judged on the current trials, unsettled
    # by any bet (the lenient side).
    lenient_max = {"metric": "duplication_rate", "max": 0.5, "statistic": "lower"}
    status, settled, message = _state(lenient_max, make_trials(20, duplicated=5))
    assert (status, settled) == ("pass", True) and message.startswith("lower of duplication_rate")
    assert message.endswith(NO_GUARANTEE)
    lenient_min = {"metric": "completion_rate", "min": 0.5, "statistic": "upper"}
    status, _, message = _state(lenient_min, make_trials(20, completed=15))
    assert status == "pass" and message.startswith("upper of completion_rate")


def test_a_cautious_min_rule_is_not_passed_before_the_bound_is_proved(make_trials: Trials) -> None:
    rule = {"metric": "completion_rate", "min": 0.8, "min_trials": 1}
    status, settled, message = _state(rule, make_trials(5, completed=5))
    assert (status, settled) == ("fail", False)
    assert message.startswith("lower anytime-valid 95% bound of completion_rate = ")
    assert "< min 80.0% (not settled yet: more trials could decide it)" in message
    status, settled, message = _state(rule, make_trials(40, completed=40))
    assert (status, settled) == ("pass", True)
    assert "≥ min 80.0% (" in message and NO_GUARANTEE not in message
    assert "but only" not in message


def test_a_cautious_rule_proved_bad_says_which_bound_crossed(make_trials: Trials) -> None:
    status, settled, message = _state(
        {"metric": "completion_rate", "min": 0.8, "min_trials": 100}, make_trials(20, completed=2)
    )
    assert (status, settled) == ("fail", True)
    assert message.startswith(
        "the upper anytime-valid bound is already past min 80.0%: the rate is below it "
        "(fails regardless of more trials) (2 of 20 trials completed: completion_rate 10.0%"
    )
    status, _, message = _state(
        {"metric": "duplication_rate", "max": 0.05, "min_trials": 1}, make_trials(20, duplicated=20)
    )
    assert message.startswith(
        "the lower anytime-valid bound is already past max 5.0%: the rate is above it ("
    )


def test_rule_state_of_no_scored_trials_shows_no_rate(make_trials: Trials) -> None:
    status, settled, message = _state(
        {"metric": "duplication_rate", "max": 0.05}, make_trials(3).iloc[0:0]
    )
    assert (status, settled) == ("fail", False)
    assert "0 of 0 trials duplicated: duplication_rate n/a, anytime-valid" in message
    assert "bounds [0.0%, 100.0%]" in message


# The verdict line a CI reader sees, one row per branch of rule_state: the words, the signs
# and every figure. A sign is the value against the bound; too few trials is said apart.
RULE_STATE_TEXTS = [
    (
        {"metric": "excess_effects_mean", "max": 0.5},
        {"n": 4, "duplicated": 2},
        0.95,
        "",
        ("pass", True),
        f"point excess_effects_mean = 0.5 over 4 trials{NO_GUARANTEE}",
    ),
    (
        {"metric": "excess_effects_mean", "min": 0.5, "min_trials": 10},
        {"n": 4},
        0.95,
        "; 1 errored trial left out",
        ("fail", False),
        "point excess_effects_mean = 0 over 4 trials; the rule needs at least 10 to pass; "
        f"1 errored trial left out{NO_GUARANTEE}",
    ),
    (
        {"metric": "excess_effects_mean", "min": 0.5},
        {"n": 4, "duplicated": 2},
        0.95,
        "",
        ("pass", True),
        f"point excess_effects_mean = 0.5 over 4 trials{NO_GUARANTEE}",
    ),
    (
        {"metric": "excess_effects_mean", "max": 0.5},
        {"n": 0},
        0.95,
        "",
        ("fail", False),
        "point excess_effects_mean = nan over 0 trials; the rule needs at least 1 to pass"
        + NO_GUARANTEE,
    ),
    (
        {"metric": "duplication_rate", "max": 0.05, "min_trials": 30},
        {"n": 20, "duplicated": 20},
        0.95,
        "",
        ("fail", True),
        "the lower anytime-valid bound is already past max 5.0%: the rate is above it (fails "
        "regardless of more trials) (20 of 20 trials duplicated: duplication_rate 100.0%, "
        "anytime-valid one-sided 95% bounds [84.8%, 100.0%]; the rule needs at least 30 to pass)",
    ),
    (
        {"metric": "duplication_rate", "max": 0.05},
        {"n": 20, "duplicated": 20},
        0.9,
        "; 2 errored trials left out",
        ("fail", True),
        "the lower anytime-valid bound is already past max 5.0%: the rate is above it (20 of 20 "
        "trials duplicated: duplication_rate 100.0%, anytime-valid one-sided 90% bounds "
        "[88.1%, 100.0%]; 2 errored trials left out)",
    ),
    (
        {"metric": "completion_rate", "min": 0.8},
        {"n": 20, "completed": 2},
        0.95,
        "",
        ("fail", True),
        "the upper anytime-valid bound is already past min 80.0%: the rate is below it (2 of 20 "
        "trials completed: completion_rate 10.0%, anytime-valid one-sided 95% bounds "
        "[10.0%, 41.5%])",
    ),
    (
        {"metric": "duplication_rate", "max": 0.05},
        {"n": 73},
        0.95,
        "",
        ("pass", True),
        "upper anytime-valid 95% bound of duplication_rate = 4.5% ≤ max 5.0% (0 of 73 trials "
        "duplicated: duplication_rate 0.0%, anytime-valid one-sided 95% bounds [0.0%, 4.5%])",
    ),
    (
        {"metric": "duplication_rate", "max": 0.05, "min_trials": 100},
        {"n": 70},
        0.95,
        "",
        ("fail", False),
        "upper anytime-valid 95% bound of duplication_rate = 4.7% ≤ max 5.0%, but only 70 "
        "scored trial(s) of the 100 the rule needs (0 of 70 trials duplicated: duplication_rate "
        "0.0%, anytime-valid one-sided 95% bounds [0.0%, 4.7%]; the rule needs at least 100 to "
        "pass)",
    ),
    (
        {"metric": "duplication_rate", "max": 0.05},
        {"n": 20},
        0.95,
        "",
        ("fail", False),
        "upper anytime-valid 95% bound of duplication_rate = 15.2% > max 5.0% (not settled yet: "
        "more trials could decide it) (0 of 20 trials duplicated: duplication_rate 0.0%, "
        "anytime-valid one-sided 95% bounds [0.0%, 15.2%])",
    ),
    (
        {"metric": "completion_rate", "min": 0.8},
        {"n": 40, "completed": 40},
        0.95,
        "",
        ("pass", True),
        "lower anytime-valid 95% bound of completion_rate = 92.0% ≥ min 80.0% (40 of 40 trials "
        "completed: completion_rate 100.0%, anytime-valid one-sided 95% bounds [92.0%, 100.0%])",
    ),
    (
        {"metric": "completion_rate", "min": 0.8},
        {"n": 5, "completed": 5},
        0.95,
        "",
        ("fail", False),
        "lower anytime-valid 95% bound of completion_rate = 52.3% < min 80.0% (not settled yet: "
        "more trials could decide it) (5 of 5 trials completed: completion_rate 100.0%, "
        "anytime-valid one-sided 95% bounds [52.3%, 100.0%])",
    ),
    (
        {"metric": "duplication_rate", "max": 1.0},
        {"n": 3, "duplicated": 3},
        0.95,
        "",
        ("pass", True),
        "upper anytime-valid 95% bound of duplication_rate = 100.0% ≤ max 100.0% (3 of 3 trials "
        "duplicated: duplication_rate 100.0%, anytime-valid one-sided 95% bounds "
        "[34.4%, 100.0%])",
    ),
    (
        {"metric": "completion_rate", "min": 0.0},
        {"n": 3, "completed": 0},
        0.95,
        "",
        ("pass", True),
        "lower anytime-valid 95% bound of completion_rate = 0.0% ≥ min 0.0% (0 of 3 trials "
        "completed: completion_rate 0.0%, anytime-valid one-sided 95% bounds [0.0%, 65.6%])",
    ),
    (
        {"metric": "duplication_rate", "max": 0.5, "statistic": "point"},
        {"n": 4, "duplicated": 2},
        0.95,
        "",
        ("pass", True),
        "point of duplication_rate = 50.0% ≤ max 50.0% (2 of 4 trials duplicated: "
        "duplication_rate 50.0%, anytime-valid one-sided 95% bounds [20.0%, 100.0%])"
        + NO_GUARANTEE,
    ),
    (
        {"metric": "duplication_rate", "max": 0.5, "statistic": "lower", "min_trials": 10},
        {"n": 4, "duplicated": 3},
        0.95,
        "",
        ("fail", False),
        "lower of duplication_rate = 34.4% ≤ max 50.0% (3 of 4 trials duplicated: "
        "duplication_rate 75.0%, anytime-valid one-sided 95% bounds [34.4%, 100.0%]; the rule "
        f"needs at least 10 to pass){NO_GUARANTEE}",
    ),
    (
        {"metric": "completion_rate", "min": 0.5, "statistic": "upper"},
        {"n": 4, "completed": 1},
        0.95,
        "",
        ("pass", True),
        "upper of completion_rate = 89.8% ≥ min 50.0% (1 of 4 trials completed: completion_rate "
        f"25.0%, anytime-valid one-sided 95% bounds [0.0%, 89.8%]){NO_GUARANTEE}",
    ),
    (
        {"metric": "completion_rate", "min": 0.5, "statistic": "point", "min_trials": 10},
        {"n": 4, "completed": 3},
        0.95,
        "",
        ("fail", False),
        "point of completion_rate = 75.0% ≥ min 50.0% (3 of 4 trials completed: completion_rate "
        "75.0%, anytime-valid one-sided 95% bounds [34.4%, 100.0%]; the rule needs at least 10 to "
        f"pass){NO_GUARANTEE}",
    ),
    (
        {"metric": "completion_rate", "min": 0.5, "statistic": "point"},
        {"n": 4, "completed": 1},
        0.95,
        "",
        ("fail", True),
        "point of completion_rate = 25.0% < min 50.0% (1 of 4 trials completed: completion_rate "
        f"25.0%, anytime-valid one-sided 95% bounds [0.0%, 89.8%]){NO_GUARANTEE}",
    ),
    (
        {"metric": "duplication_rate", "max": 0.05},
        {"n": 0},
        0.95,
        "",
        ("fail", False),
        "upper anytime-valid 95% bound of duplication_rate = 100.0% > max 5.0% (not settled yet: "
        "more trials could decide it) (0 of 0 trials duplicated: duplication_rate n/a, "
        "anytime-valid one-sided 95% bounds [0.0%, 100.0%]; the rule needs at least 1 to pass)",
    ),
]


@pytest.mark.parametrize(
    ("rule", "made", "confidence", "excluded", "verdict", "text"),
    RULE_STATE_TEXTS,
    ids=[f"row{i}" for i in range(len(RULE_STATE_TEXTS))],
)
def test_rule_state_says_its_verdict_in_full(
    make_trials: Trials,
    rule: dict[str, object],
    made: dict[str, int],
    confidence: float,
    excluded: str,
    verdict: tuple[str, bool],
    text: str,
) -> None:
    # A rule judged before its min_trials are in once said "34.4% > max 50.0%" of a value
    # within its bound: the sign must compare the value, the shortfall is said apart.
    trials = make_trials(**made)
    gate_rule = parse_gate({"rule": [{"name": "r", **rule}]}).rules[0]
    if excluded:
        state = rule_state(gate_rule, trials, confidence, excluded)
    else:  # the default: nothing appended
        state = rule_state(gate_rule, trials, confidence)
    assert (state.status, state.settled) == verdict
    assert state.message == text
