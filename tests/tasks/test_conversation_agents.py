"""The user asks again an agent under test: it is called a second time with the follow-up and
the first exchange in ``ctx.history``, and what that call sends carries the retry source user."""

from __future__ import annotations

from pathlib import Path

from batch_eval import batch_eval
from inspect_ai import task_with
from inspect_ai.log import resolve_sample_attachments
from inspect_ai.model import get_model
from twice.mocks import LEDGER_STORE_KEY
from twice.tasks import refund
from twice.tasks.agents import AGENT_STORE_KEY

AGENTS = ("openai-agents", "langgraph", "pydantic-ai")
STUBS = {"stub/retry": 2, "stub/no-retry": 1, "stub/verify": 1}
"""Refunds on the server after the user asks again, per control: retry redoes it, no-retry
answers from the session's history, verify looks first."""


def test_conversation_agents_asked_again_keep_the_controls_apart(tmp_path: Path) -> None:
    tasks = [
        task_with(
            refund(fault="ask_again", agent=agent), model=get_model(stub), name=f"{agent}|{stub}"
        )
        for agent in AGENTS
        for stub in STUBS
    ]
    logs = batch_eval(tasks, log_dir=str(tmp_path), limit=1, max_tasks=4)
    assert all(log.status == "success" for log in logs), [log.error for log in logs]
    seen = {}
    for log in logs:
        agent, stub = (log.eval.task or "").split("|")
        (sample,) = log.samples or []
        assert sample.store[AGENT_STORE_KEY]["crashed"] is False, sample.store[AGENT_STORE_KEY]
        ledger = sample.store[LEDGER_STORE_KEY]
        seen[agent, stub] = len(ledger["effects"])
        sources = [a["source"] for a in ledger["attempts"] if a["mutating"]]
        if stub == "stub/retry":
            # The agent's own tools say nothing; the follow-up's attempt is the user's.
            assert sources[-1] == "user" and sources.count("user") == 1, (agent, sources)
        else:
            assert "user" not in sources, (agent, stub, sources)
    assert seen == {(a, s): n for a in AGENTS for s, n in STUBS.items()}


COMPACTED = {"stub/retry": 2, "stub/no-retry": 2, "stub/verify": 1}
"""Refunds on the server after a compaction, per control: retry and no-retry have lost the
result and refund again, verify looks first (as in twice's own loop)."""


def test_conversation_agents_compaction_keeps_the_controls_apart(tmp_path: Path) -> None:
    # The model reads the agent's conversation compacted from the turn after the refund's
    # reply reached the agent; the agent's own process is left alone.
    agents = ("openai-agents", "langgraph")
    tasks = [
        task_with(
            refund(fault="compaction", agent=agent), model=get_model(stub), name=f"{agent}|{stub}"
        )
        for agent in agents
        for stub in COMPACTED
    ]
    logs = batch_eval(tasks, log_dir=str(tmp_path), limit=1, max_tasks=3)
    assert all(log.status == "success" for log in logs), [log.error for log in logs]
    seen = {}
    for log in logs:
        agent, stub = (log.eval.task or "").split("|")
        (sample,) = log.samples or []
        assert sample.store[AGENT_STORE_KEY]["crashed"] is False, sample.store[AGENT_STORE_KEY]
        ledger = sample.store[LEDGER_STORE_KEY]
        seen[agent, stub] = len(ledger["effects"])
        sources = [a["source"] for a in ledger["attempts"] if a["mutating"]]
        if COMPACTED[stub] == 2:
            assert sources == ["initial", "compaction"], (agent, stub, sources)
        else:
            assert sources == ["initial"], (agent, stub, sources)
        # The model's turn after the reply read the placeholder and the note, not the result.
        inputs = [
            " ".join(m.text for m in e.input)
            for e in resolve_sample_attachments(sample).events
            if e.event == "model" and e.input
        ]
        assert "(Tool result removed)" in inputs[1] and "compacted" in inputs[1]
        assert "re_1" not in inputs[1]
    assert seen == {(a, s): n for a in agents for s, n in COMPACTED.items()}


def test_conversation_agents_both_faults_name_each_repeat(tmp_path: Path) -> None:
    # Compacted after the refund's reply, then asked again after the final answer: the
    # follow-up's session is sent as the agent sends it, and each repeat is named for its cause.
    (log,) = batch_eval(
        refund(fault="compaction+ask_again", agent="langgraph"),
        model=get_model("stub/retry"),
        log_dir=str(tmp_path),
        limit=1,
    )
    assert log.status == "success", log.error
    (sample,) = log.samples or []
    ledger = sample.store[LEDGER_STORE_KEY]
    assert len(ledger["effects"]) == 3
    sources = [a["source"] for a in ledger["attempts"] if a["mutating"]]
    assert sources == ["initial", "compaction", "user"]
