"""What ``twice run`` guarantees under interruption and concurrency: one run per log dir,
SIGINT/SIGTERM exit 130/143 with the summary marked incomplete, resumable from any cwd,
atomic summary and report, and prompts recorded by digest (not copied) wherever written."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from twice.evals import run_suite, suite_from_flags
from twice.evals.cli import cli
from twice.evals.locks._lock import LOCK_NAME, LogDirLockedError, lock_log_dir
from twice.evals.run import write_atomic
from twice.tasks import load_prompt

Twice = Callable[..., Any]
HANG_RUN = Path(__file__).parent / "scripts" / "hang_run.py"
DEADLINE_S = 180.0


def _snapshot(log_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(log_dir.glob("*.eval"))}


def _suite(**axes: Any) -> Any:
    flags: dict[str, Any] = {
        "config": None, "models": ["stub/verify"], "prompts": [], "tasks": ["refund"],
        "faults": ["none"], "protections": [], "epochs": None, "limit": 1,
    }  # fmt: skip
    return suite_from_flags(**(flags | axes))


# -- the lock ------------------------------------------------------------------------------


def test_reliability_second_run_on_a_locked_dir_exits_2_naming_the_holder(
    twice: Twice, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    with lock_log_dir(log_dir):
        result = twice(
            "run", "--model", "stub/verify", "--task", "refund", "--fault", "none",
            "--limit", "1", "--log-dir", log_dir, "--display", "none",
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        message = " ".join(result.stderr.split())
        assert f"log directory '{log_dir}' is in use by another twice run" in message
        assert f"(pid {os.getpid()} on {socket.gethostname()}, started 20" in message
        assert "Traceback" not in result.output
        assert sorted(p.name for p in log_dir.iterdir()) == [LOCK_NAME]  # nothing written
    assert not (log_dir / LOCK_NAME).exists()


def test_reliability_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (log_dir / LOCK_NAME).write_text(
        json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "2020-01-01"})
    )
    with lock_log_dir(log_dir) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with (
            pytest.raises(LogDirLockedError, match=f"pid {os.getpid()}"),
            lock_log_dir(log_dir),
        ):
            pass
    result = run_suite(_suite(), log_dir, report=False)
    assert result.ok and result.table["trials"].tolist() == [1]


# -- interruption --------------------------------------------------------------------------


def _hang_run(log_dir: Path, marks: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(HANG_RUN), "run", "--model", "stub/retry", "--model", "hang/slow",
        "--task", "refund", "--fault", "lost_reply", "--limit", "4", "--log-dir", str(log_dir),
        "--display", "none", "--no-report", *extra,
    ]  # fmt: skip


def _report(log_dir: Path) -> str:
    """The HTML ``twice report`` writes for ``log_dir``.

    In process: what is tested is the report of the logs a stopped run left, not the
    command's process (a subprocess would import inspect again for every report).
    """
    result = CliRunner().invoke(cli, ["report", str(log_dir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return (log_dir / "report.html").read_text(encoding="utf-8")


def _wait(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} early:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"no {path} after {DEADLINE_S:.0f} s")
        time.sleep(0.2)


def _wait_for_finished_log(log_dir: Path, fault: str, proc: subprocess.Popen[str]) -> None:
    """Wait until the log of the cell under ``fault`` is finished (not "started")."""
    from inspect_ai.log import read_eval_log

    deadline = time.monotonic() + DEADLINE_S
    while True:
        for path in log_dir.rglob("*.eval"):
            try:
                header = read_eval_log(str(path), header_only=True)
            except Exception:  # being written: look again
                continue
            if header.eval.task_args.get("fault") == fault and header.status != "started":
                return
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} early:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"no finished {fault} log after {DEADLINE_S:.0f} s")
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_reliability_interrupted_run_exits_non_zero_marks_summary_and_resumes(
    tmp_path: Path, sig: signal.Signals, code: int, twice: Callable[..., Any]
) -> None:
    """A signalled run exits 128 + n, marks its summary, and its logs gate and resume.

    The run and its rerun are processes (the signal is the point); the report and the
    gates read the logs the stopped process left, in process.
    """
    log_dir, marks = tmp_path / "logs", tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARK_DIR": str(marks), "HANG_SAMPLE": "refund-003"}
    proc = subprocess.Popen(
        _hang_run(log_dir, marks),
        env={**env, "HANG": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait(marks / "hanging", proc)  # hang/slow is stuck on one trial, mid-run
    proc.send_signal(sig)
    out = proc.communicate(timeout=DEADLINE_S)[0]
    assert proc.returncode == code, out
    assert f"interrupted by {sig.name}" in out and "Traceback" not in out
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] == sig.name
    missing = {(c["model"], c["task"], c["fault"]) for c in summary["missing"]}
    assert ("hang/slow", "refund", "lost_reply") in missing
    assert all(c["errors"] == 0 for c in summary["cells"]), "cut-short trials are not crashes"
    # A report of the stopped run says it is partial, above its rates (it read like a
    # finished run's: "11 trials in 4 cells" and nothing else).
    assert f"Partial results.</b> The run was interrupted ({sig.name})" in _report(log_dir)
    # A gate on the stopped run refuses it for its cancelled log, not for each cut-short
    # trial as if it had crashed (an interrupted suite listed hundreds of CancelledErrors).
    gate_file = tmp_path / "gate.toml"
    gate_file.write_text('[[rule]]\nmetric = "completion_rate"\nmin = 0.0\n')
    gate = twice("gate", log_dir, "--config", gate_file)
    assert gate.exit_code == 2, gate.stderr
    assert "has status 'cancelled'" in gate.stderr and "CancelledError" not in gate.stderr
    # The same logs without their summary (a copied artifact): the cancelled log still says
    # which trials were cut short. They were counted as errored trials, so the gate's trial
    # count and its list depended on summary.json's presence.
    bare = tmp_path / "no-summary"
    shutil.copytree(log_dir, bare, ignore=shutil.ignore_patterns("summary.json", ".twice.lock"))
    again = twice("gate", bare, "--config", gate_file, "--allow-errors")
    allowed = twice("gate", log_dir, "--config", gate_file, "--allow-errors")
    assert "CancelledError" not in again.stderr, again.stderr
    counted = re.compile(r"\(\d+ log\(s\), \d+ trial\(s\)")
    assert counted.findall(again.stdout) == counted.findall(allowed.stdout), again.stdout

    rerun = subprocess.run(
        _hang_run(log_dir, marks), env=env, capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is True and "missing" not in summary
    assert "Partial results" not in _report(log_dir)
    assert sorted((c["model"], c["trials"]) for c in summary["cells"]) == [
        ("hang/slow", 4),
        ("stub/retry", 4),
    ]


SECOND_SIGNAL_BOUND_S = 3.0
"""How long a run may take to end after a second Ctrl-C ("stops at once")."""


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5, 2.5])
def test_a_second_ctrl_c_stops_at_once_and_leaves_no_running_summary(
    tmp_path: Path, delay: float
) -> None:
    # The failing path: the second SIGINT was raised into inspect's tasks as they stopped;
    # the run then took seconds to end, or never did (idle in epoll_wait), its summary.json
    # still "running".
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "twice.evals.cli", "run", "-M", "delay=1", "--workers", "1",
         "--log-dir", str(log_dir), "--display", "none", "--no-report"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + DEADLINE_S
    while not list(log_dir.glob("*.eval")):  # trials are running
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the run never started its trials"
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    second = time.monotonic()
    try:
        out = proc.communicate(timeout=DEADLINE_S)[0]
    finally:
        proc.kill()
    took = time.monotonic() - second
    assert proc.returncode == 130, out
    assert took < SECOND_SIGNAL_BOUND_S, f"ended {took:.1f} s after the second Ctrl-C:\n{out}"
    assert "Traceback" not in out
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["status"] == "incomplete" and summary["complete"] is False, summary
    assert summary["interrupted"] == "SIGINT"
    with lock_log_dir(log_dir):  # free for the rerun that resumes it
        pass


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one-process", "workers", "until-decided"])
def test_an_interrupted_runs_report_counts_the_cut_short_trials_that_had_duplicated(
    tmp_path: Path, mode: str
) -> None:
    # A trial that retries runs longest, so an interrupt cuts it short first and the finished
    # trials are those that did not retry: the report said "Never duplicated: hang/dup" while
    # the ledger of its cut-short trial already held two refunds.
    log_dir, marks = tmp_path / "logs", tmp_path / "marks"
    marks.mkdir()
    env = {
        **os.environ, "MARK_DIR": str(marks), "HANG_SAMPLE": "refund-003", "HANG": "1",
        "ERROR_SAMPLE": "refund-001",  # an errored trial too: both are said
    }  # fmt: skip
    gate = tmp_path / "gate.toml"
    gate.write_text('[[rule]]\nmetric = "duplication_rate"\nmax = 0.5\n')
    how = {
        "one-process": ["--workers", "1"],
        "workers": ["--workers", "2"],
        "until-decided": ["--until-decided", str(gate)],
    }[mode]
    command = [
        # Two cells, so --workers 2 runs two workers; under "none" nothing hangs.
        sys.executable, str(HANG_RUN), "run", "--model", "hang/dup", "--task", "refund",
        "--fault", "lost_reply", "--fault", "none", "--limit", "4", "--log-dir", str(log_dir),
        "--display", "none", *how,
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _wait(marks / "hanging", proc)  # type: ignore[arg-type]
    if mode == "workers":
        # The hanging trial sees only its own worker's trials: the other worker runs the
        # "none" cell, whose trials a signal sent now would cut short too.
        _wait_for_finished_log(log_dir, "none", proc)  # type: ignore[arg-type]
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=DEADLINE_S)[0]
    assert proc.returncode == 143, out
    summary = json.loads((log_dir / "summary.json").read_text())
    # With --workers, the errored trials' count replaced the cut-short one.
    (cut,) = summary["cut_short"]
    assert (cut["fault"], cut["trials"], cut["duplicated"]) == ("lost_reply", 1, 1)
    assert summary["errored"] == 2 and summary["complete"] is False  # one per cell
    for report in (
        (log_dir / "report.html").read_text(encoding="utf-8"),  # the run's
        _report(log_dir),  # and twice report's, from summary.json
    ):
        assert "1 trial(s) were cut short and are not in them; 1 of those had already" in report
        assert "cut short</span> (not in these rates): hang/dup (1 trial(s))" in report
        assert "Never duplicated" not in report


def test_reliability_resuming_with_new_cells_runs_them_and_says_so(
    twice: Twice, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    base = ["run", "--task", "refund", "--fault", "none", "--limit", "1", "--log-dir", log_dir]
    first = twice(*base, "--model", "stub/verify", "--display", "none")
    assert first.exit_code == 0, first.output
    before = _snapshot(log_dir)
    second = twice(*base, "--model", "stub/verify", "--model", "stub/retry", "--display", "none")
    assert second.exit_code == 0, second.output
    assert "1 of 2 cell(s) were already finished and reused; 1 new or unfinished" in (
        " ".join(second.stderr.split())
    )
    after = _snapshot(log_dir)
    assert {n: after[n] for n in before} == before and len(after) == 2
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is True
    assert sorted(c["model"] for c in summary["cells"]) == ["stub/retry", "stub/verify"]


def test_reliability_a_log_run_again_for_more_epochs_is_not_called_reused(
    twice: Twice, tmp_path: Path
) -> None:
    # Raising --epochs reran the cell's trials, yet twice said "1 of 1 cell(s) were already
    # finished and reused; 0 new or unfinished cell(s) run".
    base = ["run", "--task", "refund", "--fault", "none", "--limit", "1", "--model",
            "stub/verify", "--display", "none", "--log-dir", tmp_path / "logs"]  # fmt: skip
    assert twice(*base, "--epochs", "1").exit_code == 0
    more = twice(*base, "--epochs", "2")
    assert more.exit_code == 0, more.output
    assert "reused" not in more.stderr
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert [c["trials"] for c in summary["cells"]] == [2]
    again = twice(*base, "--epochs", "2")
    assert "1 of 1 cell(s) were already finished and reused" in " ".join(again.stderr.split())


@pytest.mark.slow
def test_reliability_a_workers_rerun_says_what_it_reused(tmp_path: Path) -> None:
    # Each worker knew; the merged run never said.
    log_dir = str(tmp_path / "logs")
    cmd = [sys.executable, "-m", "twice.evals.cli", "run", "--task", "refund", "--limit", "1",
           "--model", "stub/verify", "--fault", "none", "--fault", "lost_reply", "--workers",
           "2", "--display", "none", "--no-report", "--log-dir", log_dir]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and "reused" not in first.stderr, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "2 of 2 cell(s) were already finished and reused" in " ".join(again.stderr.split())


def test_a_run_with_other_cells_into_a_used_directory_says_the_old_ones_are_not_counted(
    twice: Twice, tmp_path: Path
) -> None:
    # The second run's summary and report silently replaced the first's results: a second
    # --agent-cmd (or --model) run into one directory read as if the first had never run.
    log_dir = tmp_path / "logs"
    base = ["run", "--task", "refund", "--fault", "none", "--limit", "1", "--log-dir", log_dir]
    assert twice(*base, "--model", "stub/retry", "--display", "none").exit_code == 0
    second = twice(*base, "--model", "stub/verify", "--display", "none")
    assert second.exit_code == 0, second.output
    said = "also holds logs of 1 cell(s) {} (stub/retry / baseline / refund / none / bare)"
    assert said.format("this run does not plan") in " ".join(second.stderr.split())
    report = twice("report", log_dir)
    assert said.format("its last run did not plan") in " ".join(report.stderr.split())
    again = twice(*base, "--model", "stub/retry", "--model", "stub/verify", "--display", "none")
    assert "also holds logs" not in again.stderr  # both planned: nothing left uncounted


def test_reliability_resume_does_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = tmp_path / "terse.md"
    prompt.write_text("Be terse.")
    log_dir = tmp_path / "logs"
    suite = _suite(prompts=["baseline", str(prompt)])
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "deeper").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a")
    run_suite(suite, log_dir, report=False)
    before = _snapshot(log_dir)
    monkeypatch.chdir(tmp_path / "b" / "deeper")
    again = run_suite(suite, log_dir, report=False)
    assert _snapshot(log_dir) == before, "a finished cell was run again from another cwd"
    assert again.ok and again.reused == 2


# -- atomic writes -------------------------------------------------------------------------


def test_reliability_failed_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("<html>the previous report</html>")

    def fail_half_way(tmp: Path) -> None:
        tmp.write_text("<html>half")
        raise OSError(27, "File too large")

    with pytest.raises(OSError, match="File too large"):
        write_atomic(target, fail_half_way)
    assert target.read_text() == "<html>the previous report</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_reliability_run_whose_report_write_fails_keeps_the_old_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = tmp_path / "logs"
    run_suite(_suite(), log_dir)
    old = (log_dir / "report.html").read_bytes()

    def broken(frame: Any, path: Path, **kwargs: Any) -> Path:
        Path(path).write_text("<html>trunc")
        raise OSError(27, "File too large")

    monkeypatch.setattr("twice.reports.write_report", broken)
    with pytest.raises(OSError):
        run_suite(_suite(), log_dir)
    assert (log_dir / "report.html").read_bytes() == old
    assert not [p for p in log_dir.iterdir() if p.suffix == ".tmp"]


def test_a_run_whose_summary_cannot_be_written_says_so_in_one_line_and_exits_1(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: the OSError of the last summary write was a traceback, and the
    # summary.json left behind said "running".
    from twice.evals.run import _run

    real = _run.write_summary

    def full_disk(table: Any, path: Any, **extra: Any) -> Any:
        if not table.empty:  # the summary with the counts: a large file on a full disk
            raise OSError(28, "No space left on device")
        return real(table, path, **extra)

    monkeypatch.setattr(_run, "write_summary", full_disk)
    log_dir = tmp_path / "logs"
    result = twice(
        "run", "--model", "stub/retry", "--task", "refund", "--fault", "none", "--limit", "1",
        "--log-dir", log_dir, "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == (
        f"error: cannot write '{log_dir / 'summary.json'}': No space left on device; the logs "
        "are kept and summary.json says incomplete: make room (or raise the limit), then "
        "rerun the same command to resume"
    )
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["status"] == "incomplete" and "No space left" in summary["error"]
    assert list(log_dir.glob("*.eval"))


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_run_over_the_file_size_limit_is_one_line_and_exit_1(
    tmp_path: Path, workers: str
) -> None:
    # The failing path: `ulimit -f` hit as the report was written: a traceback, exit 1.
    import resource

    def small_files() -> None:  # the logs (13 KB) fit, the report (over 28 KB) does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    log_dir = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "twice.evals.cli", "run", "--model", "stub/retry", "--task",
         "refund", "--fault", "none", "--fault", "lost_reply", "--limit", "1", "--log-dir",
         str(log_dir), "--display", "none", "--workers", workers],
        capture_output=True, text=True, timeout=DEADLINE_S, preexec_fn=small_files,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: cannot write '{log_dir / 'report.html'}': File too large; the logs and "
        f"summary.json are written: make room (or raise the limit), then `twice report "
        f"{log_dir}`"
    )
    assert json.loads((log_dir / "summary.json").read_text())["status"] == "complete"


# -- prompts -------------------------------------------------------------------------------


def test_reliability_prompt_digest_is_of_the_file_bytes_and_bom_is_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bom.md"
    path.write_bytes("\ufeffBe careful.\n".encode())
    p = load_prompt(str(path))
    assert p.text == "Be careful."
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert p.sha256 == expected
    if shutil.which("sha256sum"):
        printed = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True)
        assert printed.stdout.split()[0] == p.sha256


@pytest.mark.slow
def test_reliability_large_prompt_is_recorded_by_digest_not_copied(tmp_path: Path) -> None:
    big = tmp_path / "big.md"
    big.write_text("Refund exactly once. " * 500_000)  # ~10 MB
    log_dir = tmp_path / "logs"
    run_suite(_suite(prompts=[str(big)]), log_dir)
    summary = json.loads((log_dir / "summary.json").read_text())
    recorded = summary["run"]["prompts"]["big"]
    assert recorded["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()
    assert recorded["bytes"] == big.stat().st_size and recorded["truncated"] is True
    for name, limit in [("summary.json", 100_000), ("logs.json", 200_000)]:
        size = (log_dir / name).stat().st_size
        assert size < limit, f"{name} is {size} bytes: the prompt was copied into it"
    assert (log_dir / "report.html").stat().st_size < 2_000_000
