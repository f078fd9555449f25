"""Wilson score intervals for a proportion, one cell or many at once."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtri

ALPHA = 0.05
"""The error of every interval and test unless a caller asks for another (95 % intervals)."""


def alpha_of(confidence: float) -> float:
    """The error of a ``confidence`` interval (or bound): ``1 - confidence``, rounded to 12
    places, so a gate at 0.95 uses the report's 0.05 exactly (``1 - 0.95`` is
    0.050000000000000044, and moved the gate's Wilson bound off the report's in the 17th
    digit: a rule's limit between the two passed where the summary's bound exceeds it)."""
    alpha = 1 - confidence
    rounded = round(alpha, 12)
    return rounded if rounded > 0 else alpha  # a confidence within 5e-13 of 1: not zero


def wilson(successes: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` (NaNs when ``n == 0``).

    The interval always contains ``successes / n`` and lies in [0, 1], with exact ends: the
    formula's bounds come out of floating point inexact (statsmodels' too), so 0 of 28 came
    back as ``[1.4e-17, 0.12]`` and 96 of 96 as ``[0.96, 0.9999999999999999]``, intervals
    that did not contain their own rate. The Wilson bound at k = 0 (k = n) is exactly 0 (1).
    """
    lo, hi = wilson_many(np.array([successes]), np.array([n]), alpha)[0]
    return (lo, hi)


def wilson_many(k: np.ndarray, n: np.ndarray, alpha: float = ALPHA) -> list[list[float]]:
    """:func:`wilson` for many cells at once.

    Args:
        k: Successes per cell.
        n: Trials per cell (0 allowed).
        alpha: Error of each two-sided interval.

    Returns:
        ``[lo, hi]`` per cell, ``[nan, nan]`` where ``n == 0``.
    """
    safe_n = np.where(n > 0, n, 1)
    lo, hi = wilson_bounds(k, safe_n, alpha)
    rate = k / safe_n
    lo = np.where(k == 0, 0.0, np.minimum(np.maximum(lo, 0.0), rate))
    hi = np.where(k == n, 1.0, np.maximum(np.minimum(hi, 1.0), rate))
    empty = n == 0
    return [
        [math.nan, math.nan] if e else [float(a), float(b)]
        for e, a, b in zip(empty, lo, hi, strict=True)
    ]


def wilson_bounds(k: np.ndarray, n: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """statsmodels' ``proportion_confint(k, n, alpha, method="wilson")``, the same arithmetic
    in the same order (so the same bits: ``tests/reports/test_report_intervals.py`` checks it
    against statsmodels), before :func:`wilson_many` makes the ends exact.

    Not the call itself: ``statsmodels.stats.proportion`` imports ``scipy.stats`` and costs
    0.8 s of every process that writes a summary (each ``--shard``/``--workers`` worker,
    ``twice gate``), where the interval needs only the normal quantile (``scipy.special``,
    0.13 s). statsmodels stays the reference and computes the comparisons
    (:func:`difference`).

    Args:
        k: Successes per cell.
        n: Trials per cell (each > 0).
        alpha: Error of each two-sided interval.

    Returns:
        The lower and upper bounds, clipped to [0, 1].
    """
    # As floats, as statsmodels converts them: in int64, n**2 overflows past n ≈ 3.04e9 (the
    # trial counts `twice trials` searches for rates near 1e-9) and the square root fails.
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    crit = -ndtri(alpha / 2.0)  # = scipy.stats.norm.isf(alpha / 2), as statsmodels takes it
    q = k / n
    crit2 = crit**2
    denom = 1 + crit2 / n
    center = (q + crit2 / (2 * n)) / denom
    dist = crit * np.sqrt(q * (1.0 - q) / n + crit2 / (4.0 * n**2))
    dist /= denom
    return np.clip(center - dist, 0, 1), np.clip(center + dist, 0, 1)
