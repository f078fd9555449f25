"""Evals whose trials live in a ``twice serve`` server: an agent reaches them over MCP.

:func:`served_task` is a twice task whose tools are not in-process: each sample × epoch makes
a trial on the server (``POST /_twice/trials``), the agent drives the trial's tools through
inspect's ``mcp_server_http`` inside ``mcp_connection`` (or an external command drives its
services over HTTP), and when the agent stops, the trial's ledger is copied from the server
into the sample store: twice's own ``side_effects`` scorer scores it, and the log reads like
any other twice log.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from inspect_ai import Task
from inspect_ai.log import transcript
from inspect_ai.model import ChatMessage, ChatMessageSystem, ModelOutput
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import mcp_connection, mcp_server_http
from inspect_ai.util import concurrency, store
from twice.assertions import side_effects
from twice.mocks import LEDGER_STORE_KEY, Ledger, get_fault, raise_if_stub_could_not_play
from twice.tasks import (
    CompactingFilter,
    follow_up,
    get_protection,
    load_prompt,
    prompt_metadata,
    remember_command_secrets,
    scrub,
    secret_values,
    stub_setup,
    task_parts,
)
from twice.tasks.agents import (
    AGENT_STORE_KEY,
    attribute_attempts,
    intent_identity,
    mark_source,
    model_tool_calls,
    scrub_agent_trace,
)

from ..suite import AGENT_TIMEOUT, check_hang_seconds, usable_cpus
from ._command import OUTPUT_TAIL, CommandRun, code_block, output_tail, run_command
from ._history import HISTORY_ENV, final_answer, joined, write_history
from ._model_endpoint import MODEL_NAME, ModelAccess, model_endpoint

SERVED_STORE_KEY = "twice:served"
"""Store key of the served trial: ``{"server", "id", "urls", "task", "conversation", "marks"}``
(never the token: the store is in the log). ``conversation`` is the cell's conversation
fault (``ask_again``, ``compaction`` or None), which the agent command's solver applies;
``marks`` are ``[since, source, repeats_only]`` for :func:`~twice.tasks.agents.mark_source`:
what the conversation fault caused, named when the ledger is copied."""


TOKEN_ENV = "TWICE_SERVE_TOKEN"
"""Environment variable holding the server's control-API token, if it has one. Read when a
request is made, never passed as a solver argument: inspect logs solver arguments."""


URL_ENV = "TWICE_SERVE_URL"
"""Environment variable a served task may name as its server (``server="$TWICE_SERVE_URL"``):
``twice run --agent-cmd`` sets it to the run's own server, whose port changes every run."""


def server_url(server: str) -> str:
    """``server``, or for ``$NAME`` the URL in environment variable ``NAME``, read when a
    trial starts. Inspect logs the setup's arguments and tells an eval set's tasks apart by
    them, so a URL that changes between runs (a fresh port) would make every run's logs new
    tasks, never resumed; the name stays the same.

    Raises:
        RuntimeError: when the variable is not set.
    """
    if not server.startswith("$"):
        return server
    url = os.environ.get(server[1:])
    if not url:
        raise RuntimeError(f"{server[1:]} is not set: it should hold the twice serve URL")
    return url


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for the process's requests to servers: httpx builds one for each new
    client otherwise, loading the CA bundle (about 30 ms of CPU each time), and a served
    trial makes three clients."""
    return httpx.create_ssl_context()


def server_client() -> httpx.AsyncClient:
    """A client for requests to a ``twice serve`` server (its TLS context built once)."""
    return httpx.AsyncClient(timeout=30, verify=_tls())


def _headers(token: str | None) -> dict[str, str]:
    token = token or os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


async def create_trial(
    server: str, body: dict[str, Any], token: str | None = None
) -> dict[str, Any]:
    """``POST /_twice/trials``; returns the trial's id and URLs.

    Raises:
        RuntimeError: with the server's error message when it refuses.
    """
    async with server_client() as client:
        r = await client.post(f"{server}/_twice/trials", json=body, headers=_headers(token))
    if r.status_code != 201:
        raise RuntimeError(f"twice serve refused the trial ({r.status_code}): {r.text}")
    return dict(r.json())


async def trial_get(server: str, trial_id: str, what: str, token: str | None = None) -> Any:
    """``GET /_twice/trials/<id>/<what>`` (``ledger`` or ``verdict``)."""
    async with server_client() as client:
        r = await client.get(f"{server}/_twice/trials/{trial_id}/{what}", headers=_headers(token))
    r.raise_for_status()
    return r.json()


async def sync_ledger(state: TaskState | None = None, since: int | None = None) -> None:
    """Copy the served trial's ledger into the sample store (where the scorer reads it).

    With ``state`` and ``since`` (the first transcript event of the agent's run), the
    attempts the agent's client sent without naming their source are attributed to the
    model or the framework from the model's tool calls since then (``attribute_attempts``).
    """
    served = store().get(SERVED_STORE_KEY)
    data = await trial_get(served["server"], served["id"], "ledger")
    if state is not None and since is not None:
        ledger = Ledger.from_dict(data)
        identity = intent_identity(state.metadata)
        marks = served.get("marks") or []
        for at, source, repeats_only in marks:
            mark_source(ledger, at, source, identity, repeats_only=repeats_only)
        calls = model_tool_calls(transcript().events[since:])
        if attribute_attempts(ledger, calls, identity) or marks:
            data = {**data, "attempts": ledger.to_dict()["attempts"]}
    store().set(LEDGER_STORE_KEY, data)


@solver
def served_agent(agent: Solver) -> Solver:
    """Run ``agent``, then copy the trial's ledger into the store (even if the agent failed or
    hit a limit: the ledger is what happened), its attempts attributed to the model or the
    framework from the model's tool calls twice saw through the bridge."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        first_event = len(transcript().events)
        try:
            return await agent(state, generate)
        finally:
            await sync_ledger(state, first_event)

    return solve


@solver
def served_trial_setup(
    server: str,
    task: str,
    fault: str,
    protection: str,
    prompt_name: str,
    prompt_text: str,
    hang_seconds: float | None = None,
) -> Solver:
    """Make this sample × epoch's trial on the server; set the prompt and the stubs' plan.

    ``hang_seconds``: how long the trial holds a lost reply open (None: the server's
    default, ``twice serve --hang-seconds``)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        url = server_url(server)
        chosen = get_fault(fault)
        body: dict[str, Any] = {
            "task": task,
            "sample": str(state.sample_id),
            # The server runs the wire fault; the conversation fault is the agent solver's.
            "fault": chosen.wire_name,
            "protection": protection,
        }
        if hang_seconds is not None:
            body["hang_seconds"] = hang_seconds
        trial = await create_trial(url, body)
        store().set(
            SERVED_STORE_KEY,
            {
                "server": url,
                "id": trial["id"],
                "urls": trial["urls"],
                "task": task,
                "conversation": chosen.conversation,
                "marks": [],
            },
        )
        await sync_ledger()
        state.messages.insert(0, ChatMessageSystem(content=prompt_text))
        stub_setup(state, prompt_name, prompt_text=prompt_text)
        return state

    return solve


@solver
def mcp_agent() -> Solver:
    """The model drives the trial's tools over MCP streamable HTTP (inspect's MCP client)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        urls = store().get(SERVED_STORE_KEY)["urls"]
        server = mcp_server_http(name="twice", url=urls["mcp"], timeout=30)
        async with mcp_connection([server]):
            state.tools = list(await server.tools())
            return await generate(state)

    return solve


AGENT_OUTPUT_SOURCE = "twice:agent_cmd"
"""The ``source`` of the info event that records how an agent command ended and the tails of
its stdout and stderr (the report's trial detail reads it)."""

AGENT_COMMANDS = "agent commands"
"""The name of the limit on agent commands running at once, as inspect's concurrency display
shows it."""

_at_once: int | None = None


@contextlib.contextmanager
def agent_commands_at_once(limit: int | None) -> Iterator[None]:
    """While evals run: at most ``limit`` agent commands run at once (``--max-agent-cmds``);
    None: one per usable CPU. A setting of the run, not of its tasks: it changes no trial's
    identity, so a rerun with another limit resumes."""
    global _at_once
    before, _at_once = _at_once, limit
    try:
        yield
    finally:
        _at_once = before


def agent_env(served: dict[str, Any], state: TaskState, model: ModelAccess) -> dict[str, str]:
    """What an external agent command is given: the trial's URLs, the task, the model.

    ``TWICE_<SERVICE>_URL`` for every service (and ``TWICE_MCP_URL``), ``TWICE_TRIAL_ID``,
    ``TWICE_INPUT`` (the user's request), ``TWICE_SYSTEM_PROMPT``, and the eval's model
    (:func:`model_endpoint`): OpenAI-compatible at ``OPENAI_BASE_URL`` with
    ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` (``inspect``; any name is the eval's model), and
    Anthropic-compatible at ``ANTHROPIC_BASE_URL`` with ``ANTHROPIC_API_KEY``. The key is the
    trial's own (no credential: it names the trial while it runs).
    """
    env = {f"TWICE_{name.upper()}_URL": url for name, url in served["urls"].items()}
    system = next((m.text for m in state.messages if m.role == "system"), "")
    env.update(
        {
            "TWICE_TRIAL_ID": served["id"],
            "TWICE_INPUT": state.input_text,
            "TWICE_SYSTEM_PROMPT": system,
            "OPENAI_BASE_URL": model.openai_base_url,
            "OPENAI_API_KEY": model.key,
            "OPENAI_MODEL": MODEL_NAME,
            "ANTHROPIC_BASE_URL": model.anthropic_base_url,
            "ANTHROPIC_API_KEY": model.key,
        }
    )
    return env


def command_agent(command: str, timeout: float = AGENT_TIMEOUT, cwd: str | None = None) -> Solver:
    """Run an external agent command for the trial (``twice run --agent-cmd``).

    The command runs through ``sh -c`` in ``cwd`` (default: the current directory) with
    :func:`agent_env`, in a process group of its own (:func:`run_command`): after
    ``timeout`` seconds, or when it exits, every process it started is stopped. Its model
    calls go to the eval's model, stub models included, through an endpoint on 127.0.0.1 in
    this process (:func:`model_endpoint`: inspect's bridge converters, the trial's own key)
    while the command runs. The trial is
    scored from its ledger whatever the command does; a command that exits non-zero or runs
    out of time crashed (``crashed_rate``). Its exit status and output tails are in the
    transcript.

    Raises:
        RuntimeError: when the command cannot be run at all (exit 126 or 127: not found or
            not executable), which is a usage error, not a trial outcome.
    """
    real, where = command, cwd or os.getcwd()
    remember_command_secrets(command)  # a key written on the command line, not in the env

    # Inspect logs a solver's arguments as given (the plan in every .eval, and logs.json):
    # the command itself would carry any key written on it. The solver it logs is given the
    # command scrubbed; the one it runs is this closure's. Its arguments are also the cell's
    # identity to eval_set, so they stay what they were: no cwd unless one was given (a
    # rerun from another directory must reuse the logs).
    @solver(name="command_agent")
    def logged(command: str, timeout: float = AGENT_TIMEOUT, cwd: str | None = None) -> Solver:
        return _command_solver(real, timeout, where)

    shown = scrub(command, secret_values())
    if cwd is None:
        return logged(shown, timeout=timeout)
    return logged(shown, timeout=timeout, cwd=cwd)


async def served_ledger(served: dict[str, Any]) -> Ledger:
    """The served trial's ledger as it stands (``GET /_twice/trials/<id>/ledger``)."""
    return Ledger.from_dict(await trial_get(served["server"], served["id"], "ledger"))


def _command_solver(command: str, timeout: float, where: str) -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        served = store().get(SERVED_STORE_KEY)
        conversation = served.get("conversation")
        first_event = len(transcript().events)
        compactor = None
        faults = (conversation or "").split("+")
        if "compaction" in faults:
            compactor = CompactingFilter(lambda: served_ledger(served))

        def mark_compaction() -> None:
            # Repeats of a request sent before the compaction are the compaction's doing
            # (named before the user's follow-up, whose attempts are the user's).
            if compactor is None or compactor.since is None:
                return
            mark = [compactor.since, "compaction", True]
            if mark not in served["marks"]:
                served["marks"].append(mark)
                store().set(SERVED_STORE_KEY, served)

        runs: list[tuple[str, CommandRun]] = []

        async def run_agent() -> tuple[list[ChatMessage], ModelOutput]:
            deadline = time.monotonic() + timeout
            with tempfile.TemporaryDirectory(prefix="twice-history-") as folder:
                history = Path(folder) / "history.json"
                write_history(history, [])
                async with model_endpoint(filter=compactor) as (model, bridge):
                    env = {**agent_env(served, state, model), HISTORY_ENV: str(history)}
                    runs.append(("request", await run_command(command, env, where, timeout)))
                    messages = list(bridge.state.messages)
                    if "ask_again" in faults and not _failed(runs[-1][1]):
                        if compactor is not None:
                            compactor.end()
                            mark_compaction()
                        text = follow_up(served["task"], state.sample_id, state.epoch)
                        answer = final_answer(bridge.state.output, messages)
                        write_history(history, [("user", state.input_text), ("assistant", answer)])
                        # Every mutating attempt from here on answers the user's follow-up.
                        asked_from = len((await served_ledger(served)).attempts)
                        served["marks"].append([asked_from, "user", False])
                        store().set(SERVED_STORE_KEY, served)
                        transcript().info(f"twice: the user asks again: {text!r}")
                        left = max(deadline - time.monotonic(), 0.0)
                        run = await run_command(command, {**env, "TWICE_INPUT": text}, where, left)
                        runs.append(("follow-up", run))
                        messages = joined(messages, list(bridge.state.messages), text)
                    return messages, bridge.state.output

        try:
            # One trial's agent command per usable CPU at a time by default, as inspect runs its
            # own subprocesses (max_subprocesses): a row of trials at once on two cores starves
            # this process's own server, whose connections then time out before their first
            # byte is read. The agent's time counts from when it gets its slot.
            async with concurrency(AGENT_COMMANDS, _at_once or usable_cpus()):
                messages, output = await run_agent()
        except BaseException:
            # A limit (the task's message_limit, a token limit) ends the sample here, and
            # inspect logs what the agent sent so far: scrubbed as on the way out below.
            scrub_agent_trace(state, since=first_event)
            raise
        mark_compaction()
        if messages:
            state.messages = messages
        state.output = output
        # What the command printed may carry the environment's credentials (a traceback
        # with a header, an agent printing its settings): scrubbed here. What it sent the
        # model (its conversation, the model events) is scrubbed too.
        scrub_agent_trace(state, since=first_event)
        _record_runs(command, runs, timeout)
        return state

    return solve


def _record_runs(command: str, runs: list[tuple[str, CommandRun]], timeout: float) -> None:
    """Log how each run of the command ended; record whether the agent crashed.

    Raises:
        RuntimeError: when the command could not run at all (exit 126 or 127).
    """
    secrets = secret_values()
    errors = [_log_run(command, request, run, timeout, secrets) for request, run in runs]
    # A command that fails, or hangs until it is stopped, is an agent that crashed, as
    # an in-process agent's exception is: the trial is still scored from its ledger, and
    # crashed_rate counts it.
    failed = any(_failed(run) for _, run in runs)
    store().set(
        AGENT_STORE_KEY,
        {
            "agent": scrub(command, secrets),
            "crashed": failed,
            "error": next((e for e in errors if e), ""),
        },
    )
    raise_if_stub_could_not_play()  # the command saw only the bridge's HTTP error
    for _, run in runs:
        if run.returncode in (126, 127):
            raise RuntimeError(
                f"agent command {scrub(command, secrets)!r} could not run "
                f"(exit {run.returncode}): "
                f"{scrub(run.stderr, secrets).strip()[-500:]}"
            )


def _failed(run: CommandRun) -> bool:
    return run.returncode != 0 or run.timed_out


def _log_run(
    command: str, request: str, result: CommandRun, timeout: float, secrets: list[str]
) -> str:
    """Log how one run of the command ended and the tails of its output; return its error
    (empty when it exited 0 in time).

    ``request``: which of the user's requests the run answered (``request``, or
    ``follow-up`` under ``ask_again``)."""
    stdout, stdout_cut = output_tail(result.stdout, result.stdout_bytes, secrets)
    stderr, stderr_cut = output_tail(result.stderr, result.stderr_bytes, secrets)
    # Both streams alike: the agent's answer comes through the model bridge, so stdout
    # is, as stderr, what the agent chose to say about its run.
    transcript().info(
        {
            "agent_cmd": scrub(command, secrets),
            "request": request,
            "returncode": result.returncode,
            "timed_out": result.timed_out,
            "tail_bytes": OUTPUT_TAIL,
            "stdout": stdout,
            "stdout_bytes": result.stdout_bytes,
            "stdout_truncated": stdout_cut,
            "stderr": stderr,
            "stderr_bytes": result.stderr_bytes,
            "stderr_truncated": stderr_cut,
        },
        source=AGENT_OUTPUT_SOURCE,
    )
    # inspect view shows a dict info event as JSON, where a text of many lines is one
    # line of escapes; it renders a text info event as Markdown: each stream is also
    # logged as a code block, which it shows line by line.
    for stream, text, cut in (("stderr", stderr, stderr_cut), ("stdout", stdout, stdout_cut)):
        if text:
            shown = f" (last {OUTPUT_TAIL // 1024} KiB)" if cut else ""
            transcript().info(code_block(text), source=f"{AGENT_OUTPUT_SOURCE} {stream}{shown}")
    last = (result.stderr.strip().splitlines() or [""])[-1]
    if result.timed_out:
        error = f"timed out after {timeout:g} s (--agent-timeout); its processes were stopped"
    else:
        error = f"exit {result.returncode}: {last}".rstrip(": ") if _failed(result) else ""
    return scrub(error, secrets)


def served_task(
    task: str,
    server: str,
    *,
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    solver: Solver | None = None,
    hang_seconds: float | None = None,
    message_limit: int = 30,
    sandbox: str | None = None,
    agent: str | None = None,
) -> Task:
    """A twice task whose trials live in a ``twice serve`` server.

    Args:
        task: A built-in task name, or a task of your own (``path.py:function``) that the
            server was started with (``twice serve --task``).
        server: The server's base URL (``http://127.0.0.1:8765``), or ``$NAME``: the URL in
            environment variable ``NAME`` when a trial starts (:func:`server_url`; a run
            whose server's port changes then still resumes).
        fault: A fault name. The server runs its wire part; a conversation part
            (``ask_again``, ``compaction``) is applied by :func:`command_agent`.
        protection: A protection name (the server's tool layer applies it to MCP tools).
        prompt: A built-in prompt name or a prompt file path.
        solver: The agent; default: the model drives the trial's tools over MCP.
        hang_seconds: How long a trial holds a lost reply (``lost_reply``,
            ``timeout_before_commit``) open before closing the connection; None: the
            server's default. An agent whose own timeout is shorter sees a read timeout.
        message_limit: Hard stop for agents that loop.
        sandbox: The task's sandbox, if its agent needs one.
        agent: The agent's name on the agent axis (``twice run --agent-cmd`` gives
            ``cmd:COMMAND``); default ``react``, as for twice's own loop.

    A server started with ``--token`` needs the token in ``$TWICE_SERVE_TOKEN`` (never a task
    or solver argument, which inspect would log).

    Raises:
        ValueError: for an unknown task, fault, protection or prompt, or a ``hang_seconds``
            out of range.
    """
    parts = task_parts(task)
    if get_fault(fault).conversation is not None and solver is None:
        raise ValueError(
            f"fault {fault!r} changes the conversation between the agent's turns, which the "
            "MCP agent (the default solver) does not take; give the agent command's solver "
            "(command_agent), or a fault without a conversation part"
        )
    if hang_seconds is not None:
        hang_seconds = check_hang_seconds(hang_seconds)
    get_protection(protection)
    p = load_prompt(prompt)
    return Task(
        name=parts.name,
        dataset=parts.dataset,
        setup=served_trial_setup(server, task, fault, protection, p.name, p.text, hang_seconds),
        solver=served_agent(solver or mcp_agent()),
        scorer=side_effects(parts.end_state),
        message_limit=message_limit,
        sandbox=sandbox,
        metadata={
            "twice": {
                "task": task,
                "fault": fault,
                "protection": protection,
                **prompt_metadata(p),
                "served": True,
                **({"agent": agent} if agent else {}),
            }
        },
    )
