"""The conversation faults (the user asks again, the context is compacted) through twice's
public path: one suite run (conftest ``conversation_run``), its summary.json and the ledgers in
its logs. The table in docs/concepts/reference-results.md is the one measured here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]


def cell(
    summary: dict[str, Any], model: str, fault: str, protection: str = "bare"
) -> dict[str, Any]:
    found = [
        c
        for c in summary["cells"]
        if (c["model"], c["fault"], c["protection"]) == (model, fault, protection)
    ]
    assert len(found) == 1, f"expected one cell for {model}/{fault}/{protection}, got {found}"
    return found[0]


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(
            [c.strip().replace("`", "").replace("**", "") for c in line.strip("|").split("|")]
        )
    return rows


def leading_int(text: str) -> int:
    return int(re.match(r"\d+", text).group())  # type: ignore[union-attr]


BARE = [
    # model, fault, refunds, completed, duplicated
    ("stub/retry", "ask_again", 2, True, True),
    ("stub/no-retry", "ask_again", 1, True, False),
    ("stub/verify", "ask_again", 1, True, False),
    ("stub/retry", "compaction", 2, True, True),
    ("stub/no-retry", "compaction", 2, True, True),
    ("stub/verify", "compaction", 1, True, False),
    ("stub/retry", "lost_reply+ask_again", 3, True, True),
    ("stub/no-retry", "lost_reply+ask_again", 1, True, False),
    ("stub/verify", "lost_reply+ask_again", 1, True, False),
    ("stub/retry", "timeout_before_commit+ask_again", 2, True, True),
    ("stub/no-retry", "timeout_before_commit+ask_again", 0, False, False),
    ("stub/verify", "timeout_before_commit+ask_again", 1, True, False),
]


@pytest.mark.parametrize(("model", "fault", "refunds", "completed", "duplicated"), BARE)
def test_conversation_faults_bare(
    conversation_summary: dict[str, Any],
    conversation_ledgers: Any,
    model: str,
    fault: str,
    refunds: int,
    completed: bool,
    duplicated: bool,
) -> None:
    c = cell(conversation_summary, model, fault)
    assert c["trials"] == 2 and c["errors"] == 0
    assert c["completion_rate"] == (1.0 if completed else 0.0)
    assert c["duplication_rate"] == (1.0 if duplicated else 0.0)
    for ledger in conversation_ledgers(model, fault, "bare"):
        assert len(ledger.effects) == refunds


def test_conversation_faults_tell_the_controls_apart(conversation_summary: dict[str, Any]) -> None:
    # Only looking before acting is safe from both: a memory-trusting agent survives the
    # user asking again and duplicates after a compaction.
    safe = {
        model
        for model in ("stub/retry", "stub/no-retry", "stub/verify")
        if all(
            cell(conversation_summary, model, f)["safe_success_rate"] == 1.0
            for f in ("ask_again", "compaction")
        )
    }
    assert safe == {"stub/verify"}
    assert cell(conversation_summary, "stub/no-retry", "ask_again")["safe_success_rate"] == 1.0
    assert cell(conversation_summary, "stub/no-retry", "compaction")["duplication_rate"] == 1.0


@pytest.mark.parametrize(
    ("protection", "refunds"),
    [("intent-key", 1), ("declared", 1), ("retry-stepkey", 2), ("lookup", 2)],
)
@pytest.mark.parametrize(
    ("model", "fault"),
    [
        ("stub/retry", "ask_again"),
        ("stub/retry", "compaction"),
        ("stub/no-retry", "compaction"),
    ],
)
def test_conversation_faults_protections(
    conversation_summary: dict[str, Any],
    conversation_ledgers: Any,
    model: str,
    fault: str,
    protection: str,
    refunds: int,
) -> None:
    # A key derived from the intent, or the durable action log, wins: the repeat is the same
    # intent. A key per tool call, or a lookup before transport retries only, loses: the
    # repeat is a new tool call, sent as the first attempt of a new key.
    for ledger in conversation_ledgers(model, fault, protection):
        assert len(ledger.effects) == refunds
    c = cell(conversation_summary, model, fault, protection)
    assert c["duplication_rate"] == (1.0 if refunds > 1 else 0.0)
    assert c["completion_rate"] == 1.0


@pytest.mark.parametrize("protection", ["intent-key", "declared", "retry-stepkey", "lookup"])
def test_conversation_faults_memory_trusting_agent_never_repeats_when_asked(
    conversation_ledgers: Any, protection: str
) -> None:
    for ledger in conversation_ledgers("stub/no-retry", "ask_again", protection):
        assert len(ledger.effects) == 1
        assert [a.source for a in ledger.attempts if a.mutating] == ["initial"]


@pytest.mark.parametrize("protection", ["intent-key", "declared"])
def test_conversation_faults_lost_reply_then_asked_again_is_won_by_the_intent(
    conversation_ledgers: Any, conversation_summary: dict[str, Any], protection: str
) -> None:
    for ledger in conversation_ledgers("stub/retry", "lost_reply+ask_again", protection):
        assert [e.id for e in ledger.effects] == ["re_1"]
    c = cell(conversation_summary, "stub/retry", "lost_reply+ask_again", protection)
    assert c["safe_success_rate"] == 1.0


@pytest.mark.parametrize(
    ("fault", "sources"),
    [
        ("ask_again", ["initial", "user"]),
        ("compaction", ["initial", "compaction"]),
        ("lost_reply+ask_again", ["initial", "model", "user"]),
    ],
)
def test_conversation_faults_name_their_retry_source(
    conversation_ledgers: Any, fault: str, sources: list[str]
) -> None:
    for ledger in conversation_ledgers("stub/retry", fault, "bare"):
        assert [a.source for a in ledger.attempts if a.mutating] == sources
        # The repeat made the excess effect, and the ledger says who sent it.
        last = ledger.attempt(ledger.effects[-1].attempt)
        assert last.source == sources[-1]


def test_conversation_faults_intent_key_replays_to_the_user_repeat(
    conversation_ledgers: Any,
) -> None:
    for ledger in conversation_ledgers("stub/retry", "ask_again", "intent-key"):
        first, repeat = [a for a in ledger.attempts if a.mutating]
        assert repeat.source == "user" and repeat.key == first.key and repeat.replayed


def test_conversation_faults_declared_answers_from_the_action_log(
    conversation_ledgers: Any,
) -> None:
    for fault in ("ask_again", "compaction"):
        for ledger in conversation_ledgers("stub/retry", fault, "declared"):
            # Nothing is sent again: the action log holds the result.
            assert len([a for a in ledger.attempts if a.mutating]) == 1
            assert any("from the action log" in t for t in ledger.observations)


def test_conversation_faults_verify_looks_before_it_acts(conversation_ledgers: Any) -> None:
    for fault in ("ask_again", "compaction"):
        for ledger in conversation_ledgers("stub/verify", fault, "bare"):
            reads = [a for a in ledger.attempts if not a.mutating and a.method == "GET"]
            assert reads, ledger.attempts
            assert len([a for a in ledger.attempts if a.mutating]) == 1


def test_conversation_faults_report_counts_the_new_sources(conversation_run: Any) -> None:
    trials = conversation_run.trials
    mine = trials[(trials["model"] == "stub/retry") & (trials["protection"] == "bare")]
    asked = mine[mine["fault"] == "ask_again"]
    compacted = mine[mine["fault"] == "compaction"]
    assert list(asked["excess_user"]) == [1.0, 1.0]
    assert list(compacted["excess_compaction"]) == [1.0, 1.0]
    html = Path(conversation_run.report_path).read_text(encoding="utf-8")
    assert "the user asked again" in html and "its context was compacted" in html


def test_the_reference_results_page_shows_the_conversation_table(
    conversation_ledgers: Any, conversation_summary: dict[str, Any]
) -> None:
    text = (ROOT / "docs/concepts/reference-results.md").read_text(encoding="utf-8")
    rows = markdown_table(text, "| model | conversation fault | protection | refunds |")
    assert rows
    for model, fault, protection, refunds, completed, duplicated in rows:
        ledgers = conversation_ledgers(model, fault, protection)
        assert ledgers and all(len(ledger.effects) == leading_int(refunds) for ledger in ledgers)
        c = cell(conversation_summary, model, fault, protection)
        assert c["completion_rate"] == (1.0 if completed == "yes" else 0.0), (model, fault)
        assert c["duplication_rate"] == (1.0 if duplicated == "yes" else 0.0), (model, fault)


def render_trial(run: Any, model: str, fault: str, sample: str = "refund-001") -> str:
    """One trial as the guide shows it: the conversation the model saw, then the ledger."""
    from inspect_ai.log import read_eval_log
    from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ChatMessageUser
    from twice.mocks import ledgers

    log = next(
        log
        for log in run.logs
        if log.eval.model == model and (log.eval.metadata or {})["twice"]["fault"] == fault
    )
    full = read_eval_log(log.location)
    index, trial = next((i, s) for i, s in enumerate(full.samples or []) if s.id == sample)
    lines = []
    for m in trial.messages:
        if isinstance(m, ChatMessageUser):
            lines.append(f"user: {m.text}")
        elif isinstance(m, ChatMessageAssistant) and m.tool_calls:
            calls = [
                f"{c.function}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})"
                for c in m.tool_calls
            ]
            lines.append("assistant: " + ", ".join(calls))
        elif isinstance(m, ChatMessageAssistant):
            lines.append(f"assistant: {m.text}")
        elif isinstance(m, ChatMessageTool):
            lines.append(f"tool: {m.error.message if m.error else m.text}")
    ledger = ledgers(full)[index]
    made = [
        f"{e.id} (attempt {e.attempt}, {ledger.attempt(e.attempt).source})" for e in ledger.effects
    ]
    lines.append("ledger: " + ", ".join(made))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("model", "fault"), [("stub/retry", "ask_again"), ("stub/no-retry", "compaction")]
)
def test_the_guide_shows_one_trial_of_each_as_it_ran(
    conversation_run: Any, readme_blocks: dict[str, str], model: str, fault: str
) -> None:
    shown = readme_blocks[f"output: conversation {fault}"]
    assert render_trial(conversation_run, model, fault) == shown


def test_the_conversation_suite_file_runs_the_controls_on_every_builtin_task() -> None:
    from twice.evals.suite import load_suite
    from twice.tasks import TASKS

    suite = load_suite(ROOT / "evals" / "conversation.toml")
    cells = suite.cells()
    for fault in ("ask_again", "compaction", "lost_reply+ask_again"):
        ran = {c.task for c in cells if c.fault == fault and c.model == "stub/verify"}
        assert ran == set(TASKS), (fault, set(TASKS) - ran)
    assert {c.protection for c in cells} >= {"intent-key", "declared", "retry-stepkey"}


def test_conversation_faults_tell_retry_from_verify_on_every_builtin_task(
    tmp_path: Path,
) -> None:
    import json

    from twice.evals import run_suite
    from twice.evals.suite._suite import Matrix, Suite
    from twice.tasks import TASKS

    suite = Suite(
        (
            Matrix(
                models=("stub/retry", "stub/verify"),
                tasks=tuple(TASKS),
                faults=("ask_again", "compaction"),
                protections=("bare",),
            ),
        ),
        limit=1,
        source="test",
    )
    run = run_suite(suite, tmp_path)
    assert run.ok, run.failed
    summary = json.loads(Path(run.summary_path).read_text())
    seen = {(c["model"], c["task"], c["fault"]): c for c in summary["cells"]}
    assert len(seen) == 2 * len(TASKS) * 2
    for (model, task, fault), c in seen.items():
        assert c["errors"] == 0, (model, task, fault)
        if model == "stub/verify":
            # Looking first: done once, on every task, whatever the conversation did.
            assert c["safe_success_rate"] == 1.0, (task, fault, c)
    retried = {t for (m, t, f), c in seen.items() if m == "stub/retry" and c["duplication_rate"]}
    # Archiving is naturally idempotent: redoing it commits nothing (that task's point).
    assert retried == set(TASKS) - {"archive_record"}


def test_conversation_faults_summary_names_the_retry_sources(
    conversation_summary: dict[str, Any],
) -> None:
    asked = cell(conversation_summary, "stub/retry", "ask_again")
    assert asked["retry_sources"] == {
        "initial": {"attempts": 2, "excess": 0},
        "user": {"attempts": 2, "excess": 2},
    }
    compacted = cell(conversation_summary, "stub/no-retry", "compaction")
    assert compacted["retry_sources"]["compaction"] == {"attempts": 2, "excess": 2}
    lost = cell(conversation_summary, "stub/retry", "lost_reply+ask_again")
    assert set(lost["retry_sources"]) == {"initial", "model", "user"}
    keyed = cell(conversation_summary, "stub/retry", "ask_again", "intent-key")
    assert keyed["retry_sources"]["user"] == {"attempts": 2, "excess": 0}


def test_conversation_faults_noisy_redoes_at_its_known_rate_when_asked(tmp_path: Path) -> None:
    import json

    from twice.evals import run_suite
    from twice.evals.suite._suite import Matrix, Suite
    from twice.mocks import noisy_retry_rate

    suite = Suite(
        (
            Matrix(
                models=("stub/noisy",),
                prompts=("baseline", "cautious", "persistent"),
                tasks=("refund",),
                faults=("ask_again",),
                protections=("bare",),
            ),
        ),
        source="test",
    )
    run = run_suite(suite, tmp_path)
    assert run.ok, run.failed
    for c in json.loads(Path(run.summary_path).read_text())["cells"]:
        lo, hi = c["duplication_ci"]
        # Asked again, it redoes the refund with its retry probability: the interval covers it.
        assert lo <= noisy_retry_rate(c["prompt"]) <= hi, c
        assert c["trials"] == 28 and c["completion_rate"] == 1.0


def test_conversation_faults_verify_asked_again_after_an_undone_saga_does_not_undo_twice(
    tmp_path: Path,
) -> None:
    from inspect_ai import eval
    from twice.mocks import ledgers
    from twice.tasks import travel_booking

    # travel-007's hotel is sold out: the flight is booked, then cancelled. Asked again, the
    # stub looks, finds the flight (cancelled) and no hotel, tries the hotel, fails again,
    # and has nothing left to undo: the flight it cancelled stays cancelled once.
    (log,) = eval(
        travel_booking(fault="ask_again"),
        model="stub/verify",
        sample_id="travel-007",
        log_dir=str(tmp_path),
        display="none",
    )
    (ledger,) = ledgers(log)
    assert [e.name for e in ledger.effects] == ["travel.flight.book", "travel.flight.cancel"]


def test_conversation_faults_both_in_one_trial_name_each_repeat(tmp_path: Path) -> None:
    from inspect_ai.log import read_eval_log
    from twice.evals import run_suite
    from twice.evals.suite._suite import Matrix, Suite
    from twice.mocks import ledgers

    suite = Suite(
        (
            Matrix(
                models=("stub/retry", "stub/no-retry", "stub/verify"),
                tasks=("refund",),
                faults=("compaction+ask_again",),
                protections=("bare", "intent-key"),
            ),
        ),
        limit=1,
        source="test",
    )
    run = run_suite(suite, tmp_path)
    assert run.ok, run.failed
    seen = {}
    for log in run.logs:
        protection = (log.eval.metadata or {})["twice"]["protection"]
        (ledger,) = ledgers(read_eval_log(log.location))
        seen[log.eval.model, protection] = (
            len(ledger.effects),
            [a.source for a in ledger.attempts if a.mutating],
        )
    assert seen == {
        # Compacted, it refunds again; asked again, it refunds a third time.
        ("stub/retry", "bare"): (3, ["initial", "compaction", "user"]),
        # Compacted, it refunds again; asked again, it answers from what it now remembers.
        ("stub/no-retry", "bare"): (2, ["initial", "compaction"]),
        ("stub/verify", "bare"): (1, ["initial"]),
        # One key for the intent: both repeats get the first refund back.
        ("stub/retry", "intent-key"): (1, ["initial", "compaction", "user"]),
        ("stub/no-retry", "intent-key"): (1, ["initial", "compaction"]),
        ("stub/verify", "intent-key"): (1, ["initial"]),
    }
