"""Every suite file twice ships loads and names only things that exist."""

from __future__ import annotations

from pathlib import Path

import pytest
from twice import evals
from twice.evals import load_suite

SUITES = sorted(p for p in Path(evals.__file__).parent.glob("*.toml") if p.name != "gate.toml")


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.name)
def test_shipped_suite_is_valid(path: Path) -> None:
    suite = load_suite(path)
    suite.validate()
    assert sum(1 for _ in suite.cells()) > 0


def test_full_suite_covers_every_task_fault_and_protection() -> None:
    from twice.mocks import FAULTS
    from twice.tasks import PROTECTIONS, TASKS

    cells = list(load_suite(Path(evals.__file__).parent / "full.toml").cells())
    assert {c.task for c in cells} == set(TASKS)
    assert {c.fault for c in cells} == set(FAULTS)
    assert {c.protection for c in cells} == set(PROTECTIONS)
