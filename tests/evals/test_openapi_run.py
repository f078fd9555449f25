"""``twice run --task openapi:PATH[:DATASET]``: a task from an OpenAPI document and a dataset,
from the command line and a suite file, through the summary, the report and the gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "docs" / "examples" / "openapi"
TASK = "openapi:tests/mocks/openapi_docs/stripe.json:docs/examples/openapi/stripe_refunds.jsonl"


def test_twice_run_suite_of_an_openapi_task_summary_report_and_gate(
    twice: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the suite names its files relative to where twice runs
    out = tmp_path / "logs"
    run = twice("run", "--config", EXAMPLES / "suite.toml", "--log-dir", out, "--display", "none")
    assert run.exit_code == 0, run.output
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    rates = {
        (c["task"], c["model"], c["protection"]): (c["trials"], c["duplication_rate"])
        for c in summary["cells"]
    }
    assert rates == {
        (TASK, "stub/retry", "bare"): (2, 1.0),
        (TASK, "stub/no-retry", "bare"): (2, 0.0),
        (TASK, "stub/verify", "bare"): (2, 0.0),
        (TASK, "stub/retry", "intent-key"): (2, 0.0),
    }
    assert TASK in (out / "report.html").read_text(encoding="utf-8")
    gate = twice("gate", out, "--config", EXAMPLES / "gate.toml")
    assert gate.exit_code == 1, gate.output
    failed = [line for line in gate.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "stub/retry" in failed[0] and "/ bare]" in failed[0]
    # The same cells named from the flags (another spelling of the paths) are reused.
    again = twice(
        "run", "--task", TASK.replace("openapi:", "openapi:./"), "--model", "stub/verify",
        "--fault", "lost_reply", "--log-dir", out, "--display", "none",
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "1 of 1 cell(s) were already finished and reused" in again.stderr


def test_twice_run_openapi_task_with_a_bad_row_is_a_usage_error(
    twice: Callable[..., Any], tmp_path: Path
) -> None:
    data = tmp_path / "refunds.jsonl"
    row = json.loads((EXAMPLES / "stripe_refunds.jsonl").read_text().splitlines()[0])
    row["plan"][0]["call"]["tool"] = "RefundCharge"
    data.write_text(json.dumps(row) + "\n")
    stripe = ROOT / "tests" / "mocks" / "openapi_docs" / "stripe.json"
    result = twice("run", "--task", f"openapi:{stripe}:{data}", "--model", "stub/retry",
                   "--log-dir", tmp_path / "logs", "--display", "none")  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert (
        f"{data}:1: sample 'stripe-refund-1': plan[0].call.tool 'RefundCharge' is not an " in line
    )
    assert "its tools: GetChargesCharge, GetRefunds, GetRefundsRefund, PostChargesCharge" in line
