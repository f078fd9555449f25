"""``no_dup^k`` (τ-bench's pass^k for avoiding duplicates): estimator, summary.json, report."""

from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path

import pandas as pd
import pytest
from twice.reports import cells, render_report, summary
from twice.reports._passk import no_dup_k


def frame(outcomes: dict[str, list[float]], **cell: str) -> pd.DataFrame:
    """Trials of one cell: sample id → 1 per epoch that avoided duplicating, else 0 (NaN =
    crashed), as the ``duplicated`` column (its complement)."""
    keys = {"model": "m/a", "prompt": "p", "task": "t", "fault": "f", "protection": "x"} | cell
    rows = []
    for sample, xs in outcomes.items():
        for epoch, x in enumerate(xs, start=1):
            rows.append({**keys, "sample": sample, "epoch": epoch, "duplicated": 1.0 - x})
    return pd.DataFrame(rows)


def brute(xs: list[float], k: int) -> float:
    """The mean over every k-subset of a sample's trials that all avoided duplicating."""
    subsets = list(combinations(xs, k))
    return sum(all(s) for s in subsets) / len(subsets)


def test_no_dup_k_is_the_unbiased_subset_average() -> None:
    data = {"a": [1, 1, 0, 1], "b": [1, 1, 1, 1], "c": [0, 1, 0, 1]}
    (values,) = no_dup_k(frame(data)).values()
    assert set(values) == {"1", "2", "3", "4"}
    for k in range(1, 5):
        expected = sum(brute(xs, k) for xs in data.values()) / 3
        assert values[str(k)] == pytest.approx(expected)
    assert values["1"] == pytest.approx(9 / 12)  # k=1 is one minus the duplication rate
    assert values["4"] == pytest.approx(1 / 3)  # only sample b never duplicated


def test_no_dup_k_falls_with_k_for_a_flaky_agent_and_skips_crashed_trials() -> None:
    data = {"a": [1, 0, 1, math.nan], "b": [1, 1, 1, 1]}
    (values,) = no_dup_k(frame(data)).values()
    # a has 3 scored trials, so k=4 comes from b alone.
    assert values["4"] == 1.0
    assert values["1"] > values["2"] > values["3"]


def test_summary_cells_carry_no_dup_k() -> None:
    trials = frame({"a": [1, 1], "b": [1, 0]})
    for m in ("completed", "exactly_once", "diverged", "safe_success", "excess_effects"):
        trials[m] = 0.0
    trials["unseen_effects"] = 0.0
    trials["total_tokens"] = 0
    trials["error"] = ""
    doc = json.loads(json.dumps(summary(cells(trials))))
    assert doc["cells"][0]["no_dup_k"] == {"1": 0.75, "2": 0.5}


def test_report_shows_no_dup_k(refund_frame: pd.DataFrame, tmp_path: Path) -> None:
    html = render_report(refund_frame)
    assert "no_dup^k" in html
    assert "k=1:" in html


def test_no_dup_k_counts_duplicates_not_other_failures() -> None:
    # It was pass^k of exactly_once: an agent that never acted (nothing done, so not exactly
    # once) scored no_dup^1 = 0 though it never duplicated; the README defines it over
    # duplicates, and summary.json's name says so.
    never_acted = frame({"a": [1, 1], "b": [1, 1]}).assign(exactly_once=0.0)
    (values,) = no_dup_k(never_acted).values()
    assert values == {"1": 1.0, "2": 1.0}
    duplicated = frame({"a": [0, 1]}).assign(exactly_once=0.0)
    assert next(iter(no_dup_k(duplicated).values())) == {"1": 0.5, "2": 0.0}
