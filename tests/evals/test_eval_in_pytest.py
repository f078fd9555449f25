"""Gating in pytest: a twice eval run inside a test, and the rates it returns."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from twice.evals import CellRates, EvalRates, eval_rates

GATE_EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "gate"
ROW = {
    "model": "stub/retry",
    "prompt": "baseline",
    "task": "refund",
    "fault": "lost_reply",
    "protection": "bare",
    "trials": 4,
    "errors": 0,
    "completion_rate": 1.0,
    "duplication_rate": 1.0,
    "duplication_ci": [0.51, 1.0],
    "exactly_once_rate": 0.0,
    "safe_success_rate": 0.0,
    "excess_effects_mean": 1.0,
    "divergence_rate": 0.0,
}


def test_twice_eval_docs_example_gates_on_rates(pytester: pytest.Pytester) -> None:
    for path in sorted(GATE_EXAMPLE.glob("*.py")):
        pytester.makepyfile(**{path.stem: path.read_text(encoding="utf-8")})
    # In a subprocess: an in-process run would unload the C extensions the eval imports
    # (numpy.fft via statsmodels), and they cannot be loaded twice in one process.
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    (summary,) = pytester.path.glob("**/twice-eval-1/summary.json")
    cells = json.loads(summary.read_text(encoding="utf-8"))["cells"]
    assert sorted((c["model"], c["trials"], c["duplication_rate"]) for c in cells) == [
        ("stub/retry", 4, 1.0),
        ("stub/verify", 4, 0.0),
    ]


def test_eval_rates_bad_name_raises_before_running(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown fault 'lost-reply'; expected one of: none"):
        eval_rates(task="refund", model="stub/retry", fault="lost-reply", log_dir=tmp_path)
    with pytest.raises(ValueError, match=r"model must be a name or a non-empty list"):
        eval_rates(task="refund", model=[], fault="none", log_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_eval_rates_cell_lookup_errors_list_the_cells(tmp_path: Path) -> None:
    rows = [ROW, {**ROW, "model": "stub/verify", "duplication_rate": 0.0}]
    rates = EvalRates(
        cells=tuple(CellRates.from_row(r) for r in rows), table=pd.DataFrame(rows), log_dir=tmp_path
    )
    assert rates.cell(model="stub/verify").duplication_rate == 0.0
    assert rates.cell(model="stub/retry").duplication_ci == (0.51, 1.0)
    with pytest.raises(LookupError, match=r"2 cells match \{\}; the cells are:\n  stub/retry / "):
        rates.one()
    with pytest.raises(LookupError, match=r"0 cells match \{'model': 'stub/x'\}"):
        rates.cell(model="stub/x")
    with pytest.raises(ValueError, match=r"unknown axis models; expected: model, prompt"):
        rates.cell(models="stub/retry")


def test_evals_plugin_also_loads_the_mock_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ledger(ledger):\n    assert ledger.effects == []\n")
    pytester.runpytest("-p", "twice.evals.pytest_plugin").assert_outcomes(passed=1)
