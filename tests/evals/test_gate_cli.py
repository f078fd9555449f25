"""``twice gate`` on real stub logs: pass/fail, JUnit, baseline, and exit 2 on bad logs."""

from __future__ import annotations

import contextlib
import os
import shutil
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log
from inspect_ai.model import ChatMessageUser, ModelOutput, ModelUsage
from twice.evals import run_suite, suite_from_flags

Twice = Callable[..., Any]

DUP_GATE = """
[[rule]]
name = "no duplicates"
metric = "duplication_rate"
max = 0.2
min_trials = 20
{filters}
"""


def gate_file(tmp_path: Path, filters: str = "") -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(DUP_GATE.format(filters=filters), encoding="utf-8")
    return path


def test_gate_cli_passes_for_stub_verify(twice: Twice, stub_logs: Path, tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    result = twice(
        "gate",
        stub_logs,
        "--config",
        gate_file(tmp_path, 'model = "stub/verify"'),
        "--junit",
        junit,
    )
    assert result.exit_code == 0, result.output
    assert "gate passed: 1 passed, 0 failed" in result.stdout
    assert "upper 95% bound of duplication_rate = 13.8% ≤ max 20.0%" in result.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and suite.get("tests") == "1"


def test_gate_cli_fifo_config_is_refused_not_waited_on(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    # The failing path: the gate file was read with read_text(), which waits for a writer.
    fifo = tmp_path / "gate.toml"
    os.mkfifo(fifo)
    result = twice("gate", stub_logs, "--config", fifo)
    assert result.exit_code == 2, result.output
    assert f"gate file '{fifo}' is not a regular file" in result.stderr


def test_gate_cli_junit_that_cannot_be_written_is_one_line_exit_2(
    twice: Twice, stub_logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: a path that passes the up-front check and fails at the write (a full
    # disk, a file-size limit, /sys as root) ended in a traceback and exit 1 after "passed".
    import twice.evals.gate._gate as gate_module

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gate_module, "replace_local", full)
    junit = tmp_path / "gate.xml"
    config = gate_file(tmp_path, 'model = "stub/verify"')
    result = twice("gate", stub_logs, "--config", config, "--junit", junit)
    assert result.exit_code == 2, result.output
    assert f"error: cannot write --junit '{junit}': No space left on device" in result.stderr


def test_gate_cli_junit_through_a_symlink_writes_its_target_and_keeps_the_link(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    # The failing path: the write went to a temporary file renamed over the link, so the
    # link became a plain file and the file it named kept the old report.
    target = tmp_path / "ci" / "gate.xml"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "gate.xml"
    link.symlink_to(target)
    config = gate_file(tmp_path, 'model = "stub/verify"')
    result = twice("gate", stub_logs, "--config", config, "--junit", link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and link.resolve() == target
    assert ET.parse(target).getroot().tag == "testsuites"
    assert [p.name for p in target.parent.iterdir()] == ["gate.xml"]  # no temporary left


def test_gate_cli_junit_into_a_fifo_writes_into_it_and_leaves_the_fifo(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    # The failing path (the same rename): a FIFO, /dev/stdout or, as root, /dev/full was
    # replaced by a regular file holding the XML.
    import stat
    import threading

    fifo = tmp_path / "gate.xml"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    config = gate_file(tmp_path, 'model = "stub/verify"')
    try:
        result = twice("gate", stub_logs, "--config", config, "--junit", fifo)
    finally:
        # If nothing opened the FIFO to write, let a reader still waiting go. Never a blocking
        # open: a reader that has just read the gate's XML may be alive a moment longer, then
        # gone, and a blocking open would wait forever for it (the test hung a CI run).
        with contextlib.suppress(OSError):  # ENXIO: no reader left
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert read and ET.fromstring(read[0]).tag == "testsuites"


@pytest.mark.parametrize("stdout", ["pipe", "file"])
def test_gate_cli_junit_to_dev_stdout_follows_the_gates_own_output(
    stub_logs: Path, tmp_path: Path, stdout: str
) -> None:
    # The failing paths: piped, /dev/stdout resolved to /proc/PID/fd/pipe:[N], which does not
    # exist (exit 2); redirected to a file, that file was renamed over and the gate's text
    # went to the orphaned one.
    import subprocess
    import sys

    config = gate_file(tmp_path, 'model = "stub/verify"')
    out = tmp_path / "out.txt"
    args = [sys.executable, "-m", "twice.evals.cli", "gate", str(stub_logs), "--config",
            str(config), "--junit", "/dev/stdout"]  # fmt: skip
    if stdout == "pipe":
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        text = done.stdout
    else:
        with out.open("w") as f:
            inode = os.fstat(f.fileno()).st_ino
            done = subprocess.run(args, stdout=f, stderr=subprocess.PIPE, text=True, timeout=120)
        assert out.stat().st_ino == inode
        text = out.read_text()
    assert done.returncode == 0, done.stderr
    assert "gate passed" in text and "<testsuites" in text
    assert text.index("gate passed") < text.index("<testsuites")


def test_a_regular_file_under_dev_is_replaced_not_appended_to(tmp_path: Path) -> None:
    # The failing path: every name under /dev or /proc was taken for a stream, so a log
    # directory on /dev/shm had its summary.json appended to on each write: invalid JSON.
    from twice.reports import is_stream, write_text

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    target = shm / f"twice-{tmp_path.name}.json"
    try:
        write_text(target, "first")
        write_text(target, "second")
        assert target.read_text() == "second"
    finally:
        target.unlink(missing_ok=True)
    assert is_stream("/dev/stdout") and is_stream("/proc/self/fd/1")
    assert not is_stream(shm / "missing.json")


def test_gate_cli_fails_for_stub_retry_and_junit_says_why(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    junit = tmp_path / "gate.xml"
    result = twice("gate", stub_logs, "--config", gate_file(tmp_path), "--junit", junit)
    assert result.exit_code == 1, result.output
    assert (
        "FAIL  rule 'no duplicates' [stub/retry / baseline / refund / lost_reply / bare]"
        in result.stdout
    )
    assert "gate FAILED: 1 passed, 1 failed" in result.stdout
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    retry = cases["stub/retry / baseline / refund / lost_reply / bare"].find("failure")
    assert retry is not None
    message = retry.get("message") or ""
    assert "upper 95% bound of duplication_rate = 100.0% > max 20.0%" in message
    assert "24 of 24 trials duplicated" in message
    assert cases["stub/verify / baseline / refund / lost_reply / bare"].find("failure") is None
    # The README and the gate guide show this very failure.
    root = Path(__file__).parents[2]
    for page in ("README.md", "docs/guides/gate.md"):
        text = (root / page).read_text(encoding="utf-8")
        shown = text.split("<!-- output: twice gate, a failing rule -->\n```text\n")[1]
        lines = shown.split("```")[0].splitlines()
        assert lines and all(line in result.stdout.splitlines() for line in lines), page


def test_gate_cli_baseline_flags_a_regression(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    # Pair cells on everything but the model: stub/retry (24/24 duplicated) against the
    # pooled baseline (24/48) is significantly worse; stub/verify (0/24) is not.
    cfg = tmp_path / "gate.toml"
    cfg.write_text('[baseline]\nmetrics = ["duplication_rate"]\nmatch = ["task", "fault"]\n')
    result = twice("gate", stub_logs, "--config", cfg, "--baseline", stub_logs)
    assert result.exit_code == 1, result.output
    assert "24/24) vs baseline 50.0% (24/48): significantly worse" in result.stdout
    assert "0/24) vs baseline 50.0% (24/48): not significantly worse" in result.stdout


def test_gate_and_report_on_a_folder_of_runs_do_not_pool_them(
    twice: Twice, tmp_path: Path, stub_logs: Path
) -> None:
    # A folder holding a release run and a pilot run was read as one run: their trials were
    # added together in each cell (and could reach a rule's min_trials together).
    from twice.reports import LogReadError, trials_frame

    runs = tmp_path / "runs"
    for name in ("pilot", "release"):
        shutil.copytree(stub_logs, runs / name)
    for args in (("gate", runs, "--config", gate_file(tmp_path)), ("report", runs)):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        assert "holds no inspect logs of its own, but its subdirectories pilot, release" in (
            " ".join(result.stderr.split())
        )
    with pytest.raises(LogReadError, match="runs are not pooled"):
        trials_frame(runs)
    assert twice("gate", runs / "pilot", "--config", gate_file(tmp_path)).exit_code in (0, 1)


def test_gate_cli_exit_2_on_missing_log_dir(twice: Twice, stub_logs: Path, tmp_path: Path) -> None:
    result = twice("gate", tmp_path / "nope", "--config", gate_file(tmp_path))
    assert result.exit_code == 2
    assert "nope' does not exist" in result.stderr
    (tmp_path / "afile.txt").write_text("not logs")
    for args in (("gate", tmp_path / "afile.txt", "--config", gate_file(tmp_path)),
                 ("report", tmp_path / "afile.txt")):  # fmt: skip
        result = twice(*args)
        assert result.exit_code == 2
        assert "afile.txt' is a file, not a log directory" in result.stderr
    # The failing paths: a FIFO given as the baseline was said not to exist, and an empty
    # LOG_DIR (an unset CI variable) read the current directory.
    os.mkfifo(tmp_path / "fifo")
    config = gate_file(tmp_path)
    for args, expected in [
        (("gate", stub_logs, "--config", config, "--baseline", tmp_path / "fifo"),
         "fifo' is a file, not a log directory"),
        (("report", stub_logs, "-o", tmp_path / "r.html", "--baseline", tmp_path / "fifo"),
         "fifo' is a file, not a log directory"),
        (("gate", "", "--config", config), "Invalid value for LOG_DIR: is empty"),
        (("report", ""), "Invalid value for LOG_DIR: is empty"),
        (("report", stub_logs, "-o", tmp_path / "r.html", "--baseline", " "),
         "Invalid value for --baseline: is empty"),
        # Wrote LOG_DIR/report.html, as if -o had not been given.
        (("report", stub_logs, "-o", ""), "Invalid value for -o: is empty"),
    ]:  # fmt: skip
        result = twice(*args)
        assert result.exit_code == 2, result.output
        assert expected in " ".join(result.stderr.split()), result.stderr


def test_gate_cli_exit_2_on_empty_log_dir(twice: Twice, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = twice("gate", tmp_path / "empty", "--config", gate_file(tmp_path))
    assert result.exit_code == 2
    assert "holds no inspect logs" in result.stderr and "twice run --log-dir" in result.stderr


def test_gate_cli_exit_2_on_corrupt_log(twice: Twice, stub_logs: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(stub_logs, logs)
    corrupt = logs / "2026-01-01T00-00-00-00-00_refund_broken.eval"
    corrupt.write_bytes(b"not a zip")
    junit = tmp_path / "gate.xml"
    result = twice("gate", logs, "--config", gate_file(tmp_path), "--junit", junit)
    assert result.exit_code == 2
    assert corrupt.name in result.stderr and "cannot be read" in result.stderr
    assert corrupt.read_bytes() == b"not a zip"  # evidence is not deleted


def test_a_log_missing_some_of_its_trials_is_refused_not_counted_short(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    # A log that lost a sample member (cut, or edited) was read as the cell's whole run: the
    # report and the gate rated 23 trials as if 24 had run, without a word.
    import zipfile

    import zipfile_zstd  # noqa: F401  (inspect's .eval members are zstd-compressed)

    logs = tmp_path / "logs"
    shutil.copytree(stub_logs, logs)
    damaged = sorted(logs.glob("*.eval"))[0]
    with zipfile.ZipFile(damaged) as src:
        members = [(i, src.read(i.filename)) for i in src.infolist()]
    dropped = next(i.filename for i, _ in members if i.filename.startswith("samples/"))
    with zipfile.ZipFile(damaged, "w") as out:
        for info, data in members:
            if info.filename != dropped:
                out.writestr(info, data)
    for args in (("gate", logs, "--config", gate_file(tmp_path)), ("report", logs)):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        said = " ".join(result.stderr.split())
        assert damaged.name in said and "finished with 24 trial(s) but holds 23" in said


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[rule]\n", "is not valid TOML"),
        (
            '[[rule]]\nmetric = "dup"\nmax = 0.1\n',
            "unknown metric 'dup'; expected one of: completion_rate",
        ),
        ('description = "no rules"\n', "has no [[rule]] blocks and no --baseline"),
    ],
)
def test_gate_cli_exit_2_on_bad_config(
    twice: Twice, stub_logs: Path, tmp_path: Path, text: str, expected: str
) -> None:
    cfg = tmp_path / "gate.toml"
    cfg.write_text(text)
    result = twice("gate", stub_logs, "--config", cfg)
    assert result.exit_code == 2
    assert expected in result.stderr


def test_gate_cli_exit_2_on_missing_config(twice: Twice, stub_logs: Path, tmp_path: Path) -> None:
    result = twice("gate", stub_logs, "--config", tmp_path / "missing.toml")
    assert result.exit_code == 2
    assert "missing.toml' does not exist" in result.stderr
    # What is accepted, named: `--config gate` meant the shipped gate.toml.
    result = twice("gate", stub_logs, "--config", "gate")
    assert result.exit_code == 2
    assert "gate file 'gate' does not exist; twice ships gate.toml" in result.stderr
    result = twice("run", "--config", "defaults")
    assert result.exit_code == 2
    assert "twice ships conversation.toml, default.toml, full.toml, real.toml" in result.output


def _flaky_model(input: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
    """A model whose provider crashes on one ticket (order_1042) and answers the others."""
    user = next(m.text for m in input if isinstance(m, ChatMessageUser))
    if "order_1042" in user:
        raise RuntimeError("provider crashed")
    out = ModelOutput.from_content("mockllm/model", "Nothing to do.")
    out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return out


@pytest.fixture
def errored_logs(tmp_path: Path) -> Path:
    log_dir = tmp_path / "errored"
    suite = suite_from_flags(
        config=None,
        models=["mockllm/model"],
        prompts=[],
        tasks=["refund"],
        faults=["none"],
        protections=[],
        epochs=None,
        limit=3,
    )
    result = run_suite(
        suite,
        log_dir,
        model_args={"custom_outputs": _flaky_model},
        display="none",
        report=False,
        retry_attempts=0,
    )
    assert not result.ok
    return log_dir


def test_gate_cli_exit_2_on_errored_trials(
    twice: Twice, errored_logs: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "gate.toml"
    cfg.write_text('[[rule]]\nmetric = "duplication_rate"\nmax = 1.0\n')
    junit = tmp_path / "gate.xml"
    result = twice("gate", errored_logs, "--config", cfg, "--junit", junit)
    assert result.exit_code == 2, result.output
    assert "trial refund-001 epoch 1 of mockllm/model" in result.stderr
    assert "provider crashed" in result.stderr and "--allow-errors" in result.stderr
    error = ET.parse(junit).getroot().find("testsuite/testcase/error")
    assert error is not None and "provider crashed" in (error.get("message") or "")


def test_gate_cli_allow_errors_gates_the_scored_trials(
    twice: Twice, errored_logs: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "gate.toml"
    cfg.write_text('[[rule]]\nmetric = "duplication_rate"\nmax = 1.0\n')
    result = twice("gate", errored_logs, "--config", cfg, "--allow-errors")
    assert result.exit_code == 0, result.output
    assert "0 of 2 trials duplicated" in result.stdout
    assert "1 errored trial(s) excluded" in result.stdout


def test_gate_cli_exit_2_when_a_planned_cell_has_no_log(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    # A run killed before a cell started leaves that cell out of the logs entirely; the
    # gate must not pass on the cells that happen to be there.
    logs = tmp_path / "logs"
    shutil.copytree(stub_logs, logs)
    retry = next(
        p
        for p in logs.glob("*.eval")
        if read_eval_log(str(p), header_only=True).eval.model == "stub/retry"
    )
    retry.unlink()
    result = twice("gate", logs, "--config", gate_file(tmp_path))
    assert result.exit_code == 2, result.output
    assert "task refund on stub/retry" in result.stderr and "has no log" in result.stderr


@pytest.mark.slow
def test_gate_cli_shipped_gate_passes_verify_and_fails_retry(twice: Twice, tmp_path: Path) -> None:
    """The shipped thresholds are met by the control that verifies before retrying and not by
    the one that blindly retries.

    25 samples x 3 epochs is 75 trials per cell: just above the rules' ``min_trials`` of 73,
    the fewest with which 0 duplicates can pass (the file is written for 4 epochs of every
    sample), so the run proves the verify control passes with the least evidence the shipped
    file accepts, on every default fault, in two thirds of the trials.
    """
    log_dir = tmp_path / "logs"
    run = twice(
        "run", "--model", "stub/verify", "--model", "stub/retry", "--task", "refund",
        "--limit", "25", "--epochs", "3", "--log-dir", log_dir, "--display", "none",
        "--no-report",
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    shipped = Path(__file__).parents[2] / "evals" / "gate.toml"
    rules = tomllib.loads(shipped.read_text())["rule"]
    assert max(r.get("min_trials", 0) for r in rules) <= 25 * 3, "run more trials per cell"
    junit = tmp_path / "gate.xml"
    result = twice("gate", log_dir, "--config", shipped, "--junit", junit)
    assert result.exit_code == 1, result.output
    failed = {
        (c.get("classname"), c.get("name"))
        for c in ET.parse(junit).getroot().iter("testcase")
        if c.find("failure") is not None
    }
    # The README's reference results: blind retries duplicate after a lost reply and after a
    # reset after the commit; after a timeout before commit the retry is what completes the job.
    assert failed == {
        (
            "twice.rule.no duplicates after an unknown outcome",
            f"stub/retry / baseline / refund / {fault} / bare",
        )
        for fault in ("lost_reply", "reset_after_commit")
    }
    # Both controls refund the amount asked for: the wrong-values rule passes for each.
    assert "gate FAILED: 12 passed, 2 failed, 0 skipped" in result.stdout
    assert result.stdout.count("PASS  rule 'no wrong values without faults'") == 2


def test_gate_cli_exit_2_on_unreadable_baseline(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "gate.toml"
    cfg.write_text('[baseline]\nmetrics = ["duplication_rate"]\n')
    result = twice("gate", stub_logs, "--config", cfg, "--baseline", tmp_path / "old")
    assert result.exit_code == 2
    assert (
        "Invalid value for --baseline" in result.stderr and "old' does not exist" in result.stderr
    )
