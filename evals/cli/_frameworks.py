"""``twice frameworks``: run the framework analysis (every registry row × the stub controls ×
the faults × the tasks), then write its page and report."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ._common import LOCATION, another_signal_exits, default_display

DEFAULT_LOG_DIR = "logs/frameworks"


@click.command()
@click.option(
    "--row",
    "rows",
    multiple=True,
    help="A row of the frameworks registry to run (repeatable; its file's stem). Default: "
    "every row; rows measured earlier in the same --log-dir stay on the page.",
)
@click.option(
    "--epochs", type=click.IntRange(min=1), default=1, show_default=True, help="Epochs per sample."
)
@click.option("--limit", type=click.IntRange(min=1), help="Samples per task (first N).")
@click.option(
    "--log-dir",
    type=LOCATION,
    default=DEFAULT_LOG_DIR,
    show_default=True,
    help="Where each row's logs go (LOG_DIR/ROW/), with the page and the report; rerun with "
    "the same directory to resume.",
)
@click.option(
    "--page",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the page here (make frameworks: docs/frameworks.md).",
)
@click.option(
    "--display",
    type=click.Choice(["full", "rich", "plain", "log", "none"]),
    help="Inspect's progress display. Default: as twice run.",
)
@click.option("--no-report", is_flag=True, help="Skip the HTML reports.")
@click.option(
    "--registry",
    type=click.Path(file_okay=False, path_type=Path),
    help="A folder of registry rows (*.toml) to run instead of twice's own "
    "(tasks/agents/frameworks/).",
)
@click.option(
    "--hang-seconds",
    type=float,
    help="Seconds an agent command row's trials hold a lost reply (lost_reply, "
    "timeout_before_commit) open before closing the connection (default 120, at most 600); "
    "the agent's own, shorter timeout is what should end the wait.",
)
@click.option(
    "--max-agent-cmds",
    type=click.IntRange(min=1),
    help="How many of an agent command row's commands run at once (default: one per usable "
    "CPU). Its trials mostly wait on lost replies, so more keep the cores busy.",
)
def frameworks(
    rows: tuple[str, ...],
    epochs: int,
    limit: int | None,
    log_dir: str,
    page: Path | None,
    display: str | None,
    no_report: bool,
    registry: Path | None,
    hang_seconds: float | None,
    max_agent_cmds: int | None,
) -> None:
    """Which agent frameworks do it twice: run every framework row under the stub controls.

    Each installed row of tasks/agents/frameworks/*.toml runs as a suite (stub/retry,
    stub/no-retry, stub/verify × lost_reply, reset_after_commit, timeout_before_commit,
    error_after_commit, rate_limited × refund, send_email) into LOG_DIR/ROW/. A row whose
    agent is not installed is listed with how to install it. Then LOG_DIR/frameworks.md (the
    page: a finding per row) and LOG_DIR/report.html (every row's trials) are written.
    """
    from dataclasses import replace

    from ..frameworks import FrameworksPlan, run_frameworks

    plan = FrameworksPlan(
        log_dir=log_dir, rows=rows, epochs=epochs, limit=limit, page=page,
        display=display or default_display(), report=not no_report, hang_seconds=hang_seconds,
        max_agent_cmds=max_agent_cmds,
    )  # fmt: skip
    if registry is not None:
        plan = replace(plan, registry=registry)
    result = run_frameworks(plan, say=lambda line: click.echo(line, err=True))
    if result.interrupted is not None:
        click.echo(
            f"twice: interrupted by {result.interrupted.interrupted}; rerun the same command "
            "to resume",
            err=True,
        )
        another_signal_exits(result.exit_code)
        sys.exit(result.exit_code)
    for name, ran in result.ran.items():
        trials = len(ran.trials)
        reused = f", {ran.reused} cell(s) reused" if ran.reused else ""
        click.echo(f"{name}: {trials} trial(s){reused}, {ran.log_dir}")
        for line in ran.failed:
            click.echo(f"error: {name}: {line}", err=True)
        if ran.missing:
            click.echo(
                f"twice: {name}: {len(ran.missing)} cell(s) did not finish; rerun the same "
                "command to resume",
                err=True,
            )
    for status in result.not_installed:
        click.echo(f"{status.row.row}: not installed: {status.missing}")
    for where in result.page_paths:
        click.echo(f"page:    {where}")
    if result.report_path is not None:
        click.echo(f"report:  {result.report_path}")
    sys.exit(result.exit_code)
