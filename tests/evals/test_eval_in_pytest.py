"""Gating in pytest: a twice eval run inside a test, and the rates it returns."""

from __future__ import annotations

import json
import math
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
    with pytest.raises(ValueError, match=r"unknown axis models; expected: model, agent, prompt"):
        rates.cell(models="stub/retry")


def test_eval_rates_gates_an_agent_under_test(tmp_path: Path) -> None:
    # eval_rates had no agent axis: TypeError on agent=..., so a framework or user agent
    # could only be gated with `twice gate`.
    agent = tmp_path / "twice_refunds.py"
    agent.write_text(
        "import httpx\n\n\n"
        "async def agent(request, ctx):\n"
        "    async with httpx.AsyncClient() as http:\n"
        "        for _ in range(2):  # a retry without a key\n"
        "            await http.post(ctx.urls['payments'] + '/v1/refunds',\n"
        "                            json={'order_id': 'order_1042', 'amount': 499})\n"
        "    return 'done'\n",
        encoding="utf-8",
    )
    spec = f"{agent}:agent"
    rates = eval_rates(
        task="refund", model="stub/verify", fault="none", agent=["react", spec], limit=1,
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert rates.cell(agent="react").duplication_rate == 0.0
    mine = rates.cell(agent=spec)
    assert mine.duplication_rate == 1.0 and mine.agent == spec
    assert mine.label().startswith(f"stub/verify / {spec} / baseline / refund")


def test_evals_plugin_also_loads_the_mock_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ledger(ledger):\n    assert ledger.effects == []\n")
    pytester.runpytest("-p", "twice.evals.pytest_plugin").assert_outcomes(passed=1)


def test_failing_gate_names_the_duplicated_trials_without_inspects_trace(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest('pytest_plugins = ["twice.evals.pytest_plugin"]\n')
    pytester.makepyfile(
        test_gate="""
def test_first(twice_eval):
    assert twice_eval(task="refund", model="stub/verify", fault="lost_reply", limit=1)

def test_retry_never_duplicates(twice_eval):
    rates = twice_eval(task="refund", model="stub/retry", fault="lost_reply", limit=2)
    assert rates.one().duplication_rate == 0
"""
    )
    result = pytester.runpytest_subprocess()  # a subprocess: see the docs example's test
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    # The evidence: which cell, how many of how many, and which trials to open.
    assert (
        "CellRates(stub/retry / baseline / refund / lost_reply / bare: 2 trials, 0 errors; "
        "duplicated 2 = 100% [34%-100%]: refund-001#1, refund-002#1;" in out
    )
    # Not inspect's own trace records (every model and tool call, entered and left), nor
    # the deprecation warning its retry set-up raises for every model.
    assert "TRACE" not in out and "Tool Call:" not in out
    assert "'initial' parameter is deprecated" not in out


def test_cell_repr_lists_the_trials_behind_each_rate(tmp_path: Path) -> None:
    trials = pd.DataFrame(
        {
            "model": "stub/retry", "prompt": "baseline", "task": "refund",
            "fault": "lost_reply", "protection": "bare",
            "sample": [f"refund-{i:03d}" for i in (2, 1, 3, 4, 5, 6, 7, 8)],
            "epoch": [1, 1, 1, 1, 1, 1, 1, 2],
            "duplicated": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, None],
            "completed": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, None],
            "error": ["", "", "", "", "", "", "", "RuntimeError: boom"],
        }
    )  # fmt: skip
    other = trials.assign(model="stub/verify", duplicated=0.0)
    row = {**ROW, "trials": 8, "errors": 1, "duplication_rate": 6 / 7}
    cell = CellRates.from_row(row, pd.concat([trials, other]))
    assert len(cell.frame) == 8  # its own trials, not the other model's
    assert cell.trials_where("duplicated") == [
        "refund-001#1", "refund-002#1", "refund-004#1", "refund-005#1", "refund-006#1",
        "refund-007#1",
    ]  # fmt: skip
    text = repr(cell)
    assert text.startswith("CellRates(stub/retry / baseline / refund / lost_reply / bare: ")
    assert (
        "duplicated 6 = 86% [51%-100%]: refund-001#1, refund-002#1, refund-004#1, "
        "refund-005#1, refund-006#1 and 1 more;" in text
    )
    assert "errors in: refund-008#2" in text and "not completed: refund-003#1" in text
    with pytest.raises(KeyError, match=r"no trial column 'dup'; the metrics are: completed"):
        cell.trials_where("dup")
    # Without a trial frame (a row alone), the count comes from the rate and nothing is named.
    assert "duplicated 6 = 86% [51%-100%]; completed" in repr(CellRates.from_row(row))
    assert "wrong values" not in text and math.isnan(cell.wrong_rate)  # a row without it
    wrong = trials.assign(wrong=[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, None])
    cell_wrong = CellRates.from_row({**row, "wrong_rate": 1 / 7}, wrong)
    assert cell_wrong.wrong_rate == 1 / 7 and cell_wrong.trials_where("wrong") == ["refund-003#1"]
    assert "wrong values: refund-003#1" in repr(cell_wrong)
    rates = EvalRates(cells=(cell,), table=pd.DataFrame([row]), log_dir=tmp_path)
    assert repr(rates) == (
        f"EvalRates(1 cell, logs in {tmp_path}: stub/retry / baseline / refund / lost_reply / "
        "bare: duplicated 86% of 8)"
    )
