"""Shared fixtures: a reference suite run on the stub controls, and mock services."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals._run import RunResult, run_suite
from evals._suite import Matrix, Suite
from mocks import PaymentsService, Services

ORDER = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}

REFERENCE_SUITE = Suite(
    (
        Matrix(
            models=("stub/retry", "stub/no-retry", "stub/verify"),
            tasks=("refund",),
            faults=("none", "lost_reply", "timeout_before_commit"),
            protections=("bare",),
        ),
        Matrix(
            models=("stub/no-retry",),
            tasks=("refund",),
            faults=("lost_reply",),
            protections=(
                "retry-nokey",
                "retry-randomkey",
                "retry-stepkey",
                "intent-key",
                "lookup",
            ),
        ),
        Matrix(
            models=("stub/drift", "stub/parallel"),
            tasks=("refund",),
            faults=("lost_reply", "none"),
            protections=("bare", "intent-key"),
        ),
    ),
    limit=4,
    source="tests/conftest.py",
)
"""The DESIGN.md reference cells, four samples each."""


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """One in-process run of the reference suite (shared by the reference-result tests)."""
    return run_suite(REFERENCE_SUITE, tmp_path_factory.mktemp("reference"), report=True)


@pytest.fixture(scope="session")
def reference_summary(reference_run: RunResult) -> dict[str, Any]:
    """The run's summary.json, parsed."""
    data: dict[str, Any] = json.loads(Path(reference_run.summary_path).read_text())
    return data


@pytest.fixture
def payments() -> Services:
    """A payments service with one order (order_1042, $39.97 paid), no fault."""
    return Services([PaymentsService(orders=[ORDER])])


@pytest.fixture(scope="session")
def trial_ledgers(reference_run: RunResult) -> Any:
    """``trial_ledgers(model, fault, protection)`` → the ledgers of that cell's trials."""
    from inspect_ai.log import read_eval_log

    from mocks import LEDGER_STORE_KEY, Ledger

    def find(model: str, fault: str, protection: str) -> list[Ledger]:
        for log in reference_run.logs:
            meta = (log.eval.metadata or {}).get("twice", {})
            if (
                log.eval.model == model
                and meta.get("fault") == fault
                and meta.get("protection") == protection
            ):
                full = read_eval_log(log.location)
                return [Ledger.from_dict(s.store[LEDGER_STORE_KEY]) for s in full.samples or []]
        raise LookupError(f"no log for {model} / {fault} / {protection}")

    return find
