"""A twice process ends once its work is written, whatever threads an interrupt left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A loop stopped by an interrupt while a task that had used a worker thread was still pending
# (what a SIGTERM to a --workers worker did mid-trial): AnyIO stops that thread only when the
# task finishes, and the thread is not a daemon.
ABANDONED_WORKER_THREAD = """
import asyncio, os, signal, sys
import anyio

async def root():
    await anyio.to_thread.run_sync(lambda: None)
    os.kill(os.getpid(), signal.SIGINT)  # Python's default handler: KeyboardInterrupt
    await asyncio.sleep(3600)

loop = asyncio.new_event_loop()
try:
    loop.run_until_complete(root())
except KeyboardInterrupt:
    pass
if sys.argv[1:] == ["release"]:
    from twice.evals.cli import release_worker_threads
    release_worker_threads()
print("written", flush=True)
"""


def test_the_abandoned_worker_thread_holds_the_interpreter_at_exit() -> None:
    # The control: without twice's release, the interpreter waits for the thread forever.
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, "-c", ABANDONED_WORKER_THREAD], capture_output=True, timeout=8
        )


def test_twice_releases_it_and_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ABANDONED_WORKER_THREAD, "release"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "written"


@pytest.mark.parametrize("command", [["list"], ["trials", "--rate", "0.01"]])
def test_output_that_cannot_be_written_is_one_line_and_exit_2(command: list[str]) -> None:
    # The failing path: `twice list > /dev/full` (a full disk behind `>`) ended in a traceback.
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "twice.evals.cli", *command],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: cannot write to standard output: No space left on device\n"


def test_a_run_whose_progress_cannot_be_written_is_one_line_and_exit_2(tmp_path) -> None:
    # The failing path: inspect's progress display writes with print(), not click.echo, so
    # `twice run > /dev/full` ended in a traceback (an ExceptionGroup) instead of this line.
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "twice.evals.cli", "run", "--model", "stub/retry",
             "--fault", "none", "--limit", "1", "--log-dir", str(tmp_path / "logs")],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.endswith("error: cannot write to standard output: No space left on device\n")


def _reader_gone(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``twice ARGS`` whose standard output has no reader (``| head -1`` once it has left)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "twice.evals.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # every write to stdout now fails with EPIPE
    stderr = proc.stderr.read()
    return subprocess.CompletedProcess(args, proc.wait(timeout=300), "", stderr)


def test_a_passing_gate_whose_reader_left_exits_0(stub_logs: Path, tmp_path: Path) -> None:
    # The failing path: `twice gate ... | head -1` exited 1 on a passing gate (click's EPIPE).
    gate = tmp_path / "gate.toml"
    gate.write_text('[[rule]]\nmetric = "completion_rate"\nmin = 0.0\n')
    done = _reader_gone(["gate", str(stub_logs), "--config", str(gate)])
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_run_whose_reader_left_finishes_its_summary(tmp_path: Path) -> None:
    # The failing path: `twice run --display plain | head -1` exited 1 with no message and
    # left summary.json "running".
    log_dir = tmp_path / "logs"
    done = _reader_gone(
        ["run", "--model", "stub/retry", "--task", "refund", "--fault", "none", "--limit", "1",
         "--log-dir", str(log_dir), "--display", "plain"]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["cells"][0]["trials"] == 1


def test_a_run_in_someone_elses_process_leaves_its_signal_handlers_alone() -> None:
    # After an interrupted run, twice's own process ends at once on a second signal; a test's
    # CliRunner or a library caller keeps its handlers (one that exits would kill a pytest
    # worker whose next test signals itself).
    import signal

    from twice.evals.cli import _common

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    _common.another_signal_exits(143)
    assert {sig: signal.getsignal(sig) for sig in before} == before


EXIT_AFTER_A_STOP = """
import atexit, json, signal, sys
from twice.evals.cli import _common, main

def after_twices_own_exit_handlers():  # registered first, so it runs last
    ignored = [signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)]
    print(json.dumps(ignored), flush=True)

atexit.register(after_twices_own_exit_handlers)
stopped = sys.argv[1:] == ["stopped"]
sys.argv = ["twice", "list"]
try:
    main()
except SystemExit:
    pass
if stopped:
    _common.another_signal_exits(130)  # what `twice run` does once a signal has stopped it
sys.exit(130)
"""


@pytest.mark.parametrize("stopped", [True, False])
def test_after_a_stop_no_signal_can_end_the_interpreters_exit(stopped: bool) -> None:
    # The failing path: Python puts the default actions back once the exit handlers have run,
    # while it still tears down modules, so a second Ctrl-C then killed the process by the
    # signal (-2) where the run's code is 130. Python's handlers are gone by then; only an
    # ignored signal stays ignored. A process no signal stopped keeps its handlers.
    done = subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_A_STOP, *(["stopped"] if stopped else [])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [stopped, stopped]
