"""A trial's ledger reaches the transcript once, and its final store, whatever happens.

Inspect copies the store at the start and end of every span and logs the difference, and
every enclosing span logs the same change again. twice turns that off after its setup
(``ledger_changes_once``): the setup's span logs what setup wrote, the ``solvers`` span logs
the whole net change once, and the final store holds the ledger as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inspect_ai import eval
from inspect_ai.event import StoreEvent
from inspect_ai.log import EvalLog
from twice.mocks import LEDGER_STORE_KEY, STUB_STORE_KEY
from twice.tasks import refund


def _run(tmp_path: Path, model: str, fault: str = "none") -> EvalLog:
    return eval(
        refund(fault=fault, protection="bare"),
        model=model,
        sample_id=["refund-001"],
        log_dir=str(tmp_path),
        display="none",
    )[0]


def _store_events(log: EvalLog) -> list[StoreEvent]:
    assert log.samples
    return [e for e in log.samples[0].events if isinstance(e, StoreEvent)]


def test_the_ledger_reaches_the_transcript_once(tmp_path: Path) -> None:
    # stub/retry under lost_reply calls issue_refund twice: four tool spans on the old code,
    # each logging its attempt, and the agent loop's span logging both again
    log = _run(tmp_path, "stub/retry", fault="lost_reply")
    assert log.status == "success"
    events = _store_events(log)
    assert len(events) == 2, [[c.path for c in e.changes] for e in events]
    setup, net = events
    assert {c.path for c in setup.changes} == {f"/{STUB_STORE_KEY}", f"/{LEDGER_STORE_KEY}"}
    (ledger_add,) = [c for c in net.changes if c.path == f"/{LEDGER_STORE_KEY}"]
    assert len(ledger_add.value["attempts"]) == 2  # type: ignore[index]
    # (events store long texts as attachments, so compare the attempts)
    assert log.samples
    assert log.samples[0].store[LEDGER_STORE_KEY]["attempts"] == ledger_add.value["attempts"]  # type: ignore[index]


def test_a_trial_cut_short_keeps_its_ledger(tmp_path: Path) -> None:
    # the message limit ends the trial after its first call (system, user, assistant, tool)
    log = eval(
        refund(fault="lost_reply", protection="bare"),
        model="stub/retry",
        sample_id=["refund-001"],
        log_dir=str(tmp_path),
        display="none",
        message_limit=3,
    )[0]
    assert log.samples
    sample = log.samples[0]
    assert sample.limit is not None and sample.limit.type == "message"
    assert len(sample.store[LEDGER_STORE_KEY]["attempts"]) == 1
    # the solvers span logs the net change on its way out through the limit
    last = _store_events(log)[-1]
    (ledger_add,) = [c for c in last.changes if c.path == f"/{LEDGER_STORE_KEY}"]
    assert ledger_add.value["attempts"] == sample.store[LEDGER_STORE_KEY]["attempts"]  # type: ignore[index]


def _logged_plans(log: EvalLog) -> int:
    """How many times the sample's gold plan text appears in its events and final store."""
    assert log.samples
    sample = log.samples[0]
    marker = '"found_pattern"'  # a key only the plan's steps have
    in_store = json.dumps(sample.store).count(marker)
    in_events = sum(
        json.dumps(e.model_dump(exclude={"sample", "state"})).count(marker) for e in sample.events
    )
    return in_store + in_events


def test_the_gold_plan_is_not_copied_into_the_store(tmp_path: Path) -> None:
    log = _run(tmp_path, "stub/retry", fault="lost_reply")
    assert log.status == "success" and log.samples
    assert "plan" not in log.samples[0].store[STUB_STORE_KEY]
    assert _logged_plans(log) == 0
    # the stub still follows the plan: the lost reply's retry duplicates the refund
    assert len(log.samples[0].store[LEDGER_STORE_KEY]["effects"]) == 2


def test_without_the_sample_accessor_the_plan_goes_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import twice.mocks._stub as stub

    # what the setup and the stub do if a later inspect drops the private accessor
    monkeypatch.setattr(stub, "_sample_state", None)
    monkeypatch.setattr(stub, "PLAN_FROM_METADATA", False)
    log = _run(tmp_path, "stub/retry", fault="lost_reply")
    assert log.status == "success" and log.samples
    assert log.samples[0].store[STUB_STORE_KEY]["plan"] == log.samples[0].metadata["plan"]
    assert _logged_plans(log) > 0
    assert len(log.samples[0].store[LEDGER_STORE_KEY]["effects"]) == 2
