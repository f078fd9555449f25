"""``twice gate LOG_DIR``: the release decision, exit 0 pass or 1 fail, JUnit XML for CI."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click
from twice.mocks import UsageError

from ._common import LOCATION, check_writable_output, echo_some, errored_lines, read_trials


@click.command()
@click.argument("log_dir", type=LOCATION)
@click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Gate TOML file (rules, [baseline]).",
)
@click.option(
    "--baseline",
    "baseline_dir",
    type=LOCATION,
    help="Fail when a rate is significantly worse than in these logs (path or URI).",
)
@click.option(
    "--junit",
    type=LOCATION,
    help="Write JUnit XML here (a path or URI; one test case per rule × cell).",
)
@click.option(
    "--allow-errors",
    is_flag=True,
    help="Gate on the scored trials even if some evals or trials errored.",
)
def gate(
    log_dir: str,
    config: Path,
    baseline_dir: str | None,
    junit: str | None,
    allow_errors: bool,
) -> None:
    """Decide a release from the rates in LOG_DIR.

    Exits 0 when every rule passes, 1 when one fails, 2 on bad usage or when the logs are
    unreadable or hold errored evals/trials (unless --allow-errors).
    """
    from twice.reports import is_remote

    from ..gate import GateError, evaluate_gate, format_gate, load_gate, write_junit

    if junit is not None and not is_remote(junit):
        check_writable_output(junit, "--junit")
    cfg = load_gate(config)
    if not cfg.rules and baseline_dir is None:
        raise GateError(
            f"{config} has no [[rule]] blocks and no --baseline was given: nothing to check"
        )
    logs, frame = read_trials(log_dir, "LOG_DIR")
    base_frame = None
    problems = errored_lines(logs, frame)
    if baseline_dir is not None:
        base_logs, base_frame = read_trials(baseline_dir, "--baseline", write=False)
        problems += [f"baseline: {p}" for p in errored_lines(base_logs, base_frame)]
    if problems and allow_errors:
        echo_some(problems, "excluded")
        click.echo(
            f"twice gate: --allow-errors: gating without {len(problems)} errored or missing "
            "log(s)/trial(s)/cell(s) listed above",
            err=True,
        )
    if problems and not allow_errors:
        echo_some(problems, "error")
        if junit:
            _write_junit(lambda: write_junit([], junit, errors=problems), junit)
        click.echo(
            f"twice gate: {len(problems)} errored log(s)/trial(s); a gate on partial results "
            "could pass by accident. Rerun `twice run` with the same --log-dir to resume, or "
            "pass --allow-errors to gate on the scored trials.",
            err=True,
        )
        sys.exit(2)
    from ..run import sequential_record

    sequential = sequential_record(log_dir, logs)
    result = evaluate_gate(frame, cfg, baseline=base_frame, sequential=sequential)
    skipped = f", {len(logs.superseded)} superseded log(s) not counted" if logs.superseded else ""
    click.echo(
        f"twice gate: {log_dir} ({len(logs.files)} log(s), {len(frame)} trial(s){skipped}) "
        f"against {config}"
    )
    click.echo(format_gate(result))
    if junit:
        suite = "twice gate (sequential: anytime-valid bounds)" if sequential else "twice gate"
        _write_junit(lambda: write_junit(result.checks, junit, suite=suite), junit)
        click.echo(f"junit:  {junit}")
    sys.exit(0 if result.passed else 1)


def _write_junit(write: Callable[[], object], junit: str) -> None:
    """Write the JUnit file (a path that passed the up-front check can still fail: a full
    disk, a file-size limit, a /sys path as root).

    Raises:
        UsageError: naming the file and why it cannot be written.
    """
    try:
        write()
    except OSError as ex:
        raise UsageError(f"cannot write --junit {junit!r}: {ex.strerror or ex}") from None
