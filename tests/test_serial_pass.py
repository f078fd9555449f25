"""Sharing the machine: ``make test``'s two passes (xdist workers never run a ``serial``
test; ``--serial-only`` runs those alone, and refuses ``-n``), and state of a test session's
own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILE = "tests/evals/test_run_reliability.py"
SERIAL = "test_an_interrupted_runs_report_counts_the_cut_short_trials_that_had_duplicated"


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_serial_only_collects_only_the_serial_tests() -> None:
    done = _pytest("--collect-only", "-q", "--serial-only", FILE)
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(ids) == 3 and all(SERIAL in i for i in ids), done.stdout


def test_serial_tests_are_deselected_in_xdist_workers() -> None:
    done = _pytest("-n", "2", "-q", FILE, "-k", f"{SERIAL} or stale_lock")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed in" in done.stdout, done.stdout  # the serial three did not run
    assert "tests marked serial did not run under -n: run them with --serial-only" in (done.stdout)


def test_serial_only_refuses_workers() -> None:
    done = _pytest("-n", "2", "--serial-only", FILE)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--serial-only runs the serial tests one at a time: drop -n" in done.stderr


def test_inspect_trace_files_are_the_sessions_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    from inspect_ai._util.trace import inspect_trace_dir

    assert inspect_trace_dir().is_relative_to(tmp_path_factory.getbasetemp())
