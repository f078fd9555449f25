"""``twice run``'s progress display: live on a terminal, static lines in CI or a pipe."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from twice.evals import run_suite, suite_from_flags
from twice.evals.cli import default_display


class _Stdout(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize(
    ("tty", "env", "expected"),
    [
        (True, {}, "rich"),
        (False, {}, "plain"),
        (True, {"CI": "true"}, "plain"),
        (True, {"INSPECT_DISPLAY": "none"}, "none"),
        (False, {"INSPECT_DISPLAY": " Full "}, "full"),
    ],
)
def test_run_display_default_depends_on_terminal_and_env(
    monkeypatch: pytest.MonkeyPatch, tty: bool, env: dict[str, str], expected: str
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("INSPECT_DISPLAY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("sys.stdout", _Stdout(tty))
    assert default_display() == expected


@pytest.mark.parametrize(("display", "tables"), [("none", 0), ("plain", 1)])
def test_a_quiet_run_skips_inspects_final_results_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, display: str, tables: int
) -> None:
    # Laying the table out cost 6.5 s of the default suite's 77 for text a quiet console
    # throws away; a display that shows it still gets it.
    import inspect_ai._display.rich.display as rich_display

    calls: list[int] = []
    original = rich_display.tasks_results

    def counting(tasks: Any) -> Any:
        calls.append(len(tasks))
        return original(tasks)

    monkeypatch.setattr(rich_display, "tasks_results", counting)
    suite = suite_from_flags(
        config=None, models=["stub/verify"], prompts=["baseline"], tasks=["refund"],
        faults=["none"], protections=[], epochs=None, limit=1,
    )  # fmt: skip
    result = run_suite(suite, tmp_path / "logs", display=display, report=False)
    assert result.ok
    assert len(calls) == tables
    assert rich_display.tasks_results is counting  # put back after the run
