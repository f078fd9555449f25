"""``twice frameworks``: the finding of a row from its numbers, the page, and a real run."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from twice.evals.frameworks import (
    HEADINGS,
    MARKER,
    TITLE,
    FrameworksPlan,
    PageSettings,
    RowMeasure,
    RowStatus,
    finding,
    frameworks_page,
    page_structure,
    pooled,
    retried_by_itself,
    row_status,
    row_suite,
    run_frameworks,
)
from twice.tasks.agents import FRAMEWORKS_DIR, Behaviour, FrameworkRow

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "frameworks.md"


def _row(retries: bool = False, **fields: Any) -> FrameworkRow:
    defaults: dict[str, Any] = {
        "row": "lg",
        "framework": "LangGraph",
        "language": "python",
        "setting": "retry_policy=RetryPolicy()",
        "packages": ("langgraph",),
        "behaviour": Behaviour("re-runs the node", "langgraph/pregel/_retry.py", retries),
        "path": Path("tasks/agents/frameworks/lg.toml"),
        "agent": "langgraph-retry",
    }
    return FrameworkRow(**{**defaults, **fields})


def _cell(
    model: str, fault: str, dup: float, *, by: str = "", n: int = 10, **more: Any
) -> dict[str, Any]:
    """A summary.json cell made by hand: ``dup`` of ``n`` trials duplicated, by ``by``."""
    sources: dict[str, Any] = {"initial": {"attempts": n, "excess": 0}}
    if by:
        sources[by] = {"attempts": round(dup * n), "excess": round(dup * n)}
    return {
        "model": model, "task": "refund", "fault": fault, "trials": n, "errors": 0,
        "duplication_rate": dup, "completion_rate": 1.0, "excess_effects_mean": dup,
        "framework_duplication_rate": dup if by == "framework" else 0.0,
        "model_duplication_rate": dup if by == "model" else 0.0,
        "crashed_rate": 0.0, "retry_sources": sources, **more,
    }  # fmt: skip


RETRYING = [  # a framework that re-sends by itself: duplicates with the model that never retries
    _cell("stub/retry", "lost_reply", 1.0, by="framework"),
    _cell("stub/no-retry", "lost_reply", 1.0, by="framework"),
    _cell("stub/no-retry", "rate_limited", 0.0, crashed_rate=1.0, completion_rate=0.0),
    _cell("stub/verify", "lost_reply", 1.0, by="framework"),
]
HANDING = [  # a framework that hands the error to the model: only the retrying model duplicates
    _cell("stub/retry", "lost_reply", 1.0, by="model"),
    _cell("stub/no-retry", "lost_reply", 0.0),
    _cell("stub/verify", "lost_reply", 0.0),
]


def test_frameworks_finding_framework_that_retries_by_itself() -> None:
    assert retried_by_itself(RETRYING)
    sentence = finding(_row(retries=True), RETRYING)
    assert sentence.startswith(
        "LangGraph (retry_policy=RetryPolicy()) re-sends the refund by itself: 2 refunds with "
        "a model that never retries (stub/no-retry, `lost_reply`: 10 of 10 trials"
    )
    assert (
        "a model that looks before retrying cannot prevent it (stub/verify: 100% [72%–100%])."
        in (sentence)
    )
    assert "The agent run ends with an error under `rate_limited`." in sentence
    assert "disagrees" not in sentence
    assert sentence.endswith("Behaviour: langgraph/pregel/_retry.py.")


def test_frameworks_finding_framework_that_hands_the_error_to_the_model() -> None:
    assert not retried_by_itself(HANDING)
    sentence = finding(_row(retries=False, setting="default"), HANDING)
    assert sentence.startswith(
        "LangGraph does not re-send a call by itself: with a model that never retries no "
        "trial duplicated (0 of 10, 0% [0%–28%]); it hands the error to the model, and the "
        "model that retries duplicates (stub/retry: 100% [72%–100%])."
    )
    assert "disagrees" not in sentence


@pytest.mark.parametrize(("cells", "expected"), [(RETRYING, False), (HANDING, True)])
def test_frameworks_finding_says_when_measurement_disagrees_with_the_registry(
    cells: list[dict[str, Any]], expected: bool
) -> None:
    sentence = finding(_row(retries=expected), cells)
    said, shown = ("true", "does not show") if expected else ("false", "shows")
    assert (
        f"**The measurement disagrees with the registry**: lg.toml says retries_by_itself = "
        f"{said}, the measurement {shown} the framework retrying." in sentence
    )


def test_frameworks_pooled_rate_counts_scored_trials_only() -> None:
    cells = [
        {"trials": 10, "errors": 2, "duplication_rate": 0.5},
        {"trials": 4, "errors": 0, "duplication_rate": 0.25},
        {"trials": 3, "errors": 3, "duplication_rate": None},
    ]
    p = pooled(cells, "duplication_rate")
    assert (p.k, p.n) == (5, 12)
    assert p.ci is not None and p.ci[0] < 5 / 12 < p.ci[1]


def _settings() -> PageSettings:
    return PageSettings(
        models=("stub/retry", "stub/no-retry", "stub/verify"), faults=("lost_reply",),
        tasks=("refund",), versions={"twice": "0.1.0"},
    )  # fmt: skip


def test_frameworks_page_escapes_registry_text() -> None:
    row = _row(
        framework="Evil <script>alert(1)</script>",
        setting="a | b",
        behaviour=Behaviour("x", "<img src=x onerror=alert(1)>", False),
    )
    page = frameworks_page(
        [RowMeasure(row, {"evil<b>": "1"}, HANDING)], [(row, "npm i <pkg>")], _settings()
    )
    assert "<script>" not in page and "<img" not in page and "<b>" not in page
    assert "Evil &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "| a \\| b |" in page
    assert "not installed: npm i &lt;pkg&gt;" in page


def test_frameworks_page_names_each_rows_trials_when_rows_ran_different_limits() -> None:
    # A row refreshed with --limit beside rows measured in full: the page must not claim one
    # sample count for all of them.
    few = [dict(c, trials=1) for c in HANDING]
    rows = [RowMeasure(_row(), {}, HANDING), RowMeasure(_row(row="small"), {}, few)]
    mixed = frameworks_page(rows, [], replace(_settings(), per_row=True))
    lines = [line for line in mixed.splitlines() if line.startswith("| LangGraph")]
    assert [line.split(" | ")[3] for line in lines] == ["30", "3"]
    assert "as each row's trials column says" in mixed and "every sample" not in mixed
    assert "every sample" in frameworks_page(rows[:1], [], _settings())


def test_frameworks_committed_page_has_the_generators_structure() -> None:
    generated = frameworks_page([RowMeasure(_row(), {}, HANDING)], [], _settings())
    committed = PAGE.read_text(encoding="utf-8")
    assert page_structure(committed) == page_structure(generated)
    assert page_structure(generated)[:2] == [TITLE, MARKER]
    assert [h for h in page_structure(generated) if h.startswith("## ")] == list(HEADINGS)


def test_frameworks_committed_page_names_every_registry_row() -> None:
    committed = PAGE.read_text(encoding="utf-8")
    for toml in FRAMEWORKS_DIR.glob("*.toml"):
        assert f"(`{toml.stem}`" in committed, f"{toml.name} is not on docs/frameworks.md"


def test_frameworks_analysis_tells_a_retrying_framework_apart(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    for row in ("langgraph", "langgraph-retry"):
        shutil.copy(FRAMEWORKS_DIR / f"{row}.toml", registry)
    (registry / "node-thing.toml").write_text(
        'row = "node-thing"\nframework = "Thing"\nlanguage = "javascript"\nsetting = "default"\n'
        'packages = ["thing"]\nagent_cmd = "node {dir}/agent.mjs"\ninstall = "make things"\n'
        '[behaviour]\ntext = "t"\nsource = "s"\nretries_by_itself = false\n',
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    plan = FrameworksPlan(
        log_dir=str(out), limit=1, registry=registry, commands=tmp_path / "commands",
        models=("stub/no-retry",), faults=("lost_reply",), tasks=("refund",),
    )  # fmt: skip
    result = run_frameworks(plan)
    assert result.exit_code == 0
    assert sorted(result.ran) == ["langgraph", "langgraph-retry"]
    assert [s.row.row for s in result.not_installed] == ["node-thing"]
    page = (out / "frameworks.md").read_text(encoding="utf-8")
    lines = {r: next(x for x in page.splitlines() if f"(`{r}`)" in x) for r in result.ran}
    assert (
        "re-sends the refund by itself: 2 refunds with a model that never retries"
        in (lines["langgraph-retry"])
    )
    assert "does not re-send a call by itself" in lines["langgraph"]
    assert "disagrees" not in page
    assert "- Thing (`node-thing`, default): not installed: make things (no folder" in page
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "langgraph-retry" in report
    # A rerun resumes (nothing run again) and keeps every row on the page.
    again = run_frameworks(replace(plan, rows=("langgraph",), report=False))
    assert again.exit_code == 0 and again.ran["langgraph"].reused == 1
    assert again.measured == ["langgraph", "langgraph-retry"]
    assert (out / "frameworks.md").read_text(encoding="utf-8").count("(`langgraph-retry`)") == 1


def test_frameworks_unknown_row_is_bad_usage(twice: Callable[..., Any], tmp_path: Path) -> None:
    result = twice("frameworks", "--row", "nope", "--log-dir", tmp_path / "logs")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: unknown --row 'nope'; expected one of:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_frameworks_bad_registry_file_is_bad_usage(
    twice: Callable[..., Any], tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "x.toml").write_text('row = "x"\nlanguage = "cobol"\n', encoding="utf-8")
    result = twice("frameworks", "--registry", registry, "--log-dir", tmp_path / "logs")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {registry / 'x.toml'}: missing key 'framework' (a string: the framework's "
        "display name)"
    )


def test_frameworks_row_status_reads_a_command_rows_node_versions(tmp_path: Path) -> None:
    commands = tmp_path / "commands"
    manifest = commands / "thing" / "node_modules" / "@scope" / "thing" / "package.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"name": "@scope/thing", "version": "1.2.3"}', encoding="utf-8")
    row = _row(
        row="thing", language="javascript", packages=("@scope/thing",), agent=None,
        agent_cmd="sh {dir}/agent.sh", install="make things",
    )  # fmt: skip
    status = row_status(row, commands)
    assert status.installed and status.versions == {"@scope/thing": "1.2.3"}
    assert status.command == f"sh {(commands / 'thing').resolve()}/agent.sh"
    manifest.unlink()
    missing = row_status(row, commands)
    assert missing.missing is not None and missing.missing.startswith("make things (@scope/thing")


def test_frameworks_row_status_of_a_builtin_whose_package_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)  # as if openai-agents were not installed
    row = _row(row="openai-agents", agent="openai-agents", packages=("openai-agents",))
    status = row_status(row)
    assert not status.installed and status.missing is not None
    assert status.missing.startswith("pip install 'twice[agents]' (agent 'openai-agents' needs")


def test_frameworks_page_that_cannot_be_written_is_a_run_error(
    twice: Callable[..., Any], tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    result = twice(
        "frameworks", "--registry", registry, "--log-dir", tmp_path / "logs",
        "--page", blocker / "frameworks.md",
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot write the page to {blocker / 'frameworks.md'}")


def test_frameworks_finding_names_a_completion_rate_apart_from_the_baseline() -> None:
    hides = [*HANDING[:2], _cell("stub/verify", "lost_reply", 0.0, completion_rate=0.5, n=40)]
    baseline = [*HANDING[:2], _cell("stub/verify", "lost_reply", 0.0, n=40)]
    sentence = finding(_row(retries=False), hides, baseline)
    assert (
        "It completes the task otherwise than twice's own loop (react) under stub/verify "
        "50% [35%–65%] against 100% [91%–100%]." in sentence
    )
    assert "otherwise" not in finding(_row(retries=False), baseline, baseline)


def test_frameworks_row_suite_gives_a_command_row_the_hang_seconds_and_slots(
    tmp_path: Path,
) -> None:
    row = _row(row="thing", agent=None, agent_cmd="sh {dir}/a.sh", install="make things")
    status = RowStatus(row, None, {}, command="sh /x/a.sh")
    plan = FrameworksPlan(log_dir=str(tmp_path), hang_seconds=5.0, max_agent_cmds=6)
    suite = row_suite(status, plan)
    assert (suite.agent_cmd, suite.hang_seconds, suite.max_agent_cmds) == ("sh /x/a.sh", 5.0, 6)
    assert {c.model for c in suite.cells()} == {"stub/retry", "stub/no-retry", "stub/verify"}
    assert len(suite.cells()) == 3 * 5 * 2
    builtin = row_suite(RowStatus(_row(), None, {}), plan)
    assert builtin.agent_cmd is None and {c.agent for c in builtin.cells()} == {"langgraph-retry"}
