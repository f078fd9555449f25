"""Gate in pytest: run a twice eval inside a test and assert on its rates.

Load it explicitly (``pytest_plugins = ["twice.evals.pytest_plugin"]`` in your root
conftest.py, or ``pytest -p twice.evals.pytest_plugin``). It also loads
``twice.assertions.pytest_plugin``, so one line gives the mock-service fixtures too.

Example::

    def test_verify_never_duplicates(twice_eval):
        rates = twice_eval(task="refund", model="stub/verify", fault="lost_reply", limit=5)
        assert rates.one().duplication_rate == 0

It lives in ``evals`` (not ``assertions``) because running an eval needs the tasks and the
runner, and ``assertions`` must not import them (``mocks`` ← ``assertions`` ← ``tasks`` ←
``evals``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ._rates import EvalRates, eval_rates

pytest_plugins = ["twice.assertions.pytest_plugin"]


@pytest.fixture
def twice_eval(tmp_path: Path) -> Callable[..., EvalRates]:
    """Run twice evals in this test: ``twice_eval(task=..., model=..., fault=..., ...)``.

    Takes the keyword arguments of :func:`evals.eval_rates` except ``log_dir``: each call
    logs to its own directory under the test's ``tmp_path``.
    """
    counter = itertools.count(1)

    def run(**kwargs: Any) -> EvalRates:
        if "log_dir" in kwargs:
            raise TypeError("twice_eval chooses log_dir itself (under tmp_path); call eval_rates()")
        with inspect_records_from(logging.WARNING):
            return eval_rates(log_dir=tmp_path / f"twice-eval-{next(counter)}", **kwargs)

    return run


INSPECT_LOGGER = "inspect_ai"


class _InspectBelow(logging.Filter):
    """Drops inspect's records below a level; every other logger's records pass."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        inspect = record.name == INSPECT_LOGGER or record.name.startswith(INSPECT_LOGGER + ".")
        return record.levelno >= self.level or not inspect


@contextmanager
def inspect_records_from(level: int) -> Iterator[None]:
    """While an eval runs, pytest's captured logs get inspect's records from ``level`` up.

    Inspect keeps its logger at its TRACE level (for its own trace file) and stops it
    propagating; pytest attaches its capture handlers to such loggers directly, at level
    NOTSET unless ``log_level`` is configured. A failing test after the first eval of a session
    then printed hundreds of inspect's TRACE lines (every model call and tool call, entered and
    left) above the evidence. Handlers with a level of their own (the user's ``log_level``)
    and inspect's own handler are left alone.
    """
    quiet = _InspectBelow(level)
    handlers = [
        h
        for h in logging.getLogger(INSPECT_LOGGER).handlers
        if h.level == logging.NOTSET and not type(h).__module__.startswith(INSPECT_LOGGER)
    ]
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)


def pytest_configure(config: pytest.Config) -> None:
    """Hide a deprecation warning inspect's own retry set-up raises on every model (from
    tenacity); a test suite can do nothing about it."""
    config.addinivalue_line(
        "filterwarnings",
        "ignore:The 'initial' parameter is deprecated:DeprecationWarning",
    )
