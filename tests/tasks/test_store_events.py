"""A trial's ledger reaches the transcript once, and its final store, whatever happens.

Inspect copies the store at the start and end of every span and logs the difference, and
every enclosing span logs the same change again. twice turns that off after its setup
(``ledger_changes_once``), and keeps the ledger out of the store until the trial is over
(``keep_ledger``): the task's cleanup, which inspect runs after scoring and after a failure,
puts it there, so the final store holds it and no event repeats it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from inspect_ai import eval
from inspect_ai.event import StoreEvent
from inspect_ai.log import EvalLog
from inspect_ai.model import ModelOutput, ModelUsage, get_model
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


def test_the_ledger_is_logged_once_in_the_final_store(tmp_path: Path) -> None:
    # stub/retry under lost_reply calls issue_refund twice: on the old code each tool span
    # logged its attempt, then the agent loop's span and the solver's state event logged the
    # ledger again; now it reaches the store when the trial is over
    log = _run(tmp_path, "stub/retry", fault="lost_reply")
    assert log.status == "success" and log.samples
    sample = log.samples[0]
    events = _store_events(log)
    # the setup's span and the solvers span each log what the setup stored for the stub
    assert [[c.path for c in e.changes] for e in events] == [[f"/{STUB_STORE_KEY}"]] * 2
    logged = [e for e in sample.events if f"/{LEDGER_STORE_KEY}" in json.dumps(e.model_dump())]
    assert logged == [], [e.event for e in logged]
    assert len(sample.store[LEDGER_STORE_KEY]["attempts"]) == 2
    # the scorer judged the live ledger: the lost reply's retry is the duplicate
    score = sample.scores["side_effects"].value  # type: ignore[index]
    assert score["duplicated"] == 1.0  # type: ignore[index]


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


def test_a_trial_that_fails_keeps_its_ledger(tmp_path: Path) -> None:
    # The model makes the refund, then fails: no scorer runs, the task's cleanup does.
    def outputs() -> Iterator[ModelOutput]:
        call = ModelOutput.for_tool_call(
            "mockllm/model",
            "issue_refund",
            {"order_id": "order_1042", "amount": 4.99, "reason": "cracked"},
        )
        call.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        yield call
        raise RuntimeError("the model fell over")

    log = eval(
        refund(fault="none", protection="bare"),
        model=get_model("mockllm/model", custom_outputs=outputs()),
        sample_id=["refund-001"],
        log_dir=str(tmp_path),
        display="none",
    )[0]
    assert log.samples
    sample = log.samples[0]
    assert sample.error is not None and "fell over" in sample.error.message
    assert not sample.scores
    (effect,) = sample.store[LEDGER_STORE_KEY]["effects"]
    assert effect["name"] == "payments.refund.create"


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
