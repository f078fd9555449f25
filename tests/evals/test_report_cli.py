"""``twice report``: a thin wire to ``reports.write_report`` that never loses a report."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from twice import reports

Twice = Callable[..., Any]


@pytest.fixture
def logs(stub_logs: Path, tmp_path: Path) -> Path:
    """A private copy of the stub logs (with the summary.json ``twice run`` wrote)."""
    copy = tmp_path / "logs"
    shutil.copytree(stub_logs, copy)
    return copy


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace ``reports.write_report`` with a recorder that writes a marker page."""
    calls: list[dict[str, Any]] = []

    def fake(trials: pd.DataFrame, path: str | Path, **kwargs: Any) -> Path:
        calls.append({"trials": trials, "path": Path(path), **kwargs})
        Path(path).write_text("<html>new report</html>", encoding="utf-8")
        return Path(path)

    monkeypatch.setattr(reports, "write_report", fake)
    return calls


def test_report_cli_writes_into_the_log_dir_with_run_metadata(
    twice: Twice, logs: Path, captured: list[dict[str, Any]]
) -> None:
    result = twice("report", logs)
    assert result.exit_code == 0, result.output
    assert (logs / "report.html").read_text() == "<html>new report</html>"
    (call,) = captured
    run = json.loads((logs / "summary.json").read_text())["run"]
    assert call["run"] == run and run["models"] == ["stub/retry", "stub/verify"]
    assert "baseline" not in call
    assert len(call["trials"]) == 48
    assert set(call["trials"]["model"]) == {"stub/retry", "stub/verify"}


def test_report_cli_of_a_run_still_going_says_its_results_are_partial(
    twice: Twice, logs: Path
) -> None:
    summary = json.loads((logs / "summary.json").read_text())
    summary.update(complete=False, status="running")
    (logs / "summary.json").write_text(json.dumps(summary))
    result = twice("report", logs)
    assert result.exit_code == 0, result.output
    html = (logs / "report.html").read_text(encoding="utf-8")
    assert "Partial results.</b> The run is still going." in html
    summary.update(complete=True, status="complete")
    (logs / "summary.json").write_text(json.dumps(summary))
    assert twice("report", logs).exit_code == 0
    assert "Partial results" not in (logs / "report.html").read_text(encoding="utf-8")


def test_report_cli_output_through_a_symlink_writes_its_target(
    twice: Twice, logs: Path, tmp_path: Path, captured: list[dict[str, Any]]
) -> None:
    # The failing path: the report was renamed over the link, which became a plain file.
    target = tmp_path / "site" / "index.html"
    target.parent.mkdir()
    link = tmp_path / "report.html"
    link.symlink_to(target)
    assert twice("report", logs, "-o", link).exit_code == 0
    assert link.is_symlink() and target.read_text() == "<html>new report</html>"


@pytest.mark.parametrize(
    ("link_to", "said"), [("nowhere/deep", "points nowhere"), ("out", "is in a loop")]
)
def test_report_cli_output_under_a_broken_link_is_refused(
    twice: Twice,
    logs: Path,
    tmp_path: Path,
    captured: list[dict[str, Any]],
    link_to: str,
    said: str,
) -> None:
    # The failing path: `-o out/report.html` with out -> nowhere/deep made nowhere/deep; a
    # link in a loop was refused as one that "points nowhere".
    (tmp_path / "out").symlink_to(tmp_path / link_to)
    result = twice("report", logs, "-o", tmp_path / "out" / "report.html")
    assert result.exit_code == 2, result.output
    assert f"the link '{tmp_path / 'out'}' on its path {said}" in result.output
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("link_to", ["loop", "missing/index.html"])
def test_report_cli_output_through_a_broken_link_is_refused_and_the_link_kept(
    twice: Twice, logs: Path, tmp_path: Path, captured: list[dict[str, Any]], link_to: str
) -> None:
    # The failing path: a link in a loop was renamed over (the link became the report), and
    # a link into a missing directory had that directory made; a shell's `>` refuses both.
    link = tmp_path / "report.html"
    link.symlink_to(link if link_to == "loop" else tmp_path / link_to)
    result = twice("report", logs, "-o", link)
    assert result.exit_code == 2, result.output
    assert str(link) in result.output and "Traceback" not in result.output
    assert link.is_symlink() and not (tmp_path / "missing").exists()


def test_report_cli_output_and_baseline(
    twice: Twice, logs: Path, stub_logs: Path, tmp_path: Path, captured: list[dict[str, Any]]
) -> None:
    out = tmp_path / "out" / "compare.html"
    result = twice("report", logs, "-o", out, "--baseline", stub_logs)
    assert result.exit_code == 0, result.output
    assert out.read_text() == "<html>new report</html>"
    (call,) = captured
    assert isinstance(call["baseline"], pd.DataFrame) and len(call["baseline"]) == 48


def test_report_and_gate_write_file_uris_where_they_point(
    twice: Twice, logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `twice report file:///abs/logs` wrote ./file:/abs/logs/report.html, relative to the
    # working directory, and said "report: file:/abs/logs/report.html": pathlib collapses
    # the URI's "//". -o and --junit took file:// URIs the same way.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (logs / "report.html").unlink(missing_ok=True)
    result = twice("report", logs.as_uri())
    assert result.exit_code == 0, result.output
    assert (logs / "report.html").is_file()
    assert f"report: {logs / 'report.html'}" in result.stdout
    out = tmp_path / "out" / "r.html"
    assert twice("report", logs.as_uri(), "-o", out.as_uri()).exit_code == 0
    assert out.is_file()
    gate_toml = tmp_path / "gate.toml"
    gate_toml.write_text('[[rule]]\nmetric = "duplication_rate"\nmax = 0.5\n')
    junit = tmp_path / "junit" / "gate.xml"
    gate = twice("gate", logs.as_uri(), "--config", gate_toml, "--junit", junit.as_uri())
    assert gate.exit_code == 1, gate.output  # stub/retry duplicates
    assert "<testsuite" in junit.read_text()
    assert list(cwd.iterdir()) == []  # nothing under ./file:


def test_report_cli_real_write_report_renders(twice: Twice, logs: Path) -> None:
    result = twice("report", logs, "-o", logs / "page.html")
    assert result.exit_code == 0, result.output
    assert "<html" in (logs / "page.html").read_text(encoding="utf-8").lower()
    plain = logs / "plain.txt"
    plain.write_text("x")  # the mode any new file gets under this umask
    assert (logs / "page.html").stat().st_mode == plain.stat().st_mode


def test_report_cli_corrupt_log_keeps_the_existing_report(
    twice: Twice, logs: Path, captured: list[dict[str, Any]]
) -> None:
    (logs / "report.html").write_text("previous report")
    (logs / "2026-01-01T00-00-00-00-00_refund_broken.eval").write_bytes(b"garbage")
    result = twice("report", logs)
    assert result.exit_code == 2
    assert "refund_broken.eval" in result.stderr and "cannot be read" in result.stderr
    assert (logs / "report.html").read_text() == "previous report"
    assert captured == []


@pytest.mark.parametrize("which", ["missing", "empty"])
def test_report_cli_exit_2_on_missing_or_empty_dir(
    twice: Twice, tmp_path: Path, which: str
) -> None:
    target = tmp_path / which
    if which == "empty":
        target.mkdir()
    result = twice("report", target)
    assert result.exit_code == 2
    expected = "does not exist" if which == "missing" else "holds no inspect logs"
    assert expected in result.stderr


def test_report_cli_render_failure_keeps_the_existing_report(
    twice: Twice, logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (logs / "report.html").write_text("previous report")

    def broken(trials: pd.DataFrame, path: str | Path, **kwargs: Any) -> Path:
        Path(path).write_text("half a page")
        raise RuntimeError("template bug")

    monkeypatch.setattr(reports, "write_report", broken)
    with pytest.raises(RuntimeError, match="template bug"):
        twice("report", logs)
    assert (logs / "report.html").read_text() == "previous report"
    assert not list(logs.glob(".report.html.*")), "the temporary file was left behind"


def test_report_cli_unreadable_summary_is_a_warning(
    twice: Twice, logs: Path, captured: list[dict[str, Any]]
) -> None:
    (logs / "summary.json").write_text("{not json")
    result = twice("report", logs)
    assert result.exit_code == 0, result.output
    assert "warning: ignoring unreadable" in result.stderr
    assert captured[0]["run"] is None
