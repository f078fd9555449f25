"""``twice run --workers N`` and the merge of shard directories into one run.

Workers are the shard mechanism on one machine: N local ``twice run --shard i/N`` processes
into one ``LOG_DIR``, then one merged ``summary.json`` and report, exactly as ``twice report``
merges the shards of a cluster run.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from twice.reports import (
    Location,
    LogDir,
    LogReadError,
    LogRecords,
    ShardSet,
    cells,
    frame_of,
    is_dir,
    is_file,
    is_remote,
    join,
    log_records,
    log_uri,
    prepare_report,
    read_log_dir,
    read_summary,
    read_text,
    write_summary,
    write_text,
)

from ..locks import lock_log_dir
from ..run import (
    EXIT_INTERRUPTED,
    RunResult,
    cell_dict,
    cut_short_cells,
    errored_trials,
    finished_in,
    gc_for_trials,
    incomplete_fields,
    left_fields,
    prepare_log_dir,
    prompt_names,
    refuse_runs_inside,
    run_failures,
    run_metadata,
    without_cut_short,
    write_atomic,
    write_run_file,
    write_running,
)
from ..suite import Cell, SuiteError
from ._plan import WorkerPlan
from ._processes import run_workers


def merged_run(runs: Sequence[dict[str, Any]], shards: ShardSet) -> dict[str, Any]:
    """One ``run`` record for the merged shards: the axes are the union of the shards' axes."""
    merged: dict[str, Any] = dict(runs[0]) if runs else {}
    for key in ("models", "tasks", "faults", "protections"):
        merged[key] = list(dict.fromkeys(v for r in runs for v in r.get(key) or []))
    prompts: dict[str, Any] = {}
    for r in runs:
        prompts.update(r.get("prompts") or {})
    if runs:
        merged["prompts"] = prompts
    merged.pop("shard", None)
    merged["shards"] = shards.record()
    return merged


@dataclass
class Merged:
    """A log directory read as one run, with its summary written."""

    logs: LogDir
    frame: pd.DataFrame
    table: pd.DataFrame
    run: dict[str, Any] | None
    summary_path: Location | None
    missing: list[Cell] = field(default_factory=list)
    """Planned cells without a finished log (only when ``merge`` was given the plan)."""
    status: dict[str, Any] = field(default_factory=dict)
    """What the merged summary records of the run's state (``complete``, ``status``,
    ``missing``, ``interrupted``...), for the report."""


def read_run(log_dir: Location, warn: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """The ``run`` record of ``LOG_DIR/summary.json``; None when missing or unreadable."""
    run = read_summary(log_dir, warn).get("run")
    return run if isinstance(run, dict) else None


def shards_status(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The merged ``complete``/``status``/``missing``/``interrupted`` of a sharded run, from
    its shards' own summaries: complete when every shard is; a shard still ``running`` makes
    the run running. Empty when a shard's summary does not say (an older twice)."""
    if not summaries or any("complete" not in s for s in summaries):
        return {}
    complete = all(s["complete"] is True for s in summaries)
    running = any(s.get("status") == "running" for s in summaries)
    out: dict[str, Any] = {
        "complete": complete,
        "status": "complete" if complete else "running" if running else "incomplete",
    }
    missing = [m for s in summaries for m in s.get("missing") or []]
    if missing:
        out["missing"] = missing
    cut_short = [c for s in summaries for c in s.get("cut_short") or []]
    if cut_short:
        out["cut_short"] = cut_short
    errored = sum(s["errored"] for s in summaries if isinstance(s.get("errored"), int))
    if errored:
        out["errored"] = errored
    interrupted = next((s["interrupted"] for s in summaries if s.get("interrupted")), None)
    if interrupted:
        out["interrupted"] = interrupted
    return out


def merge(
    log_dir: Location,
    run: dict[str, Any] | None = None,
    known: LogRecords | None = None,
    planned: list[Cell] | None = None,
    interrupted: str | None = None,
    partial: bool = False,
    write: bool = True,
) -> Merged:
    """Read ``log_dir`` (merging its shards) and, when sharded, write its merged summary.json.

    The merged ``run`` record is ``run`` when given (a ``--workers`` run knows its whole suite),
    else the union of the shards' own records; either way it gains ``shards``. ``known``: logs
    already read (by the workers), by ``str(path)``; the others are read here. With
    ``planned`` (a ``--workers`` run's cells) the summary says, as a one-process run's does,
    whether every planned cell finished (``complete``, ``status``, ``missing``) and which
    signal, if any, ``interrupted`` the run; without it (``twice report``/``gate``) the
    shards' own summaries say (:func:`shards_status`). ``partial``: the run ended early (a
    worker died or was stopped); a shard it never began is read as empty, its cells missing.
    ``write=False`` reads only (a gate's ``--baseline``).

    Raises:
        LogReadError: for unreadable logs, a missing shard (naming it) or shards of different
            suites.
    """
    logs = read_log_dir(log_dir, partial=partial)
    shards = logs.shards
    summaries = [dict(s) for _, s in sorted(logs.shard_summaries.items())]
    extra, missing = _run_state(log_dir, logs, summaries, planned, interrupted)
    known = known or {}
    unread = [p for p in logs.files if str(p) not in known]
    frame = frame_of(logs.files, {**known, **log_records(unread)})
    if extra.get("interrupted"):  # an interrupt's cut-short trials are not crashes
        if planned is not None:  # a workers run: its shards' own summaries are not merged
            cut_short = cut_short_cells(frame)
            extra = {**extra, "cut_short": cut_short} if cut_short else extra
        frame = without_cut_short(frame)
    else:  # nor are they without a summary to say so: the logs inspect marked cancelled do
        cancelled = {log_uri(e.path) for e in logs.current if e.status == "cancelled"}
        if cancelled:
            frame = without_cut_short(frame, cancelled)
    table = cells(frame)
    if planned is not None and errored_trials(frame):  # cut_short, if any, is kept
        names = prompt_names(planned)
        extra = {**extra, **incomplete_fields(missing, names, interrupted, errored_trials(frame))}
    if planned is not None:
        # As a one-process run's summary: the endpoints its workers could not reach, and the
        # trials a rerun runs again.
        said = (line for s in summaries for line in s.get("unreachable") or [])
        extra = {**extra, **left_fields(frame, list(dict.fromkeys(said)))}
    if shards is None:
        return Merged(logs, frame, table, run or read_run(log_dir), None)
    if run is None:
        # Each shard recorded its own share of the axes: the union is the run.
        own = [s["run"] for s in summaries if isinstance(s.get("run"), dict)]
        run = merged_run(own, shards)
    else:
        run = {**run, "shards": shards.record()}
    if not write:
        return Merged(logs, frame, table, run, None, missing)
    path = write_atomic(
        join(log_dir, "summary.json"),
        lambda tmp: write_summary(table, tmp, run=run, **extra),
    )
    return Merged(logs, frame, table, run, path, missing, extra)


def _run_state(
    log_dir: Location,
    logs: LogDir,
    summaries: list[dict[str, Any]],
    planned: list[Cell] | None,
    interrupted: str | None,
) -> tuple[dict[str, Any], list[Cell]]:
    """What the merged summary says of the run's state before its trials are read, and the
    planned cells without a finished log.

    A ``--workers`` run knows its plan; a directory of shards has the shards' own summaries
    to say it; a one-process directory only its own summary, for an interrupt.
    """
    if planned is not None:
        finished = finished_in(logs, planned)[0]
        missing = [c for c in planned if c not in finished]
        # the errored trials are added once the trials are read
        return incomplete_fields(missing, prompt_names(planned), interrupted), missing
    if logs.shards is not None:
        extra = shards_status(summaries)
        if logs.missing and extra.get("complete", True):
            # Every shard finished, yet a log its eval-set.json plans is gone (deleted,
            # left out of an artifact): the merged run is not complete, whatever they say.
            extra = {
                **extra, "complete": False, "status": "incomplete",
                "missing_logs": list(logs.missing),
            }  # fmt: skip
        return extra, []
    top = read_summary(log_dir)
    if top.get("complete") is False and top.get("interrupted"):
        return {"interrupted": top["interrupted"]}, []
    return {}, []


def mark_unmerged(log_dir: Location, reason: str) -> bool:
    """Say in ``log_dir``'s merged ``summary.json`` that its shards can no longer be merged
    (``reason``: the refusal, naming the missing shard or unreadable log): ``complete``
    false, ``status`` incomplete, ``refused`` the reason. Returns whether it wrote.

    Only a merged summary (one with ``run.shards``, written by ``twice report``/``gate`` or a
    ``--workers`` run) is marked: it is derived from the shards, and left as it was it would
    still say ``complete`` of a directory every later report and gate refuses. A one-process
    run's own summary is that run's record, and stays as the run wrote it.
    """
    top = read_summary(log_dir)
    run = top.get("run")
    if not isinstance(run, dict) or "shards" not in run:
        return False
    if top.get("refused") == reason and top.get("complete") is False:
        return False
    marked = {**top, "complete": False, "status": "incomplete", "refused": reason}
    write_atomic(
        join(log_dir, "summary.json"),
        lambda tmp: write_text(tmp, json.dumps(marked, indent=2) + "\n"),
    )
    return True


_STOPPED = {code: name for name, code in EXIT_INTERRUPTED.items()} | {
    -signal.SIGINT: "SIGINT",
    -signal.SIGTERM: "SIGTERM",
}
"""A worker's exit code when a signal stopped it → the signal's name."""


def run_with_workers(
    plan: WorkerPlan,
    count: int,
    idle: Callable[[], object] | None = None,
    at_once: int | None = None,
) -> tuple[list[str], LogRecords, str | None]:
    """Run ``count`` local shard processes of ``plan`` into ``plan.log_dir``; ``idle`` and
    ``at_once`` as :func:`run_workers`.

    Returns:
        One line per worker that failed (exit 1: an eval or a trial errored; or killed
        by a signal other than SIGINT/SIGTERM, e.g. the OOM killer) with what it said went
        wrong, else its last lines of output (every shard's logs are still merged), what the
        workers read of their logs, and the signal that stopped the run (passed on by this
        process, or received by a worker), if any.

    Raises:
        SuiteError: when a worker refused the plan (exit 2).
    """
    failed = []
    exits = run_workers(plan, count, idle, at_once)
    interrupted = next((w.interrupted for w in exits if w.interrupted), None)
    for w in exits:
        if w.returncode == 0:
            continue
        said = "; ".join(w.errors) if w.errors is not None else w.stderr_tail
        detail = f": {said}" if said else ""
        if w.returncode in _STOPPED:
            interrupted = interrupted or _STOPPED[w.returncode]
        elif w.returncode == 2:
            # A usage error. Every worker has the run's plan, so it is the run's: said as one
            # process says it, not as a worker's (the default suite runs as 2 workers nobody
            # asked for, and a missing API key would read as a worker's problem).
            raise SuiteError(said or "a worker refused the plan and gave no reason")
        elif w.returncode < 0:  # the OOM killer, a kill -9: what the others finished counts
            name = signal.Signals(-w.returncode).name
            failed.append(f"worker {w.shard} was killed by {name}{detail}")
        else:
            failed.append(f"worker {w.shard} exited {w.returncode}{detail}")
    return failed, {key: recs for w in exits for key, recs in w.records.items()}, interrupted


def run_parallel(
    plan: WorkerPlan,
    count: int,
    *,
    report: bool = True,
    at_once: int | None = None,
) -> RunResult:
    """``twice run --workers count``: the shards of ``plan`` as local processes (``at_once``:
    at most that many at a time), then the merge.

    Each worker is given the plan and runs its share; the merged summary records the whole
    suite. A run stopped by SIGINT or SIGTERM returns with ``interrupted`` set and its summary
    marked.

    Raises:
        SuiteError: when a worker refused the plan.
        LogReadError: when the workers' logs cannot be read back (a log gone or changed
            meanwhile, object storage failing); the logs stay for a rerun to resume.
    """
    suite, log_dir = plan.suite, plan.log_dir
    planned = list(suite.cells())
    run = run_metadata(suite, plan.model_args)
    summary_path = join(log_dir, "summary.json")
    if is_remote(log_dir):
        # A bucket that is missing or cannot be reached is one line here, as in one process,
        # not every worker's usage error wrapped in the run's.
        prepare_log_dir(log_dir)
    elif is_dir(log_dir):
        refuse_runs_inside(log_dir)  # its shards' directories aside (checked there too)
    with contextlib.ExitStack() as stack:
        if not is_remote(log_dir) and is_dir(log_dir):
            # The lock a one-process run takes: the two never run into one directory at once.
            # A new directory is left to the workers to create (bad input leaves none behind),
            # and their shard locks keep two runs of the same split apart. (In object storage
            # the workers' shard leases do it all: a lease's renewing thread here would keep
            # the workers from being forks.)
            stack.enter_context(lock_log_dir(log_dir))
        previous = _mark_running(summary_path, run, planned)
        try:
            # The report's libraries load while the last workers finish, not after them.
            idle = prepare_report if report else None
            failed, known, interrupted = run_with_workers(plan, count, idle, at_once)
        except SuiteError:  # the workers refused the plan: nothing ran, nothing is lost
            if previous is not None:
                write_text(summary_path, previous)
            raise
        return _merge_workers(log_dir, run, known, planned, failed, interrupted, report=report)


def _mark_running(summary_path: Location, run: dict[str, Any], planned: list[Cell]) -> str | None:
    """Mark an earlier run's summary.json ``running`` (a run killed outright leaves no stale
    ``complete`` behind) and return its text, to put back if the workers refuse to start.
    No summary yet: nothing is written (the workers check the arguments first)."""
    if not is_file(summary_path):
        return None
    previous = read_text(summary_path)
    names = prompt_names(planned)
    write_running(summary_path, run, [cell_dict(c, names) for c in planned])
    return previous


def _merge_workers(
    log_dir: Location,
    run: dict[str, Any],
    known: LogRecords,
    planned: list[Cell],
    failed: list[str],
    interrupted: str | None,
    *,
    report: bool,
) -> RunResult:
    summary_path = join(log_dir, "summary.json")
    with gc_for_trials():  # reading every log back allocates like a run
        try:
            merged = merge(
                log_dir, run, known, planned=planned, interrupted=interrupted,
                partial=bool(failed or interrupted),
            )  # fmt: skip
        except LogReadError as ex:
            if not (interrupted or failed):
                # A read failure, as in one process (exit 1, resumable), not bad usage.
                raise type(ex)(f"could not merge the workers' logs: {ex}") from None
            # Stopped, or a worker died, before there was anything to merge: the summary says
            # so (every cell missing); the logs written so far stay for the rerun to resume.
            extra = incomplete_fields(planned, prompt_names(planned), interrupted)
            empty = pd.DataFrame()
            write_atomic(summary_path, lambda tmp: write_summary(empty, tmp, run=run, **extra))
            if failed:
                failed.append(f"nothing was merged: {ex}")
            return RunResult(log_dir, [], empty, summary_path, None, failed,
                             missing=planned, interrupted=interrupted)  # fmt: skip
        if not interrupted:  # an interrupt's cut-short trials are not crashes
            failed += merged.logs.problems() + run_failures([], merged.table, merged.frame)
        report_path = None
        if report and not merged.frame.empty:
            from twice.reports import write_report

            report_path = write_run_file(  # a failure: one line, exit 1 (the summary stays)
                join(log_dir, "report.html"),
                lambda tmp: write_report(merged.frame, tmp, run=merged.run, status=merged.status),
                summary_path, merged.run or {}, merged.status,
            )  # fmt: skip
    assert merged.summary_path is not None  # the workers wrote shard directories
    # Each worker's summary says how many of its cells it found finished and left as they were.
    reused = sum(_count(s.get("reused")) for s in merged.logs.shard_summaries.values())
    return RunResult(
        log_dir, [], merged.table, merged.summary_path, report_path, failed,
        missing=merged.missing, interrupted=interrupted, reused=reused,
        unreachable=list(merged.status.get("unreachable", [])), trials=merged.frame,
        uncounted=merged.logs.uncounted_cells(),
    )  # fmt: skip


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
