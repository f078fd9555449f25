"""Differences of rates: Newcombe intervals, score tests, prompt and baseline comparisons."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest
from scipy.stats import norm
from statsmodels.stats.proportion import proportion_confint
from twice.reports import baseline_comparison, difference, prompt_comparison
from twice.reports._compare import verdict


def _trials(spec: list[tuple[dict[str, Any], int, int]]) -> pd.DataFrame:
    """A trial frame: for each (cell fields, trials, duplicated) block, ``trials`` rows of
    which the first ``duplicated`` duplicate (and so are not safe successes)."""
    rows = []
    for fields, n, dup in spec:
        cell = {
            "model": "m/a",
            "agent": "react",
            "prompt": "baseline",
            "task": "refund",
            "fault": "lost_reply",
            "protection": "bare",
            "prompt_sha256": "abc",
            **fields,
        }
        for i in range(n):
            d = float(i < dup)
            rows.append(
                {
                    **cell,
                    "completed": 1.0,
                    "duplicated": d,
                    "safe_success": 1.0 - d,
                    "error": "",
                }
            )
    return pd.DataFrame(rows)


def test_difference_matches_newcombe_1998_example() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, table II: 56/70 vs 48/80,
    # hybrid score ("method 10") interval 0.0524 to 0.3339.
    d = difference(56, 70, 48, 80)
    assert d.diff == pytest.approx(0.2)
    assert d.ci == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert d.significant


def test_difference_of_identical_extremes_is_zero_not_an_error() -> None:
    # All-0 against all-0 makes the score statistic 0/0; pytest turns warnings into errors.
    for k in (0, 24):
        d = difference(k, 24, k, 24)
        assert d.diff == 0 and d.p_value == 1.0 and not d.significant
        assert d.ci[0] < 0 < d.ci[1]


def test_difference_all_versus_none_is_significant() -> None:
    d = difference(24, 24, 0, 24)
    assert d.significant and d.ci[0] > 0.8


def test_difference_with_an_empty_side_is_nan() -> None:
    d = difference(3, 10, 0, 0)
    assert math.isnan(d.diff) and math.isnan(d.p_value) and not d.significant
    # The side with trials keeps its rate; the interval is a pair of NaNs, not a NaN.
    assert d.rate == 0.3 and math.isnan(d.rate_ref)
    assert len(d.ci) == 2 and all(math.isnan(x) for x in d.ci)
    other = difference(0, 0, 3, 10)
    assert other.rate_ref == 0.3 and math.isnan(other.rate) and math.isnan(other.diff)
    assert len(other.ci) == 2 and all(math.isnan(x) for x in other.ci)


def test_difference_of_a_single_trial_is_a_number() -> None:
    # One trial is a sample: only an empty side has no difference.
    d = difference(1, 1, 0, 5)
    assert d.diff == 1.0 and not math.isnan(d.p_value) and d.ci[0] < 1.0 <= d.ci[1] + 1e-12


def _newcombe(k: int, n: int, k_ref: int, n_ref: int, alpha: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval from the two Wilson intervals (1998, method 10)."""
    p, p_ref = k / n, k_ref / n_ref
    lo, hi = proportion_confint(k, n, alpha=alpha, method="wilson")
    lo_ref, hi_ref = proportion_confint(k_ref, n_ref, alpha=alpha, method="wilson")
    d = p - p_ref
    return (
        d - math.sqrt((p - lo) ** 2 + (hi_ref - p_ref) ** 2),
        d + math.sqrt((hi - p) ** 2 + (p_ref - lo_ref) ** 2),
    )


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_difference_interval_is_newcombe_at_the_alpha_asked(alpha: float) -> None:
    for counts in [(56, 70, 48, 80), (3, 20, 0, 20), (7, 9, 2, 11)]:
        assert difference(*counts, alpha=alpha).ci == pytest.approx(
            _newcombe(*counts, alpha), abs=1e-12
        ), counts
    assert difference(56, 70, 48, 80, alpha=0.2).ci[0] > difference(56, 70, 48, 80).ci[0]


def test_difference_p_value_is_the_score_test_of_equal_rates() -> None:
    # The score statistic at a difference of 0, with the Miettinen-Nurminen variance factor
    # N / (N - 1); another test (Wald, Agresti-Caffo) gives another p-value.
    for k, n, k_ref, n_ref in [(56, 70, 48, 80), (3, 20, 0, 20), (7, 9, 2, 11)]:
        pooled, total = (k + k_ref) / (n + n_ref), n + n_ref
        var = pooled * (1 - pooled) * (1 / n + 1 / n_ref) * total / (total - 1)
        z = (k / n - k_ref / n_ref) / math.sqrt(var)
        got = difference(k, n, k_ref, n_ref).p_value
        assert got == pytest.approx(2 * norm.sf(abs(z)), rel=1e-9), (k, n, k_ref, n_ref)


def test_verdict_knows_lower_duplication_is_better() -> None:
    fewer = difference(0, 40, 20, 40)
    assert verdict("duplicated", fewer) == "better"
    assert verdict("safe_success", fewer) == "worse"
    assert verdict("duplicated", difference(5, 40, 6, 40)) == "same"


def test_prompt_comparison_pools_only_shared_conditions() -> None:
    frame = _trials(
        [
            ({"fault": "lost_reply"}, 20, 10),
            ({"fault": "none"}, 20, 0),
            ({"prompt": "cautious", "fault": "lost_reply"}, 20, 2),
            # cautious never ran under "none": baseline's "none" trials must not count
        ]
    )
    table = prompt_comparison(frame)
    pooled = table[(table["fault"] == "all") & (table["metric"] == "duplicated")].iloc[0]
    assert (pooled["n_ref"], pooled["n"], pooled["conditions"]) == (20, 20, 1)
    assert pooled["rate_ref"] == 0.5 and pooled["rate"] == 0.1
    assert pooled["significant"] and pooled["verdict"] == "better"
    assert pooled["reference"] == "baseline" and pooled["prompt"] == "cautious"


def test_prompt_comparison_adds_per_fault_rows() -> None:
    frame = _trials(
        [
            ({"fault": "lost_reply"}, 20, 10),
            ({"fault": "none"}, 20, 0),
            ({"prompt": "p2", "fault": "lost_reply"}, 20, 10),
            ({"prompt": "p2", "fault": "none"}, 20, 0),
        ]
    )
    table = prompt_comparison(frame)
    assert set(table["fault"]) == {"all", "lost_reply", "none"}
    assert not table["significant"].any()


def test_prompt_comparison_needs_two_prompts() -> None:
    assert prompt_comparison(_trials([({}, 10, 2)])).empty


def test_baseline_comparison_flags_regressions_and_improvements() -> None:
    base = _trials(
        [
            ({"model": "m/worse"}, 30, 0),
            ({"model": "m/better"}, 30, 20),
            ({"model": "m/same"}, 30, 5),
            ({"model": "m/gone"}, 5, 0),
        ]
    )
    now = _trials(
        [
            ({"model": "m/worse"}, 30, 20),
            ({"model": "m/better"}, 30, 0),
            ({"model": "m/same", "prompt_sha256": "changed"}, 30, 6),
            ({"model": "m/new"}, 5, 0),
        ]
    )
    table = baseline_comparison(now, base)
    flags = table.drop_duplicates("model").set_index("model")["flag"].to_dict()
    assert flags == {
        "m/worse": "regression",
        "m/better": "improvement",
        "m/same": "same",
        "m/new": "new",
        "m/gone": "gone",
    }
    changed = table.drop_duplicates("model").set_index("model")["prompt_changed"].to_dict()
    assert changed["m/same"] and not changed["m/worse"]
    worse = table[(table["model"] == "m/worse") & (table["metric"] == "duplicated")].iloc[0]
    assert worse["diff"] == pytest.approx(20 / 30) and worse["verdict"] == "worse"
