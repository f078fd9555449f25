"""A run on stub models does not import the provider SDKs inspect sets up per sample, nor,
without a report, the statistics libraries of the report's comparisons.

Inspect imports the OpenAI and Anthropic SDKs (and its provider modules for them) at the
first sample of every process where they are installed: 1.2-1.6 s of CPU, paid again by each
``--workers`` worker. A run whose models and agents use neither leaves them out. statsmodels
and scipy.stats (0.8 s) serve only the report's comparisons and ``gate --baseline``: a
``--no-report`` run (each worker's, each cluster shard's) does without them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.model import _assistant_internal as internal
from twice.evals.run._speedups import needs_provider_sdk_state, without_provider_sdk_state
from twice.reports import Cell

STUB = Cell(
    model="stub/retry", prompt="baseline", task="refund", fault="lost_reply", protection="bare"
)

# A stub run in a fresh interpreter (this one has imported the SDKs for other tests); it
# prints the SDK modules it ended up with, and the run's trial count.
RUN_AND_LIST_SDKS = """
import json, sys
from click.testing import CliRunner
from twice.evals.cli import cli
out = sys.argv[1]
result = CliRunner().invoke(cli, ["run", "--log-dir", out, "--model", "stub/retry",
    "--task", "refund", "--fault", "lost_reply", "--limit", "2", "--no-report"])
sdks = sorted(m for m in sys.modules if m.split(".")[0] in ("openai", "anthropic"))
stats = sorted(m for m in sys.modules if m == "scipy.stats" or m.split(".")[0] == "statsmodels")
print(json.dumps({"exit": result.exit_code, "sdks": sdks, "stats": stats}))
"""


@pytest.fixture(scope="module")
def stub_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """What a fresh interpreter imported for a two-trial ``--no-report`` stub run."""
    logs = tmp_path_factory.mktemp("stub-run") / "logs"
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_SDKS, str(logs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["exit"] == 0
    return seen, logs


def test_a_stub_run_imports_neither_sdk(stub_run: tuple[dict[str, Any], Path]) -> None:
    seen, logs = stub_run
    assert seen["sdks"] == []
    summary = json.loads((logs / "summary.json").read_text(encoding="utf-8"))
    assert [c["trials"] for c in summary["cells"]] == [2]
    assert summary["cells"][0]["duplication_rate"] == 1.0  # the control still duplicates


def test_a_run_without_a_report_imports_no_comparison_statistics(
    stub_run: tuple[dict[str, Any], Path],
) -> None:
    seen, logs = stub_run
    assert seen["stats"] == []
    # ...and its summary still has every interval (twice's own Wilson formula).
    cell = json.loads((logs / "summary.json").read_text(encoding="utf-8"))["cells"][0]
    assert cell["duplication_ci"][0] > 0.0 and cell["duplication_ci"][1] == 1.0


@pytest.mark.parametrize(
    "cell",
    [
        Cell(
            model="openai/gpt-5-mini",
            prompt="baseline",
            task="refund",
            fault="lost_reply",
            protection="bare",
        ),
        Cell(
            model="anthropic/claude-sonnet-4-5",
            prompt="baseline",
            task="refund",
            fault="lost_reply",
            protection="bare",
        ),
        Cell(
            model="openai-api/local/qwen",
            prompt="baseline",
            task="refund",
            fault="lost_reply",
            protection="bare",
        ),
        Cell(
            model="stub/retry",
            agent="openai-agents",
            prompt="baseline",
            task="refund",
            fault="lost_reply",
            protection="bare",
        ),
        Cell(
            model="stub/retry",
            agent="my_agent.py:build",
            prompt="baseline",
            task="refund",
            fault="lost_reply",
            protection="bare",
        ),
        Cell(
            model="stub/retry",
            prompt="baseline",
            task="my_task.py:refund",
            fault="lost_reply",
            protection="bare",
        ),
    ],
    ids=["openai", "anthropic", "openai-api", "framework-agent", "own-agent", "own-task"],
)
def test_any_cell_that_may_call_a_provider_keeps_inspect_as_it_is(cell: Cell) -> None:
    assert needs_provider_sdk_state([STUB, cell])
    before = (internal._HAS_OPENAI, internal._HAS_ANTHROPIC)
    with without_provider_sdk_state([STUB, cell]):
        assert before == (internal._HAS_OPENAI, internal._HAS_ANTHROPIC)


def test_the_flags_are_restored_after_a_stub_run() -> None:
    assert not needs_provider_sdk_state(
        [STUB, Cell(model="mockllm/model", prompt="b", task="refund", fault="f", protection="p")]
    )
    before = (internal._HAS_OPENAI, internal._HAS_ANTHROPIC)
    assert before == (True, True)  # both SDKs are dependencies of twice
    with pytest.raises(RuntimeError), without_provider_sdk_state([STUB]):
        assert (internal._HAS_OPENAI, internal._HAS_ANTHROPIC) == (False, False)
        raise RuntimeError("a run that fails still restores them")
    assert before == (internal._HAS_OPENAI, internal._HAS_ANTHROPIC)
