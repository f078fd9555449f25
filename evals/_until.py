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

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from inspect_ai import Task, eval_set, task_with
from inspect_ai.log import EvalLog
from twice.reports import (
    CELL,
    LogReadError,
    cells,
    check_log_dir,
    read_log_dir,
    trials_frame,
    write_summary,
)

from ._gate import GateConfig, cell_label
from ._run import (
    RunResult,
    _failures,
    build_tasks,
    eval_options,
    gc_for_trials,
    run_metadata,
)
from ._seqgate import RuleState, rule_state
from ._sequential import METHOD
from ._suite import Suite, SuiteError

DEFAULT_MAX_TRIALS = 480
"""Trials per cell at most (20 rounds of the refund task's 24 samples): enough to pass a cell
whose true rate is 1% against a 5% bound in about 97% of runs (``bench/``)."""


@dataclass
class CellState:
    """Where one cell stands."""

    keys: dict[str, str]
    samples: int
    epochs: int = 0
    """Epochs planned so far (the task's epoch count in the next ``eval_set``)."""
    trials: int = 0
    scored: int = 0
    rounds: int = 0
    status: str = "running"
    """``pass``/``fail`` once settled, ``undecided`` at the cap, ``running`` before."""
    stopped_round: int | None = None
    rules: dict[str, RuleState] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``model / prompt / task / fault / protection``."""
        return cell_label(self.keys)

    def record(self) -> dict[str, Any]:
        """This cell in summary.json's ``run.sequential.cells``."""
        return {
            **self.keys,
            "trials": self.trials,
            "rounds": self.rounds,
            "stopped_round": self.stopped_round,
            "verdict": self.status,
            "rules": {name: s.status for name, s in self.rules.items()},
        }


def sequential_record(log_dir: str | Path) -> dict[str, Any] | None:
    """The ``run.sequential`` record of a log directory's summary.json (None: a fixed run)."""
    path = Path(log_dir) / "summary.json"
    if not path.is_file():
        return None
    try:
        run = json.loads(path.read_text(encoding="utf-8")).get("run") or {}
    except (ValueError, AttributeError):
        return None
    seq = run.get("sequential") if isinstance(run, dict) else None
    return seq if isinstance(seq, dict) else None


def _key(task: Task, model: str) -> dict[str, str]:
    meta = (task.metadata or {}).get("twice", {})
    return {
        "model": model,
        "agent": str(meta.get("agent") or "react"),
        "prompt": str(meta.get("prompt", "?")),
        "task": str(meta.get("task") or task.name),
        "fault": str(meta.get("fault", "?")),
        "protection": str(meta.get("protection", "?")),
    }


def _samples(task: Task, limit: int | None) -> int:
    n = len(task.dataset)
    return min(n, limit) if limit else n


def _judge(state: CellState, rows: pd.DataFrame, gate: GateConfig) -> bool:
    """Check every rule on the cell's trials; True when the cell's verdict is settled: one
    rule has failed for good (the cell fails whatever the others do), or all are settled."""
    scored = rows[rows["completed"].notna()]
    errors = len(rows) - len(scored)
    excluded = f"; {errors} errored trial(s) excluded" if errors else ""
    state.rules = {
        r.name: rule_state(r, scored, gate.confidence, excluded)
        for r in gate.rules
        if r.matches(state.keys)
    }
    state.trials, state.scored = len(rows), len(scored)
    states = state.rules.values()
    return any(s.settled and s.status == "fail" for s in states) or all(s.settled for s in states)


def _settle(state: CellState, round_: int) -> None:
    state.stopped_round = round_
    state.status = "fail" if any(s.status == "fail" for s in state.rules.values()) else "pass"


def _replay(state: CellState, rows: pd.DataFrame, gate: GateConfig, per_round: int) -> None:
    """Resume: re-judge the cell at each complete round already in its logs, as the first run
    did, so a resumed run stops where an uninterrupted one would have."""
    done_epochs = int(rows["epoch"].max()) if len(rows) else 0
    for r in range(1, done_epochs // per_round + 1):
        upto = rows[rows["epoch"] <= r * per_round]
        if len(upto) < state.samples * r * per_round:
            break  # this round did not finish
        state.epochs, state.rounds = r * per_round, r
        if _judge(state, upto, gate):
            _settle(state, r)
            return


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
) -> tuple[RunResult, list[CellState]]:
    """Run ``suite`` in rounds until every cell's gate verdict is settled (or at the cap).

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

    Raises:
        SuiteError: as :func:`run_suite`, or for a ``max_trials`` below one round.
    """
    tasks = build_tasks(suite, model_args)
    models = [c.model for c in suite.cells()]
    try:
        check_log_dir(log_dir)
    except LogReadError as ex:
        raise SuiteError(f"cannot resume into {str(log_dir)!r}: {ex}") from None
    log_dir.mkdir(parents=True, exist_ok=True)
    states: list[CellState] = []
    per_round: list[int] = []
    for task, model in zip(tasks, models, strict=True):
        s = _samples(task, suite.limit)
        epochs = max(1, math.ceil((batch or s) / s)) if s else 1
        if s * epochs > max_trials:
            raise SuiteError(
                f"--max-trials {max_trials} is below one round of {s * epochs} trials of "
                f"{task.name} ({s} sample(s) × {epochs} epoch(s)); raise it or lower "
                "--batch/--limit"
            )
        states.append(CellState(_key(task, model), s))
        per_round.append(epochs)
    record: dict[str, Any] = {
        "method": METHOD,
        "confidence": gate.confidence,
        "alpha": round(1 - gate.confidence, 12),
        "gate": gate_path,
        "batch": batch,
        "max_trials": max_trials,
        "cells": [],
    }
    existing = _existing(log_dir)
    for st, epr in zip(states, per_round, strict=True):
        _replay(st, _rows(existing, st.keys), gate, epr)
        if st.stopped_round is None:
            st.epochs += epr  # the next round
    logs: list[EvalLog] = []
    frame = existing
    while True:
        for task, st in zip(tasks, states, strict=True):
            task_with(task, epochs=st.epochs)
        running = [st for st in states if st.stopped_round is None]
        progress(
            f"round: {len(running)} undecided cell(s) of {len(states)}, up to "
            f"{max((st.epochs * st.samples for st in running), default=0)} trials a cell"
        )
        with gc_for_trials():
            _, logs = eval_set(
                tasks,
                log_dir=str(log_dir),
                limit=suite.limit,
                max_connections=max_connections,
                display=display,  # type: ignore[arg-type]
                retry_attempts=retry_attempts,
                retry_wait=1,
                fail_on_error=False,
                log_dir_allow_dirty=True,
                **eval_options(display),
            )
            frame = trials_frame([log.location for log in logs])
        if any(log.status != "success" for log in logs):
            break  # an eval errored: report what ran, do not plan more rounds on top of it
        grew = False
        for st, epr in zip(states, per_round, strict=True):
            if st.stopped_round is not None:
                continue
            st.rounds = st.epochs // epr
            if _judge(st, _rows(frame, st.keys), gate):
                _settle(st, st.rounds)
            elif (st.epochs + epr) * st.samples > max_trials:
                st.status = "undecided"
                st.stopped_round = st.rounds
            else:
                st.epochs += epr
                grew = True
        record["cells"] = [st.record() for st in states]
        _write(frame, log_dir, suite, model_args, record)
        if not grew:
            break
    record["cells"] = [st.record() for st in states]
    table = cells(frame)
    run = {**run_metadata(suite, model_args), "sequential": record}
    run["epochs"] = None  # per cell: see sequential.cells
    summary_path = write_summary(table, log_dir / "summary.json", run=run)
    report_path = None
    if report:
        from twice.reports import write_report

        report_path = write_report(frame, log_dir / "report.html", run=run)
    result = RunResult(log_dir, logs, table, summary_path, report_path, _failures(logs, table))
    return result, states


def _existing(log_dir: Path) -> pd.DataFrame:
    """The trials already in ``log_dir`` (an empty frame for a fresh directory)."""
    try:
        files = read_log_dir(log_dir).files
        return trials_frame(files)
    except LogReadError:
        return trials_frame([])


def _rows(frame: pd.DataFrame, keys: Mapping[str, str]) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = pd.Series(True, index=frame.index)
    for k in CELL:
        mask &= frame[k].astype(str) == keys[k]
    return frame[mask]


def _write(
    frame: pd.DataFrame,
    log_dir: Path,
    suite: Suite,
    model_args: dict[str, Any] | None,
    record: dict[str, Any],
) -> None:
    # After every round, so an interrupted run's directory already says it is sequential.
    run = {**run_metadata(suite, model_args), "sequential": record, "epochs": None}
    write_summary(cells(frame), log_dir / "summary.json", run=run)


def format_decisions(states: list[CellState], max_trials: int) -> str:
    """Per cell: the verdict, the round it stopped at and the trials it used."""
    lines = []
    total = 0
    for st in states:
        total += st.trials
        when = f"after round {st.stopped_round}" if st.stopped_round else "not run"
        verdict = {
            "pass": "PASS (settled)",
            "fail": "FAIL (settled)",
            "undecided": f"UNDECIDED at the {max_trials}-trial cap (the gate fails it)",
            "running": "stopped early (an eval errored)",
        }[st.status]
        if not st.rules and st.status == "pass":
            verdict = "NO RULE (1 round)"
        lines.append(f"{verdict:<20} {st.label}: {when}, {st.trials} trial(s)")
        for name, rs in st.rules.items():
            if rs.status == "fail" or st.status != "pass":
                lines.append(f"      {name!r}: {rs.message}")
    lines.append(f"{total} trial(s) in {len(states)} cell(s); {METHOD}")
    return "\n".join(lines)


def run_sequential_cli(
    gate_path: Path,
    *,
    batch: int | None,
    max_trials: int | None,
    suite_flags: dict[str, Any],
    log_dir: Path,
    model_args: dict[str, Any],
    max_connections: int | None,
    display: str,
    report: bool,
) -> None:
    """``twice run --until-decided``: run, print the table and each cell's decision, exit.

    Exits as ``twice run`` does (0 when every planned trial ran, 1 when an eval errored);
    the gate's verdict is printed, and ``twice gate`` on the directory repeats it.

    Raises:
        click.UsageError: for a bad gate file or suite (through :class:`SuiteError`).
    """
    import sys

    import click

    from ._gate import GateError, load_gate
    from ._run import format_table
    from ._suite import suite_from_flags

    try:
        gate = load_gate(gate_path)
    except GateError as ex:
        raise click.UsageError(str(ex)) from None
    if not gate.rules:
        raise click.UsageError(f"{gate_path} has no [[rule]] blocks: nothing to decide")
    suite = suite_from_flags(**suite_flags)
    cap = max_trials or DEFAULT_MAX_TRIALS
    n_cells = sum(1 for _ in suite.cells())
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
        model_args=model_args,
        max_connections=max_connections,
        display=display,
        report=report,
        progress=lambda line: click.echo(f"twice: {line}", err=True),
    )
    click.echo(format_table(result.table))
    click.echo("")
    click.echo(format_decisions(states, cap))
    verdict = "passed" if all(st.status == "pass" for st in states) else "FAILED"
    click.echo(f"gate {verdict} (check again: twice gate {log_dir} --config {gate_path})")
    click.echo(f"\nsummary: {result.summary_path}")
    if result.report_path:
        click.echo(f"report:  {result.report_path}")
    if not result.ok:
        for line in result.failed:
            click.echo(f"error: {line}", err=True)
        sys.exit(1)
