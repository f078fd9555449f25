"""Suites from a TOML file or from ``twice run``'s flags.

A suite file holds one or more ``[[matrix]]`` blocks; the suite is their union (a cell named
by two blocks runs once). Top-level keys set run options::

    epochs = 1
    [[matrix]]
    models = ["stub/retry", "stub/verify"]
    agents = ["react"]                          # or openai-agents, langgraph, langgraph-retry,
                                                # pydantic-ai, path/to/agent.py:function
    prompts = ["baseline", "cautious"]          # built-in names or prompt file paths
    tasks = ["refund"]
    faults = ["lost_reply", "timeout_before_commit"]
    protections = ["bare"]

An optional ``[local_model]`` table (keys of :class:`ServerOptions`) makes the run start
twice's local model server first and stop it at the end (``evals/real.toml``).
``agent_cmd = "node my_agent.js"`` at the top level runs that command as the agent of every
trial, against ``twice serve`` (see ``twice run --agent-cmd``); ``hang_seconds = 5`` then
bounds how long its trials hold a lost reply open (``twice run --hang-seconds``).
``outage_window = 300`` sets the seconds a model endpoint may fail every call before the run
ends (``--outage-window``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from twice.tasks import (
    read_regular_file,
)
from twice.tasks.agents import AGENT_TASKS, BUILTIN_AGENTS, REACT

from ..local_model import parse_options
from ._hang import DEFAULT_HANG_SECONDS
from ._suite import (
    AGENT_TIMEOUT,
    AXES,
    DEFAULT_OUTAGE_WINDOW,
    STUB_NAMES,
    Matrix,
    Suite,
    SuiteError,
)

DEFAULT_SUITE = Path(__file__).parent.parent / "default.toml"
"""The suite ``twice run`` runs with no flags: every stub model, offline."""


def shipped_file(path: str | Path) -> Path:
    """``path``, or, when no such file exists and it names a file twice ships as a repository
    path (``evals/gate.toml``) or by name (``gate.toml``), the installed copy: the README's
    commands and the cluster recipes then work outside a twice checkout too."""
    p = Path(path)
    if p.exists() or p.suffix != ".toml" or p.parent not in (Path("."), Path("evals")):
        return p
    installed = DEFAULT_SUITE.parent / p.name
    return installed if installed.is_file() else p


def read_shipped(path: str | Path, what: str) -> tuple[Path, bytes]:
    """Read a suite or gate file: ``path``, or the installed copy it names
    (:func:`shipped_file`).

    Raises:
        ValueError: naming the file and why it cannot be read; for a missing one, also the
            files twice ships (``--config gate`` means ``gate.toml``).
    """
    p = shipped_file(path)
    try:  # a FIFO is refused, never waited on; a directory or unreadable file is named
        return p, read_regular_file(p, what)
    except ValueError as ex:
        if p.exists():
            raise
        gates = what.startswith("gate")  # the shipped gate files have "gate" in their name
        names = ", ".join(
            sorted(
                f.name for f in DEFAULT_SUITE.parent.glob("*.toml") if ("gate" in f.name) == gates
            )
        )
        raise ValueError(f"{ex}; twice ships {names} (give one of those, or a path)") from None


_KNOWN_TOP = {
    "matrix", "epochs", "limit", "description", "local_model", "agent_cmd", "agent_timeout",
    "outage_window", "hang_seconds", "max_agent_cmds",
}  # fmt: skip
"""The top-level keys of a suite file."""


def load_suite(path: str | Path) -> Suite:
    """Read a suite TOML file.

    Raises:
        SuiteError: for a missing, unreadable or non-regular file (a FIFO is refused, not
            waited on), text that is not UTF-8 TOML, unknown keys, or values of the wrong
            type (``epochs``/``limit`` must be positive integers), naming the problem.
    """
    p, data = _read_toml(path)
    unknown = set(data) - _KNOWN_TOP
    if unknown:
        raise SuiteError(
            f"{p}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"expected: {', '.join(sorted(_KNOWN_TOP))}"
        )
    matrices = _matrices(data.get("matrix"), p)
    epochs = _count(data, "epochs", p)
    limit = _count(data, "limit", p)
    outage_window = _count(data, "outage_window", p)
    agent_cmd = _agent_cmd(data, p)
    local_model = None
    if "local_model" in data:
        try:
            local_model = parse_options(data["local_model"], str(p))
        except ValueError as ex:
            raise SuiteError(str(ex)) from None
    return Suite(
        matrices,
        epochs=epochs or 1,
        limit=limit,
        source=str(p),
        local_model=local_model,
        agent_cmd=agent_cmd,
        agent_timeout=data.get("agent_timeout", AGENT_TIMEOUT),
        outage_window=outage_window or DEFAULT_OUTAGE_WINDOW,
        hang_seconds=data.get("hang_seconds", DEFAULT_HANG_SECONDS),
        max_agent_cmds=data.get("max_agent_cmds"),
    )


def _read_toml(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The suite file's path as read, and its TOML."""
    try:
        p, raw = read_shipped(path, "suite file")
    except ValueError as ex:
        raise SuiteError(str(ex)) from None
    try:
        return p, tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as ex:
        raise SuiteError(
            f"suite file {str(p)!r} is not UTF-8 text ({ex.reason} at byte {ex.start}); "
            "expected a TOML file"
        ) from None
    except tomllib.TOMLDecodeError as ex:
        raise SuiteError(f"suite file {str(p)!r} is not valid TOML: {ex}") from None


def _matrices(blocks: Any, p: Path) -> tuple[Matrix, ...]:
    """The file's ``[[matrix]]`` blocks, each a table of axes with at least ``models``."""
    if not isinstance(blocks, list) or not blocks:
        raise SuiteError(f"{p}: needs at least one [[matrix]] block")
    matrices = []
    for i, block in enumerate(blocks, start=1):
        where = f"{p} [[matrix]] #{i}"
        if not isinstance(block, dict):
            raise SuiteError(
                f"{where}: is {block!r}; expected a table of axes ([[matrix]] with models = [...])"
            )
        extra = set(block) - set(AXES)
        if extra:
            raise SuiteError(
                f"{where}: unknown key(s) {', '.join(sorted(extra))}; expected: {', '.join(AXES)}"
            )
        axes = {axis: _str_list(block, axis, where) for axis in AXES}
        if axes["models"] is None:
            raise SuiteError(f"{where}: needs 'models'")
        matrices.append(Matrix(**{k: v for k, v in axes.items() if v is not None}))
    return tuple(matrices)


def _agent_cmd(data: dict[str, Any], p: Path) -> str | None:
    """The file's ``agent_cmd``: a string, in a file whose blocks name no agents."""
    agent_cmd = data.get("agent_cmd")
    if agent_cmd is not None and not isinstance(agent_cmd, str):
        raise SuiteError(f"{p}: 'agent_cmd' must be a string (a shell command), got {agent_cmd!r}")
    blocks = data["matrix"]
    named = next((i for i, b in enumerate(blocks, start=1) if "agents" in b), None)
    if agent_cmd is not None and named is not None:
        # 'react' included: the command is the agent of every trial, and runs alone.
        raise SuiteError(
            f"{p} [[matrix]] #{named}: 'agents' does not combine with agent_cmd, which runs "
            "its command as the agent of every trial (run other agents in a suite of their own)"
        )
    return agent_cmd


def _count(data: dict[str, Any], key: str, where: Path) -> int | None:
    """A positive integer setting; ``true`` is not a count (TOML booleans are not numbers)."""
    if key not in data:
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SuiteError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return int(value)


def _str_list(block: dict[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    if key not in block:
        return None
    value = block[key]
    # A bare string is refused, not taken as a list of one: every axis is a list, and the
    # one spelling is what the file reads as everywhere else (flags replace it whole).
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        got = _toml_type(value) + (f" {value!r}" if len(repr(value)) <= 80 else "")
        raise SuiteError(
            f"{where}: {key!r} must be a list of strings, e.g. {key} = [{_EXAMPLES[key]!r}], "
            f"got {got}"
        )
    return tuple(value)


_EXAMPLES = {
    "models": "stub/retry",
    "agents": REACT,
    "prompts": "baseline",
    "tasks": "refund",
    "faults": "lost_reply",
    "protections": "bare",
}


def _toml_type(value: Any) -> str:
    """A TOML value's type as the file spells it, with its article, for messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "a list holding a non-string"
    names = {str: "a string", int: "an integer", float: "a float", dict: "a table"}
    return next((n for t, n in names.items() if isinstance(value, t)), type(value).__name__)


def suite_from_flags(
    *,
    config: str | None,
    models: Sequence[str],
    prompts: Sequence[str],
    agents: Sequence[str] = (),
    mocks: dict[str, str] | None = None,
    tasks: Sequence[str],
    faults: Sequence[str],
    protections: Sequence[str],
    epochs: int | None,
    limit: int | None,
    agent_cmd: str | None = None,
    agent_timeout: float | None = None,
    outage_window: int | None = None,
    hang_seconds: float | None = None,
    max_agent_cmds: int | None = None,
) -> Suite:
    """The suite a ``twice run`` command line asks for.

    With ``--config`` the file is the base and flags replace whole axes. Without it, flags
    build one matrix (defaults: agent react, every task (the built-in framework agents' tasks
    when ``agents`` names one), faults none/lost_reply/reset_after_commit/timeout_before_commit,
    protection bare, prompt baseline); with no flags at all, the default suite runs.
    """
    axes = {
        "models": models,
        "agents": agents,
        "prompts": prompts,
        "tasks": tasks,
        "faults": faults,
        "protections": protections,
    }
    if config is not None:
        suite = load_suite(config).override(**axes)
    elif any(axes.values()):
        if not tasks and any(a in BUILTIN_AGENTS for a in agents):
            # The built-in framework agents have tools for these tasks only.
            axes["tasks"] = AGENT_TASKS
        suite = Suite(
            (
                Matrix(
                    models=tuple(models) or tuple(STUB_NAMES),
                    **{k: tuple(v) for k, v in axes.items() if v and k != "models"},
                ),
            )
        )
    else:
        suite = load_suite(DEFAULT_SUITE)
    if epochs is not None:
        suite = replace(suite, epochs=epochs)
    if limit is not None:
        suite = replace(suite, limit=limit)
    if agent_cmd is not None:
        suite = replace(suite, agent_cmd=agent_cmd)
    if suite.agent_cmd is not None and agents:
        raise SuiteError(
            f"--agent-cmd runs its command as the agent of every trial; it does not combine "
            f"with --agent {agents[0]!r} (run that agent in its own --log-dir)"
        )
    if agent_timeout is not None:
        suite = replace(suite, agent_timeout=agent_timeout)
    if outage_window is not None:  # the flag wins over the suite file's key
        suite = replace(suite, outage_window=outage_window)
    if hang_seconds is not None:
        suite = replace(suite, hang_seconds=hang_seconds)
    if max_agent_cmds is not None:
        suite = replace(suite, max_agent_cmds=max_agent_cmds)
    if mocks:
        suite = replace(suite, mocks=dict(mocks))
    suite.validate()
    return suite
