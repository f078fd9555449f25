"""Resuming: a killed ``twice run`` picks up where it stopped, finished work is reused, and
stale work (an edited prompt) is not."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log
from twice.evals import run_suite, suite_from_flags
from twice.reports import read_log_dir

HANG_RUN = Path(__file__).parent / "scripts" / "hang_run.py"
HUNG_SAMPLE = "refund-003"
DEADLINE_S = 180.0


def _snapshot(log_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(log_dir.glob("*.eval"))}


def _header(path: Path) -> tuple[str, str, int]:
    log = read_eval_log(str(path))
    return log.eval.model, log.status, len(log.samples or [])


def _wait_for(what: str, ready: object, proc: subprocess.Popen[bytes]) -> None:
    """Poll ``ready()`` until true; raise (never sleep past) the deadline or a dead process."""
    deadline = time.monotonic() + DEADLINE_S
    while not ready():  # type: ignore[operator]
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"twice run exited ({proc.returncode}) before {what}:\n{out}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"gave up waiting for {what} after {DEADLINE_S:.0f} s")
        time.sleep(0.2)


def test_resume_killed_run_reuses_finished_work(tmp_path: Path) -> None:
    log_dir, marks = tmp_path / "logs", tmp_path / "marks"
    marks.mkdir()
    args = [
        sys.executable, str(HANG_RUN), "run", "--model", "stub/retry", "--model", "hang/slow",
        "--task", "refund", "--fault", "lost_reply", "--limit", "4",
        "--log-dir", str(log_dir), "--display", "none", "--no-report",
    ]  # fmt: skip
    env = {**os.environ, "MARK_DIR": str(marks), "HANG_SAMPLE": HUNG_SAMPLE}

    # 1. Run until stub/retry has finished and hang/slow is stuck with 3 of 4 samples logged.
    proc = subprocess.Popen(
        args, env={**env, "HANG": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )

    def killable() -> bool:
        if not (marks / "hanging").exists():
            return False
        try:
            headers = [_header(p) for p in log_dir.glob("*.eval")]
        except Exception:  # a log being written can be momentarily unreadable
            return False
        return ("stub/retry", "success", 4) in headers and ("hang/slow", "started", 3) in headers

    _wait_for("a finished cell and a stuck one", killable, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _snapshot(log_dir)
    assert sorted(_header(log_dir / n)[:2] for n in before) == [
        ("hang/slow", "started"),
        ("stub/retry", "success"),
    ]
    for mark in marks.glob("done-*"):
        mark.unlink()

    # 2. Rerun the same command: only the missing trial is generated again.
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert sorted(p.name for p in marks.glob("done-*")) == [f"done-{HUNG_SAMPLE}"]
    after = _snapshot(log_dir)
    assert {n: after[n] for n in before} == before, "finished logs were rewritten"
    (new,) = set(after) - set(before)
    assert _header(log_dir / new) == ("hang/slow", "success", 4)

    # 3. Everything downstream counts each trial once.
    summary = json.loads((log_dir / "summary.json").read_text())
    assert sorted((c["model"], c["trials"]) for c in summary["cells"]) == [
        ("hang/slow", 4),
        ("stub/retry", 4),
    ]
    logs = read_log_dir(log_dir)
    assert sorted(e.model for e in logs.current) == ["hang/slow", "stub/retry"]
    assert [(e.model, e.status) for e in logs.superseded] == [("hang/slow", "started")]
    assert logs.problems() == []


def _suite(*prompts: str) -> object:
    return suite_from_flags(
        config=None, models=["stub/verify"], prompts=list(prompts), tasks=["refund"],
        faults=["none"], protections=[], epochs=None, limit=1,
    )  # fmt: skip


def test_resume_same_cells_are_not_rerun(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    suite = suite_from_flags(
        config=None, models=["stub/retry", "stub/verify"], prompts=["baseline", "cautious"],
        tasks=["refund"], faults=["lost_reply"], protections=["bare", "intent-key"],
        epochs=None, limit=1,
    )  # fmt: skip
    first = run_suite(suite, log_dir, display="none", report=False)
    before = _snapshot(log_dir)
    plan = json.loads((log_dir / "eval-set.json").read_text())["tasks"]
    assert len(before) == 8 == len(plan)

    second = run_suite(suite, log_dir, display="none", report=False)
    assert _snapshot(log_dir) == before
    assert json.loads((log_dir / "eval-set.json").read_text())["tasks"] == plan
    names = sorted(Path(log.location).name for log in second.logs)
    assert names == sorted(Path(log.location).name for log in first.logs) == sorted(before)
    assert second.table["trials"].tolist() == [1] * 8


def test_resume_edited_prompt_file_is_rerun(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    prompt = tmp_path / "terse.md"
    prompt.write_text("Be terse. Refund exactly what the ticket asks.")
    run_suite(_suite("baseline", str(prompt)), log_dir, display="none", report=False)  # type: ignore[arg-type]
    before = _snapshot(log_dir)
    assert len(before) == 2

    prompt.write_text("Be terse. Check for an existing refund before retrying.")
    run_suite(_suite("baseline", str(prompt)), log_dir, display="none", report=False)  # type: ignore[arg-type]
    after = _snapshot(log_dir)
    assert len(after) == 3, "the edited prompt's cell should run again, the other be reused"
    assert {n: after[n] for n in before} == before

    summary = json.loads((log_dir / "summary.json").read_text())
    sha = hashlib.sha256(prompt.read_text().encode()).hexdigest()
    assert summary["run"]["prompts"]["terse"]["sha256"] == sha
    assert sorted(c["prompt"] for c in summary["cells"]) == ["baseline", "terse"]
    # The gate and the report see the new prompt's trials only.
    logs = read_log_dir(log_dir)
    assert len(logs.current) == 2 and len(logs.superseded) == 1
    current = {
        read_eval_log(str(e.path)).eval.metadata["twice"]["prompt_sha256"] for e in logs.current
    }  # type: ignore[index]
    assert sha in current


@pytest.mark.parametrize("given", ["relative", "absolute"])
def test_resume_prompt_file_is_named_by_stem_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts").mkdir()
    prompt = tmp_path / "prompts" / "my_prompt.md"
    text = "You refund orders. Never refund twice."
    prompt.write_text(text + "\n")
    name = "prompts/my_prompt.md" if given == "relative" else str(prompt)
    log_dir = tmp_path / "logs"
    run_suite(_suite("baseline", name), log_dir, display="none", report=False)  # type: ignore[arg-type]
    summary = json.loads((log_dir / "summary.json").read_text())
    assert sorted(c["prompt"] for c in summary["cells"]) == ["baseline", "my_prompt"]
    recorded = summary["run"]["prompts"]["my_prompt"]
    # The digest is of the file's bytes, as `sha256sum` prints it (the text is stripped).
    assert recorded == {
        "source": name,
        "sha256": hashlib.sha256(prompt.read_bytes()).hexdigest(),
        "bytes": len(text) + 1,
        "text": text,
        "truncated": False,
    }
    assert summary["run"]["prompts"]["baseline"]["source"] == "builtin"
    # The log itself carries the same record, so `twice report` on bare logs can name it too.
    metas = [read_eval_log(str(p), header_only=True).eval.metadata for p in log_dir.glob("*.eval")]
    by_prompt = {m["twice"]["prompt"]: m["twice"] for m in metas if m}
    assert by_prompt["my_prompt"]["prompt_sha256"] == recorded["sha256"]
    assert by_prompt["my_prompt"]["prompt_text"] == text


def test_resume_trials_frame_counts_what_summary_counts(tmp_path: Path) -> None:
    # A directory run with stub/retry, then again with stub/verify: the frame must count the
    # last run's 2 trials, as summary.json and the gate do, not both runs' logs (2 + 2).
    from twice.reports import cells, trials_frame

    log_dir = tmp_path / "logs"

    def suite(model: str) -> object:
        return suite_from_flags(
            config=None, models=[model], prompts=[], tasks=["refund"], faults=["lost_reply"],
            protections=[], epochs=None, limit=2,
        )  # fmt: skip

    run_suite(suite("stub/retry"), log_dir, display="none", report=False)  # type: ignore[arg-type]
    run_suite(suite("stub/verify"), log_dir, display="none", report=False)  # type: ignore[arg-type]

    summary = json.loads((log_dir / "summary.json").read_text())
    counted = sorted((c["model"], c["trials"]) for c in summary["cells"])
    assert counted == [("stub/verify", 2)]
    frame = trials_frame(log_dir)
    assert sorted(cells(frame)[["model", "trials"]].itertuples(index=False, name=None)) == counted
    logs = read_log_dir(log_dir)
    assert [e.model for e in logs.superseded] == ["stub/retry"]
    # An explicit list of files is read as given: the earlier run is still on disk.
    everything = trials_frame([e.path for e in (*logs.current, *logs.superseded)])
    assert len(everything) == 4


def test_finished_cells_read_each_log_header_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run reads its directory at its start and at its end; each read opens every header
    # once, not again for the cell's twice record (on S3, a GET each).
    import twice.evals.run._resume as run_module
    import twice.reports._logs as logs_module

    log_dir = tmp_path / "logs"
    suite = suite_from_flags(
        config=None, models=["stub/retry", "stub/verify"], prompts=["baseline"],
        tasks=["refund"], faults=["none"], protections=[], epochs=None, limit=1,
    )  # fmt: skip
    run_suite(suite, log_dir, display="none", report=False)  # type: ignore[arg-type]
    (log_dir / "stray.eval").write_bytes((next(log_dir.glob("*.eval"))).read_bytes())
    reads: list[str] = []

    def counting(path: str, *args: object, **kwargs: object) -> object:
        reads.append(path)
        return read_eval_log(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(logs_module, "read_eval_log", counting)
    monkeypatch.setattr(run_module, "read_eval_log", counting, raising=False)
    # Another process's view: none of the headers the run above read are cached.
    monkeypatch.setattr(logs_module, "_HEADERS", type(logs_module._HEADERS)())
    planned = list(suite.cells())  # type: ignore[attr-defined]
    finished, files, cancelled = run_module.finished_cells(log_dir, planned)
    assert finished == set(planned) and not cancelled
    assert len(files) == 2  # the copy is the same task's log: one of the two counts
    assert sorted(reads) == sorted(str(p) for p in log_dir.glob("*.eval"))  # once each


@pytest.mark.parametrize("shard", [None, "1/2"])
def test_an_incomplete_run_says_how_to_resume_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard: str | None
) -> None:
    # Without --log-dir every run gets a new directory, so "rerun the same command" started
    # over; and a shard's count of unfinished cells was given out of the whole suite's.
    import pandas as pd
    from click.testing import CliRunner
    from twice.evals import RunResult, run
    from twice.evals.cli import cli

    monkeypatch.chdir(tmp_path)

    def stopped(suite: object, log_dir: object, **kwargs: object) -> RunResult:
        planned = list(suite.cells())  # type: ignore[attr-defined]
        return RunResult(
            log_dir, [], pd.DataFrame(), tmp_path / "summary.json", None, [],
            missing=planned[:1], interrupted="SIGTERM",
        )  # fmt: skip

    monkeypatch.setattr(run, "run_suite", stopped)
    args = ["run", "--model", "stub/retry", "--task", "refund", "--fault", "none",
            "--fault", "lost_reply", "--protection", "bare", "--display", "none"]  # fmt: skip
    if shard:
        args += ["--shard", shard, "--log-dir", "kept"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 143, result.output
    if shard:
        assert "running 1 of 2 cell(s), shard 1/2" in result.stderr
        assert "1 of 1 cell(s) did not finish" in result.stderr
        assert "Rerun the same command to resume" in result.stderr
    else:
        assert "1 of 2 cell(s) did not finish" in result.stderr
        assert "Rerun it with --log-dir logs/run-" in result.stderr


def test_resume_reruns_the_errored_trials_of_a_finished_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: inspect counted a log whose trials partly errored as finished, so a
    # rerun after the fault was fixed sent nothing and exited 1 again with the same errors.
    import shutil

    project = tmp_path / "proj"
    shutil.copytree(Path(__file__).parents[2] / "docs" / "examples" / "own_task", project)
    source = project / "courtesy.py"
    calls, broken = tmp_path / "calls.txt", tmp_path / "broken"
    source.write_text(
        source.read_text(encoding="utf-8").replace(
            "        async def existing()",
            f"        with open({str(calls)!r}, 'a') as f:\n"
            "            f.write(order_id + '\\n')\n"
            f"        if __import__('os').path.exists({str(broken)!r}):\n"
            "            if order_id == 'order_1054':\n"
            "                raise RuntimeError('the payments client broke')\n\n"
            "        async def existing()",
        ),
        encoding="utf-8",
    )
    suite = suite_from_flags(
        config=None, models=["stub/no-retry"], prompts=[], tasks=[f"{source}:courtesy_refund"],
        faults=["none"], protections=[], epochs=None, limit=None,
    )  # fmt: skip
    broken.touch()
    first = run_suite(suite, tmp_path / "logs", report=False)
    assert first.failed and list(first.table["errors"]) == [1]
    broken.unlink()
    calls.write_text("")
    again = run_suite(suite, tmp_path / "logs", report=False)
    assert not again.failed
    assert list(again.table["errors"]) == [0] and list(again.table["trials"]) == [2]
    # Only the errored trial ran again; the clean one was reused from the log.
    assert calls.read_text().split() == ["order_1054"]
    (log,) = (e for e in read_log_dir(tmp_path / "logs").current)
    assert len(read_eval_log(str(log.path)).samples or []) == 2


def test_a_rerun_asking_for_fewer_trials_than_the_logs_hold_is_refused(tmp_path: Path) -> None:
    # The failing paths: a smaller --limit reused the log and counted its 6 trials where a
    # fresh run has 4; fewer --epochs rewrote the log with only the first epoch's samples.
    from twice.evals import SuiteError

    def suite(limit: int, epochs: int) -> Any:
        return suite_from_flags(
            config=None, models=["stub/retry"], prompts=[], tasks=["refund"], faults=["none"],
            protections=[], epochs=epochs, limit=limit,
        )  # fmt: skip

    log_dir = tmp_path / "logs"
    run_suite(suite(3, 2), log_dir, report=False)
    before = _snapshot(log_dir)
    for limit, epochs in ((2, 2), (3, 1)):
        with pytest.raises(SuiteError, match=r"run with 3 sample\(s\) × 2 epoch\(s\); this run"):
            run_suite(suite(limit, epochs), log_dir, report=False)
        assert _snapshot(log_dir) == before
    # More of either extends the logs.
    more = run_suite(suite(4, 3), log_dir, report=False)
    assert list(more.table["trials"]) == [12]


def test_a_rerun_after_the_task_was_edited_is_not_refused_for_fewer_trials(
    tmp_path: Path,
) -> None:
    # The failing path: the refusal compared with the edited task's stale logs, so deleting
    # a dataset line exited 2 blaming --epochs/--limit, which the user never changed.
    import shutil

    project = tmp_path / "proj"
    shutil.copytree(Path(__file__).parents[2] / "docs" / "examples" / "own_task", project)
    spec = f"{project / 'courtesy.py'}:courtesy_refund"
    suite = suite_from_flags(
        config=None, models=["stub/verify"], prompts=[], tasks=[spec], faults=["none"],
        protections=[], epochs=None, limit=None,
    )  # fmt: skip
    assert list(run_suite(suite, tmp_path / "logs", report=False).table["trials"]) == [2]
    dataset = project / "courtesy.jsonl"
    dataset.write_text(dataset.read_text(encoding="utf-8").splitlines()[0] + "\n")
    again = run_suite(suite, tmp_path / "logs", report=False)
    assert list(again.table["trials"]) == [1]


def test_two_runs_logs_of_one_cell_in_one_directory_are_refused(tmp_path: Path) -> None:
    # The failing path: the logs of two identical runs copied into one directory (no
    # eval-set.json to say which run counts) were both counted: every cell had twice its
    # trials, the same sample × epoch twice, and intervals as if the copies were new trials.
    from click.testing import CliRunner
    from twice.evals.cli import cli

    suite = suite_from_flags(
        config=None, models=["stub/verify"], prompts=[], tasks=["refund"],
        faults=["lost_reply"], protections=[], epochs=2, limit=3,
    )  # fmt: skip
    mix = tmp_path / "mix"
    mix.mkdir()
    for name in ("a", "b"):
        assert run_suite(suite, tmp_path / name, display="none", report=False).ok
        for log in (tmp_path / name).glob("*.eval"):
            (mix / log.name).write_bytes(log.read_bytes())
    gate = ["gate", str(mix), "--config", str(Path(__file__).parents[2] / "evals" / "gate.toml")]
    for command in (gate, ["report", str(mix)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, result.output
        assert (
            "holds two logs of cell stub/verify / baseline / refund / lost_reply / bare"
            in result.output
        )
        assert "counted twice" in result.output
    assert not (mix / "report.html").exists()
    (*_, last) = sorted(mix.glob("*.eval"))
    last.unlink()  # one of them kept: 6 trials, each once
    assert len(read_log_dir(mix).current) == 1
    result = CliRunner().invoke(cli, ["report", str(mix)])
    assert result.exit_code == 0, result.output
