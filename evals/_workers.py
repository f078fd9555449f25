"""``twice run --workers N`` and the merge of shard directories into one run.

Workers are the shard mechanism on one machine: N local ``twice run --shard i/N`` processes
into one ``LOG_DIR``, then one merged ``summary.json`` and report, exactly as ``twice report``
merges the shards of a cluster run.
"""

from __future__ import annotations

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
    cells,
    frame_of,
    is_file,
    join,
    log_records,
    read_log_dir,
    read_text,
    write_summary,
)

from ._run import (
    EXIT_INTERRUPTED,
    RunResult,
    _failures,
    finished_in,
    gc_for_trials,
    incomplete_fields,
    prompt_names,
    run_metadata,
    without_cut_short,
)
from ._shards import merged_run, run_workers
from ._suite import Cell, Suite, SuiteError


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
    log_dir: Location,
    run: dict[str, Any] | None = None,
    known: LogRecords | None = None,
    planned: list[Cell] | None = None,
    interrupted: str | None = None,
) -> Merged:
    """Read ``log_dir`` (merging its shards) and, when sharded, write its merged summary.json.

    The merged ``run`` record is ``run`` when given (a ``--workers`` run knows its whole suite),
    else the union of the shards' own records; either way it gains ``shards``. ``known``: logs
    already read (by the workers), by ``str(path)``; the others are read here. With
    ``planned`` (a ``--workers`` run's cells) the summary says, as a one-process run's does,
    whether every planned cell finished (``complete``, ``status``, ``missing``) and which
    signal, if any, ``interrupted`` the run.

    Raises:
        LogReadError: for unreadable logs or a missing shard (naming it).
    """
    logs = read_log_dir(log_dir)
    known = known or {}
    unread = [p for p in logs.files if str(p) not in known]
    frame = frame_of(logs.files, {**known, **log_records(unread)})
    if interrupted:
        frame = without_cut_short(frame)
    table = cells(frame)
    if logs.shards is None:
        return Merged(logs, frame, table, run or read_run(log_dir), None)
    if run is None:
        # Each shard recorded its own share of the axes: the union is the run.
        own = (read_run(logs.shards.dirs[i]) for i in sorted(logs.shards.dirs))
        run = merged_run([r for r in own if r is not None], logs.shards)
    else:
        run = {**run, "shards": logs.shards.record()}
    extra: dict[str, Any] = {}
    missing: list[Cell] = []
    if planned is not None:
        finished = finished_in(logs, planned)[0]
        missing = [c for c in planned if c not in finished]
        extra = incomplete_fields(missing, prompt_names(planned), interrupted)
    path = write_summary(table, join(log_dir, "summary.json"), run=run, **extra)
    return Merged(logs, frame, table, run, path, missing)


_STOPPED = {code: name for name, code in EXIT_INTERRUPTED.items()} | {
    -signal.SIGINT: "SIGINT",
    -signal.SIGTERM: "SIGTERM",
}
"""A worker's exit code when a signal stopped it → the signal's name."""


def run_with_workers(
    args: Sequence[str], log_dir: Location, count: int
) -> tuple[list[str], LogRecords, str | None]:
    """Run ``count`` local shard processes of ``twice run ARGS`` into ``log_dir``.

    Returns:
        One line per worker that ended with exit code 1 (an eval errored or a trial crashed;
        its logs are still merged), what the workers read of their logs, and the signal that
        stopped the run (passed on by this process, or received by a worker), if any.

    Raises:
        SuiteError: when a worker refused its arguments (exit 2) or ended otherwise
            unexpectedly, quoting its last lines of output.
    """
    failed = []
    exits = run_workers(args, log_dir, count)
    interrupted = next((w.interrupted for w in exits if w.interrupted), None)
    for w in exits:
        if w.returncode == 0:
            continue
        detail = f": {w.stderr_tail}" if w.stderr_tail else ""
        if w.returncode in _STOPPED:
            interrupted = interrupted or _STOPPED[w.returncode]
        elif w.returncode == 1:
            failed.append(f"worker {w.shard} exited 1{detail}")
        else:
            raise SuiteError(f"worker {w.shard} exited {w.returncode}{detail}")
    return failed, {key: recs for w in exits for key, recs in w.records.items()}, interrupted


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
    same suite from them and runs its share); the merged summary records the whole suite. A
    run stopped by SIGINT or SIGTERM returns with ``interrupted`` set and its summary marked.

    Raises:
        SuiteError: when a worker refused its arguments or ended unexpectedly.
    """
    planned = list(suite.cells())
    run = run_metadata(suite, model_args)
    summary_path = join(log_dir, "summary.json")
    # Nothing is written here before the workers have checked their arguments: bad input
    # leaves no directory behind. An interrupt is marked in the summary at the end.
    failed, known, interrupted = run_with_workers(args, log_dir, count)
    with gc_for_trials():  # reading every log back allocates like a run
        try:
            merged = merge(log_dir, run, known, planned=planned, interrupted=interrupted)
        except LogReadError as ex:
            if interrupted:  # stopped before every shard had begun: nothing to merge yet
                extra = incomplete_fields(planned, prompt_names(planned), interrupted)
                write_summary(pd.DataFrame(), summary_path, run=run, **extra)
                return RunResult(log_dir, [], pd.DataFrame(), summary_path, None, [],
                                 missing=planned, interrupted=interrupted)  # fmt: skip
            raise SuiteError(f"could not merge the workers' logs: {ex}") from None
        if not interrupted:  # an interrupt's cut-short trials are not crashes
            failed += merged.logs.problems() + _failures([], merged.table)
        report_path = None
        if report and not merged.frame.empty:
            from twice.reports import write_report

            report_path = write_report(merged.frame, join(log_dir, "report.html"), run=merged.run)
    assert merged.summary_path is not None  # the workers wrote shard directories
    return RunResult(
        log_dir, [], merged.table, merged.summary_path, report_path, failed,
        missing=merged.missing, interrupted=interrupted,
    )  # fmt: skip
