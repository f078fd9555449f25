"""One word each: a trial *errored* (``errored``, counted in ``errors``); an agent under test
*crashed* (the ``crashed`` column). ``crashed()`` is the deprecated old name of ``errored()``."""

from __future__ import annotations

import pandas as pd
import pytest
from twice.reports import errored


def _trials() -> pd.DataFrame:
    cell = {"model": "m", "agent": "react", "prompt": "p", "task": "t", "fault": "f"}
    return pd.DataFrame(
        [
            # scored, agent fine; scored, agent crashed; inspect error; never scored
            {**cell, "error": "", "completed": 1.0, "crashed": 0.0},
            {**cell, "error": "", "completed": 0.0, "crashed": 1.0},
            {**cell, "error": "RuntimeError: boom", "completed": None, "crashed": 0.0},
            {**cell, "error": "", "completed": None, "crashed": 0.0},
        ]
    ).assign(protection="bare")


def test_errored_selects_errored_trials_not_agents_that_crashed() -> None:
    assert errored(_trials()).tolist() == [False, False, True, True]


def test_crashed_is_a_deprecated_alias_of_errored() -> None:
    from twice import reports

    with pytest.warns(DeprecationWarning, match=r"call twice\.reports\.errored\(\)"):
        old = reports.crashed(_trials())
    assert old.tolist() == errored(_trials()).tolist()
