"""The statistics' one home, ``twice.reports.stats``: pure arithmetic, the old names its
aliases, and each formula against an independent computation."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import fisher_exact
from twice import evals, reports
from twice.evals import gate
from twice.reports import stats

STATS_DIR = Path(stats.__file__).parent


def test_stats_imports_no_frame_and_nothing_else_of_twice() -> None:
    # Pure functions on numbers and arrays: a trial frame, a metric or a rule belongs to the
    # package that applies the arithmetic, not here.
    found: dict[str, list[str]] = {}
    for path in STATS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] in {"pandas", "twice"} or n.startswith("..")]
            if bad:
                found[path.name] = bad
    assert not found, f"twice.reports.stats imports only numbers libraries: {found}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (reports.wilson, stats.wilson),
        (reports.alpha_of, stats.alpha_of),
        (reports.difference, stats.difference),
        (reports.Difference, stats.Difference),
        (evals.trials_needed, stats.trials_needed),
        (gate.trials_needed, stats.trials_needed),
        (gate.METHOD, stats.METHOD),
    ],
)
def test_stats_public_names_elsewhere_are_the_same_objects(old: object, new: object) -> None:
    assert old is new


def test_stats_gate_sequential_reexports_the_bounds() -> None:
    from twice.evals.gate import _sequential

    for name in ("bounds", "proves", "log_wealth", "simulate_max_rule"):
        assert getattr(_sequential, name) is getattr(stats, name)


@pytest.mark.parametrize(
    ("n", "c"), [([5.0], [3.0]), ([4.0, 6.0, 2.0], [4.0, 1.0, 0.0]), ([1.0, 3.0], [1.0, 3.0])]
)
def test_stats_pass_hat_k_is_the_mean_of_binomial_ratios(n: list[float], c: list[float]) -> None:
    got = stats.pass_hat_k(np.array(n), np.array(c))
    assert list(got) == [str(k) for k in range(1, int(max(n)) + 1)]
    for k_text, value in got.items():
        k = int(k_text)
        want = [
            math.comb(int(ci), k) / math.comb(int(ni), k)
            for ni, ci in zip(n, c, strict=True)
            if ni >= k
        ]
        assert value == pytest.approx(sum(want) / len(want), abs=1e-12)


@pytest.mark.parametrize(
    ("k", "n", "k_ref", "n_ref"), [(3, 20, 0, 20), (0, 5, 5, 5), (7, 9, 2, 11)]
)
def test_stats_fisher_tails_are_scipys_one_sided_tests(
    k: int, n: int, k_ref: int, n_ref: int
) -> None:
    table = [[k, n - k], [k_ref, n_ref - k_ref]]
    higher, lower = stats.fisher_tails(k, n, k_ref, n_ref)
    assert higher == fisher_exact(table, alternative="greater")[1]
    assert lower == fisher_exact(table, alternative="less")[1]


def test_stats_baseline_test_reads_the_fisher_tails_by_the_metrics_direction() -> None:
    worse = reports.baseline_test("duplication_rate", 9, 20, 1, 20)
    higher, lower = stats.fisher_tails(9, 20, 1, 20)
    assert (worse.p_worse, worse.p_better, worse.verdict) == (higher, lower, "worse")
    better = reports.baseline_test("completion_rate", 9, 20, 1, 20)
    assert (better.p_worse, better.p_better, better.verdict) == (lower, higher, "better")


def test_stats_wilson_many_matches_wilson_cell_by_cell() -> None:
    k, n = np.array([0, 3, 10, 0]), np.array([10, 10, 10, 0])
    many = stats.wilson_many(k, n)
    for (a, b), ki, ni in zip(many, k, n, strict=True):
        one = stats.wilson(int(ki), int(ni))
        assert (a, b) == one or (math.isnan(a) and all(math.isnan(x) for x in one))


def test_stats_alpha_of_is_one_minus_the_confidence_rounded_to_12_places() -> None:
    # Rounded, so a gate at 0.95 computes the report's Wilson bounds at exactly 0.05 (the raw
    # 1 - 0.95 is 0.050000000000000044 and moves a bound in its last digits).
    assert 1 - 0.95 != 0.05
    assert stats.alpha_of(0.95) == 0.05
    assert stats.alpha_of(0.9) == 0.1 and stats.alpha_of(0.5) == 0.5
    # Within 5e-13 of 1 the rounding would give 0 (no interval at all): the raw error stays,
    # not rounded at any other number of places.
    near_one = 0.9999999999997
    assert stats.alpha_of(near_one) == 1 - near_one
    assert stats.alpha_of(near_one) != round(1 - near_one, 13)
