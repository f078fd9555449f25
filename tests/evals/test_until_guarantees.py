"""``twice run --until-decided`` keeps every guarantee of ``twice run``: one run per log
directory, SIGINT/SIGTERM within or between rounds exit 130/143 with summary.json marked
incomplete and the same command resumes, and a model endpoint that cannot be reached ends the
run (exit 1) in bounded time with the one line ``twice run`` prints. (The local model server
around a sequential run: tests/evals/test_local_model.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from twice.evals import parse_gate, run_until_decided, suite_from_flags
from twice.evals.locks._lock import LOCK_NAME, LogDirLockedError, lock_log_dir

HANG_RUN = Path(__file__).parent / "scripts" / "hang_run.py"
DEADLINE_S = 180.0
Twice = Callable[..., Any]
LOOSE = '[[rule]]\nname = "dup"\nmetric = "duplication_rate"\nmax = 0.5\n'


@pytest.fixture
def gate_file(tmp_path: Path) -> Path:
    """A gate a clean cell passes after a few rounds of 4 trials (0 of n below 50%)."""
    path = tmp_path / "loose.toml"
    path.write_text(LOOSE, encoding="utf-8")
    return path


def _summary(log_dir: Path) -> dict[str, Any]:
    return dict(json.loads((log_dir / "summary.json").read_text(encoding="utf-8")))


# -- the lock ------------------------------------------------------------------------------


def test_until_decided_into_a_locked_dir_exits_2_naming_the_holder(
    twice: Twice, gate_file: Path, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    with lock_log_dir(log_dir):
        result = twice(
            "run", "--until-decided", gate_file, "--model", "stub/verify", "--task", "refund",
            "--fault", "none", "--limit", "1", "--log-dir", log_dir, "--display", "none",
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        message = " ".join(result.stderr.split())
        assert f"log directory '{log_dir}' is in use by another twice run" in message
        assert f"(pid {os.getpid()} on {socket.gethostname()}" in message
        assert sorted(p.name for p in log_dir.iterdir()) == [LOCK_NAME]  # nothing written
        suite = suite_from_flags(
            config=None, models=["stub/verify"], prompts=[], tasks=["refund"],
            faults=["none"], protections=[], epochs=None, limit=1,
        )  # fmt: skip
        with pytest.raises(LogDirLockedError, match="in use by another twice run"):
            run_until_decided(suite, log_dir, parse_gate({"rule": []}), gate_path="g")


# -- interruption --------------------------------------------------------------------------


class _Killed(Exception):
    """What SIGTERM raises when nothing in the run handles it (instead of killing pytest)."""


@pytest.fixture
def sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise _Killed

    old = signal.signal(signal.SIGTERM, handler)
    yield
    signal.signal(signal.SIGTERM, old)


@pytest.mark.slow
@pytest.mark.usefixtures("sigterm_raises")
def test_sigterm_between_rounds_stops_marks_the_summary_and_the_rerun_resumes(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "logs"
    gate = parse_gate({"rule": [{"name": "dup", "metric": "duplication_rate", "max": 0.5}]})
    suite = suite_from_flags(
        config=None, models=["stub/verify"], prompts=[], tasks=["refund"],
        faults=["lost_reply"], protections=["bare"], epochs=None, limit=4,
    )  # fmt: skip
    rounds: list[str] = []

    def progress(line: str) -> None:
        rounds.append(line)
        if len(rounds) == 2:  # round 1 has run and been judged; round 2 is next
            os.kill(os.getpid(), signal.SIGTERM)

    result, states = run_until_decided(suite, log_dir, gate, gate_path="g", progress=progress)
    assert (result.interrupted, result.exit_code) == ("SIGTERM", 143)
    assert len(rounds) == 2 and not result.failed
    summary = _summary(log_dir)
    assert summary["complete"] is False and summary["status"] == "incomplete"
    assert summary["interrupted"] == "SIGTERM"
    assert [(c["model"], c["fault"]) for c in summary["missing"]] == [("stub/verify", "lost_reply")]
    (cell,) = summary["run"]["sequential"]["cells"]
    assert cell["verdict"] == "running" and cell["trials"] == 4  # round 1's trials are kept
    assert not (log_dir / LOCK_NAME).exists()

    again, states = run_until_decided(suite, log_dir, gate, gate_path="g")
    assert again.ok and again.exit_code == 0
    (st,) = states
    # 0 of n duplicated proves "below 50%" only after a few rounds; round 1 was not redone.
    assert st.status == "pass" and st.stopped_round is not None and st.stopped_round > 1
    assert st.trials == 4 * st.stopped_round
    summary = _summary(log_dir)
    assert summary["complete"] is True and "missing" not in summary
    assert "interrupted" not in summary


def _hang_run(log_dir: Path, gate: Path) -> list[str]:
    return [
        sys.executable, str(HANG_RUN), "run", "--until-decided", str(gate),
        "--model", "stub/retry", "--model", "hang/slow", "--task", "refund",
        "--fault", "lost_reply", "--limit", "4", "--log-dir", str(log_dir),
        "--display", "none", "--no-report",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_within_a_round_exits_like_twice_run_and_the_rerun_resumes(
    tmp_path: Path, gate_file: Path, sig: signal.Signals, code: int
) -> None:
    log_dir, marks = tmp_path / "logs", tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARK_DIR": str(marks), "HANG_SAMPLE": "refund-003"}
    proc = subprocess.Popen(
        _hang_run(log_dir, gate_file),
        env={**env, "HANG": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + DEADLINE_S
    while not (marks / "hanging").exists():  # hang/slow is stuck on one trial of round 1
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} early:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"no hang after {DEADLINE_S:.0f} s")
        time.sleep(0.2)
    proc.send_signal(sig)
    out = proc.communicate(timeout=DEADLINE_S)[0]
    assert proc.returncode == code, out
    assert f"interrupted by {sig.name}" in out and "Traceback" not in out
    assert "gate not decided" in out
    assert "NOT SETTLED          hang/slow / baseline / refund / lost_reply / bare: the run" in out
    summary = _summary(log_dir)
    assert summary["complete"] is False and summary["status"] == "incomplete"
    assert summary["interrupted"] == sig.name
    assert ("hang/slow", "lost_reply") in {(c["model"], c["fault"]) for c in summary["missing"]}
    assert all(c["errors"] == 0 for c in summary["cells"]), "cut-short trials are not crashes"
    assert "sequential" in summary["run"]

    rerun = subprocess.run(
        _hang_run(log_dir, gate_file), env=env, capture_output=True, text=True,
        timeout=DEADLINE_S,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = _summary(log_dir)
    assert summary["complete"] is True and "missing" not in summary
    verdicts = {c["model"]: c["verdict"] for c in summary["run"]["sequential"]["cells"]}
    assert verdicts["hang/slow"] == "pass"  # never duplicates: settled after a few rounds
    assert all(c["errors"] == 0 for c in summary["cells"])


# -- a model endpoint that cannot be reached -----------------------------------------------


@pytest.mark.slow
def test_dead_endpoint_ends_the_sequential_run_with_exit_1_in_bounded_time(
    gate_file: Path, tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    log_dir = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    env["OPENAI_API_KEY"] = "sk-test-not-a-real-key-0123456789"
    started = time.monotonic()
    # In a process of its own: without the endpoint guard, inspect retries without end.
    proc = subprocess.run(
        [
            sys.executable, "-m", "twice.evals.cli", "run", "--until-decided", str(gate_file),
            "--model", "openai/gpt-4o-mini", "-M", f"base_url={url}", "--task", "refund",
            "--fault", "none", "--limit", "4", "--log-dir", str(log_dir), "--display", "none",
            "--timeout", "2", "--max-retries", "1",
        ],
        env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(
        f"error: model 'openai/gpt-4o-mini' at {url} could not be reached: "
    )
    assert elapsed < 90, f"took {elapsed:.0f} s"
    # No more rounds after the endpoint was found down: one round of 4 trials.
    assert proc.stderr.count("twice: round:") == 1, proc.stderr
    summary = _summary(log_dir)
    assert summary["complete"] is False and summary["status"] == "incomplete"
    assert [c["model"] for c in summary["missing"]] == ["openai/gpt-4o-mini"]


# -- the suite's axes ------------------------------------------------------------------------


@pytest.mark.slow
def test_until_decided_runs_the_agent_under_test(
    twice: Twice, gate_file: Path, tmp_path: Path
) -> None:
    # --agent reached only a fixed run; a sequential one ran twice's own loop instead.
    log_dir = tmp_path / "logs"
    result = twice(
        "run", "--until-decided", gate_file, "--model", "stub/verify", "--agent", "langgraph",
        "--task", "refund", "--fault", "lost_reply", "--limit", "4", "--log-dir", log_dir,
        "--display", "none", "--no-report",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (cell,) = _summary(log_dir)["run"]["sequential"]["cells"]
    assert cell["agent"] == "langgraph" and cell["verdict"] == "pass"
