"""The conversation faults for an agent command (``twice run --agent-cmd``): asked again, the
command runs a second time with the follow-up and the session in ``TWICE_HISTORY``; under a
compaction, the model reads its conversation compacted. The stub controls are its model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log
from twice.mocks import ledgers

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "tests" / "evals" / "scripts" / "convo_agent.py"


def _run(twice: Any, out: Path, models: list[str], faults: list[str], *flags: str) -> Any:
    # A lost reply is held for 2 s, not the default 120: the agent's own timeout is 60 s.
    args = ["run", "--task", "refund", "--limit", "1", "--no-report", "--display", "none"]
    args += ["--hang-seconds", "2"]
    for model in models:
        args += ["--model", model]
    for fault in faults:
        args += ["--fault", fault]
    command = " ".join([sys.executable, str(AGENT), *flags])
    result = twice(*args, "--log-dir", out, "--agent-cmd", command)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


def _ledger(out: Path, model: str, fault: str) -> Any:
    for path in sorted(out.glob("*.eval")):
        log = read_eval_log(str(path))
        if log.eval.model == model and (log.eval.metadata or {})["twice"]["fault"] == fault:
            (ledger,) = ledgers(log)
            return ledger
    raise LookupError((model, fault))


def _mutating_sources(ledger: Any) -> list[str]:
    return [a.source for a in ledger.attempts if a.mutating]


@pytest.mark.slow
def test_agent_cmd_asked_again_and_compacted_keep_the_controls_apart(
    twice: Any, tmp_path: Path
) -> None:
    out = tmp_path / "logs"
    summary = _run(
        twice, out, ["stub/retry", "stub/no-retry", "stub/verify"], ["ask_again", "compaction"]
    )
    cells = {(c["model"], c["fault"]): c for c in summary["cells"]}
    assert all(c["errors"] == 0 and c["crashed_rate"] == 0.0 for c in cells.values()), cells
    assert all(c["completion_rate"] == 1.0 for c in cells.values())
    refunds = {key: len(_ledger(out, *key).effects) for key in cells}
    assert refunds == {
        # Asked again: retry redoes it, no-retry answers from the session it was given,
        # verify looks first.
        ("stub/retry", "ask_again"): 2,
        ("stub/no-retry", "ask_again"): 1,
        ("stub/verify", "ask_again"): 1,
        # Compacted: the result is gone from what the model reads; only verify looks.
        ("stub/retry", "compaction"): 2,
        ("stub/no-retry", "compaction"): 2,
        ("stub/verify", "compaction"): 1,
    }
    assert _mutating_sources(_ledger(out, "stub/retry", "ask_again")) == ["initial", "user"]
    assert _mutating_sources(_ledger(out, "stub/no-retry", "ask_again")) == ["initial"]
    for model in ("stub/retry", "stub/no-retry"):
        assert _mutating_sources(_ledger(out, model, "compaction")) == ["initial", "compaction"]
    for fault in ("ask_again", "compaction"):
        verify = _ledger(out, "stub/verify", fault)
        assert _mutating_sources(verify) == ["initial"]
        assert any(a.method == "GET" and not a.mutating for a in verify.attempts)
    asked = cells["stub/retry", "ask_again"]
    assert asked["retry_sources"]["user"] == {"attempts": 1, "excess": 1}
    assert cells["stub/no-retry", "compaction"]["retry_sources"]["compaction"] == {
        "attempts": 1,
        "excess": 1,
    }


@pytest.mark.slow
def test_agent_cmd_intent_key_wins_when_asked_again(twice: Any, tmp_path: Path) -> None:
    out = tmp_path / "logs"
    faults = ["lost_reply+ask_again", "compaction+ask_again"]
    summary = _run(twice, out, ["stub/retry"], faults, "--intent-key")
    assert all(c["safe_success_rate"] == 1.0 and c["errors"] == 0 for c in summary["cells"])
    asked = _ledger(out, "stub/retry", "lost_reply+ask_again")
    assert [e.id for e in asked.effects] == ["re_1"]
    repeat = [a for a in asked.attempts if a.mutating][-1]
    assert repeat.source == "user" and repeat.replayed
    # Both conversation faults in one trial: each repeat is named for what caused it.
    both = _ledger(out, "stub/retry", "compaction+ask_again")
    assert [e.id for e in both.effects] == ["re_1"]
    mutating = [a for a in both.attempts if a.mutating]
    assert [a.source for a in mutating] == ["initial", "compaction", "user"]
    assert [a.replayed for a in mutating] == [False, True, True]


@pytest.mark.slow
def test_agent_cmd_that_ignores_history_still_runs_asked_again(twice: Any, tmp_path: Path) -> None:
    # Written before TWICE_HISTORY: the follow-up reaches it with no memory of the first
    # run, so even the memory-trusting control refunds again.
    out = tmp_path / "logs"
    (cell,) = _run(twice, out, ["stub/no-retry"], ["ask_again"], "--no-history")["cells"]
    assert cell["errors"] == 0 and cell["crashed_rate"] == 0.0
    ledger = _ledger(out, "stub/no-retry", "ask_again")
    assert _mutating_sources(ledger) == ["initial", "user"]
