"""A suite run leaves inspect's control server off unless ``INSPECT_EVAL_CTL_SERVER`` asks.

Inspect starts a control server (for ``inspect ctl``) in every process that starts an eval:
a FastAPI app built and a socket bound, 0.4 s of each ``--workers`` worker's start, for a
batch run nobody steers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from inspect_ai._control import server as ctl
from twice.evals.cli import cli

ARGS = ["--model", "stub/retry", "--task", "refund", "--fault", "lost_reply", "--limit", "1"]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The control servers started during the test."""
    seen: list[Any] = []
    start = ctl.ControlServer.start

    async def spy(self: Any) -> None:
        seen.append(self)
        await start(self)

    monkeypatch.setattr(ctl.ControlServer, "start", spy)
    return seen


def run(log_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--log-dir", str(log_dir), *ARGS, "--no-report"])
    assert result.exit_code == 0, result.output


def test_a_run_starts_no_control_server(
    tmp_path: Path, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INSPECT_EVAL_CTL_SERVER", raising=False)
    run(tmp_path / "logs")
    assert started == []


@pytest.mark.parametrize("value", ["true", "1"])
def test_the_inspect_variable_turns_it_back_on(
    tmp_path: Path, started: list[Any], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("INSPECT_EVAL_CTL_SERVER", value)
    run(tmp_path / "logs")
    assert started  # inspect's own default, as `inspect eval` would have it
