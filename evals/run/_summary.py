"""What a run says when it ends: ``summary.json``'s fields (run metadata, missing, left and
cut-short cells), the per-cell table and the error lines printed on the terminal."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Collection
from dataclasses import replace
from importlib.metadata import version
from typing import Any

import pandas as pd
from inspect_ai.log import EvalLog
from twice.assertions import score_trial
from twice.mocks import LEDGER_STORE_KEY, Ledger
from twice.reports import (
    CELL,
    Location,
    LogRecords,
    errored,
    frame_of,
    log_records,
    sample_records,
    write_summary,
)
from twice.tasks import CREDENTIAL_ARG, load_prompt, scrub
from twice.tasks.agents import REACT, take_late_requests

from ..suite import Cell, Suite
from ._files import write_atomic
from ._speedups import gc_for_trials

ERRORED_IN = " trial(s) errored in "
"""How a run's error line for a cell's errored trials reads (the CLI matches it)."""


_GAVE_UP = re.compile(r"^RetryError\(<Future at 0x[0-9a-f]+ state=\w+ raised (\w+)>\)$")


def _readable(error: str) -> str:
    """A sample error as a user can act on it: inspect records a model call that ran out of
    retries as tenacity's ``RetryError(<Future at 0x… raised RateLimitError>)``."""
    gave_up = _GAVE_UP.match(error)
    if gave_up is None:
        return error
    name = gave_up.group(1)
    if name == "RateLimitError":
        return (
            "RateLimitError (HTTP 429) on every attempt: the endpoint kept refusing for "
            "longer than --outage-window; give fewer --max-connections or a larger "
            "--outage-window"
        )
    if "Timeout" in name:  # APITimeoutError, ReadTimeout...: each attempt waited it out
        return (
            f"{name} on every attempt: the model did not answer within --timeout seconds, "
            "on each retry too; give a larger --timeout if it is slow"
        )
    return f"{name} on every attempt (the call kept failing for longer than --outage-window)"


def run_failures(logs: list[EvalLog], table: pd.DataFrame, frame: pd.DataFrame) -> list[str]:
    """One line per failed eval, and per cell with errored trials (inspect sample errors,
    :func:`twice.reports.errored`, left out of the rates) with its first error, so the
    terminal says why and not only where."""
    lines = []
    for log in logs:
        if log.status not in ("success", "cancelled"):
            message = log.error.message if log.error else log.status
            lines.append(f"eval {log.eval.task} on {log.eval.model} {log.status}: {message}")
    first: dict[tuple[Any, ...], str] = {}
    if not frame.empty and table["errors"].any():
        bad = frame[errored(frame)]
        for keys, group in bad.groupby(list(CELL), sort=False):
            text = str(group["error"].iloc[0] or "").strip().splitlines()
            first[keys] = _readable(text[0])[:300] if text else "never scored"
    for row in table.itertuples():
        if row.errors:
            why = first.get(tuple(getattr(row, c) for c in CELL))
            lines.append(
                f"{row.errors}{ERRORED_IN}{Cell.from_mapping(row._asdict()).label}"
                + (f"; the first: {why}" if why else "")
            )
    late = take_late_requests()
    if late:  # each trial was scored without its request: the rates miss them
        lines.append(
            f"{len(late)} request(s) of in-process agents were refused because their trial "
            f"had ended; those trials were scored without them. The first: {late[0]}"
        )
    return [scrub(line) for line in lines]


def cell_dict(cell: Cell, names: dict[str, str]) -> dict[str, str]:
    """A cell as summary.json lists it (``missing``), its prompt by name (``names``)."""
    return replace(cell, prompt=names[cell.prompt]).as_dict()


def ran_trials(
    files: list[Location],
    interrupted: bool,
    keep_records: Callable[[LogRecords], object] | None = None,
) -> pd.DataFrame:
    """The trials of ``files`` (empty frame for none); after an interrupt, without the trials
    it cut short: they are logged as errors but did not run (the rerun runs them), so they
    are not counted as crashes either. ``keep_records`` (a ``--workers`` worker's) is
    given what was read of the logs, for the parent's merge."""
    with gc_for_trials():
        records = log_records(files)
        if keep_records is not None:
            keep_records(records)
        frame = frame_of(files, records) if files else pd.DataFrame()
    return without_cut_short(frame) if interrupted else frame


def without_cut_short(frame: pd.DataFrame, logs: Collection[str] | None = None) -> pd.DataFrame:
    """The trials of an interrupted run without those the interrupt cut short: inspect logs
    them as errors (``CancelledError``), but they did not run (the rerun runs them).

    ``logs``: only those of these logs (``log`` column values: the logs inspect marked
    ``cancelled``), when no summary says the whole run was interrupted."""
    if frame.empty:
        return frame
    cut = frame["error"].str.startswith("CancelledError")
    if logs is not None:
        cut &= frame["log"].isin(list(logs))
    return frame[~cut]


def cut_short_cells(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per cell, the trials an interrupt cut short and how many of them had already
    duplicated an action (summary.json's ``cut_short``), from a frame that still holds them.

    They are not in the rates (they did not finish), and that leaves the rates biased: a
    trial that retries runs longer, so an interrupt cuts it short first. A duplicate in the
    ledger cannot be undone by what the trial would have done next, so those trials are
    known to have duplicated, and the report says so rather than "never duplicated"."""
    if frame.empty:
        return []
    cut = frame[frame["error"].fillna("").str.startswith("CancelledError")]
    if cut.empty:
        return []
    duplicated: set[tuple[str, str, int]] = set()
    for log, rows in cut.groupby("log", sort=False):
        wanted = set(zip(rows["sample"], rows["epoch"], strict=True))
        for sample in sample_records(str(log)):
            key = (str(sample.get("id")), int(sample.get("epoch", 1)))
            ledger = (sample.get("store") or {}).get(LEDGER_STORE_KEY)
            if key in wanted and isinstance(ledger, dict):
                metrics = score_trial(Ledger.from_dict(ledger), sample.get("metadata") or {})
                if metrics.duplicated:
                    duplicated.add((str(log), *key))
    out = []
    for keys, group in cut.groupby(list(CELL), sort=False):
        dup = sum(
            (str(r.log), str(r.sample), int(r.epoch)) in duplicated for r in group.itertuples()
        )
        out.append({**dict(zip(CELL, keys, strict=True)), "trials": len(group), "duplicated": dup})
    return out


def left_fields(frame: pd.DataFrame, unreachable: list[str]) -> dict[str, Any]:
    """summary.json's ``unreachable`` (one line per model whose endpoint could not be
    reached) and ``left``: per cell, the errored trials a rerun runs again
    (:func:`rerun_errored`), their ``samples`` as ``{"sample", "epoch"}`` pairs. After an
    outage that outlasted the window, those are the trials it left."""
    extra: dict[str, Any] = {"unreachable": unreachable} if unreachable else {}
    if frame.empty:
        return extra
    bad = frame[frame["error"].fillna("") != ""]
    left = []
    for keys, group in bad.groupby(list(CELL), sort=False):
        trials = [
            {"sample": str(r.sample), "epoch": int(r.epoch)}
            for r in group.sort_values(["epoch", "sample"]).itertuples()
        ]
        left.append(
            {**dict(zip(CELL, keys, strict=True)), "trials": len(trials), "samples": trials}
        )
    if left:
        extra["left"] = left
    return extra


def incomplete_fields(
    missing: list[Cell], names: dict[str, str], interrupted: str | None, errored: int = 0
) -> dict[str, Any]:
    """summary.json's ``complete``/``status``/``missing``/``errored``/``interrupted`` at the
    end of a run. A run with errored trials is not complete: they are not in the rates, and
    the rerun runs them again (:func:`rerun_errored`), so its numbers would change."""
    complete = not missing and not errored
    extra: dict[str, Any] = {
        "complete": complete,
        "status": "complete" if complete else "incomplete",
    }
    if missing:
        extra["missing"] = [cell_dict(c, names) for c in missing]
    if errored:
        extra["errored"] = errored
    if interrupted:
        extra["interrupted"] = interrupted
    return extra


def errored_trials(frame: pd.DataFrame) -> int:
    """How many trials of a trial frame inspect recorded an error for: those
    :func:`rerun_errored` runs again, so while there are any the run is not complete. A
    trial never scored without an error (``errors`` counts it too) is not run again."""
    return int((frame["error"] != "").sum()) if not frame.empty else 0


def prompt_names(planned: list[Cell]) -> dict[str, str]:
    """Each planned prompt (name or path) → its name in summary.json."""
    return {p: load_prompt(p).name for p in dict.fromkeys(c.prompt for c in planned)}


def write_running(
    summary_path: Location, run: dict[str, Any], missing: list[dict[str, str]]
) -> None:
    """Until the run ends, summary.json says it is running: a reader never mistakes an old
    complete summary for this run's, even if this process is killed."""
    write_atomic(
        summary_path,
        lambda tmp: write_summary(
            pd.DataFrame(), tmp, run=run, complete=False, status="running", missing=missing
        ),
    )


def run_metadata(
    suite: Suite, model_args: dict[str, Any] | None = None, cells: list[Cell] | None = None
) -> dict[str, Any]:
    """What was run, for summary.json and the report: axes, prompt texts and hashes, versions.

    Model args are recorded minus anything credential-like (there should be none: see
    :func:`check_model_args`), and only when they are plain data. ``cells`` restricts the
    axes to those cells (a shard's share).
    """
    cells_: list[Cell] = list(suite.cells()) if cells is None else cells
    prompts = {}
    for name in dict.fromkeys(c.prompt for c in cells_):
        p = load_prompt(name)
        # The digest and size name the prompt; the text is an excerpt (a 10 MB prompt file
        # is not copied into summary.json and the report).
        prompts[p.name] = {
            "source": p.source,
            "sha256": p.sha256,
            "bytes": p.size,
            "text": p.excerpt,
            "truncated": p.truncated,
        }
    return {
        "models": list(dict.fromkeys(c.model for c in cells_)),
        "agents": list(dict.fromkeys(c.agent for c in cells_)),
        "mocks": dict(suite.mocks),
        "model_args": {
            k: v
            for k, v in (model_args or {}).items()
            if not CREDENTIAL_ARG.search(k) and isinstance(v, (str, int, float, bool, type(None)))
        },
        "prompts": prompts,
        "tasks": list(dict.fromkeys(c.task for c in cells_)),
        "faults": list(dict.fromkeys(c.fault for c in cells_)),
        "protections": list(dict.fromkeys(c.protection for c in cells_)),
        "epochs": suite.epochs,
        "limit": suite.limit,
        "suite": suite.source,
        "agent_cmd": suite.agent_cmd,
        "versions": {"twice": version("twice"), "inspect_ai": version("inspect_ai")},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def format_table(table: pd.DataFrame) -> str:
    """The per-cell table printed at the end of a run."""
    if table.empty:
        return "(no trials)"

    def pct(x: float) -> str:
        return "  n/a" if pd.isna(x) else f"{x:5.0%}"

    def ci(v: list[float]) -> str:
        lo, hi = v
        return "" if pd.isna(lo) else f"[{lo:.0%}–{hi:.0%}]"

    view = pd.DataFrame(
        {
            **{k: table[k] for k in CELL},
            "n": table["trials"],
            "err": table["errors"],
            "complete": table["completion_rate"].map(pct),
            "dup": table["duplication_rate"].map(pct),
            "dup 95% CI": table["duplication_ci"].map(ci),
            "safe": table["safe_success_rate"].map(pct),
            "excess": table["excess_effects_mean"].map(lambda x: "" if pd.isna(x) else f"{x:.2f}"),
            "wrong": table["wrong_rate"].map(pct),
            "crashed": table["crashed_rate"].map(pct),
        }
    )
    if not (table["wrong_rate"] > 0).any():
        # No effect with other values than asked: the column would be zeros.
        view = view.drop(columns=["wrong"])
    if (view["agent"] == REACT).all():
        # Only twice's own loop ran: the agent columns would say nothing.
        view = view.drop(columns=["agent", "crashed"])
    return str(view.to_string(index=False))
