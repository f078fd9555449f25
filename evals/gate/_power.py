"""The table of how many trials a bound needs (``twice trials``); the count itself is
:func:`twice.reports.stats.trials_needed`."""

from __future__ import annotations

from collections.abc import Sequence

from twice.reports.stats import MIN_RATE, trials_needed

DEFAULT_RATES = (0.10, 0.05, 0.02, 0.01, 0.005, 0.001)
DEFAULT_OBSERVED = (0, 1, 2)

__all__ = ["DEFAULT_OBSERVED", "DEFAULT_RATES", "MIN_RATE", "trials_needed", "trials_table"]


def _percent(fraction: float) -> str:
    """``fraction`` as a percentage, every digit given kept: ``:g`` keeps six, so a
    confidence of 0.9999999 read "100%"; twelve still hide float noise (0.07 → "7%")."""
    return f"{fraction * 100:.12g}%"


def trials_table(
    rates: Sequence[float] = DEFAULT_RATES,
    confidence: float = 0.95,
    observed: Sequence[int] = DEFAULT_OBSERVED,
) -> str:
    """A Markdown table of :func:`trials_needed` (rates × observed counts)."""
    head = ["bound on the rate"] + [f"{k} observed" for k in observed]
    lines = [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] + ["---:"] * len(observed)) + " |",
    ]
    for rate in rates:
        cells = [f"≤ {_percent(rate)} at {_percent(confidence)}"]
        cells += [f"{trials_needed(rate, confidence, k):,}" for k in observed]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
