"""Gate rules under anytime-valid bounds: the verdict of a rule in a cell, and whether it is
settled (no further trial can change it except with probability ≤ α).

Used by ``twice run --until-decided`` after every round and by ``twice gate`` on a sequential
run, so both reach the same verdict from the same trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from twice.reports import alpha_of, metric
from twice.reports.stats import bounds, proves

from ._rule import Rule

TRIAL_ORDER = ("epoch", "sample")
"""The order trials enter the confidence sequence: rounds add whole epochs, so this is the
order they were run in, and a re-check of the logs replays it exactly."""


@dataclass(frozen=True)
class RuleState:
    """One rule in one cell under anytime-valid bounds."""

    status: Literal["pass", "fail"]
    settled: bool
    """True when more trials cannot change the verdict (except with probability ≤ α)."""
    message: str


def ordered(scored: pd.DataFrame, column: str) -> np.ndarray:
    """The cell's scored outcomes of ``column`` in :data:`TRIAL_ORDER`, as 0/1 floats."""
    if scored.empty:
        return np.zeros(0)
    frame = scored.sort_values(list(TRIAL_ORDER), kind="stable")
    out: np.ndarray = frame[column].to_numpy(dtype=np.float64)
    return out


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


NO_GUARANTEE = "; no anytime-valid guarantee: this rule is judged once its min_trials are in"
"""Said of a rule the rounds cannot settle by a bound: a mean, or a rate's point or lenient
bound (a pass after the first round may be luck; rules with the cautious bound are not)."""


def rule_state(
    rule: Rule, scored: pd.DataFrame, confidence: float, excluded: str = ""
) -> RuleState:
    """The verdict of ``rule`` on a cell's scored trials under anytime-valid bounds.

    A rule on a rate with its cautious statistic (``upper`` for ``max``, ``lower`` for
    ``min``) passes once the confidence sequence proves the rate on the right side of the
    bound (and ``min_trials`` are in), and fails for good once it proves the wrong side.
    Other statistics (``point``, or the lenient bound) and means have no such guarantee:
    they are judged on the current trials and settle once ``min_trials`` are in.

    Args:
        rule: The gate rule.
        scored: The cell's scored trials (the trial frame's rows with ``completed`` set).
        confidence: The gate's confidence; each one-sided bound has error ``1 - confidence``.
        excluded: Text appended to the evidence (errored trials left out).
    """
    alpha = alpha_of(confidence)
    column = metric(rule.metric).column
    n = len(scored)
    enough = n >= rule.min_trials
    need = "" if enough else f"; the rule needs at least {rule.min_trials} to pass"
    if metric(rule.metric).kind != "rate":
        value = float(scored[column].mean()) if n else math.nan
        ok = enough and (value <= rule.bound if rule.direction == "max" else value >= rule.bound)
        msg = f"point {rule.metric} = {value:.3g} over {n} trials{need}{excluded}"
        return RuleState("pass" if ok else "fail", enough, msg + NO_GUARANTEE)
    x = ordered(scored, column)
    b = bounds(x, alpha)
    level = f"{confidence:.0%}"
    evidence = (
        f"{b.successes} of {n} trials {column}: {rule.metric} {_pct(b.point)}, anytime-valid "
        f"one-sided {level} bounds [{_pct(b.lower)}, {_pct(b.upper)}]{need}{excluded}"
    )
    # "Good" is the side of the bound the rule wants the rate on.
    good: Literal["below", "above"] = "below" if rule.direction == "max" else "above"
    bad: Literal["below", "above"] = "above" if good == "below" else "below"
    proved_bad = proves(x, rule.bound, alpha, bad)
    op_word = "max" if rule.direction == "max" else "min"
    bound = _pct(rule.bound)
    if proved_bad:
        side = "lower" if rule.direction == "max" else "upper"
        certain = "" if enough else " (fails regardless of more trials)"
        return RuleState(
            "fail",
            True,
            f"the {side} anytime-valid bound is already past {op_word} {bound}: the rate is "
            f"{'above' if good == 'below' else 'below'} it{certain} ({evidence})",
        )
    cautious = rule.statistic == ("upper" if rule.direction == "max" else "lower")
    if cautious:
        # A rate is never above 1 nor below 0: a bound there holds before any trial (as the
        # fixed gate's interval, never past it, says), though no bet can prove it.
        trivial = rule.bound >= 1 if rule.direction == "max" else rule.bound <= 0
        proved_good = trivial or proves(x, rule.bound, alpha, good)
        ok = proved_good and enough
        shown = b.upper if rule.direction == "max" else b.lower
        op = (
            ("≤" if proved_good else ">")
            if rule.direction == "max"
            else ("≥" if proved_good else "<")
        )
        msg = (
            f"{rule.statistic} anytime-valid {level} bound of {rule.metric} = {_pct(shown)} "
            f"{op} {op_word} {bound}"
        )
        if proved_good and not enough:
            msg += f", but only {n} scored trial(s) of the {rule.min_trials} the rule needs"
        elif not proved_good:
            msg += " (not settled yet: more trials could decide it)"
        return RuleState("pass" if ok else "fail", ok, f"{msg} ({evidence})")
    value = {"point": b.point, "lower": b.lower, "upper": b.upper}[rule.statistic]
    within = value <= rule.bound if rule.direction == "max" else value >= rule.bound
    ok = enough and within
    # The sign compares the value with the bound; too few trials is said by ``need``.
    op = ("≤" if within else ">") if rule.direction == "max" else ("≥" if within else "<")
    msg = f"{rule.statistic} of {rule.metric} = {_pct(value)} {op} {op_word} {bound}"
    return RuleState("pass" if ok else "fail", enough, f"{msg} ({evidence}){NO_GUARANTEE}")
