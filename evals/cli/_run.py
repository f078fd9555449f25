"""``twice run``: parse the flags into a suite and run settings, run them (one process,
``--workers``, or rounds until decided), print the table and what went wrong."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from twice.reports import MAX_SHARDS

from ..run import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, EXIT_INTERRUPTED
from ..suite import DEFAULT_OUTAGE_WINDOW, SuiteError, suite_from_flags
from ._common import (
    LOCATION,
    another_signal_exits,
    default_display,
    one_agent_cmd,
    parse_model_args,
    say_uncounted,
)

WORKERS_PER_CPU = 8
"""``--workers`` per usable CPU at most: a worker mostly waits on its model calls, so a few
per CPU can pay; thousands of interpreters (0.2 GB each) only exhaust memory."""


def max_workers() -> int:
    """The most ``--workers`` this machine takes (a resume may still give the split its log
    directory already has)."""
    from ..scale import usable_cpus

    return WORKERS_PER_CPU * usable_cpus()


def _existing_split(log_dir: str) -> int | None:
    from twice.reports import LogReadError, run_split

    try:
        return run_split(log_dir)
    except LogReadError as ex:
        raise SuiteError(f"cannot resume into {log_dir!r}: {ex}") from None


def _split_conflict(log_dir: str, split: int, asked: int) -> str:
    """Why a run split ``asked`` ways cannot go into a directory already split ``split`` ways:
    each layout's logs are invisible to the other (``twice.reports.read_log_dir``)."""
    held = (
        "a one-process run"
        if split == 1
        else f"a run split into {split} shards (shard-i-of-{split})"
    )
    ways = "one process" if asked == 1 else f"{asked} shards"
    fix = "--workers 1" if split == 1 else f"--workers {split} (or --shard i/{split})"
    return (
        f"log directory {log_dir!r} holds {held}; this run would be split into {ways}, and "
        f"neither split counts the other's logs: resume it with {fix}, or pass another --log-dir"
    )


@click.command()
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Inspect model string (repeatable). Default: every stub model.",
)
@click.option(
    "--prompt", "prompts", multiple=True, help="Built-in prompt name or prompt file (repeatable)."
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    help="Task name, or a task of your own as path/to/file.py:function (repeatable). "
    "Default: every built-in task.",
)
@click.option("--fault", "faults", multiple=True, help="Fault name (repeatable).")
@click.option("--protection", "protections", multiple=True, help="Protection name (repeatable).")
@click.option(
    "--config", type=click.Path(dir_okay=False), help="Suite TOML file; flags replace its axes."
)
@click.option("--epochs", type=click.IntRange(min=1), help="Epochs per sample.")
@click.option("--limit", type=click.IntRange(min=1), help="Samples per task (first N).")
@click.option(
    "--log-dir",
    type=LOCATION,
    help="Where logs, summary.json and report.html go (a path or an fsspec URI such as "
    "s3://bucket/run); rerun with the same directory to resume.",
)
@click.option(
    "-M",
    "model_arg",
    multiple=True,
    metavar="KEY=VALUE",
    help="Provider model argument (repeatable); API keys come from the environment, not -M.",
)
@click.option("--max-connections", type=click.IntRange(min=1), help="Concurrent model connections.")
@click.option(
    "--display",
    type=click.Choice(["full", "rich", "plain", "log", "none"]),
    help="Inspect's progress display. Default: $INSPECT_DISPLAY, else rich on a terminal, "
    "plain in CI or a pipe.",
)
@click.option(
    "--timeout",
    type=click.IntRange(min=1),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds one attempt of a model call may take; a failed attempt is retried with "
    "backoff (honouring Retry-After).",
)
@click.option(
    "--max-retries",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_RETRIES,
    show_default=True,
    help="Retries of one model call while its endpoint has never answered: then the endpoint "
    "counts as unreachable and the run ends with exit 1 (once it has answered, "
    "--outage-window bounds the retries).",
)
@click.option(
    "--outage-window",
    type=click.IntRange(min=1),
    metavar="SECONDS",
    help=f"Seconds a model endpoint may fail every call (5xx, 529, 429, refused connections) "
    f"before it counts as unreachable: the run then ends with exit 1 and the same command "
    f"runs the trials left. Default: the suite's outage_window, else "
    f"{DEFAULT_OUTAGE_WINDOW}.",
)
@click.option("--no-report", is_flag=True, help="Skip report.html.")
# -- agents under test --------------------------------------------------------------------
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="Agent under test (repeatable): react (default: twice's own loop), openai-agents, "
    "langgraph, langgraph-retry, pydantic-ai, path/to/agent.py:function or module:function.",
)
@click.option(
    "--mock",
    "mocks",
    multiple=True,
    metavar="SERVICE=URL",
    help="Serve an agent's requests to its production URL from the trial's SERVICE "
    "(repeatable), e.g. --mock payments=https://api.example.com.",
)
# -- end agents ----------------------------------------------------------------------------
@click.option(
    "--shard",
    metavar="I/N",
    help=f"Run only shard I of N (a stable split of the cells; N at most {MAX_SHARDS}) into "
    "LOG_DIR/shard-I-of-N/; "
    "`twice report`/`gate` on LOG_DIR merge the shards.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Local processes, each running one shard, merged at the end. Default: one per usable "
    "CPU, with at least 8 cells each (1 for smaller suites).",
)
@click.option(
    "--until-decided",
    "until_decided",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="GATE.toml",
    help="Run each cell in rounds until this gate's verdict on it is settled (anytime-valid "
    "bounds); replaces --epochs.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    help="With --until-decided: trials per cell per round, rounded up to whole epochs "
    "(default: one epoch of the cell's samples).",
)
@click.option(
    "--max-trials",
    type=click.IntRange(min=1),
    help="With --until-decided: most trials a cell may use (default 480).",
)
@click.option(
    "--agent-cmd",
    multiple=True,
    callback=lambda ctx, param, value: one_agent_cmd(value),
    help="Run this shell command as the agent of every trial, against a twice serve of the run: "
    "it gets TWICE_<SERVICE>_URL, TWICE_INPUT, TWICE_SYSTEM_PROMPT and OPENAI_BASE_URL / "
    "OPENAI_API_KEY for the eval's model (model name 'inspect').",
)
@click.option(
    "--agent-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds an agent under test (--agent, --agent-cmd) may run in one trial (default "
    "600): then it is stopped (an --agent-cmd command with every process it started) and the "
    "trial counts as crashed.",
)
@click.option(
    "--hang-seconds",
    type=float,
    help="With --agent-cmd: seconds a trial holds a lost reply (lost_reply, "
    "timeout_before_commit) open before closing the connection (default 120, at most 600). "
    "The agent's own, shorter timeout is what should end the wait.",
)
def run(
    models: tuple[str, ...],
    prompts: tuple[str, ...],
    tasks: tuple[str, ...],
    faults: tuple[str, ...],
    protections: tuple[str, ...],
    config: str | None,
    epochs: int | None,
    limit: int | None,
    log_dir: str | None,
    model_arg: tuple[str, ...],
    max_connections: int | None,
    display: str | None,
    timeout: int,
    max_retries: int,
    no_report: bool,
    outage_window: int | None,
    shard: str | None,
    workers: int | None,
    until_decided: Path | None,
    batch: int | None,
    max_trials: int | None,
    agent_cmd: str | None,
    agent_timeout: float | None = None,
    hang_seconds: float | None = None,
    agents: tuple[str, ...] = (),
    mocks: tuple[str, ...] = (),
) -> None:
    """Run the suite: models × prompts × tasks × faults × protections × epochs.

    With no flags, runs the default offline suite of stub models.
    """
    from twice.reports import LogReadError, StorageError
    from twice.tasks import scrub

    from ..run import (
        ERRORED_IN,
        LAST_INTERRUPT,
        RunOutputError,
        default_log_dir,
        format_table,
        run_suite,
    )
    from ..scale import WorkerPlan, default_workers, run_parallel, usable_cpus
    from ..suite import parse_shard, shard_cells

    rerun = "rerun the same command"
    if until_decided is None and (batch is not None or max_trials is not None):
        raise click.UsageError("--batch and --max-trials only apply with --until-decided GATE.toml")
    if until_decided is not None and agent_cmd is not None:
        raise click.UsageError("--agent-cmd does not combine with --until-decided (yet)")
    if until_decided is not None and epochs is not None:
        raise click.UsageError(
            "--epochs and --until-decided exclude each other: the rounds decide the epochs"
        )
    if until_decided is not None and (shard or (workers or 1) > 1):
        raise click.UsageError(
            "--until-decided runs in one process: drop --shard/--workers (the rounds need "
            "every cell's verdict)"
        )
    if until_decided is not None and log_dir and "://" in log_dir:
        raise click.UsageError(f"--until-decided needs a local --log-dir, not {log_dir!r}")
    parsed_model_args = parse_model_args(model_arg)  # bad -M values before anything else
    try:
        gate = None
        if until_decided is not None:
            from ..run import load_decision_gate

            gate = load_decision_gate(until_decided)  # a bad gate file before the suite
        suite = suite_from_flags(
            config=config,
            models=models,
            prompts=prompts,
            tasks=tasks,
            faults=faults,
            protections=protections,
            epochs=epochs,
            limit=limit,
            agent_cmd=agent_cmd,
            agent_timeout=agent_timeout,
            hang_seconds=hang_seconds,
            agents=agents,
            mocks=_mocks(mocks),
            outage_window=outage_window,
        )
        part = parse_shard(shard) if shard is not None else None  # "": an unset $VAR
        if part and workers and workers > 1:
            raise SuiteError("--shard runs one shard in this process: drop --workers")
        out = log_dir or str(default_log_dir())
        n_cells = len(suite.cells())
        local = suite.local_model
        default = 1 if part or local or gate is not None else default_workers(n_cells)
        n_workers = min(workers or default, n_cells)
        split = _existing_split(out)
        at_once = None
        if split is not None and part is None and workers is None and not (local or gate):
            # A rerun resumes split as the run already in the directory (a cluster's, maybe,
            # split 20 ways), running no more shards at a time than this machine has CPUs.
            n_workers, at_once = split, min(split, usable_cpus())
        if workers is not None and workers != split and workers > max_workers():
            raise click.BadParameter(
                f"{workers} is not in the range 1-{max_workers()}: at most "
                f"{WORKERS_PER_CPU} per usable CPU ({usable_cpus()} here); each worker is a "
                "Python process with inspect loaded, and more only queue for the same CPUs",
                param_hint="--workers",
            )
        asked = part.count if part else n_workers
        if split is not None and asked != split:
            raise SuiteError(_split_conflict(out, split, asked))
        if local is not None and n_workers > 1:
            raise SuiteError(
                "a suite with a [local_model] runs in one process (one model server): "
                "drop --workers or set it to 1"
            )
        # Without --log-dir each run gets a new directory: the same command would start over.
        rerun = "rerun the same command" if log_dir else f"rerun it with --log-dir {out}"
        shown = display or default_display()  # the display this run uses
        where = f", shard {part}" if part else f", {n_workers} workers" if n_workers > 1 else ""
        if at_once is not None and at_once < n_workers:
            where = f", {n_workers} shards {at_once} at a time"
        # A shard's counts are out of its own cells, not the suite's.
        mine = len(shard_cells(list(suite.cells()), part)) if part else n_cells
        if gate is None:  # a sequential run announces itself, naming its gate
            shown_cells = f"{mine} of {n_cells}" if part else f"{n_cells}"
            click.echo(f"twice: running {shown_cells} cell(s){where}, logs in {out}", err=True)
        if n_workers > 1:
            # Each worker is given the parsed suite and settings, and runs its share.
            plan = WorkerPlan(
                suite, out, model_args=parsed_model_args, max_connections=max_connections,
                # a worker's stdout is discarded: only "log" (to stderr, whose tail shows
                # when a worker fails) is worth a worker's time
                display="log" if shown == "log" else "none",
                timeout=timeout, max_retries=max_retries,
            )  # fmt: skip
            result = run_parallel(plan, n_workers, report=not no_report, at_once=at_once)
        else:
            # twice run and --until-decided alike: the suite's model server around the run,
            # its generate settings and the same bounds on every model call.
            run_args: dict[str, Any] = {
                "model_args": parsed_model_args,
                "max_connections": max_connections,
                "display": shown,
                "report": not no_report,
                "generate_config": local.generate_config() if local else None,
                "timeout": timeout,
                "max_retries": max_retries,
            }
            with _local_server(local) as server:
                if gate is not None and until_decided is not None:
                    from ..run import run_sequential_cli

                    result = run_sequential_cli(
                        suite, gate, until_decided, Path(out), batch=batch,
                        max_trials=max_trials, **run_args,
                    )  # fmt: skip
                else:
                    result = run_suite(suite, out, shard=part, **run_args)
                if server is not None:
                    _server_end(server, result.failed)
    except SuiteError as ex:
        raise click.UsageError(scrub(str(ex))) from None
    except RunOutputError as ex:
        fix = (
            f"the logs and summary.json are written: make room (or raise the limit), then "
            f"`twice report {out}`"
            if ex.summary_written
            else f"the logs are kept and summary.json says incomplete: make room (or raise "
            f"the limit), then {rerun} to resume"
        )
        click.echo(f"error: {scrub(str(ex))}; {fix}", err=True)
        sys.exit(1)
    except LogReadError as ex:
        # A log that vanished or changed while the run read its logs back: another process
        # writing into the same directory (object storage has no lock), not a twice bug.
        # Object storage that failed (denied, expired credentials) says so on its own.
        hint = (
            ""
            if isinstance(ex, StorageError)
            else "; is another run writing into this log directory? Give each run its own --log-dir"
        )
        click.echo(f"error: {scrub(str(ex))}{hint}, then {rerun} to resume", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        # Stopped outside the trials (while loading or summarising): nothing to resume from
        # but the logs, which the same command picks up.
        name = LAST_INTERRUPT.signal or "SIGINT"
        click.echo(f"twice: interrupted by {name}; {rerun} to resume", err=True)
        sys.exit(EXIT_INTERRUPTED.get(name, 130))
    if result.interrupted:
        another_signal_exits(result.exit_code)
    if gate is None:  # a sequential run printed its table and decisions already
        if result.reused:
            ran = mine - result.reused
            click.echo(
                f"twice: resumed {out}: {result.reused} of {mine} cell(s) were already "
                f"finished and reused; {ran} new or unfinished cell(s) run",
                err=True,
            )
        say_uncounted(out, result.uncounted, "this run does not plan")
        click.echo(format_table(result.table))
        click.echo(f"\nsummary: {result.summary_path}")
        if result.report_path:
            click.echo(f"report:  {result.report_path}")
    for line in result.unreachable:
        click.echo(f"error: {line}", err=True)
    if result.unreachable and not result.trials.empty:
        left = int((result.trials["error"].fillna("") != "").sum())
        click.echo(
            f"twice: {left} trial(s) left (summary.json names them); once the endpoint "
            f"answers, {rerun} to run only those",
            err=True,
        )
    for line in result.failed:
        # An unreachable model's crashed trials are said by its one line above.
        if not (result.unreachable and ERRORED_IN in line):
            click.echo(f"error: {line}", err=True)
    if result.missing:
        shown = ", ".join(c.label for c in result.missing[:5])
        more = f" and {len(result.missing) - 5} more" if len(result.missing) > 5 else ""
        click.echo(
            f"twice: incomplete: {len(result.missing)} of {mine} cell(s) did not finish "
            f"({shown}{more}); summary.json is marked incomplete. {rerun.capitalize()} "
            "to resume.",
            err=True,
        )
    if result.interrupted:
        click.echo(f"twice: interrupted by {result.interrupted}", err=True)
    sys.exit(result.exit_code)


def _mocks(values: tuple[str, ...]) -> dict[str, str]:
    """``--mock SERVICE=URL`` values as a dict (a service named twice is bad usage)."""
    out: dict[str, str] = {}
    for item in values:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise click.BadParameter(
                f"{item!r} is not SERVICE=URL (e.g. payments=https://api.example.com)",
                param_hint="--mock",
            )
        if name in out:
            raise click.BadParameter(f"service {name!r} is given twice", param_hint="--mock")
        out[name] = url
    return out


@contextmanager
def _local_server(options: Any) -> Iterator[Any]:
    """The suite's local model server for the run (nothing when the suite has none)."""
    if options is None:
        yield None
        return
    from ..local_model import LocalModelError, local_model_server

    click.echo(f"twice: starting the local model server ({options.name})", err=True)
    try:
        with local_model_server(options) as server:
            click.echo(f"twice: local model server ready at {server.base_url}", err=True)
            from ..run import LAST_INTERRUPT

            # A run stopped at once (a second Ctrl-C) unwinds nothing: tell the server too.
            LAST_INTERRUPT.at_once.append(server.proc.terminate if server.proc else lambda: None)
            yield server
    except LocalModelError as ex:
        click.echo(f"error: {ex}", err=True)
        sys.exit(1)
    click.echo("twice: local model server stopped", err=True)


def _server_end(server: Any, failed: list[str]) -> None:
    """After the run: the server's parse counts, and a failure line if it died."""
    if not server.alive():
        failed.append(
            f"the local model server exited with code {server.returncode} during the run; "
            f"its last output: {server.output()[-300:].strip() or '(none)'}"
        )
        return
    stats = server.stats()
    if stats:
        shapes = ", ".join(f"{k} {v}" for k, v in stats.get("shapes", {}).items())
        click.echo(f"twice: local model replies: {stats.get('requests', 0)} ({shapes})", err=True)
