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
import hashlib
import json
import os
import re
import signal
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from types import FrameType
from typing import Any, Literal
from urllib.parse import urlsplit

import pandas as pd
from inspect_ai import Task, eval_set, task_with
from inspect_ai.log import EvalLog
from inspect_ai.model import Model, get_model
from twice.assertions import score_trial
from twice.mocks import LEDGER_STORE_KEY, Ledger
from twice.reports import (
    CELL,
    SHARD_DIR,
    Location,
    LogDir,
    LogEntry,
    LogReadError,
    LogRecords,
    Shard,
    as_location,
    cells,
    check_log_dir,
    crashed,
    file_stamp,
    find_relative,
    frame_of,
    is_file,
    is_remote,
    is_stream,
    join,
    log_records,
    make_dirs,
    read_log_dir,
    read_text,
    replace_local,
    sample_records,
    write_summary,
    write_text,
)
from twice.tasks import (
    CREDENTIAL_ARG,
    TASKS,
    Prompt,
    file_digest,
    get_task,
    load_prompt,
    scrub,
    secret_values,
    twice_metadata,
)
from twice.tasks.agents import BUILTIN_AGENTS, REACT, agent_time_limit, take_late_requests

from .._inspect_compat import model_api_names
from ..local_model import environ
from ..locks import lock_log_dir
from ..suite import (
    DEFAULT_OUTAGE_WINDOW,
    Cell,
    Suite,
    SuiteError,
    shard_cells,
    shard_dir,
    suite_digest,
)
from ._endpoint import EndpointState, guard_model
from ._memory import check_memory
from ._secrets import (
    KEY_ENV_HINT,
    check_model_args,
    check_model_name,
    redact_url,
    scrub_model_record,
    scrubbed_log_records,
)
from ._speedups import (
    eval_options,
    gc_for_trials,
    no_results_table,
    revision_resolved_once,
    without_provider_sdk_state,
)

DEFAULT_TIMEOUT = 300
"""Seconds one attempt of a model call may take (``--timeout``)."""

DEFAULT_MAX_RETRIES = 3
"""Attempts beyond the first that one call makes at an endpoint that has never answered,
before it counts as unreachable (``--max-retries``); once it has answered, the outage window
bounds the retries (``_endpoint``)."""

EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143}
"""Exit codes of an interrupted run: 128 + the signal number, as a shell reports it."""


@dataclass
class RunResult:
    """What a suite run produced."""

    log_dir: Location
    logs: list[EvalLog]
    table: pd.DataFrame
    summary_path: Location
    report_path: Location | None
    failed: list[str]
    """Human lines for every eval that errored or trial that crashed."""
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
        """True when every planned cell ran to completion and no trial crashed."""
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


def _providers() -> list[str]:
    """Registered inspect model providers, for error messages (best effort: empty if unknown)."""
    try:
        return model_api_names()
    except Exception:
        return []


def _plain(text: str) -> str:
    # inspect's provider errors carry rich markup ("[bold]OPENAI_API_KEY[/bold]").
    from rich.text import Text

    with contextlib.suppress(Exception):  # not markup after all: keep the text as it is
        text = Text.from_markup(text).plain
    return " ".join(text.replace("ERROR:", "").split()).rstrip(".")


def check_base_url(model_args: Mapping[str, Any]) -> None:
    """Refuse a ``base_url`` model arg that is not an http(s) URL with a host and a port in
    range: inspect takes it, and fails only at the first call, after logs are written (exit
    1, the cause hidden in an ``ExceptionGroup``).

    Raises:
        SuiteError: naming the bad value and what is accepted.
    """
    url = model_args.get("base_url")
    if url is None:
        return
    problem = None
    try:
        parts = urlsplit(str(url))
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as ex:
        problem = str(ex)
    else:
        if parts.scheme not in ("http", "https"):
            problem = "its scheme is not http or https"
        elif not parts.hostname:
            problem = "it has no host"
    if problem:
        raise SuiteError(
            f"-M base_url={redact_url(str(url))!r} is not a usable URL ({problem}); expected "
            "an http(s) URL such as http://127.0.0.1:8000/v1"
        )


def _model(name: str, model_args: dict[str, Any], cache: dict[str, Model]) -> Model:
    if name not in cache:
        check_base_url(model_args)
        check_model_name(name)
        try:
            # Not memoized: each run puts its own endpoint guard on a fresh model (a guard that
            # found an endpoint down must not outlive its run), and inspect's cache keys a model
            # by its arguments, not by the environment its provider read (LOCAL_BASE_URL of a
            # local server on a new port).
            cache[name] = get_model(name, memoize=False, **model_args)
        except Exception as ex:  # providers raise many types: missing keys, unknown APIs
            provider = name.split("/", 1)[0]
            known = _providers()
            if known and provider not in known:
                raise SuiteError(
                    f"unknown model provider {provider!r} in {name!r}; expected one of: "
                    f"{', '.join(known)} (e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5, "
                    "openai-api/<service>/<model>, ollama/llama3, vllm/<model>, stub/retry)"
                ) from None
            # Where keys come from matters for a provider; a stub takes none.
            hint = (
                ""
                if provider == "stub"
                else f" API keys come from the environment ({KEY_ENV_HINT}); other model "
                "settings go in -M key=value."
            )
            raise SuiteError(f"could not load model {name!r}: {_plain(str(ex))}.{hint}") from None
        # A key inside a longer arg (a gateway's base_url path) reaches the provider as given
        # and the logs as [redacted].
        scrub_model_record(cache[name])
    return cache[name]


def build_tasks(
    suite: Suite,
    model_args: dict[str, Any] | None = None,
    server: str | None = None,
    *,
    guards: dict[str, EndpointState] | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout: float | None = DEFAULT_TIMEOUT,
    cells: list[Cell] | None = None,
    outage_window: float = DEFAULT_OUTAGE_WINDOW,
) -> list[Task]:
    """One inspect Task per cell, with its model attached.

    With ``suite.agent_cmd``, each task's trials live in the ``twice serve`` at ``server`` and
    the command is their agent (:func:`command_agent`).

    ``eval_set`` pairs a task with its finished log by name, task args, model, model args and
    version. The prompt is a task arg by *name or path*, so the task version carries the hash
    of the prompt file: editing a prompt file makes its old logs stale instead of silently
    reusing them on resume.

    Args:
        suite: What to run.
        model_args: Provider model args (``-M``); credentials are refused.
        guards: When given, every model gets an endpoint guard (see ``_endpoint``), keyed
            here by model name.
        max_retries: Retries of one call, before any call succeeded, after which the guard
            calls an endpoint unreachable.
        timeout: Seconds one attempt of a model call may take.
        cells: Only these cells (a shard's share); default every cell of the suite.
        outage_window: Seconds without a success, every call failing, after which the guard
            calls an endpoint unreachable.

    Raises:
        SuiteError: for credential model args, a model that cannot be loaded, or a task that
            cannot be built (a dataset record of the wrong type, naming file and line).
    """
    check_model_args(model_args or {})
    models: dict[str, Model] = {}
    prompts: dict[str, Prompt] = {}
    out = []
    if suite.agent_cmd is not None and server is None:
        raise SuiteError("an agent command needs a twice serve URL to run its trials against")
    for cell in suite.cells() if cells is None else cells:
        if cell.prompt not in prompts:  # read (and hash) each prompt file once
            prompts[cell.prompt] = load_prompt(cell.prompt)
        prompt = prompts[cell.prompt]
        args: dict[str, Any] = {}
        version = f"+prompt.{prompt.sha256[:12]}"
        if suite.agent_cmd is not None:
            # A served task has no task args (its server's URL changes every run), so the
            # version is what tells its cells apart for eval_set, and a log of another
            # command, fault or protection from one of this run's.
            version += served_version(suite.agent_cmd, cell)
        elif cell.agent != REACT:
            # Only for agents under test, so react's task args (and resumable logs) are as
            # before; a user's agent file is hashed so editing it makes its old logs stale.
            args = {"agent": cell.agent, "mocks": suite.mocks or None}
            version += agent_version(cell.agent)
        try:
            if suite.agent_cmd is not None and server is not None:
                from ..serve import command_agent, served_task

                task = served_task(
                    cell.task,
                    server,
                    fault=cell.fault,
                    protection=cell.protection,
                    prompt=cell.prompt,
                    solver=command_agent(suite.agent_cmd, timeout=suite.agent_timeout),
                    sandbox="local",
                    agent=cell.agent,
                )
            else:
                task = get_task(cell.task)(
                    fault=cell.fault, protection=cell.protection, prompt=cell.prompt, **args
                )
        except ValueError as ex:
            raise SuiteError(f"task {cell.task!r} cannot be built: {ex}") from None
        except SystemExit as ex:  # no Exception: it would end the run with its code, unsaid
            raise SuiteError(
                f"task {cell.task!r} cannot be built: it called sys.exit({ex.code!r})"
            ) from None
        except Exception as ex:
            if cell.task in TASKS:  # twice's own task: a bug of ours, with its traceback
                raise
            # A user's task that fails as it is built (a dataset path with a typo, a
            # services() that raises) is bad input like a ValueError: one line, exit 2.
            raise SuiteError(
                f"task {cell.task!r} cannot be built: {type(ex).__name__}: {ex}"
            ) from None
        if cell.task not in TASKS:
            task = _own_task(task, cell.task)
            # Editing the file, a module of the user's it imports or its dataset makes the
            # old logs stale.
            digest = file_digest(cell.task)
            version += f"+task.{digest}" if digest else ""
            version += f"+data.{(twice_metadata(task) or {}).get('dataset', '')}"
        new = cell.model not in models
        model = _model(cell.model, model_args or {}, models)
        if guards is not None and new:
            guards[cell.model] = guard_model(
                model, max_retries=max_retries, attempt_timeout=timeout,
                outage_window=outage_window,
            )  # fmt: skip
        out.append(task_with(task, model=model, version=f"{task.version}{version}"))
    return out


def served_version(command: str, cell: Cell) -> str:
    """``+cmd.<sha>.<fault>.<protection>`` of an ``--agent-cmd`` cell's task version."""
    digest = hashlib.sha256(command.encode()).hexdigest()[:12]
    return f"+cmd.{digest}.{cell.fault}.{cell.protection}"


def agent_version(agent: str) -> str:
    """``+agent.<sha>`` of a user agent's file (empty for built-in agents and modules)."""
    digest = "" if agent in BUILTIN_AGENTS else file_digest(agent)
    return f"+agent.{digest}" if digest else ""


def _own_task(task: Task, spec: str) -> Task:
    """A task of the user's own (``path.py:function``), as a cell of the suite.

    Its logs name the cell's task by the spec (``twice.task``), as cells and ``summary.json``
    do, so a rerun finds them; inspect's task name gets the spec's digest, so two files whose
    tasks share a name (or one named like a built-in) are never taken for one another.

    Raises:
        SuiteError: when the function did not build its task with ``twice_task``.
    """
    twice = twice_metadata(task)
    if twice is None:
        raise SuiteError(
            f"task {spec!r} was not built with twice.tasks.twice_task: its trials would "
            "have no mock services, ledger or side-effect scorer"
        )
    meta = {**(task.metadata or {}), "twice": {**twice, "task": spec}}
    digest = hashlib.sha256(spec.encode("utf-8")).hexdigest()[:8]
    return task_with(task, name=f"{task.name}_{digest}", metadata=meta)


ERRORED_IN = " trial(s) errored in "
"""How a run's error line for a cell's errored trials reads (the CLI matches it)."""


_GAVE_UP = re.compile(r"^RetryError\(<Future at 0x[0-9a-f]+ state=\w+ raised (\w+)>\)$")


def _readable(error: str) -> str:
    """A sample error as a user can act on it: inspect records a model call that ran out of
    retries as tenacity's ``RetryError(<Future at 0x… raised RateLimitError>)``."""
    gave_up = _GAVE_UP.match(error)
    if gave_up is None:
        return error
    name = gave_up.group(1)
    if name == "RateLimitError":
        return (
            "RateLimitError (HTTP 429) on every attempt: the endpoint kept refusing for "
            "longer than --outage-window; give fewer --max-connections or a larger "
            "--outage-window"
        )
    if "Timeout" in name:  # APITimeoutError, ReadTimeout...: each attempt waited it out
        return (
            f"{name} on every attempt: the model did not answer within --timeout seconds, "
            "on each retry too; give a larger --timeout if it is slow"
        )
    return f"{name} on every attempt (the call kept failing for longer than --outage-window)"


def run_failures(logs: list[EvalLog], table: pd.DataFrame, frame: pd.DataFrame) -> list[str]:
    """One line per failed eval, and per cell with errored trials (inspect sample errors,
    :func:`twice.reports.crashed`, left out of the rates) with its first error, so the
    terminal says why and not only where."""
    lines = []
    for log in logs:
        if log.status not in ("success", "cancelled"):
            message = log.error.message if log.error else log.status
            lines.append(f"eval {log.eval.task} on {log.eval.model} {log.status}: {message}")
    first: dict[tuple[Any, ...], str] = {}
    if not frame.empty and table["errors"].any():
        bad = frame[crashed(frame)]
        for keys, group in bad.groupby(list(CELL), sort=False):
            text = str(group["error"].iloc[0] or "").strip().splitlines()
            first[keys] = _readable(text[0])[:300] if text else "never scored"
    for row in table.itertuples():
        if row.errors:
            why = first.get(tuple(getattr(row, c) for c in CELL))
            lines.append(
                f"{row.errors}{ERRORED_IN}{Cell.from_mapping(row._asdict()).label}"
                + (f"; the first: {why}" if why else "")
            )
    late = take_late_requests()
    if late:  # each trial was scored without its request: the rates miss them
        lines.append(
            f"{len(late)} request(s) of in-process agents were refused because their trial "
            f"had ended; those trials were scored without them. The first: {late[0]}"
        )
    return [scrub(line) for line in lines]


# -- interruption --------------------------------------------------------------------------


@dataclass
class Interrupts:
    """Which signal stopped the run, if one did, and what a second one does.

    The first SIGINT is left to inspect (asyncio's handler cancels the run, inspect marks
    unfinished logs ``cancelled`` and returns); SIGTERM, which would otherwise kill the
    process without a word, is turned into the same orderly stop and remembered, so the run
    exits 143. An orderly stop still unwinds inspect's tasks and reads every log back, which
    can take seconds, or never end if a task waits on what the stop cancelled; a second
    Ctrl-C means "now". So while ``stop_now`` is set (by a run that has written its
    "running" summary), a second SIGINT or SIGTERM calls it: the run's last words, then the
    process exits at once.
    """

    signal: str | None = None
    stop_now: Callable[[str], None] | None = None
    """What a second stop signal does (it must not return); None: Python's default, a
    ``KeyboardInterrupt`` wherever the program is."""
    at_once: list[Callable[[], object]] = field(default_factory=list)
    """Things to do before a stop at once (a model server to signal: it would outlive us)."""

    def first(self, name: str) -> None:
        """Record a stop signal, and arm the second (when a run asked for it)."""
        self.signal = self.signal or name
        if self.stop_now is not None:
            self.arm()

    def arm(self) -> None:
        """From now on a SIGINT or SIGTERM stops at once (main thread only; a SIGINT a
        shell made its background job ignore stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def again(signum: int, frame: FrameType | None) -> None:
            name = self.signal or signal.Signals(signum).name
            if self.stop_now is None:
                raise KeyboardInterrupt
            self.stop_now(name)

        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, again)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_signals(state: Interrupts, stop_now: Callable[[str], None]) -> Iterator[None]:
    """For the block (a run from its "running" summary to its last one): a first SIGINT or
    SIGTERM is recorded in ``state`` and the run goes on to stop in order (inspect's eval,
    in :func:`evaluate`, is cancelled); a second calls ``stop_now``. The handlers found are
    put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals can only be handled in the main thread
        return
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def on_first(signum: int, frame: FrameType | None) -> None:
        if state.signal is not None and state.stop_now is not None:
            state.stop_now(state.signal)  # the second, wherever the first was handled
        state.first(signal.Signals(signum).name)

    state.stop_now = stop_now
    try:
        for sig, handler in saved.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, on_first)
        yield
    finally:
        state.stop_now = None
        state.at_once.clear()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@contextmanager
def _sigint_to_the_eval(state: Interrupts) -> Iterator[None]:
    """For the block (inspect's eval), the first SIGINT goes to asyncio's runner, which
    cancels the eval in order, and is recorded in ``state`` (arming the second).

    asyncio's runner takes SIGINT only when Python's default handler is in place, so that
    is put back for the block; its handler is asked to record the signal first. (A runner
    that finds another handler, or an event loop other than asyncio's, records nothing
    here: the interrupt is then known from the cancelled logs, as before.)
    """
    import asyncio

    if threading.current_thread() is not threading.main_thread() or not callable(
        getattr(asyncio.Runner, "_on_sigint", None)
    ):
        yield  # another asyncio: its runner's handler as it is (the cancelled logs tell)
        return
    before = signal.getsignal(signal.SIGINT)
    if before is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    original = asyncio.Runner._on_sigint  # type: ignore[attr-defined]

    def on_sigint(runner: Any, signum: int, frame: FrameType | None, main_task: Any) -> None:
        state.first("SIGINT")  # arms the second: the runner's own would raise into its tasks
        original(runner, signum, frame, main_task)

    asyncio.Runner._on_sigint = on_sigint  # type: ignore[attr-defined]
    try:
        yield
    finally:
        asyncio.Runner._on_sigint = original  # type: ignore[attr-defined]
        if state.signal and state.stop_now is not None:
            state.arm()
        else:
            signal.signal(signal.SIGINT, before)


@contextmanager
def _stop_on_sigterm(state: Interrupts) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals can only be handled in the main thread
        return

    def on_term(signum: int, frame: FrameType | None) -> None:
        state.signal = state.signal or "SIGTERM"
        # Whatever handles Ctrl-C now (asyncio's runner cancels the run; Python's default
        # raises KeyboardInterrupt) handles this too. A shell starts background jobs with
        # SIGINT ignored: then stop as Python's default would.
        on_int = signal.getsignal(signal.SIGINT)
        if callable(on_int):
            on_int(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


LAST_INTERRUPT = Interrupts()
"""The signal that stopped the last run in this process (the CLI's exit code reads it)."""


# -- writing -------------------------------------------------------------------------------


def write_atomic(path: Location, write: Callable[[Path], object]) -> Location:
    """Have ``write(tmp)`` write beside ``path``, scrub API keys from it, rename it in place.

    A failed or interrupted write leaves the previous file whole (and no temp file). For an
    fsspec URI the file is written locally first, then uploaded whole in one put.
    """
    if is_remote(path):
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "out"
            write(local)
            write_text(path, scrub(local.read_text(encoding="utf-8"), secret_values()))
        return path
    path = Path(as_location(path))  # a file:// URI as the path it names

    def write_scrubbed(tmp: Path) -> None:
        write(tmp)
        secrets = secret_values()
        if secrets:
            text = tmp.read_text(encoding="utf-8")
            clean = scrub(text, secrets)
            if clean != text:
                tmp.write_text(clean, encoding="utf-8")

    return replace_local(path, write_scrubbed)


def cell_dict(cell: Cell, names: dict[str, str]) -> dict[str, str]:
    """A cell as summary.json lists it (``missing``), its prompt by name (``names``)."""
    return replace(cell, prompt=names[cell.prompt]).as_dict()


_RUN_FILES = ("summary.json", "eval-set.json", "logs.json")


def refuse_runs_inside(log_dir: Location) -> None:
    """Refuse a log directory that holds another run's logs in a subdirectory (its own
    ``shard-i-of-n`` directories aside).

    inspect's eval_set lists a log directory recursively: a run into ``logs`` would take the
    logs of ``logs/run-41`` for its own, reuse or never finish their cells, and clean up the
    ones it judged stale, deleting that run's finished work.

    Raises:
        SuiteError: naming the first such directory.
    """
    for parts in find_relative(log_dir):
        if len(parts) < 2 or (len(parts) == 2 and SHARD_DIR.match(parts[0])):
            continue  # the run's own files, or its shards'
        if parts[-1] in _RUN_FILES or parts[-1].endswith(".eval"):
            inside = str(join(log_dir, *parts[:-1]))
            raise SuiteError(
                f"log directory {str(log_dir)!r} holds another run's logs in {inside!r}; "
                "inspect reads a log directory with everything under it, so this run would "
                "take those logs for its own and could delete them: give each run a "
                "directory of its own, beside the others, not above them"
            )


def prepare_log_dir(log_dir: Location) -> None:
    try:
        make_dirs(log_dir)
    except OSError as ex:
        raise SuiteError(
            f"log directory {str(log_dir)!r} cannot be created: {ex.strerror or ex}; "
            "pass a --log-dir you can write to"
        ) from None
    refuse_runs_inside(log_dir)
    if is_remote(log_dir):
        return
    # Written after every trial has run: twice's summary and report, inspect's listing of the
    # logs (logs.json) and its eval-set bookkeeping (eval-set.json).
    for name in ("summary.json", "report.html", "logs.json", "eval-set.json"):
        path = Path(as_location(join(log_dir, name)))
        if path.is_dir():
            raise SuiteError(
                f"{str(path)!r} is a directory; twice writes its {name} there: move it away"
            )
        if is_stream(path):  # a FIFO would hold the run's first summary write for ever
            raise SuiteError(
                f"{str(path)!r} is not a regular file (a FIFO or a device); twice writes its "
                f"{name} there: move it away"
            )


def _finished_cells(
    log_dir: Location, planned: list[Cell]
) -> tuple[set[Cell], list[Location], bool]:
    """The planned cells with a finished log, the log files that count for them, and
    whether one of those logs was cancelled (an interrupted run).

    One rule with ``twice gate`` and ``twice report``: the newest log of each task of the
    last run (``read_log_dir``). A log is a planned cell's when its header's twice record
    (model, task, fault, protection, prompt name and digest) is that cell's.
    """
    return finished_in(_read_or_none(log_dir), planned)


def finished_in(logs: LogDir | None, planned: list[Cell]) -> tuple[set[Cell], list[Location], bool]:
    """:func:`_finished_cells` of a directory already read (None: none to read)."""
    matched = matched_logs(logs, planned) if logs is not None else []
    finished = {cell for cell, entry in matched if entry.status == "success"}
    cancelled = any(entry.status == "cancelled" for _, entry in matched)
    return finished, [entry.path for _, entry in matched], cancelled


def matched_logs(logs: LogDir, planned: list[Cell]) -> list[tuple[Cell, LogEntry]]:
    """Each counted log of ``logs`` that belongs to a planned cell, with its cell."""
    by_key: dict[tuple[Cell, str], Cell] = {}
    for cell in planned:
        p = load_prompt(cell.prompt)
        by_key[replace(cell, prompt=p.name), p.sha256] = cell
    out = []
    for entry in logs.current:
        # read_log_dir read each header once and kept its twice record: not read again here
        # (every run reads the directory at its start and at its end).
        meta = entry.twice
        try:
            key = (Cell.from_mapping({**meta, "model": entry.model}), str(meta["prompt_sha256"]))
        except KeyError:
            continue  # not a twice log of this suite
        match = by_key.get(key)
        if match is not None:
            out.append((match, entry))
    return out


def _read_or_none(log_dir: Location) -> LogDir | None:
    try:
        return read_log_dir(log_dir)
    except LogReadError:
        return None


def samples_per_epoch(task: Task, suite: Suite) -> int:
    """The samples of ``task`` a run of ``suite`` plans in each epoch (its ``--limit``)."""
    size = len(task.dataset)
    return min(suite.limit or size, size)


def refuse_fewer_trials(logs: LogDir | None, run: PreparedRun, suite: Suite) -> None:
    """Refuse a run whose cells would have fewer trials than their finished logs hold.

    Inspect reuses a log with more samples than a smaller ``--limit`` asks for (and the cell
    then counts the old trials: 6 where a fresh run has 4), and rewrites one with more
    epochs than asked, dropping the rest. Either way the directory no longer says what the
    command ran, so the command is refused. More epochs or a larger limit extend the logs.

    Raises:
        SuiteError: naming the directory's epochs and samples per cell and the run's.
    """
    if logs is None:
        return
    tasks = dict(zip(run.planned, run.tasks, strict=True))
    for cell, entry in matched_logs(logs, run.planned):
        task = tasks[cell]
        if entry.version != str(task.version):
            continue  # written by other code or data (an edited task): stale, it reruns
        samples = samples_per_epoch(task, suite)
        if suite.epochs < entry.epochs or samples < entry.samples:
            raise SuiteError(
                f"log directory {str(run.log_dir)!r} holds cell {cell.label} run "
                f"with {entry.samples} sample(s) × {entry.epochs} epoch(s); this run asks for "
                f"{samples} × {suite.epochs}, and fewer would count the old trials or drop "
                "them: give it another --log-dir, or an --epochs and --limit no smaller"
            )


def rerun_errored(logs: LogDir | None, planned: list[Cell]) -> None:
    """Have the next ``eval_set`` run again the errored trials of the planned cells' finished
    logs, reusing their clean ones.

    Inspect counts a log whose trials partly errored as finished (``fail_on_error=False``),
    so a rerun after the endpoint (or the task) was fixed reused the errors and exited 1
    again. Their samples are invalidated, inspect's own mark for "run this again" that its
    ``eval_set`` honours (the log is rewritten whole; the retry's log then replaces it).
    """
    from inspect_ai.log import ProvenanceData, invalidate_samples, read_eval_log

    if logs is None:
        return
    for _, entry in matched_logs(logs, planned):
        if entry.status != "success" or not entry.unfinished:
            continue
        log = read_eval_log(str(entry.path))
        errored = [s.uuid for s in log.samples or [] if s.error is not None and s.uuid]
        if not errored:
            continue
        reason = "an errored trial, run again when the run resumes"
        log = invalidate_samples(log, errored, ProvenanceData(author="twice", reason=reason))
        _rewrite_log(log, entry.path)


def _rewrite_log(log: EvalLog, path: Location) -> None:
    """Write ``log`` over ``path`` whole: a local file through a temporary beside it, so an
    interrupted write leaves the old log (an object store's put is whole already)."""
    from inspect_ai.log import write_eval_log

    fmt: Literal["eval", "json"] = "json" if str(path).endswith(".json") else "eval"
    if is_remote(path):
        write_eval_log(log, str(path), format=fmt)
        return
    replace_local(as_location(path), lambda tmp: write_eval_log(log, str(tmp), format=fmt))


def _finished_logs(logs: LogDir | None, planned: list[Cell]) -> dict[Cell, tuple[str, Any]]:
    """Each planned cell with a finished log: the log's path and size/mtime (None remote)."""
    if logs is None:
        return {}
    return {
        cell: (str(entry.path), file_stamp(str(entry.path)))
        for cell, entry in matched_logs(logs, planned)
        if entry.status == "success"
    }


@dataclass(frozen=True)
class EvalSettings:
    """Inspect settings of every ``eval_set`` a twice run starts (``twice run`` and
    ``--until-decided`` alike): connections, display, retries of an errored eval, and the
    bounds on a model call that end a run whose endpoint is dead."""

    max_connections: int | None = None
    display: str | None = "none"
    retry_attempts: int = 1
    max_retries: int = DEFAULT_MAX_RETRIES
    """Attempts beyond the first of one call, before any succeeded (the endpoint guard's)."""
    timeout: int = DEFAULT_TIMEOUT
    """Seconds one attempt of a model call may take (inspect's ``attempt_timeout``)."""
    generate: dict[str, Any] = field(default_factory=dict)
    """Other inspect generate settings (``temperature``, ``seed``, ``max_tokens``...)."""

    @classmethod
    def of(
        cls,
        generate_config: dict[str, Any] | None = None,
        *,
        max_connections: int | None = None,
        display: str | None = "none",
        retry_attempts: int = 1,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: int = DEFAULT_TIMEOUT,
    ) -> EvalSettings:
        """The settings of a run; ``generate_config`` (a suite's ``[local_model]``) wins for
        ``max_retries`` and ``timeout``, a ``max_connections`` argument wins over its own."""
        generate = dict(generate_config or {})
        if max_connections is None:  # a --max-connections flag wins over the suite's setting
            max_connections = generate.pop("max_connections", None)
        generate.pop("max_connections", None)
        max_retries = int(generate.pop("max_retries", max_retries))
        timeout = int(generate.pop("timeout", timeout))
        generate.pop("attempt_timeout", None)  # always the timeout: one bound per call
        return cls(max_connections, display, retry_attempts, max_retries, timeout, generate)


@dataclass
class PreparedRun:
    """A run ready to evaluate: its tasks (models guarded), its log directory created,
    locked and checked."""

    log_dir: Location
    planned: list[Cell]
    tasks: list[Task]
    guards: dict[str, EndpointState]
    """Endpoint guards by model name (see ``_endpoint``)."""
    outage_window: int = DEFAULT_OUTAGE_WINDOW
    """Seconds an endpoint may fail every call before it counts as unreachable."""

    def unreachable(self) -> list[str]:
        """One line per model whose endpoint was found unreachable."""
        return [g.line() for g in self.guards.values() if g.down]


@contextmanager
def prepared_run(
    suite: Suite,
    log_dir: Location,
    settings: EvalSettings,
    *,
    model_args: dict[str, Any] | None = None,
    planned: list[Cell] | None = None,
    check: Callable[[list[Task]], None] | None = None,
) -> Iterator[PreparedRun]:
    """Build the tasks, then create, lock and check ``log_dir`` for the block.

    Bad input is refused before the log directory is touched: a model that cannot be loaded,
    credential model args, a task that cannot be built, and whatever ``check`` (given the
    tasks) raises. With ``suite.agent_cmd`` a ``twice serve`` runs for the block.

    Raises:
        SuiteError: as :func:`run_suite`.
    """
    planned = list(suite.cells()) if planned is None else planned
    guards: dict[str, EndpointState] = {}
    take_late_requests()  # an earlier run's in this process: that run had ended already
    with contextlib.ExitStack() as stack:
        stack.enter_context(agent_time_limit(suite.agent_timeout))  # in-process agents
        server = None
        if suite.agent_cmd is not None:
            # The external agent's trials live in a twice serve of this run (in memory: the
            # inspect logs are the run's record).
            from ..serve import URL_ENV, ServeError, running_server

            try:  # the server hosts the tasks of your own among the cells' tasks
                url = stack.enter_context(
                    running_server(tasks=[c.task for c in planned], hang_seconds=suite.hang_seconds)
                ).url
            except ServeError as ex:
                raise SuiteError(str(ex)) from None
            # Named, not given: the tasks' identity (and so the resume) outlives the port.
            stack.enter_context(environ({URL_ENV: url}))
            server = f"${URL_ENV}"
        tasks = build_tasks(
            suite, model_args, server, guards=guards, max_retries=settings.max_retries,
            timeout=settings.timeout, cells=planned, outage_window=suite.outage_window,
        )  # fmt: skip
        if check is not None:
            check(tasks)
        check_memory([(t.name, samples_per_epoch(t, suite)) for t in tasks], suite.epochs)
        prepare_log_dir(log_dir)
        try:  # a lease in object storage (renewed by a thread while the run lives)
            stack.enter_context(lock_log_dir(log_dir))
        except OSError as ex:
            raise SuiteError(
                f"log directory {str(log_dir)!r} cannot be written: {ex.strerror or ex}; "
                "pass a --log-dir you can write to"
            ) from None
        try:
            check_log_dir(log_dir)
        except LogReadError as ex:
            raise SuiteError(f"cannot resume into {str(log_dir)!r}: {ex}") from None
        yield PreparedRun(log_dir, planned, tasks, guards, suite.outage_window)


def _forget_earlier_tasks(log_dir: Location) -> None:
    """Leave ``log_dir``'s ``eval-set.json`` listing no tasks: a shard dealt no cells this time
    runs no ``eval_set`` to rewrite it, and the logs of the tasks an earlier run dealt it would
    otherwise still count in the merge (``read_log_dir`` counts the tasks it lists)."""
    path = join(log_dir, "eval-set.json")
    if not is_file(path):
        return
    try:
        info = json.loads(read_text(path))
    except ValueError:
        info = None
    if isinstance(info, dict) and info.get("tasks"):
        write_text(path, json.dumps({**info, "tasks": []}))


def evaluate(
    run: PreparedRun,
    settings: EvalSettings,
    state: Interrupts,
    *,
    epochs: int | None = None,
    limit: int | None = None,
) -> list[EvalLog]:
    """Evaluate ``run``'s tasks into its log directory with twice's settings.

    One ``eval_set`` (resumable: finished samples are reused), SIGTERM turned into the same
    orderly stop as Ctrl-C. An interrupt is recorded in ``state.signal``, never raised: the
    caller writes what ran and says the run is incomplete. ``epochs`` None keeps each task's
    own epoch count.
    """
    logs: list[EvalLog] = []
    if state.signal:  # stopped before the eval began: nothing of it to run
        return logs
    with (
        gc_for_trials(),
        _stop_on_sigterm(state),
        _sigint_to_the_eval(state),
        no_results_table(settings.display),
        without_provider_sdk_state(run.planned),
        revision_resolved_once(),
        scrubbed_log_records(),  # inspect's trace file logs each request's URL
    ):
        try:
            if not run.tasks:  # a shard dealt no cells (more shards than cells) runs nothing
                _forget_earlier_tasks(run.log_dir)
            else:
                _, logs = eval_set(
                    run.tasks,
                    log_dir=str(run.log_dir),
                    epochs=epochs,
                    limit=limit,
                    max_connections=settings.max_connections,
                    display=settings.display,  # type: ignore[arg-type]
                    retry_attempts=settings.retry_attempts,
                    retry_wait=1,
                    fail_on_error=False,
                    log_dir_allow_dirty=True,
                    # The guards bound a call's retries (the outage window, or --max-retries
                    # at an endpoint never answered); inspect's count would end a call in
                    # the middle of an outage it could ride out, so it counts none.
                    max_retries=None,
                    timeout=settings.timeout + run.outage_window,
                    attempt_timeout=settings.timeout,
                    **eval_options(settings.display),
                    **settings.generate,
                )
        except KeyboardInterrupt:
            state.first("SIGINT")
    # Inspect answers Ctrl-C by cancelling the run, marking the unfinished logs "cancelled"
    # and returning as if done: those logs are how an interrupt is known.
    if any(log.status == "cancelled" for log in logs):
        state.signal = state.signal or "SIGINT"
    return logs


def ran_trials(
    files: list[Location],
    interrupted: bool,
    keep_records: Callable[[LogRecords], object] | None = None,
) -> pd.DataFrame:
    """The trials of ``files`` (empty frame for none); after an interrupt, without the trials
    it cut short: they are logged as errors but did not run (the rerun runs them), so they
    are not counted as crashes either. ``keep_records`` (a ``--workers`` worker's) is
    given what was read of the logs, for the parent's merge."""
    with gc_for_trials():
        records = log_records(files)
        if keep_records is not None:
            keep_records(records)
        frame = frame_of(files, records) if files else pd.DataFrame()
    return without_cut_short(frame) if interrupted else frame


def without_cut_short(frame: pd.DataFrame, logs: Collection[str] | None = None) -> pd.DataFrame:
    """The trials of an interrupted run without those the interrupt cut short: inspect logs
    them as errors (``CancelledError``), but they did not run (the rerun runs them).

    ``logs``: only those of these logs (``log`` column values: the logs inspect marked
    ``cancelled``), when no summary says the whole run was interrupted."""
    if frame.empty:
        return frame
    cut = frame["error"].str.startswith("CancelledError")
    if logs is not None:
        cut &= frame["log"].isin(list(logs))
    return frame[~cut]


def cut_short_cells(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per cell, the trials an interrupt cut short and how many of them had already
    duplicated an action (summary.json's ``cut_short``), from a frame that still holds them.

    They are not in the rates (they did not finish), and that leaves the rates biased: a
    trial that retries runs longer, so an interrupt cuts it short first. A duplicate in the
    ledger cannot be undone by what the trial would have done next, so those trials are
    known to have duplicated, and the report says so rather than "never duplicated"."""
    if frame.empty:
        return []
    cut = frame[frame["error"].fillna("").str.startswith("CancelledError")]
    if cut.empty:
        return []
    duplicated: set[tuple[str, str, int]] = set()
    for log, rows in cut.groupby("log", sort=False):
        wanted = set(zip(rows["sample"], rows["epoch"], strict=True))
        for sample in sample_records(str(log)):
            key = (str(sample.get("id")), int(sample.get("epoch", 1)))
            ledger = (sample.get("store") or {}).get(LEDGER_STORE_KEY)
            if key in wanted and isinstance(ledger, dict):
                metrics = score_trial(Ledger.from_dict(ledger), sample.get("metadata") or {})
                if metrics.duplicated:
                    duplicated.add((str(log), *key))
    out = []
    for keys, group in cut.groupby(list(CELL), sort=False):
        dup = sum(
            (str(r.log), str(r.sample), int(r.epoch)) in duplicated for r in group.itertuples()
        )
        out.append({**dict(zip(CELL, keys, strict=True)), "trials": len(group), "duplicated": dup})
    return out


def left_fields(frame: pd.DataFrame, unreachable: list[str]) -> dict[str, Any]:
    """summary.json's ``unreachable`` (one line per model whose endpoint could not be
    reached) and ``left``: per cell, the errored trials a rerun runs again
    (:func:`rerun_errored`), their ``samples`` as ``{"sample", "epoch"}`` pairs. After an
    outage that outlasted the window, those are the trials it left."""
    extra: dict[str, Any] = {"unreachable": unreachable} if unreachable else {}
    if frame.empty:
        return extra
    bad = frame[frame["error"].fillna("") != ""]
    left = []
    for keys, group in bad.groupby(list(CELL), sort=False):
        trials = [
            {"sample": str(r.sample), "epoch": int(r.epoch)}
            for r in group.sort_values(["epoch", "sample"]).itertuples()
        ]
        left.append(
            {**dict(zip(CELL, keys, strict=True)), "trials": len(trials), "samples": trials}
        )
    if left:
        extra["left"] = left
    return extra


def incomplete_fields(
    missing: list[Cell], names: dict[str, str], interrupted: str | None, errored: int = 0
) -> dict[str, Any]:
    """summary.json's ``complete``/``status``/``missing``/``errored``/``interrupted`` at the
    end of a run. A run with errored trials is not complete: they are not in the rates, and
    the rerun runs them again (:func:`rerun_errored`), so its numbers would change."""
    complete = not missing and not errored
    extra: dict[str, Any] = {
        "complete": complete,
        "status": "complete" if complete else "incomplete",
    }
    if missing:
        extra["missing"] = [cell_dict(c, names) for c in missing]
    if errored:
        extra["errored"] = errored
    if interrupted:
        extra["interrupted"] = interrupted
    return extra


def errored_trials(frame: pd.DataFrame) -> int:
    """How many trials of a trial frame inspect recorded an error for: those
    :func:`rerun_errored` runs again, so while there are any the run is not complete. A
    trial never scored without an error (``errors`` counts it too) is not run again."""
    return int((frame["error"] != "").sum()) if not frame.empty else 0


def prompt_names(planned: list[Cell]) -> dict[str, str]:
    """Each planned prompt (name or path) → its name in summary.json."""
    return {p: load_prompt(p).name for p in dict.fromkeys(c.prompt for c in planned)}


def write_running(
    summary_path: Location, run: dict[str, Any], missing: list[dict[str, str]]
) -> None:
    """Until the run ends, summary.json says it is running: a reader never mistakes an old
    complete summary for this run's, even if this process is killed."""
    write_atomic(
        summary_path,
        lambda tmp: write_summary(
            pd.DataFrame(), tmp, run=run, complete=False, status="running", missing=missing
        ),
    )


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
    earlier = _read_or_none(log_dir)
    refuse_fewer_trials(earlier, prepared, suite)
    rerun_errored(earlier, planned)
    before = _finished_logs(earlier, planned)
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


def exit_at_once(name: str, state: Interrupts, summary_path: Location) -> None:
    """End the process now, after a second stop signal: say so on stderr, signal what would
    outlive it (``state.at_once``), exit 130/143. Nothing is unwound: the logs written so far
    stay (inspect writes each whole), the log directory's lock dies with the process."""
    import sys

    for thing in state.at_once:
        with contextlib.suppress(Exception):
            thing()
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"\ntwice: interrupted by {name} again: stopped at once; {summary_path} is marked "
            "incomplete, without counts; run the same command again to resume\n"
        )
        sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED.get(name, 130))


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
        now = _read_or_none(log_dir)
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
        after = _finished_logs(now, planned)
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


class RunOutputError(OSError):
    """A file of the run's own (``summary.json``, ``report.html``) could not be written after
    the trials ran (a full disk, ``ulimit -f``): the run fails (exit 1), its logs stay."""

    def __init__(self, message: str, *, summary_written: bool) -> None:
        super().__init__(message)
        self.summary_written = summary_written
        """Whether ``summary.json`` holds the run's counts (only the report failed)."""


def write_run_file(
    path: Location,
    write: Callable[[Path], object],
    summary_path: Location,
    run: dict[str, Any],
    fields: dict[str, Any],
) -> Location:
    """:func:`write_atomic`, with an ``OSError`` turned into :class:`RunOutputError`. When
    ``summary.json`` itself fails, it is marked incomplete with no counts (a small file may
    fit where the large one did not): left saying "running", it would claim a live run."""
    try:
        return write_atomic(path, write)
    except OSError as ex:
        why = f"cannot write {str(path)!r}: {ex.strerror or ex}"
        if path != summary_path:
            raise RunOutputError(why, summary_written=True) from None
        marked = {**fields, "complete": False, "status": "incomplete", "error": why}
        try:
            write_atomic(
                summary_path, lambda tmp: write_summary(pd.DataFrame(), tmp, run=run, **marked)
            )
        except OSError:
            why += " (nor could it be marked incomplete)"
        raise RunOutputError(why, summary_written=False) from None


def run_metadata(
    suite: Suite, model_args: dict[str, Any] | None = None, cells: list[Cell] | None = None
) -> dict[str, Any]:
    """What was run, for summary.json and the report: axes, prompt texts and hashes, versions.

    Model args are recorded minus anything credential-like (there should be none: see
    :func:`check_model_args`), and only when they are plain data. ``cells`` restricts the
    axes to those cells (a shard's share).
    """
    cells_: list[Cell] = list(suite.cells()) if cells is None else cells
    prompts = {}
    for name in dict.fromkeys(c.prompt for c in cells_):
        p = load_prompt(name)
        # The digest and size name the prompt; the text is an excerpt (a 10 MB prompt file
        # is not copied into summary.json and the report).
        prompts[p.name] = {
            "source": p.source,
            "sha256": p.sha256,
            "bytes": p.size,
            "text": p.excerpt,
            "truncated": p.truncated,
        }
    return {
        "models": list(dict.fromkeys(c.model for c in cells_)),
        "agents": list(dict.fromkeys(c.agent for c in cells_)),
        "mocks": dict(suite.mocks),
        "model_args": {
            k: v
            for k, v in (model_args or {}).items()
            if not CREDENTIAL_ARG.search(k) and isinstance(v, (str, int, float, bool, type(None)))
        },
        "prompts": prompts,
        "tasks": list(dict.fromkeys(c.task for c in cells_)),
        "faults": list(dict.fromkeys(c.fault for c in cells_)),
        "protections": list(dict.fromkeys(c.protection for c in cells_)),
        "epochs": suite.epochs,
        "limit": suite.limit,
        "suite": suite.source,
        "agent_cmd": suite.agent_cmd,
        "versions": {"twice": version("twice"), "inspect_ai": version("inspect_ai")},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def format_table(table: pd.DataFrame) -> str:
    """The per-cell table printed at the end of a run."""
    if table.empty:
        return "(no trials)"

    def pct(x: float) -> str:
        return "  n/a" if pd.isna(x) else f"{x:5.0%}"

    def ci(v: list[float]) -> str:
        lo, hi = v
        return "" if pd.isna(lo) else f"[{lo:.0%}–{hi:.0%}]"

    view = pd.DataFrame(
        {
            **{k: table[k] for k in CELL},
            "n": table["trials"],
            "err": table["errors"],
            "complete": table["completion_rate"].map(pct),
            "dup": table["duplication_rate"].map(pct),
            "dup 95% CI": table["duplication_ci"].map(ci),
            "safe": table["safe_success_rate"].map(pct),
            "excess": table["excess_effects_mean"].map(lambda x: "" if pd.isna(x) else f"{x:.2f}"),
            "wrong": table["wrong_rate"].map(pct),
            "crashed": table["crashed_rate"].map(pct),
        }
    )
    if not (table["wrong_rate"] > 0).any():
        # No effect with other values than asked: the column would be zeros.
        view = view.drop(columns=["wrong"])
    if (view["agent"] == REACT).all():
        # Only twice's own loop ran: the agent columns would say nothing.
        view = view.drop(columns=["agent", "crashed"])
    return str(view.to_string(index=False))
