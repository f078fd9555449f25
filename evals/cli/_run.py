"""``twice run``: parse the flags into a suite and run settings, run them (one process,
``--workers``, or rounds until decided), print the table and what went wrong."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from twice.mocks import RunError
from twice.reports import MAX_SHARDS, Shard

from ..gate import GateConfig
from ..run import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, RunResult, check_models
from ..suite import DEFAULT_OUTAGE_WINDOW, Suite, SuiteError, suite_from_flags
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
    help="Agent under test (repeatable): react (default: twice's own loop), a built-in "
    "framework agent (twice list: openai-agents, langgraph, langgraph-retry, pydantic-ai, "
    "autogen, agno, google-adk, smolagents...), path/to/agent.py:function or module:function.",
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
    "it gets TWICE_<SERVICE>_URL, TWICE_INPUT, TWICE_SYSTEM_PROMPT, and OPENAI_BASE_URL / "
    "OPENAI_API_KEY and ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY for the eval's model (model "
    "name 'inspect').",
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
@click.option(
    "--max-agent-cmds",
    type=click.IntRange(min=1),
    help="With --agent-cmd: how many agent commands run at once (default: one per usable "
    "CPU, as inspect runs its subprocesses). An agent that mostly waits on a remote model can "
    "take more.",
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
    max_agent_cmds: int | None = None,
    agents: tuple[str, ...] = (),
    mocks: tuple[str, ...] = (),
) -> None:
    """Run the suite: models × prompts × tasks × faults × protections × epochs.

    With no flags, runs the default offline suite of stub models.
    """
    _check_until_decided(
        until_decided, batch, max_trials, agent_cmd, epochs, shard, workers, log_dir
    )
    settings: dict[str, Any] = {
        "model_args": parse_model_args(model_arg),  # bad -M values before anything else
        "max_connections": max_connections,
        "display": display or default_display(),
        "report": not no_report,
        "timeout": timeout,
        "max_retries": max_retries,
    }
    resume = _Resume(log_dir or "", "rerun the same command")
    with _run_failures(resume):
        gate = None
        if until_decided is not None:
            from ..run import load_decision_gate

            gate = (until_decided, load_decision_gate(until_decided))  # before the suite
        suite = suite_from_flags(
            config=config, models=models, prompts=prompts, tasks=tasks, faults=faults,
            protections=protections, epochs=epochs, limit=limit, agent_cmd=agent_cmd,
            agent_timeout=agent_timeout, hang_seconds=hang_seconds, agents=agents,
            mocks=_mocks(mocks), outage_window=outage_window, max_agent_cmds=max_agent_cmds,
        )  # fmt: skip
        check_models(suite.models(), settings["model_args"] or {})  # before any worker starts
        mode = _run_mode(suite, log_dir, shard, workers, decided=gate is not None)
        resume.out, resume.rerun = mode.out, mode.rerun
        if gate is None:  # a sequential run announces itself, naming its gate
            _announce(mode)
            result = _run_suite(suite, mode, settings)
        else:
            rounds = {"batch": batch, "max_trials": max_trials}
            result = _run_rounds(suite, mode, *gate, settings, rounds)
    if result.interrupted:
        another_signal_exits(result.exit_code)
    _print_result(result, mode, sequential=gate is not None)
    sys.exit(result.exit_code)


@dataclass
class _Resume:
    """Where a run's logs go and how to resume it, as far as known when it fails."""

    out: str
    rerun: str


@contextmanager
def _run_failures(resume: _Resume) -> Iterator[None]:
    """Say how a run that failed after it started can be resumed.

    A failure to write the run's own files, or to read its logs back, is a run that failed
    (exit 1), not bad input, whatever the exception's own kind; a stop outside the trials
    exits as the signal says.

    Raises:
        RunError: naming the failure and what to do next.
    """
    from twice.reports import LogReadError, StorageError

    from ..run import EXIT_INTERRUPTED, LAST_INTERRUPT, RunOutputError

    try:
        yield
    except RunOutputError as ex:
        fix = (
            f"the logs and summary.json are written: make room (or raise the limit), then "
            f"`twice report {resume.out}`"
            if ex.summary_written
            else f"the logs are kept and summary.json says incomplete: make room (or raise "
            f"the limit), then {resume.rerun} to resume"
        )
        raise RunError(f"{ex}; {fix}") from None
    except LogReadError as ex:
        # A log that vanished or changed while the run read its logs back: another process
        # writing into the same directory (object storage has no lock), not a twice bug.
        # Object storage that failed (denied, expired credentials) says so on its own.
        hint = (
            ""
            if isinstance(ex, StorageError)
            else "; is another run writing into this log directory? Give each run its own --log-dir"
        )
        raise RunError(f"{ex}{hint}, then {resume.rerun} to resume") from None
    except KeyboardInterrupt:
        # Stopped outside the trials (while loading or summarising): nothing to resume from
        # but the logs, which the same command picks up.
        name = LAST_INTERRUPT.signal or "SIGINT"
        click.echo(f"twice: interrupted by {name}; {resume.rerun} to resume", err=True)
        sys.exit(EXIT_INTERRUPTED.get(name, 130))


def _check_until_decided(
    until_decided: Path | None,
    batch: int | None,
    max_trials: int | None,
    agent_cmd: str | None,
    epochs: int | None,
    shard: str | None,
    workers: int | None,
    log_dir: str | None,
) -> None:
    """Refuse the flags that do not combine with ``--until-decided`` (or need it)."""
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


@dataclass(frozen=True)
class _Mode:
    """How a ``twice run`` runs: where its logs go, which shard, how many processes."""

    out: str
    """The log directory (the one given, or a new default one)."""
    part: Shard | None
    """The shard ``--shard`` asked for; None for the whole suite."""
    workers: int
    """Worker processes (1: this process runs the suite)."""
    at_once: int | None
    """Most workers at a time, when a rerun resumes a directory split more ways than CPUs."""
    cells: int
    """The suite's cells."""
    mine: int
    """The cells this run counts: a shard's own, else the suite's."""
    rerun: str
    """How to resume it, as a user is told: without ``--log-dir`` each run gets a new
    directory, and the same command would start over."""


def _run_mode(
    suite: Suite, log_dir: str | None, shard: str | None, workers: int | None, *, decided: bool
) -> _Mode:
    """Decide how the run runs: its log directory, its shard, its worker count (resuming a
    directory split as it already is).

    Raises:
        SuiteError: for a shard or worker count that does not fit the suite or the directory.
        click.BadParameter: for more ``--workers`` than this machine takes.
    """
    from ..run import default_log_dir
    from ..scale import default_workers, usable_cpus
    from ..suite import parse_shard, shard_cells

    part = parse_shard(shard) if shard is not None else None  # "": an unset $VAR
    if part and workers and workers > 1:
        raise SuiteError("--shard runs one shard in this process: drop --workers")
    out = log_dir or str(default_log_dir())
    cells = suite.cells()
    local = suite.local_model
    default = 1 if part or local or decided else default_workers(len(cells))
    n_workers = min(workers or default, len(cells))
    split = _existing_split(out)
    at_once = None
    if split is not None and part is None and workers is None and not (local or decided):
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
    # A shard's counts are out of its own cells, not the suite's.
    mine = len(shard_cells(cells, part)) if part else len(cells)
    rerun = "rerun the same command" if log_dir else f"rerun it with --log-dir {out}"
    return _Mode(out, part, n_workers, at_once, len(cells), mine, rerun)


def _announce(mode: _Mode) -> None:
    """Say what runs, how, and where its logs go."""
    where = (
        f", shard {mode.part}"
        if mode.part
        else f", {mode.workers} workers"
        if mode.workers > 1
        else ""
    )
    if mode.at_once is not None and mode.at_once < mode.workers:
        where = f", {mode.workers} shards {mode.at_once} at a time"
    shown_cells = f"{mode.mine} of {mode.cells}" if mode.part else f"{mode.cells}"
    click.echo(f"twice: running {shown_cells} cell(s){where}, logs in {mode.out}", err=True)


def _run_suite(suite: Suite, mode: _Mode, settings: dict[str, Any]) -> RunResult:
    """Run the suite (or ``mode``'s shard of it) in this process or in ``mode.workers``
    worker processes, each given the parsed suite and settings."""
    from ..run import run_suite
    from ..scale import WorkerPlan, run_parallel

    if mode.workers <= 1:

        def run_one(run_args: dict[str, Any]) -> RunResult:
            return run_suite(suite, mode.out, shard=mode.part, **run_args)

        return _run_in_one_process(suite, run_one, settings)
    plan = WorkerPlan(
        suite, mode.out, model_args=settings["model_args"],
        max_connections=settings["max_connections"],
        # a worker's stdout is discarded: only "log" (to stderr, whose tail shows when a
        # worker fails) is worth a worker's time
        display="log" if settings["display"] == "log" else "none",
        timeout=settings["timeout"], max_retries=settings["max_retries"],
    )  # fmt: skip
    return run_parallel(plan, mode.workers, report=settings["report"], at_once=mode.at_once)


def _run_rounds(
    suite: Suite,
    mode: _Mode,
    gate_path: Path,
    gate: GateConfig,
    settings: dict[str, Any],
    rounds: dict[str, Any],
) -> RunResult:
    """``--until-decided``: the suite in rounds until ``gate`` decides each cell."""
    from ..run import run_sequential_cli

    def run_one(run_args: dict[str, Any]) -> RunResult:
        return run_sequential_cli(suite, gate, gate_path, Path(mode.out), **rounds, **run_args)

    return _run_in_one_process(suite, run_one, settings)


def _run_in_one_process(
    suite: Suite, run_one: Callable[[dict[str, Any]], RunResult], settings: dict[str, Any]
) -> RunResult:
    """``run_one`` (twice run or --until-decided alike) with the suite's model server around
    it, its generate settings and the same bounds on every model call."""
    local = suite.local_model
    run_args = {**settings, "generate_config": local.generate_config() if local else None}
    with _local_server(local) as server:
        result = run_one(run_args)
        if server is not None:
            _server_end(server, result.failed)
    return result


def _print_result(result: RunResult, mode: _Mode, *, sequential: bool) -> None:
    """The table and where the files are (a sequential run printed its own), then what went
    wrong, on stderr."""
    from ..run import ERRORED_IN, format_table

    rerun = mode.rerun
    if not sequential:
        if result.reused:
            ran = mode.mine - result.reused
            click.echo(
                f"twice: resumed {mode.out}: {result.reused} of {mode.mine} cell(s) were already "
                f"finished and reused; {ran} new or unfinished cell(s) run",
                err=True,
            )
        say_uncounted(mode.out, result.uncounted, "this run does not plan")
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
        # An unreachable model's errored trials are said by its one line above.
        if not (result.unreachable and ERRORED_IN in line):
            click.echo(f"error: {line}", err=True)
    if result.missing:
        shown = ", ".join(c.label for c in result.missing[:5])
        more = f" and {len(result.missing) - 5} more" if len(result.missing) > 5 else ""
        click.echo(
            f"twice: incomplete: {len(result.missing)} of {mode.mine} cell(s) did not finish "
            f"({shown}{more}); summary.json is marked incomplete. {rerun.capitalize()} "
            "to resume.",
            err=True,
        )
    if result.interrupted:
        click.echo(f"twice: interrupted by {result.interrupted}", err=True)


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
    from ..local_model import local_model_server

    click.echo(f"twice: starting the local model server ({options.name})", err=True)
    with local_model_server(options) as server:
        click.echo(f"twice: local model server ready at {server.base_url}", err=True)
        from ..run import LAST_INTERRUPT

        # A run stopped at once (a second Ctrl-C) unwinds nothing: tell the server too.
        LAST_INTERRUPT.at_once.append(server.proc.terminate if server.proc else lambda: None)
        yield server
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
