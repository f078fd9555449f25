"""``twice run --until-decided GATE.toml``: run each cell in rounds until its gate verdict is
settled.

A round adds whole epochs to every cell still undecided (all its samples once more, so the
stub models' per-trial seeds and a real model's samples stay distinct trials). After each
round every gate rule is checked on every cell with the anytime-valid bounds of
:mod:`._sequential`; a cell whose rules are all settled stops. The cells run through one
``eval_set`` per round into one log directory, each task with its own epoch count, so an
interrupted run resumes (inspect reuses the finished samples of a log whose epochs grew) and
``twice gate``/``twice report`` read the directory like any other run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
from inspect_ai import Task, task_with
from inspect_ai.log import EvalLog
from twice.reports import (
    Location,
    LogDir,
    alpha_of,
    cells,
    join,
    read_summary,
    trials_frame,
    write_summary,
)

from ..gate import METHOD, GateConfig
from ..suite import Cell, Suite, SuiteError
from ._decisions import (
    NOT_FAILING,
    CellState,
    cell_rows,
    epochs_held,
    format_decisions,
    judge,
    planned_cell,
    replay,
    samples_of,
    settle,
)
from ._eval import evaluate, prepared_run
from ._files import write_atomic
from ._resume import finished_cells, read_or_none, rerun_errored
from ._run import RunResult
from ._settings import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, EvalSettings, PreparedRun
from ._signals import LAST_INTERRUPT, Interrupts, stop_on_sigterm
from ._summary import (
    cell_dict,
    cut_short_cells,
    errored_trials,
    format_table,
    incomplete_fields,
    prompt_names,
    ran_trials,
    run_failures,
    run_metadata,
)

DEFAULT_MAX_TRIALS = 480
"""Trials per cell at most (20 rounds of a 24-sample task such as send_email; 17 of the
refund task's 28): enough to pass a cell whose true rate is 1% against a 5% bound in about
97% of runs (``bench/``)."""


def sequential_record(log_dir: Location, logs: LogDir | None = None) -> dict[str, Any] | None:
    """The ``run.sequential`` record of a log directory's summary.json, or else the one its
    logs carry (``metadata["twice"]["sequential"]``, without the cells' verdicts); None: a
    fixed run.

    The logs' copy means that a directory without its summary.json (deleted, or left out of
    an artifact) is still gated with the anytime-valid bounds its run looked at every round;
    with Wilson's it could pass where the run's own gate failed.
    """
    run = read_summary(log_dir).get("run")
    seq = run.get("sequential") if isinstance(run, dict) else None
    if isinstance(seq, dict):
        return seq
    for entry in logs.current if logs is not None else ():
        seq = entry.twice.get("sequential")
        if isinstance(seq, Mapping):
            return dict(seq)
    return None


def _fixed_run(log_dir: Location) -> int | None:
    """The epochs of the fixed run (``twice run --epochs``) whose summary.json ``log_dir``
    holds, if it holds one."""
    run = read_summary(log_dir).get("run")
    if not isinstance(run, dict) or isinstance(run.get("sequential"), dict):
        return None
    epochs = run.get("epochs")
    return epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else 0


def run_until_decided(
    suite: Suite,
    log_dir: Path,
    gate: GateConfig,
    *,
    gate_path: str,
    batch: int | None = None,
    max_trials: int = DEFAULT_MAX_TRIALS,
    model_args: dict[str, Any] | None = None,
    max_connections: int | None = None,
    display: str | None = "none",
    retry_attempts: int = 1,
    report: bool = True,
    progress: Callable[[str], None] = lambda _: None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout: int = DEFAULT_TIMEOUT,
    generate_config: dict[str, Any] | None = None,
) -> tuple[RunResult, list[CellState]]:
    """Run ``suite`` in rounds until every cell's gate verdict is settled (or at the cap).

    What :func:`run_suite` guarantees holds here too: the log directory is locked for the
    run; ``summary.json`` says ``running`` until the end; a model endpoint that cannot be
    reached stops the run (the result names it in ``unreachable``); SIGINT or SIGTERM stops
    it within or between rounds with ``summary.json`` marked incomplete (``interrupted``,
    ``missing``: the cells not yet settled), and the same call resumes it where it stopped.

    Args:
        suite: What to run (its ``epochs`` are ignored: rounds decide them).
        log_dir: Where logs and summary.json go; rerun with the same directory to resume.
        gate: The gate whose rules decide when a cell is settled.
        gate_path: The gate file, recorded in summary.json.
        batch: Trials per cell per round, rounded up to whole epochs of the cell's samples
            (default: one epoch).
        max_trials: No cell runs a round that would take it past this many trials.
        model_args: Provider model arguments.
        max_connections: Concurrent model connections.
        display: Inspect's progress display.
        retry_attempts: Inspect's retries of an errored eval within a round.
        report: Write report.html.
        progress: Receives one line per round.
        max_retries: Retries of a failed model call before its endpoint counts as
            unreachable.
        timeout: Seconds one model call may take.
        generate_config: Inspect generate settings for every eval (a suite's
            ``[local_model]``); its ``max_retries`` and ``timeout`` win over the arguments.

    Raises:
        SuiteError: as :func:`run_suite` (``LogDirLockedError`` for a directory another run
            holds), or for a ``max_trials`` below one round.
    """
    settings = EvalSettings.of(
        generate_config, max_connections=max_connections, display=display,
        retry_attempts=retry_attempts, max_retries=max_retries, timeout=timeout,
    )  # fmt: skip
    log_dir = Path(log_dir)
    planned = list(suite.cells())
    states: list[CellState] = []

    header = _header(gate, gate_path, batch, max_trials)
    plan = _planner(planned, states, header, suite.limit, batch, max_trials)
    with prepared_run(
        suite, log_dir, settings, model_args=model_args, planned=planned, check=plan
    ) as prepared:
        fixed = _fixed_run(prepared.log_dir)
        if fixed is not None:
            raise SuiteError(
                f"log directory {str(prepared.log_dir)!r} holds a fixed run"
                + (f" (--epochs {fixed})" if fixed else "")
                + "; its rounds would rewrite that run's logs to fewer epochs and drop trials: "
                "give --until-decided its own --log-dir"
            )
        rerun_errored(read_or_none(prepared.log_dir), prepared.planned)
        record: dict[str, Any] = {**header, "cells": []}
        run = {**run_metadata(suite, model_args), "sequential": record, "epochs": None}
        rounds = _Rounds(prepared, settings, states, gate, max_trials, record, run)
        return rounds.run(suite.limit, progress, report), states


def _header(gate: GateConfig, gate_path: str, batch: int | None, max_trials: int) -> dict[str, Any]:
    """How the run decides (summary.json's ``run.sequential``, and every log's copy)."""
    return {
        "method": METHOD,
        "confidence": gate.confidence,
        "alpha": alpha_of(gate.confidence),
        "gate": gate_path,
        "batch": batch,
        "max_trials": max_trials,
    }


def _planner(
    planned: list[Cell],
    states: list[CellState],
    header: dict[str, Any],
    limit: int | None,
    batch: int | None,
    max_trials: int,
) -> Callable[[list[Task]], None]:
    """The check :func:`prepared_run` gives the built tasks: it marks each task's logs as
    sequential and appends each cell's state to ``states``; a cap below one round is bad
    input, refused before the log directory is touched."""

    def plan(tasks: list[Task]) -> None:
        for task, cell in zip(tasks, planned, strict=True):
            # Every log says it is sequential (summary.json may go missing): its gate's bounds.
            meta = task.metadata or {}
            task.metadata = {**meta, "twice": {**meta.get("twice", {}), "sequential": header}}
            s = samples_of(task, limit)
            epochs = max(1, math.ceil((batch or s) / s)) if s else 1
            if s * epochs > max_trials:
                raise SuiteError(
                    f"--max-trials {max_trials} is below one round of {s * epochs} trials of "
                    f"{task.name} ({s} sample(s) × {epochs} epoch(s)); raise it or lower "
                    "--batch/--limit"
                )
            states.append(CellState(planned_cell(task, cell.model), s, epochs_per_round=epochs))

    return plan


@dataclass
class _Rounds:
    """The rounds of one locked run (:func:`run_until_decided`)."""

    prepared: PreparedRun
    settings: EvalSettings
    states: list[CellState]
    gate: GateConfig
    max_trials: int
    record: dict[str, Any]
    run_info: dict[str, Any]

    def _frame(self) -> tuple[pd.DataFrame, bool]:
        """The planned cells' trials in the log directory, and whether one of their logs
        was cancelled. Trials an interrupt cut short are dropped: they did not run (a resumed
        run runs them), so a round they belong to is not complete."""
        _, files, cancelled = finished_cells(self.prepared.log_dir, self.prepared.planned)
        frame = ran_trials(files, True)
        return (frame if not frame.empty else trials_frame([])), cancelled

    def _unsettled(self) -> list[Cell]:
        return [
            c
            for c, st in zip(self.prepared.planned, self.states, strict=True)
            if st.stopped_round is None
        ]

    def _summary(self, frame: pd.DataFrame, **extra: Any) -> Location:
        self.record["cells"] = [st.record() for st in self.states]
        table = cells(frame) if not frame.empty else pd.DataFrame()
        path = join(self.prepared.log_dir, "summary.json")
        return write_atomic(path, lambda tmp: write_summary(table, tmp, run=self.run_info, **extra))

    def run(self, limit: int | None, progress: Callable[[str], None], report: bool) -> RunResult:
        names = prompt_names(self.prepared.planned)
        frame = self._frame()[0]
        for st in self.states:
            rows = cell_rows(frame, st.cell)
            replay(st, rows, self.gate, self.max_trials)
            if st.stopped_round is None:
                self._next_round(st)
            self._refuse_dropping(st, rows)
        running = {"complete": False, "status": "running"}
        self._summary(frame, **running, missing=[cell_dict(c, names) for c in self._unsettled()])
        state = LAST_INTERRUPT
        state.signal = None
        logs: list[EvalLog] = []
        # Between rounds too, SIGTERM stops the run as Ctrl-C does (a KeyboardInterrupt here).
        with stop_on_sigterm(state):
            try:
                logs, frame = self._rounds(limit, progress, state, names)
            except KeyboardInterrupt:
                state.signal = state.signal or "SIGINT"
                frame = self._frame()[0]
        unsettled = self._unsettled()
        for st in self.states:
            if st.stopped_round is None:  # what the cell has so far, for the decisions
                st.trials = len(cell_rows(frame, st.cell))
        errored = errored_trials(frame)
        status = incomplete_fields(unsettled, names, state.signal, errored)
        if state.signal:  # what the interrupt cut short, and had already duplicated
            files = finished_cells(self.prepared.log_dir, self.prepared.planned)[1]
            cut_short = cut_short_cells(ran_trials(files, False))
            if cut_short:
                status["cut_short"] = cut_short
        summary_path = self._summary(frame, **status)
        report_path = None
        if report and not frame.empty:
            from twice.reports import write_report

            report_path = write_atomic(
                join(self.prepared.log_dir, "report.html"),
                lambda tmp: write_report(frame, tmp, run=self.run_info, status=status),
            )
        table = cells(frame) if not frame.empty else pd.DataFrame()
        # After an interrupt, the trials it cut short are recorded as errors: not crashes.
        failed = [] if state.signal else run_failures(logs, table, frame)
        return RunResult(
            self.prepared.log_dir, logs, table, summary_path, report_path, failed,
            missing=unsettled, interrupted=state.signal,
            unreachable=self.prepared.unreachable(),
        )  # fmt: skip

    def _refuse_dropping(self, st: CellState, rows: pd.DataFrame) -> None:
        """Refuse a resume whose rounds would hold fewer trials of a cell than its logs do.

        A cell settles (or reaches the cap) at an earlier round when the gate file or
        ``--max-trials`` changed since the logs were written; its next ``eval_set`` would then
        rewrite its log to fewer epochs, dropping the trials beyond them. Checked before
        anything is written."""
        held = epochs_held(rows)
        if held > st.epochs:
            raise SuiteError(
                f"log directory {str(self.prepared.log_dir)!r} holds {held} epoch(s) of "
                f"cell {st.label}, and this run stops it at {st.epochs} (its gate or "
                "--max-trials differ from the run that wrote them): the rest would be "
                "dropped; rerun with that run's gate and --max-trials, or another --log-dir"
            )

    def _next_round(self, st: CellState) -> bool:
        """Plan the cell's next round; at the cap, stop it undecided instead. True: planned.

        The one place the cap applies: a resumed run replays its finished rounds and comes
        here as an uninterrupted run did after its last one (a rerun of a run that stopped at
        the cap runs nothing more, not one more round each time)."""
        if (st.epochs + st.epochs_per_round) * st.samples > self.max_trials:
            st.status = "undecided"
            st.stopped_round = st.rounds
            return False
        st.epochs += st.epochs_per_round
        return True

    def _rounds(
        self,
        limit: int | None,
        progress: Callable[[str], None],
        state: Interrupts,
        names: dict[str, str],
    ) -> tuple[list[EvalLog], pd.DataFrame]:
        while True:
            for task, st in zip(self.prepared.tasks, self.states, strict=True):
                task_with(task, epochs=st.epochs)
            running = [st for st in self.states if st.stopped_round is None]
            progress(
                f"round: {len(running)} undecided cell(s) of {len(self.states)}, up to "
                f"{max((st.epochs * st.samples for st in running), default=0)} trials a cell"
            )
            logs = evaluate(self.prepared, self.settings, state, limit=limit)
            frame, cancelled = self._frame()
            if cancelled:  # a cancelled log on disk: interrupted, whatever eval_set returned
                state.signal = state.signal or "SIGINT"
            if (
                state.signal
                or self.prepared.unreachable()
                or any(log.status != "success" for log in logs)
            ):
                # Interrupted, a model out of reach or an eval errored: report what ran, do
                # not plan more rounds on top of it.
                return logs, frame
            grew = False
            for st in self.states:
                if st.stopped_round is not None:
                    continue
                st.rounds = st.epochs // st.epochs_per_round
                if judge(st, cell_rows(frame, st.cell), self.gate):
                    settle(st, st.rounds)
                else:
                    grew = self._next_round(st) or grew
            # After every round, so an interrupted run's directory already says it is
            # sequential and how far each cell got.
            missing = [cell_dict(c, names) for c in self._unsettled()]
            self._summary(frame, complete=False, status="running", missing=missing)
            if not grew:
                return logs, frame


def unmatched_rules(gate: GateConfig, suite: Suite) -> list[str]:
    """One line per rule of ``gate`` that matches no cell of ``suite`` (a typo in a filter,
    or a rule for cells this suite does not run): no round decides it, and ``twice gate``
    fails it, so the sequential verdict fails it too."""
    from twice.tasks import load_prompt

    keys = [replace(c, prompt=load_prompt(c.prompt).name).as_dict() for c in suite.cells()]
    out = []
    for rule in gate.rules:
        if not any(rule.matches(k) for k in keys):
            want = ", ".join(f"{axis}={list(p)}" for axis, p in rule.filters.items())
            have = "; ".join(
                f"{axis}: {', '.join(sorted({k[axis] for k in keys}))}" for axis in rule.filters
            )
            out.append(f"rule {rule.name!r}: no cell matches {want}; the suite has {have}")
    return out


def load_decision_gate(gate_path: Path) -> GateConfig:
    """The gate of ``--until-decided`` (read before anything else, as bad usage).

    Raises:
        GateError: for a bad gate file or one with no rules to decide.
    """
    from ..gate import GateError, load_gate

    gate = load_gate(gate_path)
    if not gate.rules:
        raise GateError(f"{gate_path} has no [[rule]] blocks: nothing to decide")
    return gate


def run_sequential_cli(
    suite: Suite,
    gate: GateConfig,
    gate_path: Path,
    log_dir: Path,
    *,
    batch: int | None,
    max_trials: int | None,
    **run_args: Any,
) -> RunResult:
    """``twice run --until-decided``: run, print the table, each cell's decision and the
    gate's verdict; the caller (``twice run``) prints the errors and exits as for any run.

    ``run_args`` go to :func:`run_until_decided` (model args, max connections, display,
    report, max retries, timeout, generate config).

    Raises:
        SuiteError: as :func:`run_until_decided`.
    """
    import click

    cap = max_trials or DEFAULT_MAX_TRIALS
    n_cells = len(suite.cells())
    click.echo(
        f"twice: running {n_cells} cell(s) until {gate_path} decides them (at most {cap} "
        f"trials a cell), logs in {log_dir}",
        err=True,
    )
    result, states = run_until_decided(
        suite,
        log_dir,
        gate,
        gate_path=str(gate_path),
        batch=batch,
        max_trials=cap,
        progress=lambda line: click.echo(f"twice: {line}", err=True),
        **run_args,
    )
    click.echo(format_table(result.table))
    click.echo("")
    click.echo(format_decisions(states, cap))
    if result.missing:
        click.echo(
            f"gate not decided: {len(result.missing)} cell(s) not settled (rerun the same "
            "command to resume)"
        )
    elif result.failed:
        # Errored trials are left out of the rates, as twice gate would refuse to: no verdict.
        click.echo(
            f"gate not decided: the run failed ({len(result.failed)} problem(s) below); "
            "twice gate refuses a run with errored trials (rerun the same command to run "
            "them again)"
        )
    else:
        unmatched = unmatched_rules(gate, suite)
        for line in unmatched:
            click.echo(f"FAIL {line}")
        passed = not unmatched and all(st.status in NOT_FAILING for st in states)
        verdict = "passed" if passed else "FAILED"
        click.echo(f"gate {verdict} (check again: twice gate {log_dir} --config {gate_path})")
    click.echo(f"\nsummary: {result.summary_path}")
    if result.report_path:
        click.echo(f"report:  {result.report_path}")
    return result
