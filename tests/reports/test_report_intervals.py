"""Every interval contains its rate and lies in [0, 1], with exact ends."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint
from twice.reports import CATALOGUE, cells, summary, wilson
from twice.reports.stats import wilson_bounds as _wilson_bounds


def _check(k: int, n: int, lo: float, hi: float) -> None:
    rate = k / n
    assert 0.0 <= lo <= rate <= hi <= 1.0, (k, n, lo, hi)
    if k == 0:
        assert lo == 0.0, (k, n, lo)
    if k == n:
        assert hi == 1.0, (k, n, hi)


def test_wilson_ends_are_exact_at_zero_and_all() -> None:
    # Where statsmodels' formula gives 1.39e-17 and 0.9999999999999999 (floating-point error).
    assert wilson(0, 28)[0] == 0.0
    assert wilson(96, 96)[1] == 1.0


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_wilson_contains_its_rate_over_every_k_of_small_n(alpha: float) -> None:
    for n in range(1, 121):
        for k in range(n + 1):
            lo, hi = wilson(k, n, alpha=alpha)
            _check(k, n, lo, hi)


def test_wilson_contains_its_rate_over_a_random_sweep_of_large_n() -> None:
    rng = random.Random(20261130)
    for _ in range(1000):
        n = rng.randint(1, 200_000)
        k = rng.choice([0, n, 1, n - 1, rng.randint(0, n)])
        alpha = rng.choice([0.05, 0.01, 0.001, 0.2])
        _check(k, n, *wilson(k, n, alpha=alpha))


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.01, 0.2, 0.001])
def test_wilson_bounds_are_statsmodels_bit_for_bit(alpha: float) -> None:
    # twice computes the Wilson formula itself (statsmodels' import costs 0.8 s of every
    # process that writes a summary); summary.json must not move by one bit for that.
    large = [0, 1, 2, 500, 4_321, 99_990, 99_991]
    n = np.array([n for n in range(1, 201) for _ in range(n + 1)] + [99_991] * len(large))
    k = np.array([k for n in range(1, 201) for k in range(n + 1)] + large)
    ours = _wilson_bounds(k.astype(float), n, alpha)
    reference = proportion_confint(k.astype(float), n, alpha=alpha, method="wilson")
    for mine, theirs in zip(ours, reference, strict=True):
        assert np.array_equal(mine, theirs), np.flatnonzero(mine != theirs)[:5]


def test_wilson_bounds_hold_past_int64_squares() -> None:
    # Integer counts as the frame holds them: n**2 of an int64 overflows past n ≈ 3.04e9, which
    # `twice trials` reaches for rates near 1e-9; statsmodels works in floats and so must we.
    k = np.array([0, 1, 7, 4_000_000_000], dtype=np.int64)
    n = np.full(4, 4_000_000_000, dtype=np.int64)
    ours = _wilson_bounds(k, n, 0.05)
    reference = proportion_confint(k, n, alpha=0.05, method="wilson")
    for mine, theirs in zip(ours, reference, strict=True):
        assert np.array_equal(mine, theirs)
    assert 9.5e-10 < wilson(0, 4_000_000_000)[1] < 9.7e-10


def test_wilson_of_no_trials_is_nan() -> None:
    assert all(math.isnan(x) for x in wilson(0, 0))


def _summary_intervals(doc: dict[str, object]) -> list[tuple[str, float, list[float]]]:
    out = []
    for cell in doc["cells"]:  # type: ignore[attr-defined]
        for key, value in cell.items():
            if key.endswith("_rate") and value is not None:
                out.append((key, value, cell[key.removesuffix("_rate") + "_ci"]))
    return out


def test_every_rate_in_summary_json_lies_in_its_interval(refund_frame: pd.DataFrame) -> None:
    doc = summary(cells(refund_frame))
    found = _summary_intervals(doc)
    assert len(found) >= 5 * len(doc["cells"])  # every rate has its interval
    ends = {"lo": 0, "hi": 0}
    for name, rate, (lo, hi) in found:
        assert 0.0 <= lo <= rate <= hi <= 1.0, (name, rate, lo, hi)
        ends["lo"] += rate == 0.0
        ends["hi"] += rate == 1.0
        if rate == 0.0:
            assert lo == 0.0, (name, lo)
        if rate == 1.0:
            assert hi == 1.0, (name, hi)
    # The fixture has rates at both ends, where the old intervals missed.
    assert ends["lo"] and ends["hi"]


def test_every_rate_of_a_synthetic_run_lies_in_its_interval(synthetic_small: object) -> None:
    from twice.reports import trials_frame

    doc = summary(cells(trials_frame(Path(synthetic_small.log_dir))))  # type: ignore[attr-defined]
    for name, rate, (lo, hi) in _summary_intervals(doc):
        assert 0.0 <= lo <= rate <= hi <= 1.0, (name, rate, lo, hi)


# -- rates and intervals are over the scored trials ----------------------------------------------


def _cell_with_errors() -> pd.DataFrame:
    """One cell of 10 trials: 7 scored (2 duplicated, 6 completed, 5 safe), 3 errored.

    One errored trial still carries metric values (written before it crashed): an errored
    trial's values must count nowhere, whatever they hold.
    """
    keys = {"model": "m/a", "agent": "react", "prompt": "p", "task": "refund"}
    keys |= {"fault": "lost_reply", "protection": "bare"}
    rows = []
    for i in range(10):
        scored = i < 7
        dup = float(i < 2) if scored else math.nan
        done = float(i < 6) if scored else math.nan
        row = {m.column: 0.0 if scored else math.nan for m in CATALOGUE}
        row |= {
            "completed": done,
            "duplicated": dup,
            "exactly_once": 1.0 - dup,
            "safe_success": done * (1.0 - dup),
            "excess_effects": dup,
        }
        if i == 9:  # errored after some metrics were written
            row |= {"duplicated": 1.0, "excess_effects": 4.0, "exactly_once": 0.0}
        rows.append(
            {
                **keys,
                **row,
                "sample": f"s{i}",
                "epoch": 1,
                "error": "" if scored else "RuntimeError('boom')",
                "total_tokens": 10,
            }
        )
    return pd.DataFrame(rows)


def test_rates_and_intervals_are_over_scored_trials_only() -> None:
    # Errored trials are counted (errors) and left out of every rate and its interval: counting
    # them in n would narrow every interval and drag every rate toward 0.
    (cell,) = summary(cells(_cell_with_errors()))["cells"]
    assert (cell["trials"], cell["errors"]) == (10, 3)
    expected = {
        "duplication": 2,
        "completion": 6,
        "exactly_once": 5,
        "safe_success": 4,
        "divergence": 0,
        "wrong": 0,
    }
    for prefix, k in expected.items():
        assert cell[f"{prefix}_rate"] == k / 7, prefix
        assert cell[f"{prefix}_ci"] == list(wilson(k, 7)), prefix
        assert cell[f"{prefix}_ci"] != list(wilson(k, 10)), prefix
    assert cell["excess_effects_mean"] == 2 / 7


def test_a_cell_of_only_errored_trials_has_no_rate() -> None:
    only = _cell_with_errors().iloc[7:]
    (cell,) = summary(cells(only))["cells"]
    assert (cell["trials"], cell["errors"]) == (3, 3)
    assert cell["duplication_rate"] is None and cell["duplication_ci"] == [None, None]


# -- the interval's level, its interior values, and summary.json as written ----------------------


@pytest.mark.parametrize("alpha", [0.05, 0.2, 0.01])
def test_wilson_is_statsmodels_at_its_alpha_for_interior_counts(alpha: float) -> None:
    # The sweeps above check containment, which an interval at the wrong level (or a lower
    # bound of 0 for every k) also passes: here the values themselves, at the alpha asked.
    for k, n in [(1, 10), (3, 10), (9, 10), (1, 2), (37, 120)]:
        lo, hi = proportion_confint(k, n, alpha=alpha, method="wilson")
        assert wilson(k, n, alpha=alpha) == (float(lo), float(hi)), (k, n)
    assert wilson(3, 10, alpha=0.2) != wilson(3, 10)


def test_summary_json_of_cells_is_json_with_every_key(tmp_path: Path) -> None:
    from twice.reports import write_summary

    frame = _cell_with_errors().iloc[:9]  # errored trials without metric values, as logged
    other = frame.assign(model="a/first", total_tokens=30)  # sorts before m/a
    table = cells(pd.concat([frame, other], ignore_index=True))
    assert list(table["model"]) == ["a/first", "m/a"]  # cells in sorted order
    assert list(table["tokens_mean"]) == [30.0, 10.0]  # over every trial, errored included
    path = write_summary(table, tmp_path / "summary.json", run={"id": "r1"})
    text = path.read_text(encoding="utf-8") if isinstance(path, Path) else Path(path).read_text()
    assert text == json.dumps(summary(table, run={"id": "r1"}), indent=2) + "\n"
    doc = json.loads(text)
    assert doc["run"] == {"id": "r1"}
    first = doc["cells"][0]
    assert type(first["trials"]) is int and type(first["errors"]) is int  # not numpy scalars
    assert first["no_dup_k"]["1"] == 5 / 7
    only_errors = summary(cells(frame.iloc[7:]))["cells"][0]
    assert only_errors["no_dup_k"] == {} and only_errors["tokens_mean"] == 10.0


# -- duplicates and attempts by retry source ------------------------------------------------------


def _cell_with_sources() -> pd.DataFrame:
    """The cell of :func:`_cell_with_errors` with the ledger's columns per retry source.

    Scored trial 0: the model repeated a refund twice (2 excess); trial 1: the framework
    re-sent one (1 excess); every trial's first attempt is ``initial``. Errored trial 9 had a
    transport retry whose excess counts nowhere (the trial was never scored).
    """
    from twice.mocks import RETRY_SOURCES

    frame = _cell_with_errors()
    for source in RETRY_SOURCES:
        frame[f"attempts_{source}"] = 0.0
        frame[f"excess_{source}"] = frame["completed"] * 0.0  # NaN where not scored
    frame["attempts_initial"] = 1.0
    frame.loc[0, ["attempts_model", "excess_model"]] = [2.0, 2.0]
    frame.loc[1, ["attempts_framework", "excess_framework"]] = [1.0, 1.0]
    frame.loc[9, ["attempts_transport", "excess_transport"]] = [2.0, 1.0]
    return frame


def test_cells_count_attempts_and_excess_by_retry_source() -> None:
    (row,) = cells(_cell_with_sources()).to_dict("records")
    # Sources with neither an attempt nor an excess effect are left out; an errored trial's
    # attempts count, its excess does not.
    assert row["retry_sources"] == {
        "initial": {"attempts": 10, "excess": 0},
        "transport": {"attempts": 2, "excess": 0},
        "model": {"attempts": 2, "excess": 2},
        "framework": {"attempts": 1, "excess": 1},
    }
    # The share of scored trials in which the framework (the model) committed an excess.
    assert row["framework_duplication_rate"] == 1 / 7
    assert row["framework_duplication_ci"] == list(wilson(1, 7))
    assert row["model_duplication_rate"] == 1 / 7
    assert "retry_sources" not in cells(_cell_with_errors())
    # Each cell gets its own sources, whatever order its trials come in.
    frame = _cell_with_sources()
    other = frame.iloc[2:7].assign(model="a/first")  # sorts first; only initial attempts
    table = cells(pd.concat([frame, other], ignore_index=True))
    assert list(table["model"]) == ["a/first", "m/a"]
    assert list(table["retry_sources"]) == [
        {"initial": {"attempts": 5, "excess": 0}},
        row["retry_sources"],
    ]


def test_cells_retry_sources_of_a_cell_of_only_errored_trials() -> None:
    (row,) = cells(_cell_with_sources().iloc[7:]).to_dict("records")
    assert row["retry_sources"] == {
        "initial": {"attempts": 3, "excess": 0},
        "transport": {"attempts": 2, "excess": 0},
    }
    assert math.isnan(row["framework_duplication_rate"])


def test_cells_list_a_source_with_one_attempt_or_only_an_excess() -> None:
    # One transport attempt that committed nothing is still a source that sent one; an excess
    # effect whose attempt the ledger lacks still names its source.
    from twice.mocks import RETRY_SOURCES

    frame = _cell_with_errors()
    for source in RETRY_SOURCES:
        frame[f"attempts_{source}"] = 0.0
        frame[f"excess_{source}"] = frame["completed"] * 0.0
    frame["attempts_initial"] = 1.0
    frame.loc[2, "attempts_transport"] = 1.0
    frame.loc[3, "excess_unknown"] = 1.0
    (row,) = cells(frame).to_dict("records")
    assert row["retry_sources"] == {
        "initial": {"attempts": 10, "excess": 0},
        "transport": {"attempts": 1, "excess": 0},
        "unknown": {"attempts": 0, "excess": 1},
    }


def test_cells_of_attempts_by_source_without_their_excess_have_no_sources() -> None:
    # A hand-built frame (or an older log's) with the attempts columns only: the sources need
    # both columns, so none is counted rather than a KeyError.
    from twice.mocks import RETRY_SOURCES

    frame = _cell_with_errors()
    for source in RETRY_SOURCES:
        frame[f"attempts_{source}"] = 1.0
    (row,) = cells(frame).to_dict("records")
    assert row["retry_sources"] == {}


def test_cells_count_the_sources_a_hand_built_frame_has_columns_for() -> None:
    frame = _cell_with_errors()
    frame["attempts_transport"] = 1.0
    frame["excess_transport"] = frame["completed"] * 0.0
    (row,) = cells(frame).to_dict("records")
    assert row["retry_sources"] == {"transport": {"attempts": 10, "excess": 0}}


def test_cells_of_one_scored_trial_have_its_rates_and_means() -> None:
    one = _cell_with_errors().iloc[[0, 8]]  # a duplicated trial and an errored one
    (row,) = cells(one).to_dict("records")
    assert (row["trials"], row["errors"]) == (2, 1)
    assert row["duplication_rate"] == 1.0 and row["excess_effects_mean"] == 1.0
    only_errors = cells(_cell_with_errors().iloc[7:]).iloc[0]
    # NaN (null in summary.json), not None or 0: a cell with nothing scored has no rate.
    assert math.isnan(only_errors["duplication_rate"])
    assert math.isnan(only_errors["excess_effects_mean"])


def test_cells_keep_a_cell_whose_key_is_missing() -> None:
    # A trial from a log that does not name its protection is still a trial of some cell.
    frame = _cell_with_sources()
    frame["protection"] = None
    (row,) = cells(frame).to_dict("records")
    assert row["trials"] == 10 and row["retry_sources"]["model"] == {"attempts": 2, "excess": 2}


def test_summary_turns_numpy_scalars_inside_cells_into_plain_json() -> None:
    table = pd.DataFrame({"trials": [3], "extra": [[np.int64(2), {"k": np.float64("nan")}]]})
    doc = summary(table)
    assert doc["cells"][0]["extra"] == [2, {"k": None}]
    assert type(doc["cells"][0]["extra"][0]) is int
    json.dumps(doc)


def test_write_summary_writes_where_it_is_told(tmp_path: Path) -> None:
    from twice.reports import write_summary

    target = tmp_path / "run" / "summary.json"
    target.parent.mkdir()
    assert write_summary(cells(_cell_with_errors()), target) == target
    assert json.loads(target.read_text(encoding="utf-8"))["cells"][0]["trials"] == 10
