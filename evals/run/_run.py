"""Run a suite through inspect's ``eval_set`` (one process, resumable) and summarise it.

What a run guarantees (README "Reliability"; ``twice run`` and ``--until-decided`` alike, both
through :func:`prepared_run` and :func:`evaluate`): one run per log directory (a lock); an
interrupted run (SIGINT, SIGTERM) exits 130/143 with ``summary.json`` marked incomplete and
naming the missing cells, and the same command resumes it (a second signal stops a
``twice run`` at once, its summary marked incomplete without counts); ``summary.json`` and
``report.html`` are replaced by rename, never left half-written; a model endpoint that cannot
be reached ends the run (exit 1) within a bounded time, named in one line; no API key from
the environment reaches what the run writes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from inspect_ai.log import EvalLog
from twice.reports import Location, LogRecords, Shard, as_location, cells, join, write_summary

from ..suite import Cell, Suite, shard_cells, shard_dir, suite_digest
from ._eval import evaluate, prepared_run
from ._files import write_atomic, write_run_file
from ._resume import finished_in, finished_logs, read_or_none, refuse_fewer_trials, rerun_errored
from ._settings import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, EvalSettings, PreparedRun
from ._signals import EXIT_INTERRUPTED, LAST_INTERRUPT, Interrupts, exit_at_once, stop_signals
from ._speedups import gc_for_trials
from ._summary import (
    cell_dict,
    cut_short_cells,
    errored_trials,
    incomplete_fields,
    left_fields,
    prompt_names,
    ran_trials,
    run_failures,
    run_metadata,
    without_cut_short,
    write_running,
)


@dataclass
class RunResult:
    """What a suite run produced."""

    log_dir: Location
    logs: list[EvalLog]
    table: pd.DataFrame
    summary_path: Location
    report_path: Location | None
    failed: list[str]
    """Human lines for every eval or trial that errored."""
    missing: list[Cell] = field(default_factory=list)
    """Planned cells with no finished log (an interrupted or failed run)."""
    interrupted: str | None = None
    """``SIGINT`` or ``SIGTERM`` when the run was stopped by one."""
    unreachable: list[str] = field(default_factory=list)
    """One line per model whose endpoint could not be reached."""
    reused: int = 0
    """Cells whose finished logs an earlier run left (resumed, not run again)."""
    trials: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False, compare=False)
    """The trial frame behind ``table`` (one row per trial), when the run read it."""
    uncounted: list[str] = field(default_factory=list)
    """Cells an earlier run left logs of in the directory that this run does not plan: kept
    on disk, counted by nothing (:meth:`twice.reports.LogDir.uncounted_cells`)."""

    @property
    def ok(self) -> bool:
        """True when every planned cell ran to completion and no trial errored."""
        return not (self.failed or self.missing or self.interrupted or self.unreachable)

    @property
    def exit_code(self) -> int:
        """The ``twice run`` exit code (docs/architecture.md): 0 all ran, 1 failed, 130/143
        interrupted."""
        if self.interrupted:
            return EXIT_INTERRUPTED.get(self.interrupted, 130)
        return 0 if self.ok else 1


def default_log_dir() -> Path:
    """``logs/run-YYYYmmdd-HHMMSS`` under the current directory."""
    return Path("logs") / dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")


def run_suite(
    suite: Suite,
    log_dir: Location,
    *,
    model_args: dict[str, Any] | None = None,
    max_connections: int | None = None,
    display: str | None = "none",
    retry_attempts: int = 1,
    report: bool = True,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout: int = DEFAULT_TIMEOUT,
    generate_config: dict[str, Any] | None = None,
    shard: Shard | None = None,
    keep_records: Callable[[LogRecords], object] | None = None,
) -> RunResult:
    """Run every cell of ``suite`` into ``log_dir`` and write ``summary.json`` (and the report).

    Re-running with the same ``log_dir`` resumes: finished evals are reused, not redone, and
    the finished samples of an interrupted eval are kept. While it runs, the directory is
    locked and ``summary.json`` says so (``"complete": false``); at the end it holds the
    planned cells' counts, and when cells are missing (an interrupt, a failed eval) it stays
    ``"complete": false`` and names them. ``generate_config`` holds inspect generate settings
    for every eval (``temperature``, ``seed``...); its ``max_retries`` and ``timeout``, when
    set, win over the arguments of those names. ``log_dir`` may be an fsspec URI
    (``s3://bucket/run``; there the lock is a lease: :func:`lock_log_dir`). With ``shard``,
    only the cells dealt to it run, into ``log_dir/shard-i-of-n/`` (which is then the
    result's ``log_dir``). ``keep_records`` is given what the run read of its logs (a
    ``--workers`` worker hands it to the parent, which merges from it).

    Raises:
        SuiteError: for a model that cannot be loaded, credential model args, a log
            directory that cannot be created or written, one locked by another live run
            (``LogDirLockedError``), or one holding a log that cannot be read (all checked
            before anything runs).
    """
    settings = EvalSettings.of(
        generate_config, max_connections=max_connections, display=display,
        retry_attempts=retry_attempts, max_retries=max_retries, timeout=timeout,
    )  # fmt: skip
    log_dir = as_location(log_dir)
    if isinstance(log_dir, Path):  # as inspect (through fsspec) and a shell read it
        log_dir = log_dir.expanduser()
    planned = list(suite.cells())
    if shard is not None:
        log_dir = shard_dir(log_dir, shard)
        planned = shard_cells(planned, shard)
    with prepared_run(suite, log_dir, settings, model_args=model_args, planned=planned) as run:
        return _run_locked(
            suite, run, settings, model_args=model_args, report=report, shard=shard,
            keep_records=keep_records,
        )  # fmt: skip


def _run_locked(
    suite: Suite,
    prepared: PreparedRun,
    settings: EvalSettings,
    *,
    model_args: dict[str, Any] | None,
    report: bool,
    shard: Shard | None = None,
    keep_records: Callable[[LogRecords], object] | None = None,
) -> RunResult:
    log_dir, planned = prepared.log_dir, prepared.planned
    run = run_metadata(suite, model_args, None if shard is None else planned)
    if shard is not None:
        whole = suite_digest(list(suite.cells()), suite.epochs, suite.limit, run["model_args"])
        run["shard"] = {"index": shard.index, "count": shard.count, "suite": whole}
    names = prompt_names(planned)
    # A cell counts as reused when its finished log is still the one that counts at the end,
    # unchanged (a log extended to more epochs, or run again, is not).
    earlier = read_or_none(log_dir)
    refuse_fewer_trials(earlier, prepared, suite)
    rerun_errored(earlier, planned)
    before = finished_logs(earlier, planned)
    summary_path = join(log_dir, "summary.json")
    state = LAST_INTERRUPT
    state.signal = None
    final: list[Location] = []  # the last summary, once written: a stop at once keeps it

    def stop_now(name: str) -> None:
        if not final:
            fields = incomplete_fields(planned, names, name)
            with contextlib.suppress(Exception):  # leaving now matters more than this file
                write_atomic(
                    summary_path,
                    lambda tmp: write_summary(
                        pd.DataFrame(), tmp, run=run, **fields, stopped_at_once=True
                    ),
                )
        exit_at_once(name, state, summary_path)

    with stop_signals(state, stop_now):
        write_running(summary_path, run, [cell_dict(c, names) for c in planned])
        result = _evaluate_and_summarise(
            suite, prepared, settings, state, run, names, before, shard, report, final,
            keep_records,
        )  # fmt: skip
    return result


def _evaluate_and_summarise(
    suite: Suite,
    prepared: PreparedRun,
    settings: EvalSettings,
    state: Interrupts,
    run: dict[str, Any],
    names: dict[str, str],
    before: dict[Cell, tuple[str, Any]],
    shard: Shard | None,
    report: bool,
    final: list[Location],
    keep_records: Callable[[LogRecords], object] | None = None,
) -> RunResult:
    log_dir, planned = prepared.log_dir, prepared.planned
    summary_path = join(log_dir, "summary.json")
    logs = evaluate(prepared, settings, state, epochs=suite.epochs, limit=suite.limit)
    # The trials' survivors make every full collection slow from here on; reading the logs
    # back allocates enough to trigger several (1.3 s of a worker's 1.5 s header reads).
    with gc_for_trials():
        now = read_or_none(log_dir)
        finished, files, cancelled = finished_in(now, planned)
        if cancelled:  # a cancelled log on disk: interrupted, whatever eval_set returned
            state.signal = state.signal or "SIGINT"
        frame = ran_trials(files, False, keep_records)
        cut_short = cut_short_cells(frame) if state.signal else []
        frame = without_cut_short(frame) if state.signal else frame
        table = cells(frame) if not frame.empty else pd.DataFrame()
        missing = [c for c in planned if c not in finished]
        extra = incomplete_fields(missing, names, state.signal, errored_trials(frame))
        if cut_short:
            extra["cut_short"] = cut_short
        extra.update(left_fields(frame, prepared.unreachable()))
        after = finished_logs(now, planned)
        reused = sum(1 for cell, log in before.items() if after.get(cell) == log)
        if shard is not None:  # the --workers parent adds up its shards' (summary "reused")
            extra["reused"] = reused
        write_run_file(
            summary_path,
            lambda tmp: write_summary(table, tmp, run=run, **extra),
            summary_path, run, extra,
        )  # fmt: skip
        final.append(summary_path)
        report_path = None
        if report and not frame.empty:
            from twice.reports import write_report

            report_path = write_run_file(
                join(log_dir, "report.html"),
                lambda tmp: write_report(frame, tmp, run=run, status=extra),
                summary_path, run, extra,
            )  # fmt: skip
    # After an interrupt, the trials it cut short are recorded as errors: not crashes.
    failed = [] if state.signal else run_failures(logs, table, frame)
    return RunResult(
        log_dir, logs, table, summary_path, report_path, failed,
        missing=missing, interrupted=state.signal, unreachable=prepared.unreachable(),
        reused=reused, trials=frame, uncounted=now.uncounted_cells() if now else [],
    )  # fmt: skip
