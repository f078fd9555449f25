"""Sharing the machine: ``make test``'s two passes (xdist workers never run a ``serial``
test; ``--serial-only`` runs those alone, and refuses ``-n``), and state of a test session's
own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A suite of two files with the suite's own conftest and markers: one test of `marked` runs
# alone, the other may share the machine; `unmarked` marks nothing.
MARKED = """
import pytest

@pytest.mark.serial
def test_alone():
    pass

def test_beside_others():
    pass
"""
UNMARKED = """
def test_a():
    pass

def test_b():
    pass
"""


@pytest.fixture
def two_files(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    pytester.makeini(
        "[pytest]\naddopts = --strict-markers -p no:cacheprovider\n"
        "markers =\n    serial: runs alone\n    slow: runs long\n"
    )
    pytester.makepyfile(test_marked=MARKED, test_unmarked=UNMARKED)
    (pytester.path / "slow_tests.txt").write_text("# none\n", encoding="utf-8")
    return pytester


def test_serial_only_collects_only_the_serial_tests(two_files: pytest.Pytester) -> None:
    done = two_files.runpytest_subprocess("--collect-only", "-q", "--serial-only")
    assert done.ret == 0, done.outlines
    ids = [line for line in done.outlines if "::" in line]
    assert ids == ["test_marked.py::test_alone"], done.outlines
    # ... reading only the files that mark a test serial: test_unmarked's two are not counted
    done.stdout.fnmatch_lines(["1/2 tests collected (1 deselected)*"])


def test_serial_tests_are_deselected_in_xdist_workers(two_files: pytest.Pytester) -> None:
    done = two_files.runpytest_subprocess("-n", "1", "-q")
    assert done.ret == 0, done.outlines
    done.assert_outcomes(passed=3)  # all but the serial one
    done.stdout.fnmatch_lines(
        ["tests marked serial did not run under -n: run them with --serial-only*"]
    )


def test_serial_only_refuses_workers(two_files: pytest.Pytester) -> None:
    done = two_files.runpytest_subprocess("-n", "2", "--serial-only")
    assert done.ret == 4, done.outlines
    done.stderr.fnmatch_lines(["*--serial-only runs the serial tests one at a time: drop -n*"])


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
