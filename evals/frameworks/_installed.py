"""Whether a registry row's agent is installed here, and the versions of its packages."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from twice.tasks.agents import (
    BUILTIN_AGENTS,
    COMMANDS_DIR,
    REACT,
    AgentError,
    FrameworkRow,
    check_agent,
)

VERSION_TIMEOUT = 60.0
"""Seconds a command row's own interpreter may take to report its packages' versions."""


@dataclass(frozen=True)
class RowStatus:
    """A registry row as found on this machine."""

    row: FrameworkRow
    missing: str | None = None
    """Why the agent cannot run here, ending with how to install it; None when installed."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """The row's packages and their installed versions (None: not found)."""
    command: str | None = None
    """A command row's shell command, its placeholders filled in."""

    @property
    def installed(self) -> bool:
        """Whether the row's agent can run here."""
        return self.missing is None


def row_status(row: FrameworkRow, commands: Path = COMMANDS_DIR) -> RowStatus:
    """Find ``row``'s agent and its packages' versions (nothing is installed or run but a
    command row's own Python, asked for its versions)."""
    if row.is_command:
        return _command_status(row, commands)
    return _builtin_status(row)


def _builtin_status(row: FrameworkRow) -> RowStatus:
    versions = {p: _version(p) for p in row.packages}
    agent = row.agent or REACT
    try:
        check_agent(agent)
        for module in BUILTIN_AGENTS[agent].modules if agent in BUILTIN_AGENTS else ():
            # find_spec (check_agent) finds a package whose own imports may still fail.
            importlib.import_module(module)
    except (AgentError, ImportError) as ex:
        why = ex.msg if isinstance(ex, ImportError) and ex.msg else str(ex)
        return RowStatus(row, f"{row.how_to_install()} ({why})", versions)
    return RowStatus(row, None, versions)


def _command_status(row: FrameworkRow, commands: Path) -> RowStatus:
    folder = row.command_dir(commands)
    command = row.command(commands)
    install = row.how_to_install()
    template = row.agent_cmd or ""
    if not folder.is_dir():
        return RowStatus(row, f"{install} (no folder {folder})", command=command)
    if row.language == "javascript":
        versions = {p: _node_version(folder, p) for p in row.packages}
        if shutil.which("node") is None and template.lstrip().startswith("node"):
            return RowStatus(row, f"{install} (node is not on PATH)", versions, command)
    else:
        python = folder / ".venv" / "bin" / "python"
        if "{python}" in template and not python.is_file():
            return RowStatus(row, f"{install} (no {python})", command=command)
        versions = _venv_versions(python, row.packages) if python.is_file() else {}
        versions = {p: versions.get(p) for p in row.packages}
    absent = [p for p, v in versions.items() if v is None]
    if absent:
        return RowStatus(row, f"{install} ({absent[0]} is not installed in {folder})", versions)
    return RowStatus(row, None, versions, command)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _node_version(folder: Path, package: str) -> str | None:
    manifest = folder / "node_modules" / package / "package.json"
    try:
        version = json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


_VERSIONS_SCRIPT = """
import importlib.metadata as m, json, sys
out = {}
for p in sys.argv[1:]:
    try:
        out[p] = m.version(p)
    except m.PackageNotFoundError:
        out[p] = None
print(json.dumps(out))
"""


def _venv_versions(python: Path, packages: tuple[str, ...]) -> dict[str, str | None]:
    """The versions a command row's own interpreter has (its venv is not this process's)."""
    try:
        done = subprocess.run(
            [str(python), "-c", _VERSIONS_SCRIPT, *packages],
            capture_output=True, text=True, timeout=VERSION_TIMEOUT, check=False,
        )  # fmt: skip
        found = json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    return {str(k): (v if isinstance(v, str) else None) for k, v in found.items()}
