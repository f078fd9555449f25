"""Anytime-valid bounds for a Bernoulli rate: a betting confidence sequence.

A gate that looks at a cell after every round of trials and stops at the first pass must stay
valid under those repeated looks. A Wilson interval is not: recomputed after every batch, it
crosses a threshold the true rate sits on far more often than ``alpha`` (``tests`` and
``bench/`` show it). A *confidence sequence* holds at every sample size at once, so the gate
may look as often as it likes and stop whenever a verdict is settled.

**Method.** The betting confidence sequence of Waudby-Smith & Ramdas, "Estimating means of
bounded random variables by betting" (JRSS-B 86(1), 2024), §4, with their predictable plug-in
bets (eq. 26-27). To test whether the rate is ``m``, a gambler starts with wealth 1 and before
each trial bets a fraction ``λ_t`` (chosen from the earlier trials only) that the outcome falls
below ``m`` (the *lower-side* wealth ``K⁻_t(m) = Π (1 + λ_i (m - x_i))``) or above it
(``K⁺_t(m) = Π (1 + λ_i (x_i - m))``). When the true rate is ``m`` or beyond the side bet on,
the wealth is a non-negative supermartingale with start 1, so by Ville's inequality it ever
reaches ``1/α`` with probability at most ``α``. Hence:

* ``max_{s≤t} K⁻_s(m) ≥ 1/α`` proves "rate < m" (the upper bound has dropped below ``m``),
* ``max_{s≤t} K⁺_s(m) ≥ 1/α`` proves "rate > m" (the lower bound has risen above ``m``),

each with error at most ``α`` however the gate peeks or stops. The bounds printed are the
``m`` not yet rejected (the running intersection of the sequence, on a grid of ``m``). Each
side is one-sided at ``α = 1 - confidence``: a ``max`` rule can only pass wrongly through the
upper bound, so its false-pass rate is at most ``α``.

Why betting rather than a group-sequential design with alpha spending: the gate must also be
re-checked by ``twice gate`` on whatever the logs hold (errored trials dropped, a resumed run,
a cell stopped at any round), and a confidence sequence is valid at every sample size without
a pre-declared schedule of looks; among confidence sequences for bounded means, the betting
one is the tightest known in practice (WSR §6), and it adapts to low variance, which is where
a duplication rate near 0 lives. No maintained Python package fits (``confseq`` needs a C++
build that fails on this Python), so the few lines of arithmetic are here, checked by property
tests against Ville's bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

METHOD = "betting confidence sequence (Waudby-Smith & Ramdas 2024, predictable plug-in)"
"""What summary.json, the gate and the report name as the method."""

TRUNCATION = 0.9
"""``c`` in WSR's eq. 27: bets are capped at ``c/m`` (or ``c/(1-m)``), so one outcome can cost
at most a fraction ``c`` of the wealth. WSR suggest 1/2 or 3/4; 0.9 lets a cell with no
duplicates at all prove "below 5%" after 65 trials instead of 78 (the floor is 59, where even
an all-in bet needs ``0.95^n ≤ α``) at the price of a slightly slower pass for rates just
under the threshold (``bench/`` measures both)."""

GRID = np.linspace(0.0, 1.0, 2001)
"""Rates at which the printed bounds are computed (step 0.05 percentage points)."""

Side = Literal["below", "above"]


def _bets(x: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """WSR's predictable plug-in bet sizes λ_t (before truncation), one per trial.

    ``x`` has trials along the last axis. λ_t uses only ``x_1..x_{t-1}``: the running mean
    and variance with a prior of one pseudo-observation (mean 1/2, variance 1/4).
    """
    n = x.shape[-1]
    t = np.arange(1, n + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)  # μ̂_t, after trial t
    var = (0.25 + np.cumsum((x - mu) ** 2, axis=-1)) / (t + 1)  # σ̂²_t
    prev = np.concatenate([np.full((*x.shape[:-1], 1), 0.25), var[..., :-1]], axis=-1)
    lam: NDArray[np.float64] = np.sqrt(2 * math.log(1 / alpha) / (prev * t * np.log1p(t)))
    return lam


def log_wealth(
    x: ArrayLike, m: ArrayLike, alpha: float, side: Side, c: float = TRUNCATION
) -> NDArray[np.float64]:
    """The log-wealth process of betting that the rate is ``below`` (or ``above``) ``m``.

    Args:
        x: Outcomes in trial order (0/1), trials along the last axis; a 2-D array holds one
            sequence per row.
        m: The rate(s) tested; broadcast against ``x[..., :1]`` (e.g. shape ``(G, 1)`` to test
            a grid on one sequence).
        alpha: Error level; it sets the bet sizes.
        side: ``below`` bets the outcomes fall below ``m`` (evidence that the rate is < m),
            ``above`` that they exceed it.
        c: Truncation of the bets (:data:`TRUNCATION`).

    Returns:
        ``log K_t(m)`` for every ``t`` (same shape as the broadcast of ``x`` and ``m``).
    """
    xs = np.asarray(x, dtype=np.float64)
    ms = np.asarray(m, dtype=np.float64)
    lam = _bets(xs, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        if side == "below":
            cap = np.where(ms < 1, c / (1 - ms), np.inf)
            step = np.minimum(lam, cap) * (ms - xs)
        else:
            cap = np.where(ms > 0, c / ms, np.inf)
            step = np.minimum(lam, cap) * (xs - ms)
    # Factors stay ≥ 1 - c > 0 by the truncation; the bet at m=0 (or 1) on the impossible side
    # is never taken (its factor is 1 + λ·0).
    out: NDArray[np.float64] = np.cumsum(np.log1p(np.nan_to_num(step, nan=0.0)), axis=-1)
    return out


@dataclass(frozen=True)
class Bounds:
    """Anytime-valid bounds of a rate after ``n`` trials (running intersection)."""

    n: int
    successes: int
    lower: float
    upper: float

    @property
    def point(self) -> float:
        """The plain proportion (NaN without trials)."""
        return self.successes / self.n if self.n else math.nan


def proves(x: Sequence[float] | NDArray[np.float64], m: float, alpha: float, side: Side) -> bool:
    """Whether the outcomes so far prove the rate is strictly below (or above) ``m``.

    True when the wealth of betting on ``side`` of ``m`` has reached ``1/α`` at some trial so
    far; under a rate on the other side of ``m`` (or equal to it) that happens with
    probability at most ``alpha``, at any stopping time.
    """
    xs = np.asarray(x, dtype=np.float64)
    if xs.size == 0:
        return False
    return bool(log_wealth(xs, m, alpha, side).max() >= math.log(1 / alpha))


def bounds(x: Sequence[float] | NDArray[np.float64], alpha: float) -> Bounds:
    """The one-sided ``1 - alpha`` anytime-valid lower and upper bounds after all of ``x``.

    A rate on :data:`GRID` is excluded once either side's wealth has reached ``1/α``; the
    bounds are the smallest and largest rates not excluded (widened by one grid step, so they
    never claim more than the test at the exact rate would). With no trials: ``(0, 1)``.
    """
    xs = np.asarray(x, dtype=np.float64)
    n, k = int(xs.size), int(xs.sum())
    if n == 0:
        return Bounds(0, 0, 0.0, 1.0)
    level = math.log(1 / alpha)
    grid = GRID[:, None]
    below = log_wealth(xs[None, :], grid, alpha, "below").max(axis=-1) >= level
    above = log_wealth(xs[None, :], grid, alpha, "above").max(axis=-1) >= level
    alive = ~(below | above)
    step = float(GRID[1] - GRID[0])
    if not alive.any():  # both sides rejected somewhere (probability ≤ 2α): show the point
        p = k / n
        return Bounds(n, k, p, p)
    idx = np.flatnonzero(alive)
    lo = max(0.0, float(GRID[idx[0]]) - step)
    hi = min(1.0, float(GRID[idx[-1]]) + step)
    p = k / n
    return Bounds(n, k, min(lo, p), max(hi, p))


# -- the study's simulator -----------------------------------------------------------------


@dataclass(frozen=True)
class Simulated:
    """Outcomes of many simulated sequential gates for one ``max`` rule."""

    trials: NDArray[np.int64]
    """Trials each gate used."""
    verdict: NDArray[np.str_]
    """``pass``, ``fail`` (settled either way) or ``undecided`` (stopped at the cap)."""


def simulate_max_rule(
    rate: float,
    threshold: float,
    *,
    alpha: float,
    batch: int,
    max_trials: int,
    gates: int,
    min_trials: int = 1,
    seed: int = 0,
) -> Simulated:
    """Run ``gates`` sequential gates of ``rate ≤ threshold`` on simulated Bernoulli trials.

    Each gate looks after every ``batch`` trials (as ``twice run --until-decided`` does) and
    stops at the first look where "rate < threshold" is proved (pass, once ``min_trials`` are
    in) or "rate > threshold" is proved (fail), else at ``max_trials`` (undecided, which the
    gate reports as a failure).
    """
    rng = np.random.default_rng(seed)
    n = max(batch, (max_trials // batch) * batch)
    x = (rng.random((gates, n)) < rate).astype(np.float64)
    level = math.log(1 / alpha)
    ok = np.maximum.accumulate(log_wealth(x, threshold, alpha, "below"), axis=1) >= level
    bad = np.maximum.accumulate(log_wealth(x, threshold, alpha, "above"), axis=1) >= level
    looks = np.arange(batch, n + 1, batch) - 1
    ok_at = ok[:, looks] & (looks + 1 >= min_trials)[None, :]
    bad_at = bad[:, looks]
    settled = ok_at | bad_at
    first = np.where(settled.any(axis=1), settled.argmax(axis=1), len(looks) - 1)
    rows = np.arange(gates)
    trials = (looks[first] + 1).astype(np.int64)
    verdict = np.where(
        bad_at[rows, first],
        "fail",
        np.where(ok_at[rows, first], "pass", "undecided"),
    )
    return Simulated(trials, verdict.astype(np.str_))


def peeking_wilson_false_pass(
    rate: float,
    threshold: float,
    *,
    alpha: float,
    batch: int,
    max_trials: int,
    gates: int,
    seed: int = 0,
) -> float:
    """How often a gate that recomputes a Wilson bound after every batch passes wrongly.

    The naive sequential gate the confidence sequence replaces: stop at the first look where
    the Wilson upper bound (two-sided ``1 - alpha`` interval, as the fixed gate uses) is at
    or below ``threshold``. With ``rate`` at the threshold every pass is a false pass.
    """
    from statsmodels.stats.proportion import proportion_confint

    rng = np.random.default_rng(seed)
    n = (max_trials // batch) * batch
    x = rng.random((gates, n)) < rate
    looks = np.arange(batch, n + 1, batch)
    k = np.cumsum(x, axis=1)[:, looks - 1]
    _, hi = proportion_confint(k, looks[None, :], alpha=alpha, method="wilson")
    return float((np.asarray(hi) <= threshold).any(axis=1).mean())
