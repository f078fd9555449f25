"""The frameworks registry: one TOML file per row of the framework analysis.

Each ``frameworks/<row>.toml`` names an agent (a built-in one, ``agent``, or a command,
``agent_cmd``), the framework and setting it stands for, the packages whose versions the
analysis prints, and what the framework itself does with a tool call that raised, citing
its source (``[behaviour]``). ``twice frameworks`` runs every row under the stub controls;
the rows are read and checked here, once, into :class:`FrameworkRow` values.
"""

from __future__ import annotations

import re
import string
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._context import AgentError
from ._load import BUILTIN_AGENTS, EXTRA, REACT

FRAMEWORKS_DIR = Path(__file__).parent / "frameworks"
"""Where the registry's rows are (shipped with twice as package data)."""
COMMANDS_DIR = Path(__file__).parent / "commands"
"""Where the agent commands' folders are: ``{dir}`` in an ``agent_cmd`` is one of them."""

LANGUAGES = ("python", "javascript")
PLACEHOLDERS = ("dir", "python")
"""What an ``agent_cmd`` may name: ``{dir}`` (the agent's folder) and ``{python}`` (the
folder's own virtualenv interpreter, ``.venv/bin/python``)."""
ROW_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

_KEYS: dict[str, str] = {
    "row": "a string: the row's name, the file's stem",
    "framework": "a string: the framework's display name",
    "language": f"one of {', '.join(repr(x) for x in LANGUAGES)}",
    "setting": "a string: 'default', or the setting that differs from the defaults",
    "packages": "a list of strings: the distributions whose versions are printed",
    "agent": f"a string: {REACT!r} or a built-in agent ({', '.join(BUILTIN_AGENTS)})",
    "agent_cmd": "a string: the shell command that runs the agent ({dir}, {python} allowed)",
    "install": "a string: the command that installs the agent when it is missing",
    "dir": "a string: the agent's folder under tasks/agents/commands/ (default: the row's)",
    "behaviour": "a table with text, source and retries_by_itself",
}
_REQUIRED = ("row", "framework", "language", "setting", "packages", "behaviour")
_BEHAVIOUR_KEYS: dict[str, str] = {
    "text": "a string: what the framework does with a tool call that raised",
    "source": "a string: the file:lines or symbol in the installed package that does it",
    "retries_by_itself": "true or false: whether the framework re-sends a call on its own",
}


class FrameworkRowError(AgentError):
    """A registry file that cannot be used: names the file, the key, the bad value and what
    is accepted (exit 2)."""


@dataclass(frozen=True)
class Behaviour:
    """What a framework itself does with a tool call that raised, and where it does it."""

    text: str
    source: str
    """The setting or code path that does it (``file:lines`` or a symbol)."""
    retries_by_itself: bool
    """The expectation the analysis checks its measurement against."""


@dataclass(frozen=True)
class FrameworkRow:
    """One row of the framework analysis, as its registry file states it."""

    row: str
    framework: str
    language: str
    setting: str
    packages: tuple[str, ...]
    behaviour: Behaviour
    path: Path
    """The registry file it was read from."""
    agent: str | None = None
    """A built-in agent (what ``twice run --agent`` takes); None for a command row."""
    agent_cmd: str | None = None
    """The command's template (``{dir}``, ``{python}``); None for a built-in row."""
    install: str | None = None
    """How to install the agent when it is missing (a command row always has one)."""
    dir: str | None = None
    """The command's folder under :data:`COMMANDS_DIR`, when the file names it."""

    @property
    def is_command(self) -> bool:
        """Whether the row runs an agent command (``--agent-cmd``) rather than a built-in."""
        return self.agent_cmd is not None

    def how_to_install(self) -> str:
        """The command that installs the row's agent: the file's ``install``, else the extra
        its built-in agent names."""
        if self.install:
            return self.install
        builtin = BUILTIN_AGENTS.get(self.agent or "")
        return f"pip install 'twice[{builtin.extra if builtin else EXTRA}]'"

    def command_dir(self, commands: Path = COMMANDS_DIR) -> Path:
        """The folder ``{dir}`` stands for: the file's ``dir``, else the folder named as the
        row, else the longest folder name the row starts with followed by ``-`` (a variant
        ``langgraph-js-retry`` shares ``langgraph-js``'s folder)."""
        if self.dir is not None:
            return commands / self.dir
        if (commands / self.row).is_dir() or not commands.is_dir():
            return commands / self.row
        shared = [
            d.name for d in commands.iterdir() if d.is_dir() and self.row.startswith(d.name + "-")
        ]
        return commands / max(shared, key=len) if shared else commands / self.row

    def command(self, commands: Path = COMMANDS_DIR) -> str:
        """The row's shell command with ``{dir}`` and ``{python}`` filled in (quoted)."""
        import shlex

        if self.agent_cmd is None:
            raise FrameworkRowError(f"{self.path}: row {self.row!r} runs no agent_cmd")
        folder = self.command_dir(commands).resolve()
        python = folder / ".venv" / "bin" / "python"
        return self.agent_cmd.format(dir=shlex.quote(str(folder)), python=shlex.quote(str(python)))


def load_framework_row(path: str | Path) -> FrameworkRow:
    """Read and check one registry file.

    Raises:
        FrameworkRowError: naming the file, the key, the bad value and what is accepted.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))
    except OSError as ex:
        raise FrameworkRowError(f"{p}: cannot read it: {ex.strerror or ex}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as ex:
        raise FrameworkRowError(f"{p}: not a valid TOML file: {ex}") from None
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        raise FrameworkRowError(
            f"{p}: unknown key {unknown[0]!r}; accepted keys: {', '.join(_KEYS)}"
        )
    for key in _REQUIRED:
        if key not in data:
            raise FrameworkRowError(f"{p}: missing key {key!r} ({_KEYS[key]})")
    row = _string(data, "row", p)
    if not ROW_NAME.match(row) or row != p.stem:
        raise FrameworkRowError(
            f"{p}: row = {row!r} must be the file's stem {p.stem!r}, in lowercase letters, "
            "digits, '.', '_' and '-'"
        )
    language = _string(data, "language", p)
    if language not in LANGUAGES:
        raise FrameworkRowError(f"{p}: language = {language!r}; expected {_KEYS['language']}")
    packages = data["packages"]
    if not isinstance(packages, list) or not all(isinstance(x, str) and x for x in packages):
        raise FrameworkRowError(f"{p}: packages = {packages!r}; expected {_KEYS['packages']}")
    agent, agent_cmd = _agent(data, p)
    install = _string(data, "install", p) if "install" in data else None
    if agent_cmd is not None and install is None:
        raise FrameworkRowError(
            f"{p}: an agent_cmd row needs key 'install' ({_KEYS['install']}), e.g. "
            "'make frameworks-install'"
        )
    folder = _string(data, "dir", p) if "dir" in data else None
    if folder is not None and (agent_cmd is None or not ROW_NAME.match(folder)):
        raise FrameworkRowError(
            f"{p}: dir = {folder!r}; expected {_KEYS['dir']}, in an agent_cmd row only"
        )
    return FrameworkRow(
        row=row,
        framework=_string(data, "framework", p),
        language=language,
        setting=_string(data, "setting", p),
        packages=tuple(packages),
        behaviour=_behaviour(data["behaviour"], p),
        path=p,
        agent=agent,
        agent_cmd=agent_cmd,
        install=install,
        dir=folder,
    )


def load_frameworks(directory: str | Path = FRAMEWORKS_DIR) -> tuple[FrameworkRow, ...]:
    """Every row of the registry in ``directory``, sorted by row name.

    Raises:
        FrameworkRowError: for a bad file, or two rows running the same agent.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise FrameworkRowError(f"{folder}: no such directory of framework rows (*.toml)")
    rows = [load_framework_row(f) for f in sorted(folder.glob("*.toml"))]
    seen: dict[str, Path] = {}
    for r in rows:
        # Commands are compared filled in: `node {dir}/agent.mjs` is a different agent in each
        # row's own folder.
        agent = r.agent if r.agent is not None else f"agent_cmd = {r.command()!r}"
        if agent in seen:
            raise FrameworkRowError(
                f"{r.path}: runs the same agent ({agent}) as {seen[agent]}; each row is one "
                "agent (give the variant its own agent or command)"
            )
        seen[agent] = r.path
    return tuple(sorted(rows, key=lambda r: r.row))


def _string(
    data: dict[str, Any], key: str, p: Path, what: dict[str, str] = _KEYS, prefix: str = ""
) -> str:
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise FrameworkRowError(f"{p}: {prefix}{key} = {value!r}; expected {what[key]}")
    return value


def _agent(data: dict[str, Any], p: Path) -> tuple[str | None, str | None]:
    """The row's ``agent`` or ``agent_cmd``: exactly one, each checked."""
    if ("agent" in data) == ("agent_cmd" in data):
        given = "both" if "agent" in data else "neither"
        raise FrameworkRowError(
            f"{p}: {given} of 'agent' and 'agent_cmd' given; expected exactly one: "
            f"agent ({_KEYS['agent']}) or agent_cmd ({_KEYS['agent_cmd']})"
        )
    if "agent" in data:
        agent = _string(data, "agent", p)
        if agent != REACT and agent not in BUILTIN_AGENTS:
            raise FrameworkRowError(f"{p}: agent = {agent!r}; expected {_KEYS['agent']}")
        return agent, None
    command = _string(data, "agent_cmd", p)
    try:
        named = [field for _, field, _, _ in string.Formatter().parse(command) if field is not None]
    except ValueError as ex:
        raise FrameworkRowError(
            f"{p}: agent_cmd = {command!r} is not a command template ({ex}); write a literal "
            "brace as {{ or }}"
        ) from None
    bad = [f for f in named if f not in PLACEHOLDERS]
    if bad:
        raise FrameworkRowError(
            f"{p}: agent_cmd = {command!r} names {{{bad[0]}}}; accepted placeholders: "
            + ", ".join("{" + x + "}" for x in PLACEHOLDERS)
        )
    return None, command


def _behaviour(value: Any, p: Path) -> Behaviour:
    if not isinstance(value, dict):
        raise FrameworkRowError(f"{p}: behaviour = {value!r}; expected {_KEYS['behaviour']}")
    unknown = [k for k in value if k not in _BEHAVIOUR_KEYS]
    if unknown:
        raise FrameworkRowError(
            f"{p}: unknown key behaviour.{unknown[0]}; accepted: "
            + ", ".join(f"behaviour.{k}" for k in _BEHAVIOUR_KEYS)
        )
    for key in _BEHAVIOUR_KEYS:
        if key not in value:
            raise FrameworkRowError(f"{p}: missing key behaviour.{key} ({_BEHAVIOUR_KEYS[key]})")
    retries = value["retries_by_itself"]
    if not isinstance(retries, bool):
        raise FrameworkRowError(
            f"{p}: behaviour.retries_by_itself = {retries!r}; expected "
            f"{_BEHAVIOUR_KEYS['retries_by_itself']}"
        )
    text = _string(value, "text", p, _BEHAVIOUR_KEYS, "behaviour.")
    source = _string(value, "source", p, _BEHAVIOUR_KEYS, "behaviour.")
    return Behaviour(text=text, source=source, retries_by_itself=retries)
