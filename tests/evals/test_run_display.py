"""``twice run``'s progress display: live on a terminal, static lines in CI or a pipe."""

from __future__ import annotations

import io

import pytest
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
