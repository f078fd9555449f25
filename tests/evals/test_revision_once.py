"""A run asks git for its revision once, not three subprocesses for every eval.

Inspect's task logger runs ``git rev-parse``, ``git remote get-url`` and ``git status`` at the
start of every eval it logs (171 ``git`` processes in the default suite's 57 evals). The
revision is the code the process loaded: one answer serves the whole run, and every log still
records it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai._eval.task import log as task_log
from inspect_ai._util.git import GitContext
from inspect_ai.log import list_eval_logs, read_eval_log
from twice.evals import run_suite, suite_from_flags
from twice.evals.run._speedups import revision_resolved_once


def test_every_log_records_the_revision_found_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def git_context() -> GitContext:
        asked.append(1)
        return GitContext(origin="https://example.test/twice.git", commit="abc1234", dirty=False)

    # inspect skips git under pytest; the fake stands in for the three subprocesses
    monkeypatch.setattr(task_log, "git_context", git_context)
    suite = suite_from_flags(
        config=None, models=["stub/retry", "stub/verify"], prompts=[], tasks=["refund"],
        faults=["lost_reply", "none"], protections=[], epochs=None, limit=1,
    )  # fmt: skip
    result = run_suite(suite, tmp_path / "logs", display="none", report=False)
    assert result.ok, result.failed
    logs = [read_eval_log(f, header_only=True) for f in list_eval_logs(str(tmp_path / "logs"))]
    assert len(logs) == 4  # two models x two faults: four evals, four task loggers
    assert len(asked) == 1
    assert {(log.eval.revision.commit if log.eval.revision else None) for log in logs} == {
        "abc1234"
    }


def test_inspect_is_left_as_it_was_after_the_block() -> None:
    original = task_log.resolve_revision
    with pytest.raises(RuntimeError), revision_resolved_once():
        assert task_log.resolve_revision is not original
        raise RuntimeError("a run that fails still restores it")
    assert task_log.resolve_revision is original
