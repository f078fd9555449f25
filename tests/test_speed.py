"""The speed-ups keep behaviour: caches hit only when they should, settings are
restored, the fault schedule still counts, chunked log reading drops the same repeats.

No test here is timed; the timings are in bench/ and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from inspect_ai import eval
from inspect_ai.model import get_model
from inspect_ai.tool import ToolDef
from twice.evals.run import GC_THRESHOLDS, gc_for_trials
from twice.mocks import KEY_HEADER, LostReply, PaymentsService, Schedule, Services, StubAPI
from twice.reports import trials_frame
from twice.tasks import TrialContext, get_protection, make_tool, refund

ORDER = {"order_id": "order_1", "customer": "Ann", "amount": 10_000, "currency": "usd"}
REFUNDS = f"{PaymentsService.default_base_url}/v1/refunds"


def _context() -> TrialContext:
    return TrialContext(Services([PaymentsService(orders=[ORDER])]), get_protection("bare"))


def _tool_factory(doc: str) -> Callable[[str], Awaitable[str]]:
    async def lookup(order_id: str) -> str:
        return order_id

    lookup.__doc__ = doc
    return lookup


def test_make_tool_parses_a_schema_once_for_every_trial() -> None:
    doc = "Look an order up.\n\nArgs:\n    order_id: The order.\n"
    first = ToolDef(make_tool(_context(), _tool_factory(doc)))
    second = ToolDef(make_tool(_context(), _tool_factory(doc)))
    fresh = ToolDef(_tool_factory(doc))
    assert first.parameters == second.parameters == fresh.parameters
    assert first.description == second.description == fresh.description == "Look an order up."


def test_make_tool_schema_cache_tells_docstrings_apart() -> None:
    a = ToolDef(make_tool(_context(), _tool_factory("Refund A.\n\nArgs:\n    order_id: A.\n")))
    b = ToolDef(make_tool(_context(), _tool_factory("Refund B.\n\nArgs:\n    order_id: B.\n")))
    assert (a.description, b.description) == ("Refund A.", "Refund B.")
    assert a.parameters.properties["order_id"].description == "A."
    assert b.parameters.properties["order_id"].description == "B."


def test_fault_schedule_counts_mutating_attempts_on_its_route() -> None:
    fault = LostReply(schedule=Schedule(attempts=(2,), route="payments.refund.create"))
    services = Services([PaymentsService(orders=[ORDER])], fault=fault)
    with services.sync_client() as client:
        client.get(REFUNDS)  # not mutating: not counted
        first = client.post(REFUNDS, json={"order_id": "order_1", "amount": 100})
        with pytest.raises(httpx.ReadTimeout):
            client.post(REFUNDS, json={"order_id": "order_1", "amount": 200})
        third = client.post(REFUNDS, json={"order_id": "order_1", "amount": 300})
    assert (first.status_code, third.status_code) == (200, 200)
    assert [a.fault for a in services.ledger.attempts] == [None, None, "lost_reply", None]
    assert len(services.ledger.effects) == 3


def test_fault_schedule_ignores_other_routes() -> None:
    fault = LostReply(schedule=Schedule(attempts=(1,), route="payments.other.create"))
    services = Services([PaymentsService(orders=[ORDER])], fault=fault)
    with services.sync_client() as client:
        response = client.post(
            REFUNDS, json={"order_id": "order_1", "amount": 100}, headers={KEY_HEADER: "k"}
        )
    assert response.status_code == 200
    assert services.ledger.faults_fired() == []


def test_gc_for_trials_restores_thresholds() -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's defaults: not the trials' (the suite runs under those)
    try:
        with gc_for_trials():
            assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


CONSOLE_SCRIPT_GC = """
import atexit, gc, json, sys
from twice.evals.run import gc_for_trials
from twice.evals.cli import main

def at_exit():
    with gc_for_trials():  # what a run does around its trials, then restores
        pass
    print(json.dumps([gc.get_threshold(), gc.get_freeze_count() > 0]))

atexit.register(at_exit)
sys.argv = ["twice", "list"]
main()
"""


def test_the_console_script_keeps_the_trials_gc_thresholds_until_it_exits() -> None:
    # run_suite puts the caller's thresholds back when it ends; under the console script
    # those are the trials' own, so no full collection starts on the way out.
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT_GC], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    thresholds, frozen = json.loads(done.stdout.strip().splitlines()[-1])
    assert thresholds == list(GC_THRESHOLDS)
    assert frozen


FACADE_GENERATIONS = """
import gc, json, sys
if sys.argv[1:] == ["host-freezes"]:
    gc.freeze()
host = gc.get_freeze_count()
import twice.evals
print(json.dumps([len(gc.get_objects(0)) + len(gc.get_objects(1)), host, gc.get_freeze_count()]))
"""


def _facade_generations(*args: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", FACADE_GENERATIONS, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    counts: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return counts


def test_the_facades_imports_go_to_the_oldest_generation() -> None:
    # Left young, the first collection after the import walks all of them (0.2 s of every
    # twice process's start-up): the young generations hold a handful, not ~200,000.
    young, _, frozen = _facade_generations()
    assert young < 5_000
    assert frozen == 0


def test_the_facade_leaves_a_hosts_frozen_objects_frozen() -> None:
    young, host, frozen = _facade_generations("host-freezes")
    assert host > 1_000
    assert frozen >= host * 0.9  # a few of the host's may have died meanwhile
    assert young > 100_000  # its own stay young: a thaw would have released the host's


def test_stub_rejects_a_negative_delay() -> None:
    with pytest.raises(ValueError, match=r"delay for stub/retry must be a number >= 0, got -1"):
        StubAPI("retry", delay=-1)


def test_trials_frame_drops_repeated_samples_across_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = eval(
        refund(fault="lost_reply"),
        model=get_model("stub/retry"),
        limit=3,
        log_dir=str(tmp_path / "logs"),
        display="none",
    )[0]
    assert log.status == "success"
    copy = tmp_path / "again" / Path(log.location).name
    copy.parent.mkdir()
    shutil.copy(log.location, copy)
    once = trials_frame([log.location])
    twice = trials_frame([log.location, str(copy)])
    assert len(once) == 3
    assert twice.drop(columns="log").equals(once.drop(columns="log"))
