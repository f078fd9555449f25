"""A trial's ledger reaches the transcript once, and its final store, whatever happens.

Inspect copies the store at the start and end of every span and logs the difference, and
every enclosing span logs the same change again. twice turns that off after its setup
(``ledger_changes_once``): the setup's span logs what setup wrote, the ``solvers`` span logs
the whole net change once, and the final store holds the ledger as before.
"""

from __future__ import annotations

from pathlib import Path

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
