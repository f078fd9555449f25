"""The conversation faults from the command line: names checked up front, agents that keep
their own conversation refused with the faults that apply, a run that counts the new
retry sources."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize(
    "fault", ["ask_again+lost_reply", "lost+ask_again", "ask_again+compaction", "asked_again"]
)
def test_conversation_cli_bad_fault_name_exits_2_naming_it(
    twice: Any, tmp_path: Path, fault: str
) -> None:
    result = twice("run", "--log-dir", tmp_path / "logs", "--fault", fault, "--limit", "1")
    assert result.exit_code == 2, result.stdout
    line = " ".join(result.stderr.split())
    assert f"unknown fault {fault!r}" in line and "joined by '+'" in line
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("fault", ["compaction", "lost_reply+ask_again"])
def test_conversation_cli_agents_under_test_take_the_conversation_faults(fault: str) -> None:
    from twice.evals.suite import suite_from_flags

    # Both kinds of agent under test: each cell plans (no trial runs here).
    for agent in ({"agents": ("langgraph",)}, {"agent_cmd": "python my_agent.py"}):
        suite = suite_from_flags(
            config=None, models=("stub/retry",), prompts=(), tasks=("refund",),
            faults=(fault,), protections=(), epochs=None, limit=1, **agent,
        )  # fmt: skip
        assert {c.fault for c in suite.cells()} == {fault}


def test_conversation_cli_crash_after_commit_is_still_refused_for_an_agent_cmd(
    twice: Any, tmp_path: Path
) -> None:
    result = twice(
        "run", "--log-dir", tmp_path / "logs", "--agent-cmd", "true", "--fault",
        "crash_after_commit", "--limit", "1",
    )  # fmt: skip
    assert result.exit_code == 2, result.stdout
    assert "'crash_after_commit' restarts" in " ".join(result.stderr.split())


def test_conversation_cli_run_counts_user_and_compaction_sources(
    twice: Any, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    result = twice(
        "run", "--log-dir", logs, "--model", "stub/retry", "--task", "refund",
        "--fault", "ask_again", "--fault", "compaction", "--protection", "bare",
        "--limit", "2", "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = json.loads((logs / "summary.json").read_text())
    faults = {c["fault"]: c for c in summary["cells"]}
    assert set(faults) == {"ask_again", "compaction"}
    assert all(c["duplication_rate"] == 1.0 for c in faults.values())
    html = (logs / "report.html").read_text(encoding="utf-8")
    assert "the user asked again" in html and "its context was compacted" in html


def test_conversation_cli_list_names_the_conversation_faults(twice: Any) -> None:
    result = twice("list")
    assert result.exit_code == 0
    assert "ask_again" in result.stdout and "compaction" in result.stdout
    assert "lost_reply+ask_again" in result.stdout
