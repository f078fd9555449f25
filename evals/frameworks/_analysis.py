"""The framework analysis: every registry row × the stub controls × the faults × the tasks.

Each installed row is one suite run by :func:`twice.evals.run.run_suite` into
``LOG_DIR/<row>/`` (its own logs, ``summary.json`` and ``report.html``; a rerun resumes it),
so a row can be run again alone (``--row``) without touching the others. The page is built
from every row's ``summary.json`` found under ``LOG_DIR``, and one report from every row's
logs, each row named as its registry file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from twice.mocks import RunError
from twice.reports import Location, as_location, is_file, join, read_text, write_text
from twice.tasks.agents import COMMANDS_DIR, FRAMEWORKS_DIR, FrameworkRow, load_frameworks

from ..run import RunResult, run_suite
from ..suite import Matrix, Suite, SuiteError
from ._installed import RowStatus, row_status
from ._page import PageSettings, RowMeasure, frameworks_page, summary_cells

CONTROLS = ("stub/retry", "stub/no-retry", "stub/verify")
"""The control models: one retries a failed call, one never does, one looks first."""
FAULTS = (
    "lost_reply",
    "reset_after_commit",
    "timeout_before_commit",
    "error_after_commit",
    "rate_limited",
)
TASKS = ("refund", "send_email")
PAGE = "frameworks.md"
"""The page's name in the log directory (``--page`` writes it elsewhere too)."""


@dataclass(frozen=True)
class FrameworksPlan:
    """What ``twice frameworks`` runs, parsed once from its flags."""

    log_dir: str
    rows: tuple[str, ...] = ()
    """Rows to run (``--row``); empty: every row of the registry."""
    epochs: int = 1
    limit: int | None = None
    page: Path | None = None
    """Where the page is also written (``docs/frameworks.md`` from ``make frameworks``)."""
    registry: Path = FRAMEWORKS_DIR
    """The registry's folder (``--registry``)."""
    commands: Path = COMMANDS_DIR
    """The agent commands' folders (``{dir}`` in a command row)."""
    models: tuple[str, ...] = CONTROLS
    faults: tuple[str, ...] = FAULTS
    tasks: tuple[str, ...] = TASKS
    display: str = "none"
    report: bool = True
    hang_seconds: float | None = None
    """Seconds a command row's trials hold a lost reply open (``--hang-seconds``); None: the
    suite's default. An agent whose own timeout is shorter sees its timeout first."""
    max_agent_cmds: int | None = None
    """How many of a command row's agent commands run at once (``--max-agent-cmds``); None:
    one per usable CPU."""


@dataclass
class FrameworksResult:
    """What the analysis did."""

    ran: dict[str, RunResult] = field(default_factory=dict)
    """Each row run now, by row name."""
    not_installed: list[RowStatus] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    """Rows on the page (run now or earlier into the same log directory)."""
    page_paths: list[Location] = field(default_factory=list)
    report_path: Location | None = None
    interrupted: RunResult | None = None

    @property
    def exit_code(self) -> int:
        """0 when every row run finished, 1 when one failed, 130/143 when interrupted."""
        if self.interrupted is not None:
            return self.interrupted.exit_code
        return max((r.exit_code for r in self.ran.values()), default=0)


def select_rows(registry: Sequence[FrameworkRow], names: Sequence[str]) -> list[FrameworkRow]:
    """The registry's rows named by ``--row`` (all of them when none is named).

    Raises:
        SuiteError: for a name that is no row of the registry.
    """
    by_name = {r.row: r for r in registry}
    for name in names:
        if name not in by_name:
            raise SuiteError(f"unknown --row {name!r}; expected one of: {', '.join(by_name)}")
    return [by_name[n] for n in dict.fromkeys(names)] if names else list(registry)


def row_suite(status: RowStatus, plan: FrameworksPlan) -> Suite:
    """The suite of one installed row: the controls × the faults × the tasks."""
    row = status.row
    agents = ("react",) if status.command is not None else (row.agent or "react",)
    matrix = Matrix(models=plan.models, agents=agents, tasks=plan.tasks, faults=plan.faults)
    suite = Suite(
        matrices=(matrix,), epochs=plan.epochs, limit=plan.limit,
        source=f"frameworks row {row.path}", agent_cmd=status.command,
    )  # fmt: skip
    if status.command is not None:  # settings of agent commands only
        if plan.hang_seconds is not None:
            suite = replace(suite, hang_seconds=plan.hang_seconds)
        if plan.max_agent_cmds is not None:
            suite = replace(suite, max_agent_cmds=plan.max_agent_cmds)
    suite.validate()
    return suite


def run_frameworks(
    plan: FrameworksPlan, say: Callable[[str], None] = lambda line: None
) -> FrameworksResult:
    """Run the analysis: each selected, installed row into ``LOG_DIR/<row>/``, then the page
    and the report over every row measured in ``LOG_DIR``.

    Raises:
        FrameworkRowError: for a bad registry file.
        SuiteError: for an unknown ``--row`` or a row whose suite cannot run.
        RunError: when the page cannot be written.
    """
    registry = load_frameworks(plan.registry)
    selected = select_rows(registry, plan.rows)
    statuses = {r.row: row_status(r, plan.commands) for r in registry}
    suites = {
        r.row: row_suite(statuses[r.row], plan) for r in selected if statuses[r.row].installed
    }  # every suite checked before the first row runs
    result = FrameworksResult()
    for row in selected:
        status = statuses[row.row]
        if not status.installed:
            say(f"twice frameworks: {row.row}: not installed: {status.missing}")
            continue
        out = join(as_location(plan.log_dir), row.row)
        say(f"twice frameworks: {row.row}: {len(suites[row.row].cells())} cell(s) into {out}")
        ran = run_suite(suites[row.row], out, display=plan.display, report=plan.report)
        result.ran[row.row] = ran
        if ran.interrupted:
            result.interrupted = ran
            return result
    measures = []
    for row in registry:
        summary = _summary(plan.log_dir, row.row)
        if summary is not None:
            measures.append(
                RowMeasure(
                    row, statuses[row.row].versions, summary_cells(summary),
                    complete=bool(summary.get("complete", True)),
                )
            )  # fmt: skip
    result.measured = [m.row.row for m in measures]
    result.not_installed = [
        statuses[r.row]
        for r in registry
        if not statuses[r.row].installed and r.row not in result.measured
    ]
    page = frameworks_page(
        measures,
        [(s.row, s.missing or "") for s in result.not_installed],
        _settings(plan, measures),
    )
    for where in (join(as_location(plan.log_dir), PAGE), plan.page):
        if where is not None:
            try:
                write_text(as_location(where), page)
            except OSError as ex:
                raise RunError(
                    f"cannot write the page to {where}: {ex.strerror or ex}; the rows' logs "
                    "are kept, and the same command writes it without running them again"
                ) from None
            result.page_paths.append(as_location(where))
    if plan.report and measures:
        result.report_path = _write_report(plan.log_dir, result.measured)
    return result


def _summary(log_dir: str, row: str) -> dict[str, Any] | None:
    path = join(as_location(log_dir), row, "summary.json")
    if not is_file(path):
        return None
    data = json.loads(read_text(path))
    return data if isinstance(data, dict) else None


def _settings(plan: FrameworksPlan, measures: Sequence[RowMeasure]) -> PageSettings:
    """The page's settings: the runs' own (from their summaries), else the plan's."""
    runs = [_summary(plan.log_dir, m.row.row) or {} for m in measures]
    run = next((r.get("run") for r in runs if isinstance(r.get("run"), dict)), None) or {}
    versions = run.get("versions") if isinstance(run.get("versions"), dict) else {}
    limits = {r["run"].get("limit") for r in runs if isinstance(r.get("run"), dict)}
    return PageSettings(
        models=plan.models,
        faults=plan.faults,
        tasks=plan.tasks,
        epochs=int(run.get("epochs") or plan.epochs),
        limit=run.get("limit", plan.limit) if run else plan.limit,
        per_row=len(limits) > 1,
        versions={str(k): str(v) for k, v in (versions or {}).items()},
    )


def _write_report(log_dir: str, rows: Sequence[str]) -> Location:
    """One report over every measured row's logs, each row's trials named by its row (a
    command row's cells are named by its command line, which differs by checkout)."""
    from twice.reports import trials_frame, write_report

    frames = []
    for row in rows:
        frame = trials_frame(join(as_location(log_dir), row))
        frames.append(frame.assign(agent=row))
    out = join(as_location(log_dir), "report.html")
    write_report(pd.concat(frames, ignore_index=True), out)
    return out
