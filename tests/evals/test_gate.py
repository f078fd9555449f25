"""The gate's rules, baseline test and JUnit output, on synthetic trial frames."""

from __future__ import annotations

import math
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from twice.evals import (
    BaselinePolicy,
    Check,
    GateConfig,
    GateError,
    GateResult,
    Rule,
    evaluate_gate,
    format_gate,
    junit_xml,
    load_gate,
    parse_gate,
    write_junit,
)
from twice.reports import CELL, COMPARED

Trials = Callable[..., pd.DataFrame]

SHIPPED_GATE = Path(__file__).parents[2] / "evals" / "gate.toml"


def rule(**kw: object) -> dict[str, object]:
    return {"rule": [{"name": "r", "metric": "duplication_rate", "max": 0.2, **kw}]}


def test_gate_shipped_file_loads() -> None:
    cfg = load_gate(SHIPPED_GATE)
    assert cfg.rules, "the shipped gate.toml should hold rules"
    assert {r.metric for r in cfg.rules} >= {"duplication_rate", "completion_rate", "wrong_rate"}


def test_gate_upper_bound_passes_with_enough_clean_trials(make_trials: Trials) -> None:
    # 0 of 24 duplicated: the Wilson 95% upper bound is 13.8% ≤ 20%.
    result = evaluate_gate(make_trials(24), parse_gate(rule()))
    assert result.passed
    assert "13.8%" in result.checks[0].message


def test_gate_upper_bound_fails_with_too_few_trials(make_trials: Trials) -> None:
    # 0 of 10 duplicated looks perfect, but the upper bound (27.8%) is above 20%.
    result = evaluate_gate(make_trials(10), parse_gate(rule()))
    assert not result.passed
    (check,) = result.failures
    assert "upper 95% bound of duplication_rate = 27.8% > max 20.0%" in check.message
    assert "0 of 10 trials duplicated" in check.message


def test_gate_bound_is_the_summarys_interval_to_the_last_digit(make_trials: Trials) -> None:
    # The failing path: the gate used alpha = 1 - 0.95 = 0.050000000000000044, so its bound
    # for 0 of 6 was 0.3903342879021653 where summary.json says 0.39033428790216546; a
    # limit between the two passed although the summary's bound exceeds it.
    from twice.reports import wilson

    trials = make_trials(6)
    hi = wilson(0, 6)[1]  # summary.json's and the report's interval (alpha 0.05)
    assert evaluate_gate(trials, parse_gate(rule(max=hi))).passed
    below = math.nextafter(hi, 0.0)
    assert not evaluate_gate(trials, parse_gate(rule(max=below))).passed
    # Rounding must not make a confidence near 1 an alpha of 0 (a bound of NaN).
    from twice.reports import alpha_of

    assert alpha_of(0.95) == 0.05 and 0 < alpha_of(0.9999999999999) < 1e-12


def test_gate_point_statistic_ignores_the_interval(make_trials: Trials) -> None:
    result = evaluate_gate(make_trials(10), parse_gate(rule(statistic="point")))
    assert result.passed


def test_gate_min_bound_uses_the_lower_bound(make_trials: Trials) -> None:
    cfg = parse_gate({"rule": [{"name": "done", "metric": "completion_rate", "min": 0.9}]})
    assert evaluate_gate(make_trials(100, completed=100), cfg).passed
    # 95 of 100 completed: the point is above 90% but the lower bound (88.8%) is not.
    result = evaluate_gate(make_trials(100, completed=95), cfg)
    assert not result.passed
    assert "lower 95% bound of completion_rate = 88.8% < min 90.0%" in result.failures[0].message


def test_gate_confidence_changes_the_bound(make_trials: Trials) -> None:
    loose = parse_gate({**rule(), "confidence": 0.8})
    assert evaluate_gate(make_trials(10), loose).passed  # 80% upper bound at 0/10 is 14.1%


def test_gate_min_trials_fails_small_cells(make_trials: Trials) -> None:
    result = evaluate_gate(make_trials(24), parse_gate(rule(min_trials=30)))
    assert "only 24 scored trial(s); the rule needs at least 30" in result.failures[0].message


def test_gate_filters_select_cells_with_globs(make_trials: Trials) -> None:
    trials = pd.concat(
        [make_trials(24, model="openai/gpt-5"), make_trials(24, duplicated=24, model="stub/retry")]
    )
    checks = evaluate_gate(trials, parse_gate(rule(model="openai/*"))).checks
    assert [c.cell.split(" / ")[0] for c in checks] == ["openai/gpt-5"]
    assert all(c.status == "pass" for c in checks)


def test_gate_rule_matching_no_cell_fails(make_trials: Trials) -> None:
    # The filters as written, then each filtered axis's values in the logs, sorted, once each.
    trials = pd.concat(
        [
            make_trials(4, model="m/b"),
            make_trials(4, model="m/b", fault="timeout_before_commit"),
            make_trials(4),
        ]
    )
    typo = rule(name="typo", model=["m/*"], fault=["lost_reply_typo", "x"])
    assert evaluate_gate(trials, parse_gate(typo)).checks == [
        Check(
            "rule",
            "typo",
            "(no cell)",
            "fail",
            "no cell matches model=['m/*'], fault=['lost_reply_typo', 'x']; the logs hold "
            "model: m/a, m/b; fault: lost_reply, timeout_before_commit",
        )
    ]


def test_gate_on_no_trial_at_all_says_so(make_trials: Trials) -> None:
    # --allow-errors on a run interrupted before any trial finished: the message listed the
    # axes the logs hold, "model: " and nothing after it.
    none = make_trials(24).iloc[0:0]
    assert evaluate_gate(none, parse_gate(rule())).checks == [
        Check(
            "rule",
            "r",
            "(no cell)",
            "fail",
            "no cell matches (no filters): the logs hold no scored trial",
        )
    ]
    (check,) = evaluate_gate(none, parse_gate(rule(task="refund"))).checks
    assert check.message == "no cell matches task=['refund']: the logs hold no scored trial"


def test_gate_judges_trials_whose_cell_key_is_missing(make_trials: Trials) -> None:
    # A frame joined from logs with and without an axis has NaN there: its trials are still a
    # cell the gate judges, not dropped with their key (which left "no cell" to judge).
    trials = make_trials(24).assign(prompt=math.nan)
    (check,) = evaluate_gate(trials, parse_gate(rule())).checks
    assert (check.status, check.message) == (
        "pass",
        "upper 95% bound of duplication_rate = 13.8% ≤ max 20.0% (0 of 24 trials duplicated: "
        "duplication_rate 0.0%, Wilson 95% interval [0.0%, 13.8%])",
    )


def test_gate_errored_trials_are_excluded_and_noted(make_trials: Trials) -> None:
    result = evaluate_gate(make_trials(24, errors=3), parse_gate(rule()))
    assert result.passed
    assert "3 errored trial(s) excluded" in result.checks[0].message
    assert result.notes == ["3 errored trial(s) were excluded from the rates"]


def test_gate_bounds_the_rate_of_agents_that_crashed(make_trials: Trials) -> None:
    # A framework agent that raises on a lost reply may have made the refund once before it
    # died: completed, not duplicated. Only crashed_rate shows the crash, so a gate bounds it.
    cfg = parse_gate({"rule": [{"name": "no crash", "metric": "crashed_rate", "max": 0.2}]})
    assert evaluate_gate(make_trials(24), cfg).passed
    result = evaluate_gate(make_trials(24, agent_crashed=12), cfg)
    assert not result.passed
    message = result.failures[0].message
    assert "upper 95% bound of crashed_rate" in message and "12 of 24 trials crashed" in message
    assert evaluate_gate(make_trials(24, agent_crashed=12), parse_gate(rule())).passed


def test_gate_reads_a_frame_without_a_crashed_column_as_no_crash(make_trials: Trials) -> None:
    # a frame from before agents under test (or built by hand) has no agent that could crash
    cfg = parse_gate({"rule": [{"name": "no crash", "metric": "crashed_rate", "max": 0.2}]})
    old = make_trials(24).drop(columns="crashed")
    assert evaluate_gate(old, cfg).passed
    baseline = parse_gate({"baseline": {"metrics": ["crashed_rate"]}})
    assert evaluate_gate(make_trials(24), baseline, baseline=old).passed


def test_gate_baseline_compares_agent_crashes(make_trials: Trials) -> None:
    cfg = parse_gate({"baseline": {"metrics": ["crashed_rate"]}})
    old, new = make_trials(100), make_trials(100, agent_crashed=20)
    result = evaluate_gate(new, cfg, baseline=old)
    assert not result.passed
    assert "crashed_rate 20.0% (20/100) vs baseline 0.0% (0/100)" in result.failures[0].message


def test_gate_bounds_the_rate_of_wrong_values(make_trials: Trials) -> None:
    # A refund of the whole order where $4.99 was asked is one effect, not a duplicate: only
    # wrong_rate (and completion) show it.
    cfg = parse_gate({"rule": [{"name": "asked values", "metric": "wrong_rate", "max": 0.2}]})
    assert evaluate_gate(make_trials(24), cfg).passed
    result = evaluate_gate(make_trials(24, wrong=12), cfg)
    assert not result.passed
    message = result.failures[0].message
    assert "upper 95% bound of wrong_rate" in message and "12 of 24 trials wrong" in message
    assert evaluate_gate(make_trials(24, wrong=12), parse_gate(rule())).passed
    mean = {"rule": [{"name": "m", "metric": "wrong_effects_mean", "max": 0.1}]}
    assert not evaluate_gate(make_trials(24, wrong=12), parse_gate(mean)).passed
    baseline = parse_gate({"baseline": {"metrics": ["wrong_rate"]}})
    worse = evaluate_gate(make_trials(100, wrong=20), baseline, baseline=make_trials(100))
    assert not worse.passed
    assert "wrong_rate 20.0% (20/100) vs baseline 0.0% (0/100)" in worse.failures[0].message


def test_gate_on_logs_scored_before_wrong_values_existed_does_not_pass(
    make_trials: Trials,
) -> None:
    # Their trials never measured wrong values: counting them as 0 wrong would pass the
    # rule by accident.
    cfg = parse_gate({"rule": [{"name": "asked values", "metric": "wrong_rate", "max": 0.2}]})
    old = make_trials(24).assign(wrong=math.nan, wrong_effects=math.nan)
    result = evaluate_gate(old, cfg)
    assert not result.passed
    message = result.failures[0].message
    assert "only 0 scored trial(s)" in message
    assert "24 trial(s) scored before twice measured wrong" in message
    assert not evaluate_gate(make_trials(24).drop(columns=["wrong"]), cfg).passed


def test_gate_mean_metric_bounds_the_point(make_trials: Trials) -> None:
    cfg = parse_gate({"rule": [{"name": "x", "metric": "excess_effects_mean", "max": 0.1}]})
    assert evaluate_gate(make_trials(20, duplicated=1), cfg).passed  # mean 0.05
    assert not evaluate_gate(make_trials(20, duplicated=4), cfg).passed  # mean 0.2


def test_gate_baseline_fails_a_significant_regression(make_trials: Trials) -> None:
    cfg = parse_gate({"baseline": {"metrics": ["duplication_rate"]}})
    result = evaluate_gate(
        make_trials(20, duplicated=8), cfg, baseline=make_trials(20, duplicated=0)
    )
    (check,) = result.failures
    assert check.group == "baseline" and check.name == "duplication_rate"
    assert "40.0% (8/20) vs baseline 0.0% (0/20): significantly worse" in check.message
    # Hypergeometric tail by hand: all 8 duplicates of 40 trials landed in the new 20.
    p = math.comb(20, 8) / math.comb(40, 8)
    assert f"Fisher's exact test, one-sided p = {p:.3g} < alpha 0.05" in check.message


def test_gate_baseline_passes_noise_and_improvements(make_trials: Trials) -> None:
    cfg = parse_gate({"baseline": {"metrics": ["duplication_rate", "completion_rate"]}})
    noise = evaluate_gate(
        make_trials(20, duplicated=2), cfg, baseline=make_trials(20, duplicated=1)
    )
    assert noise.passed and "not significantly worse" in noise.checks[0].message
    better = evaluate_gate(
        make_trials(20, duplicated=0), cfg, baseline=make_trials(20, duplicated=10)
    )
    assert better.passed


def test_gate_baseline_direction_for_rates_that_should_be_high(make_trials: Trials) -> None:
    cfg = parse_gate({"baseline": {"metrics": ["completion_rate"]}})
    result = evaluate_gate(
        make_trials(20, completed=10), cfg, baseline=make_trials(20, completed=20)
    )
    assert not result.passed
    assert "completion_rate 50.0% (10/20) vs baseline 100.0% (20/20)" in result.failures[0].message


def test_gate_baseline_match_pools_unmatched_keys(make_trials: Trials) -> None:
    new = make_trials(20, duplicated=8, model="new/model")
    old = make_trials(20, duplicated=0, model="old/model")
    strict = evaluate_gate(
        new, parse_gate({"baseline": {"metrics": ["duplication_rate"]}}), baseline=old
    )
    assert [c.status for c in strict.checks] == ["skip", "fail"]
    assert "the baseline has no scored trials for model=new/model" in strict.checks[0].message
    cross = parse_gate({"baseline": {"metrics": ["duplication_rate"], "match": ["task", "fault"]}})
    assert not evaluate_gate(new, cross, baseline=old).passed


def test_gate_baseline_that_compared_no_cell_fails(make_trials: Trials) -> None:
    # The failing path: the same agent spelt ./agents/a.py in the new run paired with nothing,
    # every check skipped, and the gate passed a 0% → 100% duplication regression.
    cfg = parse_gate({"baseline": {"metrics": ["duplication_rate"]}})
    old = make_trials(4, agent="agents/a.py:run")
    new = make_trials(4, duplicated=4, agent="./agents/a.py:run")
    result = evaluate_gate(new, cfg, baseline=old)
    assert not result.passed
    (check,) = result.failures
    assert check.cell == "(no cell)"
    assert "no cell could be compared with the baseline" in check.message
    assert "agent: ./agents/a.py:run vs baseline agents/a.py:run" in check.message
    # One compared cell is enough: the others may be new (a task added since the baseline).
    both = pd.concat([new, make_trials(4, agent="agents/a.py:run")], ignore_index=True)
    assert [c.status for c in evaluate_gate(both, cfg, baseline=old).checks] == ["skip", "pass"]


def test_gate_baseline_that_compared_no_cell_names_what_differs(make_trials: Trials) -> None:
    # Each key that differs, with both sides' values sorted; "-" for a side with none.
    cfg = parse_gate({"baseline": {"metrics": ["wrong_rate"], "match": ["model", "agent"]}})
    ours = pd.concat([make_trials(2, agent="y"), make_trials(2, agent="x")])
    base = pd.concat([make_trials(2, agent="q", model="b/2"), make_trials(2, agent="p")])
    why = {
        "ours": "model: m/a vs baseline b/2, m/a; agent: x, y vs baseline p, q",
        "no run": "model: - vs baseline b/2, m/a; agent: - vs baseline p, q",
        "no baseline": "model: m/a vs baseline -; agent: x, y vs baseline -",
    }
    for case, (new, old) in {
        "ours": (ours, base),
        "no run": (ours.iloc[0:0], base),
        "no baseline": (ours, base.iloc[0:0]),
    }.items():
        checks = evaluate_gate(new, cfg, baseline=old).checks
        assert checks[-1] == Check(
            "baseline",
            "wrong_rate",
            "(no cell)",
            "fail",
            f"no cell could be compared with the baseline on model, agent ({why[case]})",
        ), case


def test_gate_shipped_baseline_compares_each_agent_with_itself(make_trials: Trials) -> None:
    # The failing path: the shipped match left out "agent", so the new run's keyed agent
    # (now 4/4 duplicated) was compared with both baseline agents pooled (4/8) and passed.
    shipped = load_gate(SHIPPED_GATE)
    cfg = parse_gate(
        {"baseline": {"metrics": ["duplication_rate"], "match": list(shipped.baseline.match)}}
    )
    old = pd.concat(
        [make_trials(4, agent="keyed"), make_trials(4, duplicated=4, agent="nokey")],
        ignore_index=True,
    )
    result = evaluate_gate(make_trials(4, duplicated=4, agent="keyed"), cfg, baseline=old)
    assert not result.passed
    assert "100.0% (4/4) vs baseline 0.0% (0/4)" in result.failures[0].message


RULE = '[[rule]]\nname = "r"\nmetric = "duplication_rate"\n'
"""The head of a rule on a rate, without its bound."""

METRICS = (
    "completion_rate, duplication_rate, exactly_once_rate, safe_success_rate, divergence_rate, "
    "wrong_rate, excess_effects_mean, wrong_effects_mean, unseen_effects_mean, crashed_rate"
)
RATES = (
    "completion_rate, duplication_rate, exactly_once_rate, safe_success_rate, divergence_rate, "
    "wrong_rate, crashed_rate"
)
NEVER = "can never pass (no number of trials proves a rate exactly"

BAD_GATE_FILES = [
    # The file and its top level.
    (None, "gate file 'g.toml' does not exist; twice ships gate.toml (give one of those, or a "
     "path)"),
    ("[[rule]\n", "gate file 'g.toml' is not valid TOML: Expected ']]' at the end of an array "
     "declaration (at line 1, column 7)"),
    (b"\xff\xfe", "gate file 'g.toml' is not valid TOML: 'utf-8' codec can't decode byte 0xff "
     "in position 0: invalid start byte"),
    ("rules = []\nthreshold = 1\n", "g.toml: unknown key(s) rules, threshold; expected: baseline, "
     "confidence, description, rule"),
    ("rule = 3\n", "g.toml: rules are written as [[rule]] blocks (a list of tables), got 3"),
    ('[rule]\nmetric = "duplication_rate"\n', "g.toml: rules are written as [[rule]] blocks "
     "(a list of tables), got {'metric': 'duplication_rate'}"),
    ("confidence = 1.0\n", "g.toml: 'confidence' must be a number strictly between 0 and 1, "
     "got 1.0"),
    ("confidence = 0\n", "g.toml: 'confidence' must be a number strictly between 0 and 1, got 0"),
    ("confidence = true\n", "g.toml: 'confidence' must be a number strictly between 0 and 1, "
     "got True"),
    ('confidence = "high"\n', "g.toml: 'confidence' must be a number strictly between 0 and 1, "
     "got 'high'"),
    (RULE + "max = 0.1\n" + RULE + "max = 0.2\n" + '[[rule]]\nname = "a"\nmetric = '
     '"completion_rate"\nmin = 0.9\n' * 3, "g.toml: rule names must be distinct; repeated: a, r"),
    # A rule.
    ("rule = [1]\n", "g.toml [[rule]] #1: must be a table, got 1"),
    (RULE + "max = 0.1\nthreshold = 1\nlimit = 2\n", "g.toml [[rule]] #1: unknown key(s) limit, "
     "threshold; expected: agent, fault, max, metric, min, min_trials, model, name, prompt, "
     "protection, statistic, task"),
    ("[[rule]]\nmax = 0.1\n", f"g.toml [[rule]] #1: 'metric' is missing; give one of: {METRICS}"),
    ('[[rule]]\nmetric = "dup_rate"\nmax = 0.1\n', "g.toml [[rule]] #1: unknown metric "
     f"'dup_rate'; expected one of: {METRICS}"),
    (RULE, "g.toml [[rule]] #1: give exactly one of 'max' or 'min' (the bound on "
     "duplication_rate), got neither"),
    (RULE + "max = 0.1\nmin = 0.0\n", "g.toml [[rule]] #1: give exactly one of 'max' or 'min' "
     "(the bound on duplication_rate), got both"),
    (RULE + "max = 1.5\n", "g.toml [[rule]] #1: 'max' must be a number between 0 and 1, got 1.5"),
    (RULE + "min = -0.1\n", "g.toml [[rule]] #1: 'min' must be a number between 0 and 1, "
     "got -0.1"),
    (RULE + "max = true\n", "g.toml [[rule]] #1: 'max' must be a number between 0 and 1, "
     "got True"),
    (RULE + 'max = "5%"\n', "g.toml [[rule]] #1: 'max' must be a number between 0 and 1, "
     "got '5%'"),
    ('[[rule]]\nmetric = "excess_effects_mean"\nmax = -1\n', "g.toml [[rule]] #1: 'max' must "
     "be a non-negative number, got -1"),
    ('[[rule]]\nmetric = "excess_effects_mean"\nmax = true\n', "g.toml [[rule]] #1: 'max' must "
     "be a non-negative number, got True"),
    ('[[rule]]\nmetric = "excess_effects_mean"\nmin = "1"\n', "g.toml [[rule]] #1: 'min' must "
     "be a non-negative number, got '1'"),
    (RULE + 'max = 0.1\nstatistic = "mean"\n', "g.toml [[rule]] #1: unknown statistic 'mean'; "
     "expected one of: point, lower, upper"),
    ('[[rule]]\nmetric = "excess_effects_mean"\nmax = 1\nstatistic = "upper"\n', "g.toml "
     "[[rule]] #1: excess_effects_mean is a mean without an interval; statistic must be "
     "'point', got 'upper'"),
    # Rules that could never pass: every cell ran to the sequential cap, then failed.
    (RULE + "max = 0.0\n", f"g.toml [[rule]] #1: max = 0.0 on the upper bound of "
     f"duplication_rate {NEVER} 0); for 'none seen' use statistic = \"point\", or give a max "
     "above 0"),
    ('[[rule]]\nmetric = "completion_rate"\nmin = 1\nstatistic = "lower"\n', "g.toml [[rule]] "
     f"#1: min = 1 on the lower bound of completion_rate {NEVER} 1); for 'all seen' use "
     "statistic = \"point\", or give a min below 1"),
    (RULE + "max = 0.1\nmin_trials = 0\n", "g.toml [[rule]] #1: 'min_trials' must be an "
     "integer ≥ 1, got 0"),
    (RULE + "max = 0.1\nmin_trials = 2.5\n", "g.toml [[rule]] #1: 'min_trials' must be an "
     "integer ≥ 1, got 2.5"),
    (RULE + "max = 0.1\nmin_trials = true\n", "g.toml [[rule]] #1: 'min_trials' must be an "
     "integer ≥ 1, got True"),
    (RULE + "max = 0.1\nmodel = 3\n", "g.toml [[rule]] #1: 'model' must be a string or a "
     "non-empty list of strings, got 3"),
    (RULE + "max = 0.1\nfault = []\n", "g.toml [[rule]] #1: 'fault' must be a string or a "
     "non-empty list of strings, got []"),
    (RULE + 'max = 0.1\nprompt = ["a", 2]\n', "g.toml [[rule]] #1: 'prompt' must be a string "
     "or a non-empty list of strings, got ['a', 2]"),
    ('[[rule]]\nname = "  "\nmetric = "duplication_rate"\nmax = 0.1\n', "g.toml [[rule]] #1: "
     "'name' must be a non-empty string, got '  '"),
    ('[[rule]]\nname = 7\nmetric = "duplication_rate"\nmax = 0.1\n', "g.toml [[rule]] #1: "
     "'name' must be a non-empty string, got 7"),
    (RULE + "max = 0.1\n[[rule]]\nmetric = \"wrong_rate\"\n", "g.toml [[rule]] #2: give exactly "
     "one of 'max' or 'min' (the bound on wrong_rate), got neither"),
    # The baseline.
    ("baseline = 3\n", "g.toml [baseline]: must be a table, got 3"),
    ("[baseline]\nalpha = 0.05\nlevel = 1\nmatches = []\n", "g.toml [baseline]: unknown key(s) "
     "level, matches; expected: alpha, match, metrics"),
    ("[baseline]\nalpha = 0\n", "g.toml [baseline]: 'alpha' must be a number strictly between 0 "
     "and 1, got 0"),
    ("[baseline]\nalpha = 1\n", "g.toml [baseline]: 'alpha' must be a number strictly between 0 "
     "and 1, got 1"),
    ('[baseline]\nalpha = "0.05"\n', "g.toml [baseline]: 'alpha' must be a number strictly "
     "between 0 and 1, got '0.05'"),
    ('[baseline]\nmetrics = ["duplication_rate", "excess_effects_mean"]\n', "g.toml [baseline]: "
     "metric 'excess_effects_mean' cannot be compared with a test of proportions; expected one "
     f"of: {RATES}"),
    ('[baseline]\nmetrics = "dup"\n', "g.toml [baseline]: metric 'dup' cannot be compared with "
     f"a test of proportions; expected one of: {RATES}"),
    ("[baseline]\nmetrics = []\n", "g.toml [baseline]: 'metrics' must be a string or a non-empty "
     "list of strings, got []"),
    ('[baseline]\nmatch = ["model", "modell"]\n', "g.toml [baseline]: unknown match key "
     "'modell'; expected some of: model, agent, prompt, task, fault, protection"),
    ("[baseline]\nmatch = 1\n", "g.toml [baseline]: 'match' must be a string or a non-empty "
     "list of strings, got 1"),
]  # fmt: skip
"""A gate file → the whole message that refuses it: the file, the block, the bad value, and
what would be accepted."""


@pytest.mark.parametrize(
    ("text", "expected"), BAD_GATE_FILES, ids=[f"row{i}" for i in range(len(BAD_GATE_FILES))]
)
def test_gate_file_refused_says_what_and_why_in_full(
    text: str | bytes | None, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if text is not None:  # None: no such file
        Path("g.toml").write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with pytest.raises(GateError) as err:
        load_gate("g.toml")
    assert str(err.value) == expected
    if isinstance(text, str) and not expected.startswith("gate file"):
        # The same document already parsed: the same message, under the source it is given.
        with pytest.raises(GateError) as parsed:
            parse_gate(tomllib.loads(text), source="g.toml")
        assert str(parsed.value) == expected


GOOD_RULES = [
    # The defaults: a name from the bound, the cautious statistic of a rate, one trial.
    ({"metric": "duplication_rate", "max": 0.2},
     Rule("duplication_rate max 0.2", "duplication_rate", 0.2, "max", "upper")),
    ({"metric": "completion_rate", "min": 0.9},
     Rule("completion_rate min 0.9", "completion_rate", 0.9, "min", "lower")),
    ({"metric": "excess_effects_mean", "min": 0},
     Rule("excess_effects_mean min 0", "excess_effects_mean", 0.0, "min", "point")),
    # Everything given: a name trimmed, filters as tuples in CELL's order.
    ({"name": "  done  ", "metric": "completion_rate", "min": 1, "statistic": "point",
      "min_trials": 1, "fault": "lost_reply", "model": ["a/*", "b"]},
     Rule("done", "completion_rate", 1.0, "min", "point", 1,
          {"model": ("a/*", "b"), "fault": ("lost_reply",)})),
    ({"name": "few", "metric": "excess_effects_mean", "max": 2.5, "min_trials": 30},
     Rule("few", "excess_effects_mean", 2.5, "max", "point", 30)),
    # Bounds only the cautious statistic can never meet are fine on the others.
    ({"metric": "duplication_rate", "max": 0, "statistic": "point"},
     Rule("duplication_rate max 0", "duplication_rate", 0.0, "max", "point")),
    ({"metric": "duplication_rate", "max": 0.0, "statistic": "lower"},
     Rule("duplication_rate max 0.0", "duplication_rate", 0.0, "max", "lower")),
    ({"metric": "completion_rate", "min": 1, "statistic": "upper"},
     Rule("completion_rate min 1", "completion_rate", 1.0, "min", "upper")),
    ({"metric": "duplication_rate", "max": 1},
     Rule("duplication_rate max 1", "duplication_rate", 1.0, "max", "upper")),
    ({"metric": "completion_rate", "min": 0},
     Rule("completion_rate min 0", "completion_rate", 0.0, "min", "lower")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("block", "expected"), GOOD_RULES, ids=[f"row{i}" for i in range(len(GOOD_RULES))]
)
def test_gate_rule_parses_to_its_rule(block: dict[str, object], expected: Rule) -> None:
    (parsed,) = parse_gate({"rule": [block]}).rules
    assert parsed == expected
    assert type(parsed.bound) is float


def test_gate_file_defaults_and_baseline_policy() -> None:
    default = parse_gate({})
    assert default == GateConfig((), 0.95, BaselinePolicy(0.05, COMPARED, CELL), "<config>")
    assert parse_gate({"baseline": {}}, source="g.toml") == GateConfig(
        (), 0.95, BaselinePolicy(0.05, COMPARED, CELL), "g.toml"
    )
    given = {"confidence": 0.8, "baseline": {"alpha": 0.1, "metrics": "wrong_rate", "match": []}}
    assert parse_gate(given) == GateConfig((), 0.8, BaselinePolicy(0.1, ("wrong_rate",), ()))
    pooled = parse_gate({"baseline": {"match": "task"}}).baseline
    assert pooled == BaselinePolicy(0.05, COMPARED, ("task",))
    assert type(default.confidence) is float and type(pooled.alpha) is float


def test_gate_junit_has_one_case_per_rule_and_cell(make_trials: Trials) -> None:
    trials = pd.concat(
        [make_trials(24, model="a/ok"), make_trials(24, duplicated=24, model="a/bad")]
    )
    result = evaluate_gate(trials, parse_gate(rule()))
    root = ET.fromstring(junit_xml(result.checks))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {
        "a/ok / baseline / refund / lost_reply / bare",
        "a/bad / baseline / refund / lost_reply / bare",
    }
    failure = cases["a/bad / baseline / refund / lost_reply / bare"].find("failure")
    assert failure is not None
    assert "upper 95% bound of duplication_rate = 100.0% > max 20.0%" in (
        failure.get("message") or ""
    )
    assert cases["a/ok / baseline / refund / lost_reply / bare"].find("failure") is None


def test_gate_shipped_junit_fails_a_cell_with_wrong_values(make_trials: Trials) -> None:
    # 100 trials without faults, none duplicated, 10 refunding another amount than asked:
    # the shipped gate's wrong-values rule is the one that fails, in its own test case.
    result = evaluate_gate(make_trials(100, wrong=10, fault="none"), load_gate(SHIPPED_GATE))
    cases = {
        c.get("classname"): c for c in ET.fromstring(junit_xml(result.checks)).iter("testcase")
    }
    wrong = cases["twice.rule.no wrong values without faults"].find("failure")
    assert wrong is not None
    assert "10 of 100 trials wrong: wrong_rate 10.0%" in (wrong.get("message") or "")
    assert cases["twice.rule.no duplicates without faults"].find("failure") is None


def test_gate_baseline_and_report_badge_agree(make_trials: Trials) -> None:
    # One test behind both: with a two-sided score test in the report and a one-sided Fisher
    # test in the gate, a report could say "regression" where the gate passed.
    from twice.reports import baseline_comparison

    # (k, n, k0, n0) where the two old tests disagreed (score p < 0.05 ≤ Fisher p), then a grid.
    cases = [(2, 10, 0, 20), (2, 10, 0, 30), (1, 10, 0, 40), (5, 10, 3, 20), (20, 20, 8, 10)]
    cases += [(k, 20, k0, 30) for k in range(0, 21, 4) for k0 in range(0, 31, 6)]
    disagreements = []
    for k, n, k0, n0 in cases:
        now = make_trials(n, duplicated=k).assign(prompt_sha256="a")
        base = make_trials(n0, duplicated=k0).assign(prompt_sha256="a")
        flag = baseline_comparison(now, base)["flag"].iloc[0]
        gate = evaluate_gate(now, parse_gate({}), baseline=base)
        if (flag in ("regression", "mixed")) == gate.passed:
            disagreements.append((k, n, k0, n0, flag, gate.passed))
    assert disagreements == []


# -- the baseline's configured alpha is the one the comparison uses ----------------------------


@pytest.mark.parametrize(
    ("alpha", "status"),
    [(0.05, "fail"), (0.03, "fail"), (0.02, "pass"), (0.01, "pass")],
)
def test_gate_baseline_uses_the_configured_alpha(
    make_trials: Trials, alpha: float, status: str
) -> None:
    # 5 of 20 duplicated against 0 of 20: one-sided p = 0.0236. A stricter policy (alpha 0.02
    # or 0.01) must pass it; the default 0.05 fails it.
    p = math.comb(20, 5) / math.comb(40, 5)
    assert round(p, 4) == 0.0236
    cfg = parse_gate({"baseline": {"metrics": ["duplication_rate"], "alpha": alpha}})
    assert cfg.baseline.alpha == alpha
    result = evaluate_gate(
        make_trials(20, duplicated=5), cfg, baseline=make_trials(20, duplicated=0)
    )
    (check,) = result.checks
    assert check.status == status, check.message
    sign = "<" if status == "fail" else "≥"
    assert f"one-sided p = {p:.3g} {sign} alpha {alpha:g}" in check.message


def test_gate_baseline_with_a_looser_alpha_fails_a_smaller_regression(make_trials: Trials) -> None:
    # 5 of 20 against 1 of 20: p = 0.0909 passes at the default 0.05, fails at 0.1.
    new, old = make_trials(20, duplicated=5), make_trials(20, duplicated=1)
    default = parse_gate({"baseline": {"metrics": ["duplication_rate"]}})
    loose = parse_gate({"baseline": {"metrics": ["duplication_rate"], "alpha": 0.1}})
    assert evaluate_gate(new, default, baseline=old).passed
    result = evaluate_gate(new, loose, baseline=old)
    assert not result.passed
    assert "one-sided p = 0.0909 < alpha 0.1" in result.failures[0].message


def test_gate_file_baseline_alpha_reaches_the_comparison(
    make_trials: Trials, tmp_path: Path
) -> None:
    # From the TOML file, as `twice gate --baseline` reads it.
    path = tmp_path / "gate.toml"
    path.write_text('[baseline]\nalpha = 0.01\nmetrics = ["duplication_rate"]\n')
    cfg = load_gate(path)
    result = evaluate_gate(
        make_trials(20, duplicated=5), cfg, baseline=make_trials(20, duplicated=0)
    )
    assert result.passed and "≥ alpha 0.01" in result.checks[0].message


# -- boundaries of the rules (survivors of make mutation) ----------------------------------------


def test_gate_a_cell_with_exactly_min_trials_is_judged(make_trials: Trials) -> None:
    # 0 of 24 duplicated: upper bound 13.8% ≤ 20%, with exactly the 24 trials required.
    result = evaluate_gate(make_trials(24), parse_gate(rule(min_trials=24)))
    (check,) = result.checks
    assert check.status == "pass", check.message
    assert check.message == (
        "upper 95% bound of duplication_rate = 13.8% ≤ max 20.0% (0 of 24 trials duplicated: "
        "duplication_rate 0.0%, Wilson 95% interval [0.0%, 13.8%])"
    )
    assert not evaluate_gate(make_trials(23), parse_gate(rule(min_trials=24))).passed


def test_gate_a_min_rule_passes_at_its_bound(make_trials: Trials) -> None:
    cfg = parse_gate(
        {"rule": [{"name": "done", "metric": "completion_rate", "min": 0.9, "statistic": "point"}]}
    )
    (check,) = evaluate_gate(make_trials(10, completed=9), cfg).checks
    assert check.status == "pass"
    assert check.message.startswith("point of completion_rate = 90.0% ≥ min 90.0% (")
    (below,) = evaluate_gate(make_trials(10, completed=8), cfg).checks
    assert below.status == "fail" and "point of completion_rate = 80.0% < min 90.0%" in (
        below.message
    )


def test_gate_a_min_rule_that_fails_regardless_of_more_trials_says_so(
    make_trials: Trials,
) -> None:
    cfg = parse_gate(
        {"rule": [{"name": "done", "metric": "completion_rate", "min": 0.9, "min_trials": 60}]}
    )
    (check,) = evaluate_gate(make_trials(10, completed=0), cfg).checks
    assert check.status == "fail"
    assert check.message == (
        "fails regardless of more trials: the upper 95% bound is already below min 90.0% with "
        "10 scored trial(s) of the 60 required (0 of 10 trials completed: completion_rate 0.0%, "
        "Wilson 95% interval [0.0%, 27.8%])"
    )
    (dup,) = evaluate_gate(make_trials(10, duplicated=10), parse_gate(rule(min_trials=60))).checks
    assert dup.message.startswith(
        "fails regardless of more trials: the lower 95% bound is already above max 20.0% with "
        "10 scored trial(s) of the 60 required"
    )


def test_gate_baseline_compares_a_cell_of_one_scored_trial(make_trials: Trials) -> None:
    cfg = parse_gate({"baseline": {"metrics": ["duplication_rate"]}})
    (check,) = evaluate_gate(
        make_trials(1, duplicated=1), cfg, baseline=make_trials(20, duplicated=0)
    ).checks
    assert check.status in {"pass", "fail"} and "(1/1) vs baseline 0.0% (0/20)" in check.message
    skipped = evaluate_gate(
        make_trials(0, errors=2), cfg, baseline=make_trials(20, duplicated=0)
    ).checks[0]
    assert skipped.status == "skip"
    assert skipped.message == (
        "this cell has no scored trials for model=m/a, agent=react, prompt=baseline, "
        "task=refund, fault=lost_reply, protection=bare"
    )
    assert skipped.cell == "m/a / baseline / refund / lost_reply / bare"


CELL_A = "m/a / baseline / refund / lost_reply / bare"


@pytest.mark.parametrize(
    ("gate_rule", "made", "status", "cell", "text"),
    [
        pytest.param(
            {"metric": "duplication_rate", "max": 0.2}, {"n": 24}, "pass", CELL_A,
            "upper 95% bound of duplication_rate = 13.8% ≤ max 20.0% (0 of 24 trials "
            "duplicated: duplication_rate 0.0%, Wilson 95% interval [0.0%, 13.8%])",
            id="max-upper-pass",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.2}, {"n": 10, "duplicated": 1}, "fail",
            CELL_A,
            "upper 95% bound of duplication_rate = 40.4% > max 20.0% (1 of 10 trials "
            "duplicated: duplication_rate 10.0%, Wilson 95% interval [1.8%, 40.4%])",
            id="max-upper-fail",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.2, "min_trials": 30},
            {"n": 10, "duplicated": 1, "errors": 2}, "fail", CELL_A,
            "only 10 scored trial(s); the rule needs at least 30 (1 of 10 trials duplicated: "
            "duplication_rate 10.0%, Wilson 95% interval [1.8%, 40.4%]; 2 errored trial(s) "
            "excluded)",
            id="max-upper-too-few",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.2, "min_trials": 30},
            {"n": 10, "duplicated": 9}, "fail", CELL_A,
            "fails regardless of more trials: the lower 95% bound is already above max 20.0% "
            "with 10 scored trial(s) of the 30 required (9 of 10 trials duplicated: "
            "duplication_rate 90.0%, Wilson 95% interval [59.6%, 98.2%])",
            id="max-upper-too-few-but-certain",
        ),
        pytest.param(
            {"metric": "completion_rate", "min": 0.8}, {"n": 40, "completed": 39}, "pass",
            CELL_A,
            "lower 95% bound of completion_rate = 87.1% ≥ min 80.0% (39 of 40 trials "
            "completed: completion_rate 97.5%, Wilson 95% interval [87.1%, 99.6%])",
            id="min-lower-pass",
        ),
        pytest.param(
            {"metric": "completion_rate", "min": 0.8}, {"n": 10, "completed": 9}, "fail",
            CELL_A,
            "lower 95% bound of completion_rate = 59.6% < min 80.0% (9 of 10 trials "
            "completed: completion_rate 90.0%, Wilson 95% interval [59.6%, 98.2%])",
            id="min-lower-fail",
        ),
        pytest.param(
            {"metric": "completion_rate", "min": 0.8, "min_trials": 20}, {"n": 10}, "fail",
            CELL_A,
            "only 10 scored trial(s); the rule needs at least 20 (10 of 10 trials completed: "
            "completion_rate 100.0%, Wilson 95% interval [72.2%, 100.0%])",
            id="min-lower-too-few",
        ),
        pytest.param(
            {"metric": "completion_rate", "min": 0.8, "min_trials": 20},
            {"n": 10, "completed": 2}, "fail", CELL_A,
            "fails regardless of more trials: the upper 95% bound is already below min 80.0% "
            "with 10 scored trial(s) of the 20 required (2 of 10 trials completed: "
            "completion_rate 20.0%, Wilson 95% interval [5.7%, 51.0%])",
            id="min-lower-too-few-but-certain",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.1, "statistic": "point"},
            {"n": 10, "duplicated": 1}, "pass", CELL_A,
            "point of duplication_rate = 10.0% ≤ max 10.0% (1 of 10 trials duplicated: "
            "duplication_rate 10.0%, Wilson 95% interval [1.8%, 40.4%])",
            id="max-point-pass-at-bound",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.1, "statistic": "point"},
            {"n": 10, "duplicated": 2}, "fail", CELL_A,
            "point of duplication_rate = 20.0% > max 10.0% (2 of 10 trials duplicated: "
            "duplication_rate 20.0%, Wilson 95% interval [5.7%, 51.0%])",
            id="max-point-fail",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.1, "statistic": "lower"},
            {"n": 10, "duplicated": 2}, "pass", CELL_A,
            "lower 95% bound of duplication_rate = 5.7% ≤ max 10.0% (2 of 10 trials "
            "duplicated: duplication_rate 20.0%, Wilson 95% interval [5.7%, 51.0%])",
            id="max-lenient-lower-pass",
        ),
        pytest.param(
            {"metric": "completion_rate", "min": 0.95, "statistic": "upper"},
            {"n": 20, "completed": 15}, "fail", CELL_A,
            "upper 95% bound of completion_rate = 88.8% < min 95.0% (15 of 20 trials "
            "completed: completion_rate 75.0%, Wilson 95% interval [53.1%, 88.8%])",
            id="min-lenient-upper-fail",
        ),
        pytest.param(
            {"metric": "excess_effects_mean", "max": 0.5}, {"n": 8, "duplicated": 4}, "pass",
            CELL_A,
            "point of excess_effects_mean = 0.5 ≤ max 0.5 (excess_effects_mean 0.5 over 8 "
            "trials)",
            id="mean-max-pass-at-bound",
        ),
        pytest.param(
            {"metric": "excess_effects_mean", "max": 0.25},
            {"n": 8, "duplicated": 3, "errors": 1}, "fail", CELL_A,
            "point of excess_effects_mean = 0.375 > max 0.25 (excess_effects_mean 0.375 over 8 "
            "trials; 1 errored trial(s) excluded)",
            id="mean-max-fail",
        ),
        pytest.param(
            {"metric": "excess_effects_mean", "min": 0.5}, {"n": 8, "duplicated": 3}, "fail",
            CELL_A,
            "point of excess_effects_mean = 0.375 < min 0.5 (excess_effects_mean 0.375 over 8 "
            "trials)",
            id="mean-min-fail",
        ),
        pytest.param(
            {"metric": "excess_effects_mean", "max": 0.5, "min_trials": 10},
            {"n": 8, "duplicated": 3}, "fail", CELL_A,
            "only 8 scored trial(s); the rule needs at least 10 (excess_effects_mean 0.375 over "
            "8 trials)",
            id="mean-too-few",
        ),
        pytest.param(
            {"metric": "excess_effects_mean", "max": 0.5}, {"n": 0, "errors": 3}, "fail",
            CELL_A,
            "only 0 scored trial(s); the rule needs at least 1 (excess_effects_mean n/a over 0 "
            "trials; 3 errored trial(s) excluded)",
            id="mean-all-errored",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.2}, {"n": 0, "errors": 3}, "fail", CELL_A,
            "only 0 scored trial(s); the rule needs at least 1 (0 of 0 trials duplicated: "
            "duplication_rate n/a, Wilson 95% interval [n/a, n/a]; 3 errored trial(s) excluded)",
            id="rate-all-errored",
        ),
        pytest.param(
            {"metric": "duplication_rate", "max": 0.2, "model": ["x/*"], "fault": "none"},
            {"n": 4}, "fail", "(no cell)",
            "no cell matches model=['x/*'], fault=['none']; the logs hold model: m/a; "
            "fault: lost_reply",
            id="missing-cell",
        ),
    ],
)  # fmt: skip
def test_gate_rule_says_its_verdict_in_full(
    make_trials: Trials,
    gate_rule: dict[str, object],
    made: dict[str, int],
    status: str,
    cell: str,
    text: str,
) -> None:
    # The verdict line is what a CI reader acts on: its words, sign, bound and every figure
    # must say what was measured, for every branch of a fixed-sample rule.
    cfg = parse_gate({"rule": [{"name": "r", **gate_rule}]})
    (check,) = evaluate_gate(make_trials(**made), cfg).checks
    assert (check.group, check.name, check.status, check.cell) == ("rule", "r", status, cell)
    assert check.message == text


def test_gate_rule_counts_trials_scored_before_the_metric_apart(make_trials: Trials) -> None:
    trials = make_trials(4, duplicated=1, errors=1)
    trials.loc[:1, "wrong"] = math.nan
    cfg = parse_gate({"rule": [{"name": "r", "metric": "wrong_rate", "max": 0.9}]})
    (check,) = evaluate_gate(trials, cfg).checks
    assert check.message == (
        "upper 95% bound of wrong_rate = 65.8% ≤ max 90.0% (0 of 2 trials wrong: wrong_rate "
        "0.0%, Wilson 95% interval [0.0%, 65.8%]; 1 errored trial(s) excluded; 2 trial(s) "
        "scored before twice measured wrong)"
    )


def test_gate_an_interval_that_touches_the_bound_is_not_a_certain_fail(
    make_trials: Trials,
) -> None:
    # An interval whose far end sits exactly on the bound has not excluded it: more trials may
    # still pass the rule, so the verdict is the shortfall, not "fails regardless".
    from twice.reports import wilson

    lo, hi = wilson(9, 10)[0], wilson(2, 10)[1]
    cases = [
        ({"metric": "duplication_rate", "max": lo}, {"duplicated": 9}, "duplicated"),
        ({"metric": "completion_rate", "min": hi}, {"completed": 2}, "completed"),
    ]
    for gate_rule, made, what in cases:
        cfg = parse_gate({"rule": [{"name": "r", "min_trials": 30, **gate_rule}]})
        (check,) = evaluate_gate(make_trials(10, **made), cfg).checks
        assert check.message.startswith(
            f"only 10 scored trial(s); the rule needs at least 30 ({made[what]} of 10 trials "
            f"{what}:"
        ), check.message


@pytest.mark.parametrize(
    ("made", "base", "policy", "verdicts"),
    [
        pytest.param(
            {"n": 20, "duplicated": 8}, {"n": 20}, {"metrics": ["duplication_rate"]},
            [("fail", CELL_A,
              "duplication_rate 40.0% (8/20) vs baseline 0.0% (0/20): significantly worse "
              "(Fisher's exact test, one-sided p = 0.00164 < alpha 0.05)")],
            id="rate-that-should-be-low-worse",
        ),
        pytest.param(
            {"n": 20, "duplicated": 2}, {"n": 20, "duplicated": 1},
            {"metrics": ["duplication_rate"], "alpha": 0.1},
            [("pass", CELL_A,
              "duplication_rate 10.0% (2/20) vs baseline 5.0% (1/20): not significantly worse "
              "(Fisher's exact test, one-sided p = 0.5 ≥ alpha 0.1)")],
            id="rate-that-should-be-low-noise",
        ),
        pytest.param(
            {"n": 20, "completed": 10}, {"n": 20}, {"metrics": ["completion_rate"]},
            [("fail", CELL_A,
              "completion_rate 50.0% (10/20) vs baseline 100.0% (20/20): significantly worse "
              "(Fisher's exact test, one-sided p = 0.000218 < alpha 0.05)")],
            id="rate-that-should-be-high-worse",
        ),
        pytest.param(
            {"n": 20, "completed": 19}, {"n": 20, "completed": 10},
            {"metrics": ["completion_rate"]},
            [("pass", CELL_A,
              "completion_rate 95.0% (19/20) vs baseline 50.0% (10/20): not significantly "
              "worse (Fisher's exact test, one-sided p = 1 ≥ alpha 0.05)")],
            id="rate-that-should-be-high-better",
        ),
        pytest.param(
            {"n": 20}, {"n": 0, "errors": 2}, {"metrics": ["duplication_rate"]},
            [("skip", CELL_A,
              "the baseline has no scored trials for model=m/a, agent=react, prompt=baseline, "
              "task=refund, fault=lost_reply, protection=bare"),
             ("fail", "(no cell)",
              "no cell could be compared with the baseline on model, agent, prompt, task, "
              "fault, protection (model: m/a vs baseline -; agent: react vs baseline -; "
              "prompt: baseline vs baseline -; task: refund vs baseline -; fault: lost_reply "
              "vs baseline -; protection: bare vs baseline -)")],
            id="baseline-all-errored",
        ),
        pytest.param(
            {"n": 20}, {"n": 5, "agent": "other"},
            {"metrics": ["duplication_rate"], "match": ["agent", "task"]},
            [("skip", CELL_A, "the baseline has no scored trials for agent=react, task=refund"),
             ("fail", "(no cell)",
              "no cell could be compared with the baseline on agent, task (agent: react vs "
              "baseline other)")],
            id="baseline-of-another-agent",
        ),
        pytest.param(
            {"n": 20}, {"n": 5, "agent": "other"}, {"metrics": ["duplication_rate"], "match": []},
            [("pass", CELL_A,
              "duplication_rate 0.0% (0/20) vs baseline 0.0% (0/5): not significantly worse "
              "(Fisher's exact test, one-sided p = 1 ≥ alpha 0.05)")],
            id="baseline-pooled",
        ),
        pytest.param(
            {"n": 20}, {"n": 0, "errors": 2}, {"metrics": ["duplication_rate"], "match": []},
            [("skip", CELL_A, "the baseline has no scored trials for all trials"),
             ("fail", "(no cell)",
              "no cell could be compared with the baseline on all trials (neither side has "
              "scored trials in a shared cell)")],
            id="pooled-baseline-all-errored",
        ),
    ],
)  # fmt: skip
def test_gate_baseline_says_its_verdict_in_full(
    make_trials: Trials,
    made: dict[str, int],
    base: dict[str, object],
    policy: dict[str, Any],
    verdicts: list[tuple[str, str, str]],
) -> None:
    cfg = parse_gate({"baseline": policy})
    result = evaluate_gate(make_trials(**made), cfg, baseline=make_trials(**base))
    (compared,) = policy["metrics"]
    assert {(c.group, c.name) for c in result.checks} == {("baseline", compared)}
    assert [(c.status, c.cell, c.message) for c in result.checks] == verdicts


def test_gate_baseline_with_no_shared_cell_says_why(make_trials: Trials) -> None:
    # Each side has the same models and agents, crossed the other way: nothing pairs up.
    ours = pd.concat(
        [make_trials(3, model="a/x", agent="p"), make_trials(3, model="b/y", agent="q")]
    )
    base = pd.concat(
        [make_trials(3, model="a/x", agent="q"), make_trials(3, model="b/y", agent="p")]
    )
    cfg = parse_gate({"baseline": {"metrics": ["duplication_rate"], "match": ["model", "agent"]}})
    result = evaluate_gate(ours, cfg, baseline=base)
    assert [(c.status, c.cell, c.message) for c in result.checks] == [
        ("skip", "a/x / p / baseline / refund / lost_reply / bare",
         "the baseline has no scored trials for model=a/x, agent=p"),
        ("skip", "b/y / q / baseline / refund / lost_reply / bare",
         "the baseline has no scored trials for model=b/y, agent=q"),
        ("fail", "(no cell)",
         "no cell could be compared with the baseline on model, agent (neither side has scored "
         "trials in a shared cell)"),
    ]  # fmt: skip


JUNIT_OF_A_SMALL_GATE = """\
<?xml version='1.0' encoding='utf-8'?>
<testsuites name="s" tests="5" failures="2" errors="1" skipped="1">
  <testsuite name="s" tests="5" failures="2" errors="1" skipped="1">
    <testcase classname="twice.rule.no dups" name="a/bad / baseline / refund / lost_reply / bare">
      <failure message="{dup}" type="rule">{dup}</failure>
    </testcase>
    <testcase classname="twice.rule.no dups" name="a/ok / baseline / refund / lost_reply / bare">
      <system-out>upper 95% bound of duplication_rate = 13.8% ≤ max 20.0% (0 of 24 trials \
duplicated: duplication_rate 0.0%, Wilson 95% interval [0.0%, 13.8%])</system-out>
    </testcase>
    <testcase classname="twice.baseline.duplication_rate" \
name="a/bad / baseline / refund / lost_reply / bare">
      <failure message="{worse}" type="baseline">{worse}</failure>
    </testcase>
    <testcase classname="twice.baseline.duplication_rate" \
name="a/ok / baseline / refund / lost_reply / bare">
      <skipped message="the baseline has no scored trials for model=a/ok, agent=react, \
prompt=baseline, task=refund, fault=lost_reply, protection=bare" />
    </testcase>
    <testcase classname="twice.logs" name="logs #1">
      <error message="logs/x.eval: unreadable" type="logs">logs/x.eval: unreadable</error>
    </testcase>
  </testsuite>
</testsuites>
""".format(
    dup="upper 95% bound of duplication_rate = 60.3% &gt; max 20.0% (3 of 10 trials "
    "duplicated: duplication_rate 30.0%, Wilson 95% interval [10.8%, 60.3%]; 1 errored "
    "trial(s) excluded)",
    worse="duplication_rate 30.0% (3/10) vs baseline 0.0% (0/20): significantly worse "
    "(Fisher's exact test, one-sided p = 0.0296 &lt; alpha 0.05)",
)

SUMMARY_OF_A_SMALL_GATE = """\
PASS  rule 'no dups' [a/ok / baseline / refund / lost_reply / bare]: upper 95% bound of \
duplication_rate = 13.8% ≤ max 20.0% (0 of 24 trials duplicated: duplication_rate 0.0%, Wilson \
95% interval [0.0%, 13.8%])
SKIP  baseline 'duplication_rate' [a/ok / baseline / refund / lost_reply / bare]
      the baseline has no scored trials for model=a/ok, agent=react, prompt=baseline, \
task=refund, fault=lost_reply, protection=bare
FAIL  rule 'no dups' [a/bad / baseline / refund / lost_reply / bare]
      upper 95% bound of duplication_rate = 60.3% > max 20.0% (3 of 10 trials duplicated: \
duplication_rate 30.0%, Wilson 95% interval [10.8%, 60.3%]; 1 errored trial(s) excluded)
FAIL  baseline 'duplication_rate' [a/bad / baseline / refund / lost_reply / bare]
      duplication_rate 30.0% (3/10) vs baseline 0.0% (0/20): significantly worse (Fisher's \
exact test, one-sided p = 0.0296 < alpha 0.05)
note: 1 errored trial(s) were excluded from the rates
gate FAILED: 1 passed, 2 failed, 1 skipped"""


def test_gate_junit_and_summary_of_a_small_gate_in_full(
    make_trials: Trials, tmp_path: Path
) -> None:
    # Every attribute and text a CI tool reads (the suite's counts, each case's classname and
    # name, a failure's message and text, a skip's reason, a log error), and the summary line.
    trials = pd.concat(
        [make_trials(24, model="a/ok"), make_trials(10, duplicated=3, errors=1, model="a/bad")]
    )
    cfg = parse_gate(
        {
            "rule": [{"name": "no dups", "metric": "duplication_rate", "max": 0.2}],
            "baseline": {"metrics": ["duplication_rate"]},
        }
    )
    result = evaluate_gate(trials, cfg, baseline=make_trials(20, model="a/bad"))
    errors = ["logs/x.eval: unreadable"]
    data = junit_xml(result.checks, suite="s", errors=errors)
    assert data.decode("utf-8") == JUNIT_OF_A_SMALL_GATE
    out = write_junit(result.checks, tmp_path / "gate.xml", suite="s", errors=errors)
    assert out == tmp_path / "gate.xml" and out.read_bytes() == data
    assert format_gate(result) == SUMMARY_OF_A_SMALL_GATE
    passed = evaluate_gate(make_trials(24), parse_gate(rule()))
    assert format_gate(passed).splitlines()[-1] == "gate passed: 1 passed, 0 failed, 0 skipped"
    assert b'tests="1" failures="0" errors="0" skipped="0"' in junit_xml(passed.checks)
    empty = junit_xml([])
    assert b'<testsuite name="twice gate" tests="0" failures="0" errors="0" skipped="0"' in empty


def test_gate_junit_file_is_written_where_asked_under_the_default_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    checks = [Check("rule", "r", "c1", "pass", "p")]
    out = write_junit(checks, tmp_path / "gate.xml")
    assert out == tmp_path / "gate.xml"
    assert out.read_bytes() == junit_xml(checks)
    assert b'<testsuites name="twice gate" tests="1"' in out.read_bytes()
    # A file:// URI is the path it names.
    by_uri = write_junit(checks, f"file://{tmp_path}/by-uri.xml", suite="s")
    assert by_uri == tmp_path / "by-uri.xml"
    assert by_uri.read_bytes() == junit_xml(checks, suite="s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by-uri.xml", "gate.xml"]


def test_gate_junit_to_an_object_store_is_the_uri_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fsspec's in-memory store takes the remote path (any URI but file://), as s3:// does.
    import fsspec

    monkeypatch.chdir(tmp_path)
    fs = fsspec.filesystem("memory")
    uri = "memory://twice-gate-junit/run/gate.xml"
    checks = [Check("rule", "r", "c1", "fail", "f"), Check("rule", "r", "c2", "pass", "p")]
    try:
        fs.pipe_file("/twice-gate-junit/run/gate.xml", b"an older run's XML, longer than this")
        out = write_junit(checks, uri, suite="s", errors=["logs/x.eval: unreadable"])
        assert out == uri
        assert fs.cat_file("/twice-gate-junit/run/gate.xml") == junit_xml(
            checks, suite="s", errors=["logs/x.eval: unreadable"]
        )
        assert list(tmp_path.iterdir()) == []  # nothing under ./memory:/ on the local disk
    finally:
        fs.rm("/twice-gate-junit", recursive=True)


def test_gate_summary_lists_passes_then_skips_then_failures() -> None:
    checks = [
        Check("rule", "r", "c1", "fail", "f"),
        Check("baseline", "b", "c2", "skip", "s"),
        Check("rule", "r", "c3", "pass", "p"),
    ]
    assert format_gate(GateResult(checks)) == (
        "PASS  rule 'r' [c3]: p\n"
        "SKIP  baseline 'b' [c2]\n      s\n"
        "FAIL  rule 'r' [c1]\n      f\n"
        "gate FAILED: 1 passed, 1 failed, 1 skipped"
    )
