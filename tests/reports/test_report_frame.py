"""The trial frame's ledger columns (retry sources) and the synthetic log generator."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from inspect_ai.log import read_eval_log, write_eval_log
from synthetic_logs import SyntheticRun, write_synthetic_logs
from twice.assertions import Intent, trial_metrics
from twice.mocks import Attempt, Effect, Ledger
from twice.reports import (
    LEDGER_COLUMNS,
    PARSE_COLUMNS,
    RETRY_SOURCES,
    LogReadError,
    cells,
    ledger_counts,
    summary,
    tidy,
    trials_frame,
)
from twice.reports._frame import RAW_COLUMNS, sample_records


def _attempt(n: int, source: str, effects: list[str], mutating: bool = True) -> Attempt:
    return Attempt(
        n, "payments", "POST", "/v1/refunds", "payments.refund.create", mutating, None, {},
        source=source, effect_ids=effects,
    )  # fmt: skip


def _trial(
    attempts: list[Attempt], effects: list[str], order_ids: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(store, score JSON) of a trial, the score computed by twice's real scoring code."""
    ledger = Ledger(attempts=attempts)
    for a in attempts:
        for eid in a.effect_ids:
            order = (order_ids or {}).get(eid, "order_1042")
            ledger.effects.append(Effect(eid, "payments.refund.create", a.n, {"order_id": order}))
    assert [e.id for e in ledger.effects] == effects
    metrics = trial_metrics(ledger, [Intent("payments.refund.create", {"order_id": "order_1042"})])
    store = {"twice:ledger": ledger.to_dict()}
    return store, {"value": metrics.values(), "metadata": metrics.evidence()}


def test_ledger_counts_charges_the_repeat_to_its_source() -> None:
    store, score = _trial(
        [
            _attempt(1, "initial", ["re_1"]),
            _attempt(2, "transport", []),
            _attempt(3, "model", ["re_2"]),
            _attempt(4, "initial", [], mutating=False),  # a read: not counted
        ],
        ["re_1", "re_2"],
    )
    counts = ledger_counts(store, score)
    assert counts["attempts"] == 3
    assert counts["effects"] == 2
    assert (counts["attempts_initial"], counts["attempts_transport"], counts["attempts_model"]) == (
        1,
        1,
        1,
    )
    assert counts["excess_model"] == 1
    assert counts["excess_initial"] == counts["excess_transport"] == 0


def test_ledger_counts_unmatched_effect_is_excess() -> None:
    store, score = _trial(
        [_attempt(1, "initial", ["re_1"]), _attempt(2, "resume", ["re_2"])],
        ["re_1", "re_2"],
        order_ids={"re_2": "order_9999"},
    )
    counts = ledger_counts(store, score)
    assert counts["excess_resume"] == 1
    assert sum(counts[f"excess_{s}"] for s in RETRY_SOURCES) == 1


def test_ledger_counts_unknown_source_name_is_unknown() -> None:
    store, score = _trial(
        [_attempt(1, "initial", ["re_1"]), _attempt(2, "bogus", ["re_2"])], ["re_1", "re_2"]
    )
    counts = ledger_counts(store, score)
    assert counts["attempts_unknown"] == 1
    assert counts["excess_unknown"] == 1


def test_ledger_counts_reads_the_scorers_facts_not_the_ledger() -> None:
    # The scorer's judgement is the contract: a fact that says "excess" is counted even when
    # the raw ledger alone would not say so (and a score without facts counts nothing).
    store, score = _trial([_attempt(1, "initial", ["re_1"])], ["re_1"])
    score["metadata"]["effects"][0]["excess"] = True
    assert ledger_counts(store, score)["excess_initial"] == 1
    del score["metadata"]["effects"]
    assert math.isnan(ledger_counts(store, score)["excess_initial"])


def test_ledger_counts_unscored_trial_has_nan_excess() -> None:
    counts = ledger_counts({}, None)
    assert counts["attempts"] == 0
    assert all(math.isnan(counts[f"excess_{s}"]) for s in RETRY_SOURCES)


def test_trials_frame_excess_by_source_adds_up_to_excess_effects(
    refund_frame: pd.DataFrame,
) -> None:
    scored = refund_frame[refund_frame["completed"].notna()]
    by_source = scored[[f"excess_{s}" for s in RETRY_SOURCES]].sum(axis=1)
    assert (by_source == scored["excess_effects"]).all()
    assert scored["excess_effects"].sum() > 0  # the fixture does duplicate


def test_trials_frame_tells_model_retries_from_transport_retries(
    refund_frame: pd.DataFrame,
) -> None:
    cell = refund_frame.groupby(["model", "protection"])
    retry = cell.get_group(("stub/retry", "bare"))
    nokey = cell.get_group(("stub/no-retry", "retry-nokey"))
    assert retry["excess_model"].sum() == len(retry) and retry["excess_transport"].sum() == 0
    assert nokey["excess_transport"].sum() == len(nokey) and nokey["excess_model"].sum() == 0
    assert set(LEDGER_COLUMNS) <= set(refund_frame.columns)


def test_sample_records_reads_json_logs_like_eval_logs(
    synthetic_small: SyntheticRun, tmp_path: Path
) -> None:
    source = synthetic_small.paths[0]
    as_json = tmp_path / "copy.json"
    write_eval_log(read_eval_log(str(source)), str(as_json))
    from_eval = {(r["id"], r["epoch"]): r["store"] for r in sample_records(source)}
    from_json = {(r["id"], r["epoch"]): r["store"] for r in sample_records(as_json)}
    assert from_eval == from_json
    assert len(from_eval) == 30


def test_write_synthetic_logs_writes_the_requested_trials(synthetic_small: SyntheticRun) -> None:
    frame = trials_frame(synthetic_small.log_dir)
    assert len(frame) == synthetic_small.trials == 240
    assert frame.groupby(["model", "prompt", "fault", "protection"]).size().eq(30).all()
    assert sorted(frame["epoch"].unique()) == [1, 2]
    assert not frame[list(LEDGER_COLUMNS)].isna().any().any()
    # Faults that cannot duplicate never do; the fault that can, does somewhere.
    assert frame.loc[frame["fault"] == "none", "duplicated"].sum() == 0
    assert frame.loc[frame["fault"] == "lost_reply", "duplicated"].sum() > 0


@pytest.mark.parametrize("trials", [1, 7])
def test_write_synthetic_logs_gives_every_cell_a_trial(tmp_path: Path, trials: int) -> None:
    run = write_synthetic_logs(
        tmp_path,
        trials=trials,
        models=("m/a",),
        prompts=("p",),
        faults=("none", "lost_reply"),
        protections=("bare",),
    )
    assert len(run.paths) == 2
    assert run.trials == max(trials, 2)


def _samples_df_raw(log_dir: Path) -> pd.DataFrame:
    """The raw frame built the documented way, with inspect's ``samples_df``."""
    from inspect_ai.analysis import EvalColumn, SampleColumn, samples_df

    def score(s: Any) -> Any:
        sc = (s.scores or {}).get("side_effects")
        return None if sc is None else json.dumps(sc.value)

    columns = [
        EvalColumn("eval_id", path="eval.eval_id", required=True),
        EvalColumn("model", path="eval.model", required=True),
        EvalColumn("task_name", path="eval.task", required=True),
        EvalColumn("eval_metadata", path="eval.metadata"),
        EvalColumn("log", path=lambda log: log.location),
        SampleColumn("sample", path="id", required=True),
        SampleColumn("epoch", path="epoch", required=True),
        SampleColumn("score", path=score),
        SampleColumn(
            "total_tokens", path=lambda s: sum(u.total_tokens for u in s.model_usage.values())
        ),
        SampleColumn("total_time", path="total_time"),
        SampleColumn("error", path="error"),
        SampleColumn("limit", path="limit"),
    ]
    raw = samples_df(str(log_dir), columns=columns, quiet=True, strict=True)
    raw = raw.drop(columns=["sample_id"])  # inspect's uuid column, always added
    assert sorted(raw.columns) == sorted(RAW_COLUMNS)
    return raw


def test_trials_frame_agrees_with_samples_df(refund_logs: Path, refund_frame: pd.DataFrame) -> None:
    keys = ["log", "sample", "epoch"]
    ours = (
        refund_frame.drop(columns=[*LEDGER_COLUMNS, *PARSE_COLUMNS])
        .sort_values(keys)
        .reset_index(drop=True)
    )
    theirs = tidy(_samples_df_raw(refund_logs)).sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, theirs, check_exact=False)


def test_trials_frame_takes_log_locations_as_uris(synthetic_small: SyntheticRun) -> None:
    # run_suite passes EvalLog.location, a file:// URI for logs eval_set found on disk.
    uris = [p.resolve().as_uri() for p in synthetic_small.paths[:2]]
    frame = trials_frame(uris)
    assert len(frame) == 60
    assert set(frame["log"]) == set(uris)


def test_trials_frame_names_an_unreadable_log(tmp_path: Path) -> None:
    bad = tmp_path / "broken.eval"
    bad.write_bytes(b"not a zip")
    with pytest.raises(LogReadError, match=r"broken\.eval"):
        trials_frame([bad])


def test_cells_rate_wrong_values_with_an_interval(refund_frame: pd.DataFrame) -> None:
    table = cells(refund_frame)
    assert {"wrong_rate", "wrong_ci", "wrong_effects_mean"} <= set(table.columns)
    # The stubs refund the amount asked for: no trial is wrong.
    assert (table["wrong_rate"] == 0).all() and (table["wrong_effects_mean"] == 0).all()
    one = refund_frame.copy()
    one.loc[one.index[0], ["wrong", "wrong_effects"]] = 1.0
    row = cells(one).sort_values("wrong_rate").iloc[-1]  # the cell of that trial
    n = int(row["trials"] - row["errors"])
    assert row["wrong_rate"] == pytest.approx(1 / n)
    lo, hi = row["wrong_ci"]
    assert 0 < lo <= row["wrong_rate"] <= hi <= 1


def test_cells_of_trials_scored_before_wrong_values_existed_are_unmeasured(
    refund_frame: pd.DataFrame,
) -> None:
    # Counting a trial that never measured wrong values as "0 wrong" would claim a rate no
    # run measured: such cells say null, and the other rates are unchanged.
    older = refund_frame.assign(wrong=math.nan, wrong_effects=math.nan)
    for frame in (older, refund_frame.drop(columns=["wrong", "wrong_effects"])):
        table = cells(frame)
        assert table["wrong_rate"].isna().all() and table["wrong_effects_mean"].isna().all()
        pd.testing.assert_series_equal(
            table["duplication_rate"], cells(refund_frame)["duplication_rate"]
        )
        record = summary(table)["cells"][0]
        assert record["wrong_rate"] is None and record["wrong_ci"] == [None, None]


def test_cells_rate_duplicates_caused_by_the_framework_and_by_the_model(
    refund_frame: pd.DataFrame,
) -> None:
    assert {"attempts_framework", "excess_framework"} <= set(refund_frame.columns)
    table = cells(refund_frame)
    # twice's own loop has no framework: its duplicates are the model's (stub/retry) or the
    # tool layer's transport retries.
    assert (table["framework_duplication_rate"] == 0).all()
    retry = table[(table["model"] == "stub/retry") & (table["fault"] == "lost_reply")]
    retry = retry[retry["protection"] == "bare"]
    assert (retry["model_duplication_rate"] == 1).all() and len(retry)
    one = refund_frame.copy()
    first = one.index[0]
    one.loc[first, "excess_framework"] = 1.0
    row = cells(one).sort_values("framework_duplication_rate").iloc[-1]
    n = int(row["trials"] - row["errors"])
    assert row["framework_duplication_rate"] == pytest.approx(1 / n)
    lo, hi = row["framework_duplication_ci"]
    assert 0 < lo <= row["framework_duplication_rate"] <= hi <= 1
    # A trial scored before the per-effect facts existed has no excess by source: unmeasured.
    older = refund_frame.assign(excess_framework=math.nan, excess_model=math.nan)
    record = summary(cells(older))["cells"][0]
    assert record["framework_duplication_rate"] is None
    assert record["model_duplication_rate"] is None
