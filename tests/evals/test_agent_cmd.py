"""``twice run --agent-cmd``: an agent outside twice, over real HTTP, scored like any trial."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from twice.evals._suite import SuiteError, load_suite, suite_from_flags
from twice.evals.cli import cli

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "docs" / "examples" / "http_agent.py"


@pytest.mark.slow
def test_run_agent_cmd_scores_the_external_agents_ledger(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--task",
            "refund",
            "--model",
            "stub/retry",
            "--model",
            "stub/no-retry",
            "--fault",
            "lost_reply",
            "--limit",
            "1",
            "--no-report",
            "--display",
            "none",
            "--log-dir",
            str(out),
            "--agent-cmd",
            f"{sys.executable} {AGENT}",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    dup = {c["model"]: c["duplication_rate"] for c in summary["cells"]}
    # The stub's retry reaches the agent's own tool code: the retry refunds again.
    assert dup == {"stub/retry": 1.0, "stub/no-retry": 0.0}
    assert all(c["errors"] == 0 and c["completion_rate"] == 1.0 for c in summary["cells"])
    assert all(c["crashed_rate"] == 0.0 for c in summary["cells"])  # it exited 0
    assert summary["run"]["agent_cmd"].endswith("http_agent.py")


@pytest.mark.slow
def test_a_failed_agent_command_crashed_and_what_it_printed_is_logged_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged_text: Callable[[Path], str]
) -> None:
    # The command's output tails (twice's info event) and inspect's sandbox event kept a
    # credential the command printed.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    script = tmp_path / "prints.py"
    script.write_text(
        "import os, sys\n"
        "print('token is', os.environ['MY_SERVICE_TOKEN'])\n"
        "print('and again', os.environ['MY_SERVICE_TOKEN'], file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "none", "--limit",
         "1", "--no-report", "--display", "none", "--log-dir", str(out),
         "--agent-cmd", f"{sys.executable} {script}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    logged = logged_text(out)
    assert "token is [redacted]" in logged and "and again [redacted]" in logged
    assert "tok-SECRET789" not in logged
    # A command that fails is an agent that crashed (it used to count as a clean run).
    (cell,) = json.loads((out / "summary.json").read_text())["cells"]
    assert cell["crashed_rate"] == 1.0 and cell["errors"] == 0
    assert "exit 3: and again [redacted]" in logged


def test_agent_cmd_in_toml_and_its_bad_values(tmp_path: Path) -> None:
    good = tmp_path / "suite.toml"
    good.write_text('agent_cmd = "node my_agent.js"\n[[matrix]]\nmodels = ["stub/retry"]\n')
    assert load_suite(good).agent_cmd == "node my_agent.js"
    bad = tmp_path / "bad.toml"
    bad.write_text('agent_cmd = ["node"]\n[[matrix]]\nmodels = ["stub/retry"]\n')
    with pytest.raises(SuiteError, match="'agent_cmd' must be a string"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="agent_cmd is empty"):
        suite_from_flags(
            config=None,
            models=["stub/retry"],
            prompts=[],
            tasks=[],
            faults=[],
            protections=[],
            epochs=None,
            limit=None,
            agent_cmd="  ",
        )
