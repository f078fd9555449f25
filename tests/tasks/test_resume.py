"""The third retry source: a run that dies after a commit and resumes from its checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import Task, eval
from inspect_ai.event import InfoEvent
from inspect_ai.log import EvalLog, resolve_sample_attachments
from inspect_ai.solver import generate
from inspect_ai.tool import ToolError
from twice.mocks import (
    CRASH_HEADER,
    FAULTS,
    CrashAfterCommit,
    Ledger,
    LostReply,
    PaymentsService,
    Schedule,
    Services,
    ledgers,
)
from twice.tasks import (
    ACTION_LOG_STORE_KEY,
    ActionLog,
    Protection,
    RunCrashed,
    TrialContext,
    get_protection,
    load_dataset,
    make_tool,
    mutate,
    trial_setup,
)
from twice.tasks.travel_booking.reference import RefCell, run_cell, summarize
from twice.tasks.travel_booking.travel_booking import DATASET, _services, travel_tools

IDS = ["travel-001", "travel-003"]  # one trip that books, one whose hotel is sold out
ORDER = {"order_id": "o1", "customer": "Dana", "amount": 5000}


def _crash(protection: str, tmp_path: Path, action_log: bool | None = None) -> EvalLog:
    cell = RefCell("stub/no-retry", "crash_after_commit", protection, action_log)
    return run_cell(cell, log_dir=tmp_path, sample_id=IDS)


def _ledger(log: EvalLog, i: int = 0) -> Ledger:
    return ledgers(log)[i]


def _flight_attempts(ledger: Ledger) -> list[tuple[str, bool]]:
    return [(a.source, a.replayed) for a in ledger.attempts if a.route == "travel.flight.book"]


# -- the fault --------------------------------------------------------------------------------


def test_crash_after_commit_is_a_builtin_fault_that_commits() -> None:
    fault = FAULTS["crash_after_commit"]
    assert isinstance(fault, CrashAfterCommit) and fault.commits


def test_crash_after_commit_commits_and_marks_the_reply() -> None:
    services = Services([PaymentsService(orders=[ORDER])], fault=CrashAfterCommit())

    async def go() -> Any:
        async with services.client() as client:
            return await client.post(
                "https://payments.twice.test/v1/refunds", json={"order_id": "o1", "amount": 100}
            )

    response = asyncio.run(go())
    assert (response.status_code, response.headers[CRASH_HEADER]) == (200, "after_commit")
    assert response.json()["id"] == "re_1"
    assert [e.id for e in services.ledger.effects] == ["re_1"]
    assert services.ledger.attempts[0].fault == "crash_after_commit"
    assert "run crashed" in services.ledger.describe_effect(services.ledger.effects[0])


# -- the tool layer, without an eval ------------------------------------------------------------


def _refund_tool(ctx: TrialContext) -> Any:
    async def issue_refund(order_id: str) -> str:
        """Refund one dollar.

        Args:
            order_id: The order.
        """
        result = await mutate(
            ctx,
            route="payments.refund.create",
            method="POST",
            url="https://payments.twice.test/v1/refunds",
            payload={"order_id": order_id, "amount": 100},
            identity={"order_id": order_id},
            noun="refund",
            api="payments API",
        )
        return f"{result.body['id']} from_action_log={result.from_action_log}"

    return make_tool(ctx, issue_refund, idempotency="keyed")


def test_tool_layer_raises_run_crashed_after_writing_the_action_log() -> None:
    ctx = TrialContext(
        Services([PaymentsService(orders=[ORDER])], fault=CrashAfterCommit()),
        get_protection("bare"),
        action_log=ActionLog(),
    )
    tool = _refund_tool(ctx)
    with pytest.raises(RunCrashed, match="crashed right after call 1"):
        asyncio.run(tool(order_id="o1"))
    assert ctx.action_log is not None
    [record] = ctx.action_log.records
    assert (record.state, record.body["id"] if record.body else None) == ("done", "re_1")
    assert ctx.services.ledger.observations == []  # the agent never saw re_1

    ctx.restart(calls=0)
    assert asyncio.run(tool(order_id="o1")) == "re_1 from_action_log=True"
    assert len(ctx.services.ledger.attempts) == 1  # nothing was sent again


def test_tool_layer_without_action_log_resends_and_marks_the_attempt_resume() -> None:
    ctx = TrialContext(
        Services([PaymentsService(orders=[ORDER])], fault=CrashAfterCommit()),
        get_protection("bare"),
    )
    tool = _refund_tool(ctx)
    with pytest.raises(RunCrashed):
        asyncio.run(tool(order_id="o1"))
    ctx.restart(calls=0)
    assert asyncio.run(tool(order_id="o1")).startswith("re_2")
    assert [a.source for a in ctx.services.ledger.attempts] == ["initial", "resume"]
    # Only the first re-send after the restart is the resume; a later repeat is the model's.
    asyncio.run(tool(order_id="o1"))
    assert ctx.services.ledger.attempts[-1].source == "model"


def test_restart_rolls_the_step_counter_back_to_the_checkpoint() -> None:
    ctx = TrialContext(Services([PaymentsService(orders=[ORDER])]), get_protection("bare"))
    ctx.calls = 3
    ctx.dispatched = [(1, "a"), (2, "b"), (3, "c")]
    ctx.restart(calls=1)
    assert (ctx.calls, ctx.resume_pending, ctx.restarts) == (1, {"b", "c"}, 1)


def test_action_log_reuses_the_recorded_key_after_an_unknown_outcome() -> None:
    # retry-stepkey makes a new key per call, so a model retry after a lost reply duplicates;
    # with the action log the repeat reuses the key recorded with the unknown attempt.
    def refunds(action_log: ActionLog | None) -> int:
        ctx = TrialContext(
            Services([PaymentsService(orders=[ORDER])], fault=LostReply(schedule=Schedule())),
            Protection("stepkey-0", 0, "step", False, "test: step key, no transport retries"),
            action_log=action_log,
        )
        tool = _refund_tool(ctx)
        with pytest.raises(ToolError):
            asyncio.run(tool(order_id="o1"))
        asyncio.run(tool(order_id="o1"))
        return len(ctx.services.ledger.effects)

    assert refunds(None) == 2
    assert refunds(ActionLog()) == 1


# -- end to end: the resumable agent loop --------------------------------------------------------


def test_resume_without_action_log_duplicates(tmp_path: Path) -> None:
    log = _crash("bare", tmp_path)
    for i in range(2):
        ledger = _ledger(log, i)
        assert _flight_attempts(ledger) == [("initial", False), ("resume", False)]
        assert [e.id for e in ledger.effects if e.name == "travel.flight.book"] == ["fb_1", "fb_2"]
        assert ledger.unseen_effects()[0].id == "fb_1"
    sample = (log.samples or [])[0]
    assert sample.scores is not None and sample.scores["side_effects"].value["duplicated"] == 1.0
    events = resolve_sample_attachments(sample).events
    infos = [e for e in events if isinstance(e, InfoEvent)]
    assert any("restarting from the checkpoint" in str(e.data) for e in infos)


def test_resume_with_action_log_does_not_duplicate(tmp_path: Path) -> None:
    log = _crash("bare", tmp_path, action_log=True)
    for i, sample in enumerate(log.samples or []):
        ledger = _ledger(log, i)
        assert _flight_attempts(ledger) == [("initial", False)]
        assert [e.name for e in ledger.effects].count("travel.flight.book") == 1
        assert sample.scores is not None
        assert sample.scores["side_effects"].value["safe_success"] == 1.0
        assert sample.store[ACTION_LOG_STORE_KEY][0]["state"] == "done"
    assert (log.eval.metadata or {})["twice"]["action_log"] is True
    texts = [m.text for m in (log.samples or [])[0].messages if m.role == "tool"]
    # The restarted run's repeat is told the run restarted (a repeat in one run is not).
    assert any("Already done before the run restarted (from the action log" in t for t in texts)


@pytest.mark.parametrize("protection", ["retry-stepkey", "intent-key"])
def test_resume_with_a_stable_key_is_replayed_by_the_service(
    tmp_path: Path, protection: str
) -> None:
    ledger = _ledger(_crash(protection, tmp_path))
    assert _flight_attempts(ledger) == [("initial", False), ("resume", True)]
    assert [e.name for e in ledger.effects].count("travel.flight.book") == 1


@pytest.mark.parametrize(
    ("protection", "action_log", "effects", "dup"),
    [("bare", False, 2.0, 1.0), ("bare", True, 1.0, 0.0), ("declared", None, 1.0, 0.0)],
)
def test_resume_refund(
    tmp_path: Path, protection: str, action_log: bool | None, effects: float, dup: float
) -> None:
    cell = RefCell("stub/no-retry", "crash_after_commit", protection, action_log, "refund")
    row = summarize(cell, run_cell(cell, log_dir=tmp_path, limit=2))
    assert (row["forward"], row["duplicated"], row["errors"]) == (effects, dup, 0)


def test_the_new_agent_loop_keeps_refunds_reference_results(tmp_path: Path) -> None:
    expected = {"stub/retry": 2.0, "stub/no-retry": 1.0, "stub/verify": 1.0}
    for model, refunds in expected.items():
        cell = RefCell(model, "lost_reply", task="refund")
        row = summarize(cell, run_cell(cell, log_dir=tmp_path, limit=2))
        assert row["forward"] == refunds, model


def _plain_loop_task(fault: str) -> Task:
    # trial_setup with inspect's own generate(): no checkpoints, so no one catches the crash.
    return Task(
        dataset=load_dataset(DATASET, "travel_booking"),
        setup=trial_setup(_services, travel_tools, fault, "bare", "baseline", "Book trips."),
        solver=generate(),
    )


def test_crash_without_the_resumable_loop_fails_the_sample(tmp_path: Path) -> None:
    log = eval(
        _plain_loop_task("crash_after_commit"),
        model="stub/no-retry",
        display="none",
        log_dir=str(tmp_path),
        sample_id=IDS[:1],
    )[0]
    assert log.status == "error"
    assert log.error is not None and "crash_after_commit" in log.error.message


def test_resumable_loop_gives_up_after_max_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    always = CrashAfterCommit(name="crash_every_time", schedule=Schedule(every=True))
    monkeypatch.setitem(FAULTS, always.name, always)
    with pytest.raises(RuntimeError, match="giving up after 3 restarts"):
        run_cell(RefCell("stub/no-retry", always.name), log_dir=tmp_path, sample_id=IDS[:1])
