"""``make test``'s two passes: which tests an xdist worker runs, and in what order.

A plugin of the suite (``pytest_plugins`` in ``conftest.py``) that imports nothing of twice, so
a pytest run that loads it alone starts in a fraction of a second (the tests of the passes
themselves run such suites).

- xdist workers never run a test marked ``serial``; ``--serial-only`` runs only those, one at
  a time, and refuses ``-n``.
- Workers start the tests of ``slow_tests.txt`` first, longest first, then the other ``slow``
  ones, then the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-only",
        action="store_true",
        help="run only the tests marked serial (make test's second pass, without -n)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--serial-only``, leave unread the test files that mark nothing ``serial`` (by
    their text: ``pytest.mark.serial`` or ``mark.serial``): the pass that runs a handful of
    tests need not import every module of the suite (a dozen seconds of one core)."""
    path = collection_path
    if not config.getoption("--serial-only") or not path.name.startswith("test_"):
        return None
    if path.suffix == ".py" and "mark.serial" not in path.read_text(encoding="utf-8"):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``serial`` tests out of xdist workers; ``--serial-only`` runs them alone.

    A serial test measures wall time or signals processes on a deadline: beside another
    test on the same cores it fails for no fault of the code. ``make test`` runs everything
    else under xdist (``-n``) and then these in a second pass of their own.
    """
    in_worker = hasattr(config, "workerinput")
    only = bool(config.getoption("--serial-only"))
    if not (in_worker or only):
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        serial = item.get_closest_marker("serial") is not None
        (keep if serial == only else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    if in_worker:
        # The slow tests first, longest first, so the run does not end on one of them with
        # the other workers idle: worksteal hands each worker a contiguous share and an idle
        # worker takes the tail of another's, so what is left at the end is the short tests.
        # The order is the same in every worker, as xdist requires (a stable sort).
        rank = _slow_rank()
        keep.sort(key=lambda item: _start_order(item, rank))
    items[:] = keep


SLOW_TESTS = Path(os.environ.get("TWICE_SLOW_TESTS", Path(__file__).parent / "slow_tests.txt"))
"""The table of known-slow tests (another table in ``TWICE_SLOW_TESTS``: the order's own test)."""


def _slow_rank() -> dict[str, int]:
    """``slow_tests.txt``'s test functions (``path::name``) by rank, the longest 0."""
    lines = SLOW_TESTS.read_text(encoding="utf-8").splitlines()
    ids = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return {test_id: n for n, test_id in enumerate(ids)}


def _start_order(item: pytest.Item, rank: dict[str, int]) -> tuple[int, int]:
    """Where a worker starts ``item``: the listed slow tests in their order, then the other
    ``slow`` ones, then the rest (each group in collection order)."""
    listed = rank.get(item.nodeid.split("[", 1)[0])
    if listed is not None:
        return (0, listed)
    return (1, 0) if item.get_closest_marker("slow") is not None else (2, 0)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        terminalreporter.write_line(
            "tests marked serial did not run under -n: run them with --serial-only "
            "(make test does, after this pass)"
        )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--serial-only") and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("--serial-only runs the serial tests one at a time: drop -n")
