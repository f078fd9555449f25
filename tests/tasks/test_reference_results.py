"""The reference results and the seed demo's table, through twice's public path; the
tables the README and the site show are the ones measured here.

One in-process suite run (conftest ``reference_run``) → logs → summary.json; every assertion
here reads what a user would read: summary.json cells or the ledgers in the logs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest


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


def test_summary_has_design_keys(reference_summary: dict[str, Any]) -> None:
    required = {
        "model", "prompt", "task", "fault", "protection", "trials", "errors",
        "completion_rate", "duplication_rate", "duplication_ci", "exactly_once_rate",
        "safe_success_rate", "excess_effects_mean",
    }  # fmt: skip
    for c in reference_summary["cells"]:
        assert required <= set(c), required - set(c)
        assert c["trials"] == 4 and c["errors"] == 0
        lo, hi = c["duplication_ci"]
        assert 0.0 <= lo <= c["duplication_rate"] <= hi <= 1.0
        lo, hi = c["wrong_ci"]  # an addition: trials with an effect of other values
        assert 0.0 <= lo <= c["wrong_rate"] <= hi <= 1.0
        assert c["wrong_effects_mean"] >= 0.0


@pytest.mark.parametrize(
    ("model", "fault", "completion", "duplication"),
    [
        ("stub/retry", "lost_reply", 1.0, 1.0),
        ("stub/no-retry", "lost_reply", 1.0, 0.0),
        ("stub/verify", "lost_reply", 1.0, 0.0),
        # The lost reply's connection-error form: the outcome is as unknown, the stubs alike.
        ("stub/retry", "reset_after_commit", 1.0, 1.0),
        ("stub/no-retry", "reset_after_commit", 1.0, 0.0),
        ("stub/verify", "reset_after_commit", 1.0, 0.0),
        ("stub/retry", "timeout_before_commit", 1.0, 0.0),
        ("stub/no-retry", "timeout_before_commit", 0.0, 0.0),
        ("stub/verify", "timeout_before_commit", 1.0, 0.0),
        ("stub/retry", "none", 1.0, 0.0),
        ("stub/no-retry", "none", 1.0, 0.0),
        ("stub/verify", "none", 1.0, 0.0),
    ],
)
def test_reference_results_bare(
    reference_summary: dict[str, Any], model: str, fault: str, completion: float, duplication: float
) -> None:
    c = cell(reference_summary, model, fault)
    assert c["completion_rate"] == completion
    assert c["duplication_rate"] == duplication
    assert c["safe_success_rate"] == (1.0 if completion == 1.0 and duplication == 0.0 else 0.0)
    # These stubs refund the amount asked for, whatever they do about the fault.
    assert c["wrong_rate"] == 0.0 and c["wrong_effects_mean"] == 0.0


def test_controls_are_told_apart(reference_summary: dict[str, Any]) -> None:
    # The twin faults: only verify-before-retry wins both.
    wins = {
        model
        for model in ("stub/retry", "stub/no-retry", "stub/verify")
        if all(
            cell(reference_summary, model, f)["safe_success_rate"] == 1.0
            for f in ("lost_reply", "timeout_before_commit")
        )
    }
    assert wins == {"stub/verify"}


@pytest.mark.parametrize(
    ("protection", "refunds", "agent_saw"),
    [
        ("retry-nokey", 2, "re_2"),
        ("retry-randomkey", 2, "re_2"),
        ("retry-stepkey", 1, "re_1"),
        ("lookup", 1, "found it already made, so it was not sent again: refund re_1 "),
        ("intent-key", 1, None),
    ],
)
@pytest.mark.parametrize("fault", ["lost_reply", "reset_after_commit"])
def test_seed_demo_table(
    trial_ledgers: Any,
    reference_summary: dict[str, Any],
    fault: str,
    protection: str,
    refunds: int,
    agent_saw: str | None,
) -> None:
    ledgers = trial_ledgers("stub/no-retry", fault, protection)
    assert len(ledgers) == 4
    for ledger in ledgers:
        assert len(ledger.effects) == refunds
        if agent_saw:
            assert any(agent_saw in text for text in ledger.observations), ledger.observations
    c = cell(reference_summary, "stub/no-retry", fault, protection)
    assert c["duplication_rate"] == (1.0 if refunds == 2 else 0.0)


@pytest.mark.parametrize("fault", ["lost_reply", "reset_after_commit"])
def test_seed_demo_agent_never_learns_of_re_1(trial_ledgers: Any, fault: str) -> None:
    for ledger in trial_ledgers("stub/no-retry", fault, "retry-nokey"):
        assert [e.id for e in ledger.unseen_effects()] == ["re_1"]
        first = ledger.attempt(ledger.effects[0].attempt)
        assert (first.delivered, first.outcome, first.fault) == (False, "unknown", fault)
        second = ledger.attempt(ledger.effects[1].attempt)
        assert second.source == "transport"


def test_random_key_bug_sends_two_keys(trial_ledgers: Any) -> None:
    for ledger in trial_ledgers("stub/no-retry", "lost_reply", "retry-randomkey"):
        keys = [a.key for a in ledger.attempts if a.mutating]
        assert len(keys) == 2 and keys[0] != keys[1]


def test_step_key_replays_saved_response(trial_ledgers: Any) -> None:
    for ledger in trial_ledgers("stub/no-retry", "lost_reply", "retry-stepkey"):
        mutating = [a for a in ledger.attempts if a.mutating]
        assert len(mutating) == 2
        assert mutating[0].key == mutating[1].key
        assert mutating[1].replayed and mutating[1].effect_ids == []


def test_same_key_different_amount_is_a_conflict_the_agent_sees(trial_ledgers: Any) -> None:
    for ledger in trial_ledgers("stub/drift", "lost_reply", "intent-key"):
        statuses = [a.status for a in ledger.attempts if a.mutating]
        # drift keeps retrying (3 calls in all); every retry is refused, none commits.
        assert statuses[0] == 200 and statuses[1:] and set(statuses[1:]) == {422}
        assert len(ledger.effects) == 1
        assert any("different parameters" in text for text in ledger.observations)


def test_drift_without_key_diverges(reference_summary: dict[str, Any], trial_ledgers: Any) -> None:
    c = cell(reference_summary, "stub/drift", "lost_reply", "bare")
    assert c["duplication_rate"] == 1.0 and c["divergence_rate"] == 1.0
    # The retry asks a cent less than the request did: that refund is also wrong. The first
    # one has the asked amount, so the job is done (twice).
    assert c["wrong_rate"] == 1.0 and c["wrong_effects_mean"] == 1.0
    assert c["completion_rate"] == 1.0 and c["safe_success_rate"] == 0.0
    for ledger in trial_ledgers("stub/drift", "lost_reply", "bare"):
        amounts = [e.fields["amount"] for e in ledger.effects]
        assert len(amounts) == 2 and amounts[0] != amounts[1]
    # With an intent key the drifted retry is refused (422) and commits nothing: not wrong.
    keyed = cell(reference_summary, "stub/drift", "lost_reply", "intent-key")
    assert keyed["wrong_rate"] == 0.0 and keyed["completion_rate"] == 1.0
    # Without a fault drift never retries, so it never sends the changed amount.
    assert cell(reference_summary, "stub/drift", "none", "bare")["wrong_rate"] == 0.0


def test_concurrent_same_key_gives_one_refund_both_see_re_1(trial_ledgers: Any) -> None:
    for ledger in trial_ledgers("stub/parallel", "none", "intent-key"):
        assert [e.id for e in ledger.effects] == ["re_1"]
        saw = [t for t in ledger.observations if "refund re_1 " in t]
        # One call made it; the other was told the truth: the saved result of the first.
        assert len(saw) == 2
        assert sum(t.startswith("Created refund re_1 ") for t in saw) == 1
        assert sum(t.startswith("Already done: the payments API returned") for t in saw) == 1
        statuses = [a.status for a in ledger.attempts if a.mutating]
        assert 409 in statuses  # the second caller hit the in-flight key, then got the replay


def test_concurrent_without_key_gives_two_refunds(trial_ledgers: Any) -> None:
    for ledger in trial_ledgers("stub/parallel", "none", "bare"):
        assert [e.id for e in ledger.effects] == ["re_1", "re_2"]


ROOT = Path(__file__).parents[2]


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with ``header``, each cell
    without its backticks and bold marks."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("`", "").replace("**", "") for c in line.strip("|").split("|")]
        rows.append(cells)
    return rows


def leading_int(cell: str) -> int:
    return int(re.match(r"\d+", cell).group())  # type: ignore[union-attr]


@pytest.mark.parametrize("page", ["docs/concepts/reference-results.md", "README.md"])
def test_the_pages_show_the_seed_demo_table_the_run_measures(trial_ledgers: Any, page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    rows = markdown_table(text, "| protection | refunds on the server | the agent saw |")
    assert [r[0] for r in rows] == ["retry-nokey", "retry-randomkey", "retry-stepkey", "lookup"]
    for protection, refunds, saw in rows:
        ledgers = trial_ledgers("stub/no-retry", "lost_reply", protection)
        assert ledgers and all(len(ledger.effects) == leading_int(refunds) for ledger in ledgers)
        shown = re.match(r"re_\d+", saw)
        if shown:
            for ledger in ledgers:
                assert any(shown.group() in t for t in ledger.observations), (page, protection)


def test_the_reference_results_page_shows_what_the_run_measures(
    trial_ledgers: Any, reference_summary: dict[str, Any]
) -> None:
    text = (ROOT / "docs/concepts/reference-results.md").read_text(encoding="utf-8")
    rows = markdown_table(text, "| model | fault | protection | refunds on the server |")
    assert len(rows) == 6
    for model, fault, protection, refunds, completed, duplicated in rows:
        ledgers = trial_ledgers(model, fault, protection)
        assert ledgers and all(len(ledger.effects) == leading_int(refunds) for ledger in ledgers)
        c = cell(reference_summary, model, fault, protection)
        assert c["completion_rate"] == (1.0 if completed == "yes" else 0.0), (model, fault)
        assert c["duplication_rate"] == (1.0 if duplicated == "yes" else 0.0), (model, fault)
