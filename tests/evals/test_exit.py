"""A twice process ends once its work is written, whatever threads an interrupt left behind."""

from __future__ import annotations

import subprocess
import sys

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
