"""The shipped command agents (``tasks/agents/commands/*/agent.mjs`` and ``agent.py``) under
``twice run --agent-cmd``.

Each runs the refund task under ``lost_reply`` with the controls that never retry and that
always retry: a framework that leaves the decision to the model refunds once with the first and
twice with the second; one that retries by itself refunds twice with both, and the attribution
names the framework. The agents are installed by ``make frameworks-install`` (``.ci/run`` does
it): a test skips, saying so, only when node and npm or the installed folder are missing, and
fails instead when the ``CI`` variable is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from twice.evals.cli import cli

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "tasks" / "agents" / "commands"
ROWS = ROOT / "tasks" / "agents" / "frameworks"


@dataclass(frozen=True)
class Shipped:
    """A registry row of a shipped command agent, as these tests read it."""

    row: str
    language: str
    command: str
    folder: Path
    retries_by_itself: bool


def _shipped() -> list[Shipped]:
    rows = []
    for path in sorted(ROWS.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        if "agent_cmd" not in data:
            continue
        folder = COMMANDS / data.get("dir", data["row"])
        command = data["agent_cmd"].format(dir=folder, python=folder / ".venv" / "bin" / "python")
        by_itself = data["behaviour"]["retries_by_itself"]
        rows.append(Shipped(data["row"], data["language"], command, folder, by_itself))
    return rows


SHIPPED = _shipped()

HIDES_THE_TIMEOUT = {
    "llamaindex": "it hands the model str(exception), and an httpx ReadTimeout's is empty",
}
"""Rows whose framework shows the model a lost reply as an empty, successful-looking result:
the control that always retries then has nothing to retry, and refunds once."""

EMAIL_ROWS = ("vercel-ai", "llamaindex")
"""One agent per language on the send_email task: the tools' wrapping is the framework's,
the same for every task, and the refund runs above cover it for every agent."""


def _require_installed(agent: Shipped) -> None:
    """Skip (fail under CI) when the agent cannot run here, with what installs it."""
    if agent.language == "javascript":
        missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
        installed = (agent.folder / "node_modules" / ".package-lock.json").is_file()
        if missing:
            _missing(f"{' and '.join(missing)} not on PATH (Debian: apt-get install nodejs npm)")
    else:
        installed = (agent.folder / ".venv" / ".installed").is_file()
    if not installed:
        _missing(f"{agent.folder.relative_to(ROOT)} is not installed: run make frameworks-install")


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {message}")
    pytest.skip(message)


def _run(out: Path, command: str, task: str, *models: str) -> dict[str, dict[str, Any]]:
    args = ["run", "--task", task, "--fault", "lost_reply", "--limit", "1", "--no-report",
            "--display", "none", "--log-dir", str(out), "--agent-cmd", command]  # fmt: skip
    for model in models:
        args += ["--model", model]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    cells = json.loads((out / "summary.json").read_text())["cells"]
    return {c["model"]: c for c in cells}


def test_every_shipped_command_agent_has_a_row_and_a_folder() -> None:
    # A row's folder and a folder's row: an agent nobody can select, or a row that runs nothing.
    folders = {p.parent.name for p in COMMANDS.glob("*/agent.*")}
    assert folders == {a.folder.name for a in SHIPPED}
    for agent in SHIPPED:
        lock = "package-lock.json" if agent.language == "javascript" else "requirements.txt"
        assert (agent.folder / lock).is_file(), agent.row


@pytest.mark.slow
@pytest.mark.parametrize("agent", SHIPPED, ids=[a.row for a in SHIPPED])
def test_a_command_agent_refunds_as_its_framework_decides(tmp_path: Path, agent: Shipped) -> None:
    _require_installed(agent)
    cells = _run(tmp_path / "logs", agent.command, "refund", "stub/no-retry", "stub/retry")
    for cell in cells.values():
        # Every trial ran to its end and refunded: the agent's tools reached the service.
        assert cell["errors"] == 0 and cell["crashed_rate"] == 0.0, cell
        assert cell["completion_rate"] == 1.0, cell
    never, always = cells["stub/no-retry"], cells["stub/retry"]
    # The model's retry goes through the tool, unless the framework hid the timeout from it.
    assert always["duplication_rate"] == (0.0 if agent.row in HIDES_THE_TIMEOUT else 1.0)
    if agent.retries_by_itself:
        assert never["duplication_rate"] == 1.0  # a model that never retries: 2 refunds
        assert never["framework_duplication_rate"] == 1.0
        assert never["retry_sources"]["framework"]["excess"] == 1
    else:
        assert never["duplication_rate"] == 0.0  # one refund: nothing retried it
        assert "framework" not in never["retry_sources"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "agent",
    [a for a in SHIPPED if a.row in EMAIL_ROWS],
    ids=[a.row for a in SHIPPED if a.row in EMAIL_ROWS],
)
def test_a_command_agent_sends_the_email_once_with_a_model_that_never_retries(
    tmp_path: Path, agent: Shipped
) -> None:
    _require_installed(agent)
    cell = _run(tmp_path / "logs", agent.command, "send_email", "stub/no-retry")["stub/no-retry"]
    assert cell["errors"] == 0 and cell["crashed_rate"] == 0.0, cell
    assert cell["completion_rate"] == 1.0 and cell["duplication_rate"] == 0.0, cell


OFF_LOOPBACK = re.compile(
    r'sin_addr=inet_addr\("(?!127\.)[^"]*"\)|inet_pton\(AF_INET6, "(?!::1"|::ffff:127\.)[^"]*"'
)
"""A socket address in strace's output that is not a loopback one."""


@pytest.mark.slow
def test_the_claude_agent_sdk_agent_connects_to_loopback_only(tmp_path: Path) -> None:
    # Its CLI resolves api.anthropic.com unless its non-essential traffic is switched off: every
    # address the agent and the CLI it starts connect or send to is 127.0.0.1 (or ::1).
    agent = next(a for a in SHIPPED if a.row == "claude-agent-sdk")
    _require_installed(agent)
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-f", "-o", os.devnull, "true"]).returncode:
        pytest.skip("strace cannot trace here (not installed, or ptrace is not allowed)")
    traced = tmp_path / "strace.txt"
    calls = "trace=connect,sendto,sendmsg,sendmmsg"
    command = f"{strace} -f -qq -e {calls} -o {traced} {agent.command}"
    cell = _run(tmp_path / "logs", command, "refund", "stub/no-retry")["stub/no-retry"]
    assert cell["errors"] == 0 and cell["crashed_rate"] == 0.0, cell
    assert cell["completion_rate"] == 1.0, cell  # the agent ran: its refund reached the service
    text = traced.read_text()
    assert re.search(r'sin_addr=inet_addr\("127\.0\.0\.1"\)', text), "no connection traced"
    assert [line for line in text.splitlines() if OFF_LOOPBACK.search(line)] == []
