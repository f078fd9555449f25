"""The suite's cells as inspect tasks, each with its model loaded (and guarded) and a version
that makes an edited prompt, agent or task file's old logs stale."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from inspect_ai import Task, task_with
from inspect_ai.model import Model, get_model
from twice.tasks import TASKS, Prompt, file_digest, get_task, load_prompt, twice_metadata
from twice.tasks.agents import BUILTIN_AGENTS, REACT

from .._inspect_compat import model_api_names
from ..suite import DEFAULT_OUTAGE_WINDOW, Cell, Suite, SuiteError
from ._endpoint import EndpointState, guard_model
from ._secrets import (
    KEY_ENV_HINT,
    check_model_args,
    check_model_name,
    redact_url,
    scrub_model_record,
)
from ._settings import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT


def _providers(*, plugins: bool = False) -> list[str]:
    """Registered inspect model providers, for error messages (best effort: empty if unknown)."""
    try:
        return model_api_names(plugins=plugins)
    except Exception:
        return []


def check_models(models: Iterable[str], model_args: Mapping[str, Any]) -> None:
    """Refuse what is wrong with the models before any of them is loaded: a ``-M base_url``
    that is no URL, a model name holding a credential, a provider inspect does not have.

    ``twice run --workers N`` asks this before it starts a worker, so such input is one
    error, at once, as in one process. Whatever only loading a model finds (a provider's
    missing API key) is found by each worker's :func:`build_tasks`, as in one process.

    Raises:
        SuiteError: naming the bad value and what is accepted.
    """
    check_base_url(model_args)
    for name in models:
        check_model_name(name)
    providers = {name.split("/", 1)[0]: name for name in models}
    known = _providers()
    if known and not providers.keys() <= set(known):
        known = _providers(plugins=True)  # a plugin's provider, not loaded yet
    for provider, name in providers.items():
        if known and provider not in known:
            raise SuiteError(
                f"unknown model provider {provider!r} in {name!r}; expected one of: "
                f"{', '.join(known)} (e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5, "
                "openai-api/<service>/<model>, ollama/llama3, vllm/<model>, stub/retry)"
            )


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
        check_models([name], model_args)
        try:
            # Not memoized: each run puts its own endpoint guard on a fresh model (a guard that
            # found an endpoint down must not outlive its run), and inspect's cache keys a model
            # by its arguments, not by the environment its provider read (LOCAL_BASE_URL of a
            # local server on a new port).
            cache[name] = get_model(name, memoize=False, **model_args)
        except Exception as ex:  # providers raise many types: missing keys, bad model args
            # Where keys come from matters for a provider; a stub takes none.
            hint = (
                ""
                if name.startswith("stub/")
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
        task, version = _cell_task(suite, cell, prompts[cell.prompt], server)
        new = cell.model not in models
        model = _model(cell.model, model_args or {}, models)
        if guards is not None and new:
            guards[cell.model] = guard_model(
                model, max_retries=max_retries, attempt_timeout=timeout,
                outage_window=outage_window,
            )  # fmt: skip
        out.append(task_with(task, model=model, version=f"{task.version}{version}"))
    return out


def _cell_task(suite: Suite, cell: Cell, prompt: Prompt, server: str | None) -> tuple[Task, str]:
    """The cell's inspect task (no model yet), and what its version gets appended: the
    digests of the prompt, and of the agent, command or task file of the user's own."""
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
    task = _built_task(suite, cell, args, server)
    if cell.task not in TASKS:
        task = _own_task(task, cell.task)
        # Editing the file, a module of the user's it imports or its dataset makes the
        # old logs stale.
        digest = file_digest(cell.task)
        version += f"+task.{digest}" if digest else ""
        version += f"+data.{(twice_metadata(task) or {}).get('dataset', '')}"
    return task, version


def _built_task(suite: Suite, cell: Cell, args: dict[str, Any], server: str | None) -> Task:
    """The cell's task as its task function (or ``twice serve``, for an agent command)
    builds it; a task that cannot be built is bad input, one line."""
    try:
        if suite.agent_cmd is not None and server is not None:
            from ..serve import command_agent, served_task

            return served_task(
                cell.task,
                server,
                fault=cell.fault,
                protection=cell.protection,
                prompt=cell.prompt,
                solver=command_agent(suite.agent_cmd, timeout=suite.agent_timeout),
                agent=cell.agent,
            )
        return get_task(cell.task)(
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
        raise SuiteError(f"task {cell.task!r} cannot be built: {type(ex).__name__}: {ex}") from None


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
