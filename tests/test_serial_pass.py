"""Sharing the machine: ``make test``'s two passes (xdist workers never run a ``serial``
test; ``--serial-only`` runs those alone, and refuses ``-n``), and state of a test session's
own."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A suite of two files with the suite's own passes plugin and markers: one test of `marked`
# runs alone, the other may share the machine; `unmarked` marks nothing.
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
    # The suite's passes plugin, loaded as the suite's conftest loads it (without the rest of
    # that conftest, which imports twice: seconds per pytest process).
    pytester.makepyfile(passes=(ROOT / "tests" / "passes.py").read_text(encoding="utf-8"))
    pytester.makeconftest('pytest_plugins = ["passes"]\n')
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


def test_the_suite_loads_the_passes_plugin(request: pytest.FixtureRequest) -> None:
    # The tests above run the plugin in a suite of their own: this suite must load it too.
    assert request.config.pluginmanager.has_plugin("passes")
    assert request.config.getoption("--serial-only") is False


def test_workers_start_the_listed_slow_tests_first_in_their_order(
    two_files: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_files.makepyfile(
        test_order="""
import pytest

def test_first_collected():
    pass

@pytest.mark.slow
def test_marked_slow():
    pass

def test_listed_second():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_listed_first(n):
    pass
"""
    )
    table = two_files.path / "slow.txt"
    table.write_text(
        "# longest first\ntest_order.py::test_listed_first\ntest_order.py::test_listed_second\n"
    )
    monkeypatch.setenv("TWICE_SLOW_TESTS", str(table))
    done = two_files.runpytest_subprocess("-n", "1", "-v", "test_order.py")
    assert done.ret == 0, done.outlines
    ran = [line.split()[-1] for line in done.outlines if "PASSED" in line]
    assert ran == [
        "test_order.py::test_listed_first[1]",
        "test_order.py::test_listed_first[2]",
        "test_order.py::test_listed_second",
        "test_order.py::test_marked_slow",
        "test_order.py::test_first_collected",
    ], done.outlines


def test_a_hung_test_fails_instead_of_holding_the_run(
    tmp_path: Path, request: pytest.FixtureRequest, plugins_off: list[str]
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
    args = ["-p", "no:cacheprovider", *plugins_off, "-q", str(hang), "--timeout", "2"]
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
