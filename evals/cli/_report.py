"""``twice report LOG_DIR``: rebuild the HTML report (and the merged summary of shards)."""

from __future__ import annotations

from typing import Any

import click

from ._common import LOCATION, SHOWN_PROBLEMS, check_writable_output, read_trials, say_uncounted


@click.command()
@click.argument("log_dir", type=LOCATION)
@click.option(
    "-o",
    "--output",
    type=LOCATION,
    help="Where to write the HTML (path or URI). Default: LOG_DIR/report.html.",
)
@click.option(
    "--baseline",
    "baseline_dir",
    type=LOCATION,
    help="Compare against these logs (path or URI).",
)
def report(log_dir: str, output: str | None, baseline_dir: str | None) -> None:
    """Write the HTML report for LOG_DIR (replaces the file only once it is rendered)."""
    from twice.reports import is_remote, join, write_report

    from ..run import write_atomic
    from ..scale import read_run

    logs, frame = read_trials(log_dir, "LOG_DIR")
    say_uncounted(log_dir, logs.uncounted_cells(), "its last run did not plan")
    for line in logs.missing[:SHOWN_PROBLEMS]:  # the report shows what there is; say what not
        click.echo(f"warning: {line}", err=True)
    if logs.missing:
        click.echo(
            f"warning: {len(logs.missing)} planned log(s) missing: the report covers part of "
            "the run (twice gate refuses it); rerun `twice run` with the same --log-dir",
            err=True,
        )
    extra: dict[str, Any] = {"status": _run_status(log_dir, logs)}
    if baseline_dir is not None:
        extra["baseline"] = read_trials(baseline_dir, "--baseline", write=False)[1]
    # The run record: the merged one when LOG_DIR holds shards (just written), else the run's.
    run = read_run(log_dir, warn=lambda m: click.echo(f"warning: {m}", err=True))
    out = output or str(join(log_dir, "report.html"))
    if not is_remote(out):
        check_writable_output(out, "-o")
    # Render to a temporary file, then replace the target whole (a rename beside it, or one
    # upload to object storage): a failure never leaves a half-written report or deletes the
    # previous one.
    try:
        write_atomic(out, lambda tmp: write_report(frame, tmp, run=run, **extra))
    except OSError as ex:
        raise click.BadParameter(
            f"cannot write {str(out)!r}: {ex.strerror or ex}", param_hint="-o"
        ) from None
    click.echo(f"report: {out}")


def _run_status(log_dir: str, logs: Any) -> dict[str, Any]:
    """The run's state for the report: ``summary.json``'s (merged shards' included), and any
    planned log missing from the directory."""
    from twice.reports import read_summary

    status = read_summary(log_dir)  # the report reads only its state keys
    if logs.missing and not status.get("missing"):  # the cells, if named, say it already
        status["missing_logs"] = list(logs.missing)
    return status
