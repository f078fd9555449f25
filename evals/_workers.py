"""``twice run --workers N`` and the merge of shard directories into one run.

Workers are the shard mechanism on one machine: N local ``twice run --shard i/N`` processes
into one ``LOG_DIR``, then one merged ``summary.json`` and report, exactly as ``twice report``
merges the shards of a cluster run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from twice.reports import (
    Location,
    LogDir,
    LogReadError,
    LogRecords,
    cells,
    frame_of,
    is_file,
    join,
    log_records,
    read_log_dir,
    read_text,
    write_summary,
)

from ._run import RunResult, _failures, gc_for_trials, run_metadata
from ._shards import merged_run, run_workers
from ._suite import Suite, SuiteError


@dataclass
class Merged:
    """A log directory read as one run, with its summary written."""

    logs: LogDir
    frame: pd.DataFrame
    table: pd.DataFrame
    run: dict[str, Any] | None
    summary_path: Location | None


def read_run(log_dir: Location, warn: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """The ``run`` record of ``LOG_DIR/summary.json``; None (after ``warn``) when unreadable."""
    path = join(log_dir, "summary.json")
    if not is_file(path):
        return None
    try:
        run = json.loads(read_text(path)).get("run")
    except (ValueError, AttributeError) as ex:
        if warn:
            warn(f"ignoring unreadable {path}: {ex}")
        return None
    return run if isinstance(run, dict) else None


def merge(
    log_dir: Location, run: dict[str, Any] | None = None, known: LogRecords | None = None
) -> Merged:
    """Read ``log_dir`` (merging its shards) and, when sharded, write its merged summary.json.

    The merged ``run`` record is ``run`` when given (a ``--workers`` run knows its whole suite),
    else the union of the shards' own records; either way it gains ``shards``. ``known``: logs
    already read (by the workers), by ``str(path)``; the others are read here.

    Raises:
        LogReadError: for unreadable logs or a missing shard (naming it).
    """
    logs = read_log_dir(log_dir)
    known = known or {}
    unread = [p for p in logs.files if str(p) not in known]
    frame = frame_of(logs.files, {**known, **log_records(unread)})
    table = cells(frame)
    if logs.shards is None:
        return Merged(logs, frame, table, run or read_run(log_dir), None)
    if run is None:
        # Each shard recorded its own share of the axes: the union is the run.
        own = (read_run(logs.shards.dirs[i]) for i in sorted(logs.shards.dirs))
        run = merged_run([r for r in own if r is not None], logs.shards)
    else:
        run = {**run, "shards": logs.shards.record()}
    path = write_summary(table, join(log_dir, "summary.json"), run=run)
    return Merged(logs, frame, table, run, path)


def run_with_workers(
    args: Sequence[str], log_dir: Location, count: int
) -> tuple[list[str], LogRecords]:
    """Run ``count`` local shard processes of ``twice run ARGS`` into ``log_dir``.

    Returns:
        One line per worker that ended with exit code 1 (an eval errored or a trial crashed;
        its logs are still merged), and what the workers read of their logs.

    Raises:
        SuiteError: when a worker refused its arguments or was interrupted (exit 2 or 130),
            quoting its last lines of output.
    """
    failed = []
    exits = run_workers(args, log_dir, count)
    for w in exits:
        if w.returncode == 0:
            continue
        detail = f": {w.stderr_tail}" if w.stderr_tail else ""
        if w.returncode == 1:
            failed.append(f"worker {w.shard} exited 1{detail}")
        else:
            raise SuiteError(f"worker {w.shard} exited {w.returncode}{detail}")
    return failed, {key: recs for w in exits for key, recs in w.records.items()}


def run_parallel(
    suite: Suite,
    log_dir: Location,
    args: Sequence[str],
    count: int,
    *,
    model_args: dict[str, Any] | None = None,
    report: bool = True,
) -> RunResult:
    """``twice run ARGS --workers count``: the shards as local processes, then the merge.

    ``args`` are the ``twice run`` arguments that select the suite (each worker rebuilds the
    same suite from them and runs its share); the merged summary records the whole suite.

    Raises:
        SuiteError: when a worker refused its arguments or was interrupted.
    """
    failed, known = run_with_workers(args, log_dir, count)
    with gc_for_trials():  # reading every log back allocates like a run
        try:
            merged = merge(log_dir, run=run_metadata(suite, model_args), known=known)
        except LogReadError as ex:
            raise SuiteError(f"could not merge the workers' logs: {ex}") from None
        failed += merged.logs.problems() + _failures([], merged.table)
        report_path = None
        if report:
            from twice.reports import write_report

            report_path = write_report(merged.frame, join(log_dir, "report.html"), run=merged.run)
    assert merged.summary_path is not None  # the workers wrote shard directories
    return RunResult(log_dir, [], merged.table, merged.summary_path, report_path, failed)
