"""The further built-in framework agents (AutoGen, Agno, ADK, smolagents, Strands) on the controls.

One lost reply on the refund task, under each stub control: how many refunds the payments
service made, whether the agent crashed, and who sent each excess refund.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from batch_eval import batch_eval
from inspect_ai import task_with
from inspect_ai.model import get_model
from twice.mocks import LEDGER_STORE_KEY
from twice.tasks import refund
from twice.tasks.agents import AGENT_STORE_KEY, BUILTIN_AGENTS, AgentError, check_agent

STUBS = ("stub/retry", "stub/no-retry", "stub/verify")

# Refunds under lost_reply, per agent × stub (retry, no-retry, verify): the guide's table.
# None of these frameworks re-sends a tool call by itself: stub/no-retry makes 1 refund
# everywhere, and every second refund is the model's.
TABLE: dict[str, tuple[int, int, int]] = {
    "autogen": (1, 1, 1),  # the run ends after the tool: the model never sees the error
    "autogen-reflect": (2, 1, 1),
    "agno": (2, 1, 1),
    "agno-retries": (2, 1, 1),  # Agent.retries never sees a tool's exception
    "google-adk": (1, 1, 1),  # the tool's exception aborts the run (crashed)
    "google-adk-reflect": (2, 1, 1),
    "smolagents": (2, 1, 1),  # through the sync client, answered by the bridge
}
CRASHES = {"google-adk": "ReadTimeout: timed out waiting for the response"}


@pytest.mark.slow
def test_framework_agents_under_a_lost_reply_make_the_tables_refunds(tmp_path: Path) -> None:
    tasks = [
        task_with(
            refund(fault="lost_reply", agent=agent), model=get_model(stub), name=f"{agent}|{stub}"
        )
        for agent in TABLE
        for stub in STUBS
    ]
    logs = batch_eval(tasks, log_dir=str(tmp_path), limit=1)
    assert all(log.status == "success" for log in logs), [log.error for log in logs]
    seen: dict[tuple[str, str], int] = {}
    for log in logs:
        agent, stub = log.eval.task.split("|")
        (sample,) = log.samples or []
        crash = CRASHES.get(agent, "")
        assert sample.store[AGENT_STORE_KEY] == {
            "agent": agent,
            "crashed": bool(crash),
            "error": crash,
        }, (agent, stub)
        ledger: dict[str, Any] = sample.store[LEDGER_STORE_KEY]
        seen[agent, stub] = len(ledger["effects"])
        refunds = [a for a in ledger["attempts"] if a["route"] == "payments.refund.create"]
        # The first attempt is the model's call; any other is the model's again (the
        # framework sent none of its own).
        assert [a["source"] for a in refunds] == ["initial"] + ["model"] * (len(refunds) - 1), (
            agent,
            stub,
        )
    assert seen == {
        (agent, stub): TABLE[agent][STUBS.index(stub)] for agent in TABLE for stub in STUBS
    }


def test_agno_under_a_lost_reply_prints_no_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Agno logs a tool call that raised, traceback and all, to stdout; twice's output is the
    # run's table, and the failure is in the transcript.
    pytest.importorskip("agno")
    (log,) = batch_eval(
        refund(fault="lost_reply", agent="agno"), model=get_model("stub/no-retry"),
        log_dir=str(tmp_path), limit=1,
    )  # fmt: skip
    assert log.status == "success", log.error
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "timed out waiting" not in out


# Strands, in its own extra (make test-strands): with the retry hook the framework re-sends
# the refund by itself, so even stub/no-retry makes 2, and the second is the framework's.
STRANDS: dict[str, tuple[tuple[int, int, int], str]] = {
    "strands": ((2, 1, 1), "model"),
    "strands-retry": ((2, 2, 2), "framework"),
}


@pytest.mark.skipif(
    importlib.util.find_spec("strands") is None,
    reason="Strands is not in dev (its mcp pin conflicts with serve's): make test-strands",
)
def test_strands_agents_under_a_lost_reply_name_who_resent_the_refund(tmp_path: Path) -> None:
    tasks = [
        task_with(
            refund(fault="lost_reply", agent=agent), model=get_model(stub), name=f"{agent}|{stub}"
        )
        for agent in STRANDS
        for stub in STUBS
    ]
    logs = batch_eval(tasks, log_dir=str(tmp_path), limit=1)
    assert all(log.status == "success" for log in logs), [log.error for log in logs]
    for log in logs:
        agent, stub = log.eval.task.split("|")
        (sample,) = log.samples or []
        assert sample.store[AGENT_STORE_KEY]["crashed"] is False
        ledger: dict[str, Any] = sample.store[LEDGER_STORE_KEY]
        refunds, excess = STRANDS[agent]
        assert len(ledger["effects"]) == refunds[STUBS.index(stub)], (agent, stub)
        sources = [
            a["source"] for a in ledger["attempts"] if a["route"] == "payments.refund.create"
        ]
        assert sources == ["initial"] + [excess] * (len(sources) - 1), (agent, stub)


def test_framework_agents_are_registered_with_their_extra() -> None:
    assert BUILTIN_AGENTS["strands"].extra == BUILTIN_AGENTS["strands-retry"].extra == "strands"
    for name in TABLE:
        assert BUILTIN_AGENTS[name].extra == "frameworks", name


def test_a_framework_agent_whose_package_is_missing_names_the_frameworks_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "google" or name.startswith("google."):
            raise ModuleNotFoundError(name)  # a dotted name whose parent is missing
        return None if name == "agno" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    extra = r"optional extra 'frameworks': pip install 'twice\[frameworks\]'"
    with pytest.raises(AgentError, match=f"'agno' needs the package that provides 'agno'.*{extra}"):
        check_agent("agno")
    with pytest.raises(AgentError, match=f"provides 'google.adk'.*{extra}"):
        check_agent("google-adk-reflect")
    check_agent("autogen")


def test_the_agent_guide_shows_the_lost_reply_table_the_test_measures() -> None:
    guide = Path(__file__).parents[2] / "docs" / "guides" / "own-agent.md"
    lines = guide.read_text(encoding="utf-8").splitlines()
    header = "| agent | `stub/retry` | `stub/no-retry` | `stub/verify` | why |"
    shown: dict[str, tuple[int, ...]] = {}
    # Two tables: the frameworks extra's, then the strands extra's.
    for start in (i for i, line in enumerate(lines) if line == header):
        for line in lines[start + 2 :]:
            if not line.startswith("|"):
                break
            agent, *cells = (c.strip().strip("`*") for c in line.strip("|").split("|"))
            shown[agent] = tuple(int(c.strip("*").split()[0]) for c in cells[:3])
    assert shown == TABLE | {agent: refunds for agent, (refunds, _) in STRANDS.items()}


@pytest.mark.parametrize("agent", TABLE)  # Strands alike, where installed
def test_ask_again_is_refused_for_an_agent_that_keeps_no_session(agent: str) -> None:
    # Each runs one request with no session: asked again, its framework would start afresh
    # and every control would refund again, which would read as a finding about it.
    with pytest.raises(AgentError, match=f"built-in agent '{agent}' does not pass the session"):
        refund(fault="lost_reply+ask_again", agent=agent)
