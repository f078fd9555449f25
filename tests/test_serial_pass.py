"""Sharing the machine: ``make test``'s two passes (xdist workers never run a ``serial``
test; ``--serial-only`` runs those alone, and refuses ``-n``), and state of a test session's
own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
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
    done = _pytest("--collect-only", "-q", "--serial-only")
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(ids) == 3 and all(SERIAL in i for i in ids), done.stdout
    # ... reading only the files that mark a test serial, not the whole suite's
    seen = re.search(r"3/(\d+) tests collected", done.stdout)
    assert seen and int(seen[1]) < 100, done.stdout


def test_serial_tests_are_deselected_in_xdist_workers() -> None:
    done = _pytest("-n", "1", "-q", FILE, "-k", f"{SERIAL} or stale_lock")
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


def test_slow_tests_table_names_existing_tests() -> None:
    # A renamed or deleted slow test would silently lose its place at the front.
    table = ROOT / "tests" / "slow_tests.txt"
    lines = table.read_text(encoding="utf-8").splitlines()
    ids = [line for line in lines if line.strip() and not line.startswith("#")]
    assert len(ids) == len(set(ids)), "a test is listed twice"
    for test_id in ids:
        path, name = test_id.split("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert f"def {name}(" in source, f"{test_id} is not a test any more"


def test_workers_start_the_listed_slow_tests_first_in_their_order(tmp_path: Path) -> None:
    public = "tests/test_public_api.py"
    first = f"{public}::test_package_all_is_sorted_public_and_importable"  # its [mocks] too
    second = f"{public}::test_assertions_all_is_pinned"
    table = tmp_path / "slow.txt"
    table.write_text(f"# longest first\n{first}\n{second}\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "-v",
         f"{public}::test_package_export_check_catches_a_stray_name", second, f"{first}[mocks]"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TWICE_SLOW_TESTS": str(table)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split()[-1] for line in done.stdout.splitlines() if "PASSED" in line]
    assert ran == [
        f"{first}[mocks]",
        second,
        f"{public}::test_package_export_check_catches_a_stray_name",
    ], done.stdout


def test_a_hung_test_fails_instead_of_holding_the_run(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The suite's own setting: a hang (a blocking open of a FIFO nobody reads) fails its
    # test after the configured time rather than holding its worker, and the run.
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) > 0
    method = request.config.getini("timeout_method")
    assert method == "signal"
    hang = tmp_path / "test_hang.py"
    hang.write_text(
        "import os\n\n"
        "def test_blocked_in_a_system_call(tmp_path):\n"
        "    os.mkfifo(tmp_path / 'f')\n"
        "    open(tmp_path / 'f', 'wb')  # no reader: blocks until the timeout\n"
    )
    args = ["-p", "no:cacheprovider", "-q", str(hang), "--timeout", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--timeout-method", method],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Failed: Timeout (>2.0s)" in out.stdout, out.stdout


def test_a_test_runs_beside_no_other_thread() -> None:
    # twice forks its --workers only while no other thread runs (a fork copies one thread,
    # and another's locks could be copied held), else it starts fresh interpreters, seconds
    # of imports each. A thread of the suite's own (pytest-timeout's "thread" method starts
    # one per test) would make every run in a test take the slower path, and test it only.
    timers = [t.name for t in threading.enumerate() if t.name.startswith("pytest_timeout")]
    assert not timers


def test_pytesters_runs_leave_out_the_plugins_the_suite_leaves_out(
    pytester: pytest.Pytester,
) -> None:
    # pytester drops what a run imported: each run would import these plugins again.
    config = pytester.parseconfigure()
    for name in ("hypothesispytest", "schemathesis", "langsmith_plugin"):
        assert config.pluginmanager.is_blocked(name), name
