"""Chaos: a run stopped by SIGINT, SIGTERM and SIGKILL at random moments, a concurrent run on
the same log dir refused, then rerun: exactly the planned trials, the summary equal to the
gate's counts, and a non-zero exit for every interrupted attempt."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twice.reports import cells, read_log_dir, trials_frame

HANG_RUN = Path(__file__).parent / "scripts" / "hang_run.py"
DEADLINE_S = 240.0
LIMIT, EPOCHS = 6, 2
MODELS = ("stub/retry", "hang/slow")
FAULTS = ("none", "lost_reply")
PLANNED = {(m, f): LIMIT * EPOCHS for m in MODELS for f in FAULTS}
EXPECTED_EXIT = {
    # twice's own code, or (signal landed during start-up, before twice's handler) death by
    # the signal, which a shell reports as the same 128 + n.
    signal.SIGINT: {130, -signal.SIGINT},
    signal.SIGTERM: {143, -signal.SIGTERM},
    signal.SIGKILL: {-signal.SIGKILL},
}


def _command(log_dir: Path) -> list[str]:
    args = [sys.executable, str(HANG_RUN), "run", "--task", "refund", "--display", "none"]
    for m in MODELS:
        args += ["--model", m]
    for f in FAULTS:
        args += ["--fault", f]
    return [*args, "--limit", str(LIMIT), "--epochs", str(EPOCHS), "--log-dir", str(log_dir)]


def _running_since(log_dir: Path, t: float) -> bool:
    path = log_dir / "summary.json"
    try:
        return path.stat().st_mtime >= t and json.loads(path.read_text())["status"] == "running"
    except (OSError, ValueError, KeyError):
        return False


def _until(ready: object, proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(
                f"exited {proc.returncode} before {what}:\n{proc.communicate()[0]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_chaos_signals_at_random_moments_then_rerun(
    tmp_path: Path, twice: Callable[..., Any]
) -> None:
    seed = int(os.environ.get("TWICE_CHAOS_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    note = f"(TWICE_CHAOS_SEED={seed})"
    log_dir, marks = tmp_path / "logs", tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARK_DIR": str(marks), "HANG_SAMPLE": "refund-002"}
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    rng.shuffle(signals)
    exits: list[tuple[str, int]] = []

    for attempt, sig in enumerate(signals):
        # Every attempt has a trial that hangs, so the signal always finds the run in flight:
        # without one, what an earlier attempt left could all finish inside the random delay
        # and the run exit 0 before the signal was sent. The first attempt holds the log dir
        # while a second run is tried.
        proc = subprocess.Popen(
            _command(log_dir),
            env={**env, "HANG": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if attempt == 0:
            _until((marks / "hanging").exists, proc, "a trial in flight")
            rival = subprocess.run(
                _command(log_dir), env=env, capture_output=True, text=True, timeout=DEADLINE_S
            )
            assert rival.returncode == 2, rival.stdout + rival.stderr
            assert f"is in use by another twice run (pid {proc.pid} on " in " ".join(
                rival.stderr.split()
            )
            (marks / "hanging").unlink()
        else:
            # Some moment after this attempt starts its trials (it marks summary.json
            # "running" just before).
            started = time.time()
            _until(lambda t=started: _running_since(log_dir, t), proc, "the trials to start")
            time.sleep(rng.uniform(0.0, 2.0))
        assert proc.poll() is None, f"attempt {attempt} ended before the signal {note}"
        proc.send_signal(sig)
        out = proc.communicate(timeout=DEADLINE_S)[0]
        exits.append((sig.name, proc.returncode))
        assert proc.returncode in EXPECTED_EXIT[sig], (
            f"{sig.name} attempt {attempt} exited {proc.returncode} {note}:\n{out}"
        )
        assert "Traceback" not in out, out

    final = subprocess.run(
        _command(log_dir), env=env, capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert final.returncode == 0, f"{exits} {note}\n{final.stdout}{final.stderr}"

    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is True, note
    got = {(c["model"], c["fault"]): c["trials"] for c in summary["cells"]}
    assert got == PLANNED, f"{exits} {note}"
    assert all(c["errors"] == 0 for c in summary["cells"]), note

    # The gate counts the same trials (its rule: the newest log per task of the last run).
    gate_table = cells(trials_frame(read_log_dir(log_dir).files))
    gate_counts = {
        (r.model, r.fault): (r.trials, r.errors, r.duplication_rate)
        for r in gate_table.itertuples()
    }
    assert gate_counts == {
        (c["model"], c["fault"]): (c["trials"], c["errors"], c["duplication_rate"])
        for c in summary["cells"]
    }, note
    gate_toml = tmp_path / "gate.toml"
    gate_toml.write_text('[[rule]]\nmetric = "completion_rate"\nmin = 0.0\nmin_trials = 1\n')
    # In process: the gate reads what the processes left; its own process proves nothing here.
    gate = twice("gate", log_dir, "--config", gate_toml)
    assert gate.exit_code == 0, gate.output
    assert f"{sum(PLANNED.values())} trial(s)" in gate.stdout
