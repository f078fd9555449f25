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
from collections.abc import Callable
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
        return eval_rates(log_dir=tmp_path / f"twice-eval-{next(counter)}", **kwargs)

    return run
