"""A trial's ledger reaches the transcript once, and its final store, whatever happens.

Inspect copies the store at the start and end of every span and logs the difference, and
every enclosing span logs the same change again. twice turns that off after its setup
(``ledger_changes_once``), and keeps the ledger out of the store until the trial is over
(``keep_ledger``): the task's cleanup, which inspect runs after scoring and after a failure,
puts it there, so the final store holds it and no event repeats it. What the stub models read
(the gold plan, the prompt's name, a seed) is kept beside the trial and never logged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import eval
from inspect_ai.dataset import MemoryDataset
from inspect_ai.event import StoreEvent
from inspect_ai.log import EvalLog
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from twice.mocks import (
    LEDGER_STORE_KEY,
    STUB_STORE_KEY,
    Ledger,
    PaymentsService,
    services_from_state,
)
from twice.tasks import hold_metadata, load_dataset, refund, twice_task
from twice.tasks.refund.refund import DATASET, refund_tools


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
    # the setup stores nothing (the stubs' config is kept beside the trial): no store event
    assert events == []
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
    """How many times a gold plan appears anywhere in the log: header, metadata, events, store."""
    assert log.samples
    marker = "found_pattern"  # a key only the plan's steps have
    return (
        log.samples[0].model_dump_json().count(marker)
        + log.eval.model_dump_json().count(marker)
        + json.dumps(log.plan.model_dump()).count(marker)
    )


def test_the_gold_plan_and_the_starting_state_are_not_logged(tmp_path: Path) -> None:
    log = _run(tmp_path, "stub/retry", fault="lost_reply")
    assert log.status == "success" and log.samples
    sample = log.samples[0]
    assert set(sample.metadata or {}) == {"intents"} and STUB_STORE_KEY not in sample.store
    assert _logged_plans(log) == 0
    assert "other items" not in sample.model_dump_json()  # an item only the state names
    # the header names the held metadata, without its text
    assert "<plans and starting states of" in json.dumps(log.plan.model_dump())
    # the stub still follows the plan: the lost reply's retry duplicates the refund
    assert len(sample.store[LEDGER_STORE_KEY]["effects"]) == 2


def test_the_callers_dataset_keeps_its_metadata() -> None:
    original = load_dataset(DATASET, "refund")
    lean, held = hold_metadata(original)
    assert held is not None and set(held) == {s.id for s in original}
    assert all(set(s.metadata or {}) == {"intents"} for s in lean)
    for s in original:
        meta = s.metadata or {}
        assert held[s.id] == {"plan": meta["plan"], "state": meta["state"]}
    assert [s.id for s in lean] == [s.id for s in original] and lean.name == original.name


def test_end_state_checks_get_the_whole_metadata(tmp_path: Path) -> None:
    seen: list[set[str]] = []

    def end_state(ledger: Ledger, metadata: dict[str, Any]) -> str | None:
        seen.append(set(metadata))
        return None if metadata["state"]["orders"][0]["customer"] == "Dana Ortiz" else "no state"

    task = twice_task(
        name="refund-end-state",
        dataset=load_dataset(DATASET, "refund"),
        services=lambda state: services_from_state(state, PaymentsService),
        tools=refund_tools,
        fault="none",
        protection="bare",
        prompt="baseline",
        end_state=end_state,
    )
    log = eval(
        task, model="stub/retry", sample_id=["refund-001"], log_dir=str(tmp_path), display="none"
    )[0]
    assert log.status == "success" and log.samples
    assert seen == [{"intents", "plan", "state"}]
    assert log.samples[0].scores["side_effects"].value["safe_success"] == 1.0  # type: ignore


def test_samples_without_ids_keep_their_plans_in_the_metadata(tmp_path: Path) -> None:
    # a hand-built dataset without ids: the plan stays in the metadata and the stub reads it
    source = load_dataset(DATASET, "refund")
    bare = MemoryDataset([source[0].model_copy(update={"id": None})], name="refund")
    lean, held = hold_metadata(bare)
    assert held is None and lean is bare
    task = twice_task(
        name="refund-no-ids",
        dataset=bare,
        services=lambda state: services_from_state(state, PaymentsService),
        tools=refund_tools,
        fault="lost_reply",
        protection="bare",
        prompt="baseline",
    )
    log = eval(task, model="stub/retry", log_dir=str(tmp_path), display="none")[0]
    assert log.status == "success" and log.samples
    assert "plan" in (log.samples[0].metadata or {})
    assert len(log.samples[0].store[LEDGER_STORE_KEY]["effects"]) == 2


def test_without_the_sample_accessor_the_plan_goes_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import twice.mocks._stub_config as stub

    # what the setup and the stub do if a later inspect drops the private accessor
    monkeypatch.setattr(stub, "_sample_state", None)
    log = _run(tmp_path, "stub/retry", fault="lost_reply")
    assert log.status == "success" and log.samples
    config = log.samples[0].store[STUB_STORE_KEY]
    assert config["seed"] == "refund-001:1:baseline" and config["plan"][0]["found_pattern"]
    assert len(log.samples[0].store[LEDGER_STORE_KEY]["effects"]) == 2
