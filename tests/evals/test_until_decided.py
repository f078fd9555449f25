"""``twice run --until-decided GATE.toml``: rounds, stopping, resume, and the gate after it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from twice.evals.cli import cli
from twice.reports import Cell, log_files

GATE = Path(__file__).parents[2] / "evals" / "gate.toml"
COMMON = ("--task", "refund", "--fault", "lost_reply", "--limit", "4", "--display", "none")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "4"], "--batch and --max-trials only apply with --until-decided"),
        (["--max-trials", "40"], "--batch and --max-trials only apply with --until-decided"),
        (["--until-decided", str(GATE), "--epochs", "2"], "--epochs and --until-decided"),
        (["--until-decided", "missing.toml"], "gate file 'missing.toml' does not exist"),
        (
            ["--until-decided", str(GATE), "--model", "stub/retry", "--max-trials", "3"],
            "--max-trials 3 is below one round",
        ),
    ],
)
def test_until_decided_bad_usage_exits_2(args: list[str], message: str, tmp_path: Path) -> None:
    code, out = invoke("run", *args, *COMMON, "--log-dir", str(tmp_path / "logs"))
    assert code == 2, out
    assert message in out
    assert not (tmp_path / "logs" / "summary.json").exists()


@pytest.mark.slow
def test_a_rule_that_matches_no_cell_fails_the_sequential_verdict_as_it_fails_the_gate(
    tmp_path: Path,
) -> None:
    # A typo in a filter: the run said "gate passed" without the rule, where `twice gate`
    # fails a rule that matches nothing.
    gate = tmp_path / "typo.toml"
    gate.write_text(
        '[[rule]]\nname = "dup"\nmetric = "duplication_rate"\nmax = 0.5\n'
        '[[rule]]\nname = "typo"\nmetric = "completion_rate"\nmin = 0.5\n'
        'model = "stub/verfy"\n',
        encoding="utf-8",
    )
    logs = tmp_path / "logs"
    code, out = invoke("run", "--until-decided", str(gate), "--model", "stub/verify", *COMMON,
                       "--log-dir", str(logs), "--no-report")  # fmt: skip
    assert code == 0, out
    assert "PASS (settled)" in out  # the one cell passes its own rule
    assert "FAIL rule 'typo': no cell matches model=['stub/verfy']; the suite has model: " in out
    assert "gate FAILED" in out and "gate passed" not in out
    code, out = invoke("gate", str(logs), "--config", str(gate))
    assert code == 1, out


def test_a_cell_no_rule_covers_is_recorded_as_no_rule_not_as_a_pass() -> None:
    # The failing path: summary.json's run.sequential said "verdict": "pass" (rules {}) for a
    # cell the gate never looked at; only the console said NO RULE.
    from twice.evals.run._decisions import CellState, format_decisions, settle

    cell = Cell(
        model="stub/retry", prompt="baseline", task="refund", fault="none", protection="bare"
    )
    state = CellState(cell=cell, samples=4, epochs=1, trials=4)
    settle(state, 1)
    record = state.record()
    assert (record["verdict"], record["rules"], record["stopped_round"]) == ("no rule", {}, 1)
    assert format_decisions([state], 480).startswith("NO RULE (1 round)    stub/retry")


def gate_file(tmp_path: Path, max_dup: float = 0.5) -> Path:
    """A gate of one rule: duplication_rate at most ``max_dup``."""
    path = tmp_path / f"dup-{max_dup}.toml"
    path.write_text(
        f'[[rule]]\nname = "dup"\nmetric = "duplication_rate"\nmax = {max_dup}\n',
        encoding="utf-8",
    )
    return path


def loose_gate(tmp_path: Path) -> Path:
    return gate_file(tmp_path)


@pytest.mark.slow
def test_retry_fails_in_round_one_and_the_gate_agrees(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # --batch 6 with 4 samples: rounds of two epochs, 8 trials.
    code, out = invoke("run", "--until-decided", str(GATE), "--model", "stub/retry", *COMMON,
                       "--batch", "6", "--log-dir", str(logs), "--no-report")  # fmt: skip
    assert code == 0, out
    assert "FAIL (settled)" in out and "after round 1, 8 trial(s)" in out
    assert "fails regardless of more trials" in out
    run = json.loads((logs / "summary.json").read_text(encoding="utf-8"))["run"]
    seq = run["sequential"]
    assert "betting confidence sequence" in seq["method"]
    (cell,) = seq["cells"]
    assert (cell["verdict"], cell["stopped_round"], cell["trials"]) == ("fail", 1, 8)
    # The batch asked for, and the round it became (it read as if rounds were 6 trials).
    assert (seq["batch"], cell["round_trials"]) == (6, 8)
    junit = tmp_path / "gate.xml"
    code, out = invoke("gate", str(logs), "--config", str(GATE), "--junit", str(junit))
    assert code == 1, out
    assert "anytime-valid" in out and "rounds of at least 6 trial(s) (whole epochs)" in out
    root = ET.parse(junit).getroot()
    assert "anytime-valid" in root.attrib["name"]


@pytest.mark.slow
def test_verify_passes_after_some_rounds_and_a_rerun_resumes_without_new_trials(
    tmp_path: Path,
) -> None:
    logs, gate = tmp_path / "logs", loose_gate(tmp_path)
    args = ("run", "--until-decided", str(gate), "--model", "stub/verify", *COMMON,
            "--log-dir", str(logs), "--no-report")  # fmt: skip
    code, out = invoke(*args)
    assert code == 0, out
    assert "PASS (settled)" in out
    first = json.loads((logs / "summary.json").read_text(encoding="utf-8"))["run"]["sequential"]
    (cell,) = first["cells"]
    # 0 of n duplicated proves "below 50%" only after a few trials: more than one round of 4.
    assert cell["verdict"] == "pass" and cell["stopped_round"] > 1
    assert cell["trials"] == 4 * cell["stopped_round"]
    files = log_files(logs)
    code, out = invoke(*args)
    assert code == 0, out
    again = json.loads((logs / "summary.json").read_text(encoding="utf-8"))["run"]["sequential"]
    assert again["cells"] == first["cells"]
    assert log_files(logs) == files
    code, out = invoke("gate", str(logs), "--config", str(gate))
    assert code == 0, out
    assert "anytime-valid" in out
    # Without its summary.json the logs still say the run was sequential. The failing path:
    # the gate fell back to Wilson's bounds, which the run's looking every round invalidates
    # (a cell the run's own gate failed then passed).
    (logs / "summary.json").unlink()
    code, out = invoke("gate", str(logs), "--config", str(gate))
    assert code == 0, out
    assert "anytime-valid" in out and "Wilson" not in out


@pytest.mark.slow
def test_a_cell_undecided_at_the_cap_stays_there_when_the_run_is_repeated(
    tmp_path: Path,
) -> None:
    # The failing path: every rerun (a CI retry) replayed the rounds, then ran one more past
    # --max-trials; the 13th turned "undecided" into a pass.
    logs, gate = tmp_path / "logs", gate_file(tmp_path, 0.2)
    args = ("run", "--until-decided", str(gate), "--model", "stub/noisy", "--prompt", "cautious",
            *COMMON, "--max-trials", "8", "--log-dir", str(logs), "--no-report")  # fmt: skip
    code, out = invoke(*args)
    assert code == 0, out
    assert "UNDECIDED at the 8-trial cap" in out and "after round 2, 8 trial(s)" in out
    files = log_files(logs)
    for _ in range(2):
        code, out = invoke(*args)
        assert code == 0, out
        assert "UNDECIDED at the 8-trial cap" in out and "after round 2, 8 trial(s)" in out
    assert log_files(logs) == files
    (cell,) = json.loads((logs / "summary.json").read_text())["run"]["sequential"]["cells"]
    assert (cell["verdict"], cell["trials"]) == ("undecided", 8)
    # A lower cap would stop the cell before the trials its logs hold, and inspect would
    # rewrite the log without them: refused, nothing dropped.
    lower = [a if a != "8" else "4" for a in args]  # --max-trials 4
    code, out = invoke(*lower)
    assert code == 2, out
    assert "holds 2 epoch(s) of cell stub/noisy" in out and "stops it at 1" in out
    assert log_files(logs) == files
    assert sum(1 for _ in ran(logs)) == 8


def ran(logs: Path) -> list[object]:
    from twice.reports import read_log_dir, trials_frame

    frame = trials_frame(read_log_dir(logs).files)
    return list(frame.itertuples())


@pytest.mark.slow
def test_until_decided_into_a_fixed_runs_directory_is_refused(tmp_path: Path) -> None:
    # The failing path: its first round rewrote the fixed run's 3-epoch logs to one epoch,
    # dropping two thirds of the trials, with exit 0.
    logs = tmp_path / "logs"
    fixed = ("run", "--model", "stub/verify", *COMMON, "--epochs", "3", "--log-dir", str(logs),
             "--no-report")  # fmt: skip
    code, out = invoke(*fixed)
    assert code == 0, out
    files = log_files(logs)
    code, out = invoke("run", "--until-decided", str(loose_gate(tmp_path)), "--model",
                       "stub/verify", *COMMON, "--log-dir", str(logs), "--no-report")  # fmt: skip
    assert code == 2, out
    assert "holds a fixed run (--epochs 3)" in out and "its own --log-dir" in out
    assert log_files(logs) == files
    assert sum(1 for _ in ran(logs)) == 12


SOMETIMES_REFUSED = """
from openai import AsyncOpenAI

async def agent(request, ctx):
    if str(ctx.sample_id).endswith("1"):  # one sample of four: a trial error every epoch
        await AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": request}])
    return "nothing to do"
"""


@pytest.mark.slow
def test_a_sequential_run_with_errored_trials_does_not_say_the_gate_passed(
    tmp_path: Path,
) -> None:
    # The failing path: "PASS (settled)" and "gate passed" printed, then exit 1 (a quarter
    # of the trials errored), and twice gate refuses the directory.
    agent = tmp_path / "agent.py"
    agent.write_text(SOMETIMES_REFUSED, encoding="utf-8")
    logs = tmp_path / "logs"
    code, out = invoke("run", "--until-decided", str(loose_gate(tmp_path)), "--model",
                       "stub/verify", "--agent", f"{agent}:agent", *COMMON, "--log-dir",
                       str(logs), "--no-report")  # fmt: skip
    assert code == 1, out
    assert "gate passed" not in out
    assert "gate not decided: the run failed" in out


def test_a_rule_not_yet_settled_in_a_running_cell_reads_running_not_fail() -> None:
    # summary.json's run.sequential.cells said "fail" for a rule whose bound had not been
    # reached yet, while the cell was still running (interrupted between rounds, say).
    from twice.evals.gate._sequential_rules import RuleState
    from twice.evals.run._decisions import CellState

    cell = Cell(model="m/a", prompt="baseline", task="refund", fault="none", protection="bare")
    state = CellState(cell=cell, samples=4, rounds=1, trials=4)
    state.rules = {"open": RuleState("fail", False, "…"), "lost": RuleState("fail", True, "…")}
    assert state.record()["rules"] == {"open": "running", "lost": "fail"}
    state.stopped_round = 3  # at the cap, undecided: the rule's state is its verdict
    assert state.record()["rules"] == {"open": "fail", "lost": "fail"}
