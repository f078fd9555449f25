"""Differences of rates: Newcombe intervals, score tests, prompt and baseline comparisons."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest
from scipy.stats import fisher_exact, norm
from statsmodels.stats.proportion import proportion_confint
from twice.reports import (
    BaselineTest,
    baseline_comparison,
    baseline_test,
    difference,
    metric,
    prompt_comparison,
)
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


def test_verdict_of_a_rise_is_worse_for_duplication_and_better_for_safe_success() -> None:
    for rise in (difference(20, 40, 0, 40), difference(40, 40, 0, 40)):  # +50 %, all vs none
        assert verdict("duplicated", rise) == "worse"
        assert verdict("safe_success", rise) == "better"


@pytest.mark.parametrize(
    ("p_worse", "p_better", "expected"),
    [
        (0.05, 0.9, "same"),  # a p-value at alpha is not below it
        (0.0499, 0.9, "worse"),
        (0.9, 0.05, "same"),
        (0.9, 0.0499, "better"),
        (0.01, 0.01, "worse"),  # both: the regression is what a release must hear of
    ],
)
def test_baseline_verdict_needs_a_p_value_below_alpha(
    p_worse: float, p_better: float, expected: str
) -> None:
    test = BaselineTest(metric("duplication_rate"), p_worse, p_better, 0.05)
    assert test.verdict == expected
    assert test.p_value == min(p_worse, p_better)


def test_baseline_test_of_an_empty_side_is_nan_at_its_alpha() -> None:
    for k, n, k_ref, n_ref in ((0, 0, 1, 10), (1, 10, 0, 0)):
        test = baseline_test("duplication_rate", k, n, k_ref, n_ref, alpha=0.2)
        assert math.isnan(test.p_worse) and math.isnan(test.p_better)
        assert (test.alpha, test.verdict) == (0.2, "same")
        assert test.metric == metric("duplication_rate")
    assert baseline_test("completion_rate", 9, 20, 1, 20, alpha=0.2).alpha == 0.2
    # The test names its metric, whichever way the metric reads the tails.
    assert baseline_test("completed", 9, 20, 1, 20).metric == metric("completion_rate")
    assert baseline_test("duplicated", 9, 20, 1, 20).metric == metric("duplication_rate")


CELL_KEYS = {
    "model": "m/a",
    "agent": "react",
    "prompt": "baseline",
    "task": "refund",
    "fault": "lost_reply",
    "protection": "bare",
}


def test_baseline_comparison_rows_in_full() -> None:
    # 2 of 20 duplicated in the baseline, 12 of 20 now: every column the report and the gate
    # read, with Fisher's one-sided tail and Newcombe's interval computed independently.
    rows = baseline_comparison(_trials([({}, 20, 12)]), _trials([({}, 20, 2)]))
    rows = rows.to_dict("records")
    p_more = fisher_exact([[12, 8], [2, 18]], alternative="greater").pvalue
    test = "Fisher's exact test, one-sided"
    expected = [
        ("duplicated", "duplication", 0.1, 0.6, 0.5, p_more, True, "worse"),
        ("safe_success", "safe success", 0.9, 0.4, -0.5, p_more, True, "worse"),
        ("completed", "completion", 1.0, 1.0, 0.0, 1.0, False, "same"),
    ]
    assert len(rows) == len(expected)
    for row, (column, label, rate_ref, rate, diff, p, significant, said) in zip(
        rows, expected, strict=True
    ):
        k, k_ref = round(rate * 20), round(rate_ref * 20)
        assert row == {
            **CELL_KEYS,
            "flag": "regression",
            "prompt_changed": False,
            "metric": column,
            "label": label,
            "n_ref": 20,
            "n": 20,
            "rate_ref": pytest.approx(rate_ref),
            "rate": pytest.approx(rate),
            "diff": pytest.approx(diff),
            "diff_ci": pytest.approx(list(difference(k, 20, k_ref, 20).ci)),
            "p_value": pytest.approx(p, rel=1e-9),
            "significant": significant,
            "verdict": said,
            "test": test,
        }


def test_baseline_comparison_flags_a_cell_both_worse_and_better_as_mixed() -> None:
    base = _trials([({}, 30, 0)])
    base.loc[5:, "completed"] = 0.0  # 5 of 30 completed
    now = _trials([({}, 30, 20)])  # 30 of 30 completed, 20 duplicated
    table = baseline_comparison(now, base)
    assert set(table["flag"]) == {"mixed"}
    verdicts = dict(zip(table["metric"], table["verdict"], strict=True))
    assert verdicts == {"duplicated": "worse", "safe_success": "worse", "completed": "better"}


@pytest.mark.parametrize("crashed_in", ["now", "baseline"])
def test_baseline_comparison_of_a_cell_whose_trials_all_crashed_is_same_not_gone(
    crashed_in: str,
) -> None:
    # Next to a scored cell (m/b): none of its trials may stand in for the crashed cell's.
    crashed = _trials([({}, 5, 0), ({"model": "m/b"}, 20, 20)])
    crashed.loc[:4, "completed"] = math.nan
    scored = _trials([({}, 20, 2), ({"model": "m/b"}, 20, 20)])
    now, base = (crashed, scored) if crashed_in == "now" else (scored, crashed)
    table = baseline_comparison(now, base)
    cell = table[table["model"] == "m/a"]
    assert set(cell["flag"]) == {"same"}
    counts = (list(cell["n"]), list(cell["n_ref"]))
    zeros, twenties = [0, 0, 0], [20, 20, 20]
    assert counts == ((zeros, twenties) if crashed_in == "now" else (twenties, zeros))
    assert cell["p_value"].isna().all() and not cell["significant"].any()


def test_baseline_comparison_new_and_gone_cells_have_one_row_without_a_metric() -> None:
    table = baseline_comparison(_trials([({"model": "m/new"}, 3, 0)]), _trials([({}, 3, 0)]))
    rows = table.to_dict("records")
    assert rows == [
        {**CELL_KEYS, "flag": "gone", "prompt_changed": False, "metric": None},
        {**CELL_KEYS, "model": "m/new", "flag": "new", "prompt_changed": False, "metric": None},
    ]


@pytest.mark.parametrize(
    ("now_sha", "base_sha", "changed"),
    [("abc", "abc", False), ("abc", "def", True), ("", "def", False), ("abc", "", False)],
)
def test_a_prompt_is_changed_only_when_both_runs_recorded_different_texts(
    now_sha: str, base_sha: str, changed: bool
) -> None:
    now = _trials([({"prompt_sha256": now_sha}, 4, 0), ({"model": "m/b"}, 4, 0)])
    base = _trials([({"prompt_sha256": base_sha}, 4, 0), ({"model": "m/b"}, 4, 0)])
    flags = baseline_comparison(now, base).drop_duplicates("model")
    assert dict(zip(flags["model"], flags["prompt_changed"], strict=True)) == {
        "m/a": changed,
        "m/b": False,
    }


def test_prompt_comparison_row_in_full() -> None:
    # No prompt is called baseline: the first one ran is the reference.
    frame = _trials([({"prompt": "a"}, 10, 5), ({"prompt": "b"}, 10, 1)])
    rows = prompt_comparison(frame).to_dict("records")
    expected = [
        ("duplicated", "duplication", 0.5, 0.1, 5, 1),
        ("safe_success", "safe success", 0.5, 0.9, 5, 9),
        ("completed", "completion", 1.0, 1.0, 10, 10),
    ]
    assert len(rows) == len(expected)
    for row, (column, label, rate_ref, rate, k_ref, k) in zip(rows, expected, strict=True):
        d = difference(k, 10, k_ref, 10)
        assert row == {
            "model": "m/a",
            "prompt": "b",
            "reference": "a",
            "fault": "all",
            "conditions": 1,
            "metric": column,
            "label": label,
            "n_ref": 10,
            "n": 10,
            "rate_ref": rate_ref,
            "rate": rate,
            "diff": pytest.approx(rate - rate_ref),
            "diff_ci": list(d.ci),
            "p_value": d.p_value,
            "significant": False,
            "verdict": "same",
        }


def test_prompt_comparison_takes_the_reference_asked_when_it_ran() -> None:
    frame = _trials([({"prompt": "a"}, 10, 5), ({"prompt": "b"}, 10, 1)])
    table = prompt_comparison(frame, reference="b")
    assert set(table["reference"]) == {"b"} and set(table["prompt"]) == {"a"}
    table = prompt_comparison(frame, reference="never-ran")
    assert set(table["reference"]) == {"a"} and set(table["prompt"]) == {"b"}
    # A prompt called baseline is the reference wherever it comes in the run.
    frame = _trials([({"prompt": "a"}, 10, 5), ({"prompt": "baseline"}, 10, 1)])
    table = prompt_comparison(frame)
    assert set(table["reference"]) == {"baseline"} and set(table["prompt"]) == {"a"}


def test_prompt_comparison_per_fault_rows_only_when_asked_and_more_than_one_fault() -> None:
    two_faults = _trials(
        [
            ({"fault": "lost_reply"}, 4, 2),
            ({"fault": "none"}, 4, 0),
            ({"prompt": "p2", "fault": "lost_reply"}, 4, 2),
            ({"prompt": "p2", "fault": "none"}, 4, 0),
        ]
    )
    assert set(prompt_comparison(two_faults, by_fault=False)["fault"]) == {"all"}
    dup = prompt_comparison(two_faults).query("metric == 'duplicated'").set_index("fault")
    assert dict(dup["n"]) == {"all": 8, "lost_reply": 4, "none": 4}
    assert dict(dup["rate_ref"]) == {"all": 0.25, "lost_reply": 0.5, "none": 0.0}
    one_fault = _trials([({}, 4, 2), ({"prompt": "p2"}, 4, 0)])
    assert set(prompt_comparison(one_fault)["fault"]) == {"all"}


def test_prompt_comparison_is_per_model_and_skips_a_model_without_the_reference() -> None:
    frame = _trials(
        [
            ({}, 4, 2),
            ({"prompt": "p2"}, 4, 0),
            ({"model": "m/b"}, 6, 6),
            ({"model": "m/b", "prompt": "p2"}, 6, 0),
            ({"model": "m/c", "prompt": "p2"}, 5, 0),  # never ran the reference
        ]
    )
    table = prompt_comparison(frame)
    dup = table[table["metric"] == "duplicated"].set_index("model")
    assert list(dup.index) == ["m/a", "m/b"]
    assert list(dup["n"]) == [4, 6] and list(dup["rate_ref"]) == [0.5, 1.0]
    # Models in sorted order, whatever order their trials came in.
    reordered = pd.concat([frame.iloc[8:], frame.iloc[:8]], ignore_index=True)
    table = prompt_comparison(reordered)
    assert list(table[table["metric"] == "duplicated"]["model"]) == ["m/a", "m/b"]


def test_prompt_comparison_skips_a_prompt_sharing_no_condition_and_goes_on() -> None:
    frame = _trials(
        [
            ({"fault": "lost_reply"}, 4, 2),
            ({"prompt": "p2", "fault": "none"}, 4, 0),  # nothing in common with the reference
            ({"prompt": "p3", "fault": "lost_reply"}, 4, 0),
        ]
    )
    assert set(prompt_comparison(frame)["prompt"]) == {"p3"}
