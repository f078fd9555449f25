"""What the gate says of a sequential run; the anytime-valid bounds themselves are
:mod:`twice.reports.stats` (re-exported here for the callers that import them from the gate)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twice.reports.stats import (
    METHOD,
    Bounds,
    Simulated,
    bounds,
    log_wealth,
    peeking_wilson_false_pass,
    proves,
    simulate_max_rule,
)

__all__ = [
    "METHOD",
    "Bounds",
    "Simulated",
    "bounds",
    "describe",
    "log_wealth",
    "peeking_wilson_false_pass",
    "proves",
    "simulate_max_rule",
]


def describe(spec: Mapping[str, Any]) -> str:
    """One line naming a sequential run's method and schedule (for the gate's output)."""
    batch = spec.get("batch")
    # --batch is rounded up to whole epochs of a cell's samples: a floor, not the size.
    rounds = (
        f"rounds of at least {batch} trial(s) (whole epochs)" if batch else "rounds of one epoch"
    )
    return (
        f"sequential run: rules on rates use anytime-valid bounds ({spec.get('method', METHOD)}"
        f"), valid at every look; {rounds} per cell, at most {spec.get('max_trials', '?')} "
        "trials a cell"
    )
