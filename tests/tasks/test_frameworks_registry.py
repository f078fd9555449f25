"""The frameworks registry: the shipped rows load, and a bad file is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from twice.mocks import UsageError
from twice.tasks.agents import (
    BUILTIN_AGENTS,
    FRAMEWORKS_DIR,
    FrameworkRowError,
    load_framework_row,
    load_frameworks,
)

GOOD = """\
row = "{row}"
framework = "LangGraph"
language = "python"
setting = "default"
packages = ["langgraph"]
agent = "langgraph"

[behaviour]
text = "ToolNode reports the error to the model."
source = "langgraph/prebuilt/tool_node.py"
retries_by_itself = false
"""


def _write(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(body, encoding="utf-8")
    return path


def test_frameworks_registry_shipped_rows_cover_every_builtin_agent_and_react() -> None:
    rows = load_frameworks()
    assert {r.agent for r in rows if not r.is_command} == {"react", *BUILTIN_AGENTS}
    for r in rows:
        assert r.path.parent == FRAMEWORKS_DIR
        assert r.row == r.path.stem
        assert r.behaviour.text and r.behaviour.source
    retrying = {r.row for r in rows if r.behaviour.retries_by_itself}
    assert "langgraph-retry" in retrying and "langgraph" not in retrying
    # The row the frameworks guide shows.
    shown = load_framework_row(FRAMEWORKS_DIR / "langgraph-retry.toml")
    assert (shown.agent, shown.setting) == (
        "langgraph-retry",
        "retry_policy=RetryPolicy() on the tool node",
    )


def test_frameworks_registry_good_file_loads(tmp_path: Path) -> None:
    row = load_framework_row(_write(tmp_path, "lg", GOOD.replace("{row}", "lg")))
    assert (row.row, row.agent, row.agent_cmd, row.packages) == (
        "lg",
        "langgraph",
        None,
        ("langgraph",),
    )
    assert not row.is_command and row.how_to_install() == "pip install 'twice[agents]'"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace('row = "x"', 'row = "y"'), "row = 'y' must be the file's stem 'x'"),
        (lambda s: s + 'colour = "red"\n', "unknown key behaviour.colour"),
        (lambda s: "colour = 1\n" + s, "unknown key 'colour'; accepted keys: row, framework"),
        (lambda s: s.replace('framework = "LangGraph"\n', ""), "missing key 'framework'"),
        (lambda s: s.replace('"python"', '"rust"'), "language = 'rust'; expected one of 'python'"),
        (
            lambda s: s.replace('["langgraph"]', '"langgraph"'),
            "packages = 'langgraph'; expected a list",
        ),
        (
            lambda s: s.replace('agent = "langgraph"', 'agent = "crewai"'),
            "agent = 'crewai'; expected",
        ),
        (
            lambda s: s.replace('agent = "langgraph"', 'agent_cmd = "node a.mjs"'),
            "an agent_cmd row needs key 'install'",
        ),
        (
            lambda s: s.replace('agent = "langgraph"', 'agent = "langgraph"\nagent_cmd = "x"'),
            "both of 'agent' and 'agent_cmd' given; expected exactly one",
        ),
        (
            lambda s: s.replace(
                'agent = "langgraph"', 'agent_cmd = "node {folder}/a.mjs"\ninstall = "make x"'
            ),
            "names {folder}; accepted placeholders: {dir}, {python}",
        ),
        (
            lambda s: s.replace("retries_by_itself = false", 'retries_by_itself = "no"'),
            "behaviour.retries_by_itself = 'no'; expected true or false",
        ),
        (
            lambda s: s.replace('source = "langgraph/prebuilt/tool_node.py"\n', ""),
            "missing key behaviour.source",
        ),
        (lambda s: s.replace('text = "ToolNode', 'text = "'), ""),  # still a string: loads
        (lambda s: s.replace("[behaviour]", "[behaviour"), "not a valid TOML file"),
    ],
)
def test_frameworks_registry_bad_file_is_one_clear_error(
    tmp_path: Path, edit: object, message: str
) -> None:
    path = _write(tmp_path, "x", edit(GOOD.replace("{row}", "x")))  # type: ignore[operator]
    if not message:
        load_framework_row(path)
        return
    with pytest.raises(FrameworkRowError) as caught:
        load_framework_row(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text
    assert isinstance(caught.value, UsageError) and caught.value.exit_code == 2


def test_frameworks_registry_two_rows_of_one_agent_are_refused(tmp_path: Path) -> None:
    _write(tmp_path, "a", GOOD.replace("{row}", "a"))
    _write(tmp_path, "b", GOOD.replace("{row}", "b"))
    with pytest.raises(FrameworkRowError, match=r"b\.toml: runs the same agent \(langgraph\)"):
        load_frameworks(tmp_path)


def test_frameworks_registry_one_command_template_in_two_folders_is_two_agents(
    tmp_path: Path,
) -> None:
    # `node {dir}/agent.mjs` filled in with each row's own folder runs two different agents;
    # the same folder and arguments twice is one agent.
    body = GOOD.replace(
        'agent = "langgraph"', 'agent_cmd = "node {dir}/agent.mjs"\ninstall = "make x"'
    )
    for row in ("vercel-ai", "langgraph-js"):
        _write(tmp_path, row, body.replace("{row}", row))
    assert [r.row for r in load_frameworks(tmp_path)] == ["langgraph-js", "vercel-ai"]
    twin = body.replace("{row}", "twin").replace("[behaviour]", 'dir = "vercel-ai"\n\n[behaviour]')
    _write(tmp_path, "twin", twin)
    with pytest.raises(FrameworkRowError, match=r"vercel-ai\.toml: runs the same agent .*twin"):
        load_frameworks(tmp_path)


def test_frameworks_registry_command_dir_defaults_to_the_row_then_its_family(
    tmp_path: Path,
) -> None:
    commands = tmp_path / "commands"
    (commands / "langgraph-js").mkdir(parents=True)
    body = GOOD.replace('agent = "langgraph"', 'agent_cmd = "node {dir}/a.mjs"\ninstall = "make x"')
    own = load_framework_row(
        _write(tmp_path, "langgraph-js", body.replace("{row}", "langgraph-js"))
    )
    variant = load_framework_row(
        _write(tmp_path, "langgraph-js-retry", body.replace("{row}", "langgraph-js-retry"))
    )
    assert own.command_dir(commands) == commands / "langgraph-js"
    assert variant.command_dir(commands) == commands / "langgraph-js"
    assert variant.command(commands) == f"node {(commands / 'langgraph-js').resolve()}/a.mjs"


def test_frameworks_registry_a_builtin_row_is_installed_by_its_agents_extra() -> None:
    rows = {r.row: r for r in load_frameworks()}
    assert rows["strands"].how_to_install() == "pip install 'twice[strands]'"
    assert rows["autogen"].how_to_install() == "pip install 'twice[frameworks]'"
    assert rows["langgraph"].how_to_install() == "pip install 'twice[agents]'"
