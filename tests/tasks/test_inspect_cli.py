"""Everything also works the inspect way: `inspect eval tasks/refund --model stub/...`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from inspect_ai.log import list_eval_logs, read_eval_log
from twice.mocks import LEDGER_STORE_KEY

ROOT = Path(__file__).resolve().parents[2]


def test_inspect_eval_cli_resolves_task_and_stub_provider(tmp_path: Path) -> None:
    inspect = Path(sys.executable).parent / "inspect"
    proc = subprocess.run(
        [
            str(inspect),
            "eval",
            "tasks/refund",
            "--model",
            "stub/retry",
            "-T",
            "fault=lost_reply",
            "--limit",
            "2",
            "--log-dir",
            str(tmp_path),
            "--display",
            "none",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (info,) = list_eval_logs(str(tmp_path))
    log = read_eval_log(info)
    assert log.status == "success", log.error
    assert log.eval.task_args["fault"] == "lost_reply"
    for sample in log.samples or []:
        ledger = sample.store[LEDGER_STORE_KEY]  # what `inspect view` shows under Store
        assert [e["id"] for e in ledger["effects"]] == ["re_1", "re_2"]
        assert sample.scores and sample.scores["side_effects"].value["duplicated"] == 1.0
