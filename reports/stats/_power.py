"""How many trials a bound needs: "duplication ≤ 1% at 95%" is a statement about n.

A gate rule like ``upper bound of duplication_rate ≤ 0.01`` passes only once the Wilson
interval is narrow enough. With no duplicates observed the Wilson upper bound is
``z² / (n + z²)``, so it falls below a rate ``p`` only when ``n ≥ z² (1 − p) / p``: about 381
trials for 1% at 95%. Every observed duplicate pushes the need up. The interval is the same
two-sided Wilson interval the report and the gate use (statsmodels' formula), so a count
matches what ``twice gate`` will decide.
"""

from __future__ import annotations

from ._intervals import alpha_of, wilson

MIN_RATE = 1e-9
"""The smallest bound :func:`trials_needed` computes (≈ 3.8 × 10⁹ trials at 95%)."""


def trials_needed(max_rate: float, confidence: float = 0.95, observed: int = 0) -> int:
    """The fewest trials whose Wilson upper bound is ≤ ``max_rate`` with ``observed`` events.

    Args:
        max_rate: The bound to prove, strictly between 0 and 1 (e.g. 0.01).
        confidence: Level of the (two-sided) Wilson interval, as in the report and the gate.
        observed: How many of the trials show the event (e.g. duplicates).

    Raises:
        ValueError: for a rate or confidence outside (0, 1) or a negative count.
    """
    if not 0 < max_rate < 1:
        raise ValueError(f"max_rate must be strictly between 0 and 1, got {max_rate!r}")
    if max_rate < MIN_RATE:
        # The interval's floating-point arithmetic overflows long before: 1e-300 gave 1.9e300
        # trials where the closed form says 3.8e300.
        raise ValueError(
            f"{max_rate!r} is below {MIN_RATE:g}: proving a rate that low takes more than "
            "10^9 trials, past what this computes exactly"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if observed < 0:
        raise ValueError(f"observed must be ≥ 0, got {observed!r}")
    alpha = alpha_of(confidence)

    def fits(n: int) -> bool:
        return wilson(observed, n, alpha=alpha)[1] <= max_rate

    # The upper bound falls as n grows with the count fixed: find a bracket, then bisect.
    lo, hi = max(observed, 1), max(observed, 1)
    while not fits(hi):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
