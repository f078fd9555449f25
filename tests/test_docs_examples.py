"""The README's and the site's examples are files that tests run, included, never copied.

Every fenced block of a code language on a page (Python, JSON, TOML, YAML) is a
``--8<-- "PATH"`` include (pymdownx.snippets) of a file in ``RUN_BY``: the test named there runs
or loads that file. Shell blocks are commands: each ``twice`` command line shown names a real
subcommand and real options (checked against the click commands). And no file of the
repository names a document it does not contain.
"""

from __future__ import annotations

import re
import runpy
import shlex
import subprocess
from pathlib import Path

import click
import pytest
import yaml
from twice.evals.cli import cli

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted(
    p for p in (ROOT / "docs" / "examples").rglob("*") if p.suffix in (".py", ".jsonl")
)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CODE_LANGUAGES = {"python", "py", "json", "jsonl", "toml", "yaml", "yml", "js", "javascript"}
SHELL_LANGUAGES = {"console", "bash", "sh", "shell"}
FENCE = re.compile(
    r"^(?P<fence>`{3,})(?P<lang>\S*)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.S | re.M
)
SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')

# Every file a page includes, and the test that runs or loads it (file, name).
RUN_BY: dict[str, tuple[str, str]] = {
    "docs/examples/gate/conftest.py": (
        "tests/evals/test_eval_in_pytest.py",
        "test_twice_eval_docs_example_gates_on_rates",
    ),
    "docs/examples/gate/test_gate.py": (
        "tests/evals/test_eval_in_pytest.py",
        "test_twice_eval_docs_example_gates_on_rates",
    ),
    "tasks/agents/frameworks/langgraph-retry.toml": (
        "tests/tasks/test_frameworks_registry.py",
        "test_frameworks_registry_shipped_rows_cover_every_builtin_agent_and_react",
    ),
    "docs/examples/http_agent.py": (
        "tests/evals/test_agent_cmd.py",
        "test_run_agent_cmd_scores_the_external_agents_ledger",
    ),
    "docs/examples/my_agent.py": (
        "tests/evals/test_agents_cli.py",
        "test_twice_run_runs_a_user_agent_file_with_its_production_url",
    ),
    "docs/examples/retrying_agent.mjs": (
        "tests/evals/test_agent_cmd.py",
        "test_a_node_agents_own_retry_loop_is_charged_to_the_framework_not_the_model",
    ),
    "tasks/agents/commands/vercel-ai/agent.mjs": (
        "tests/evals/test_command_agents.py",
        "test_a_command_agent_refunds_as_its_framework_decides",
    ),
    "docs/examples/openapi/adyen_overrides.yaml": (
        "tests/mocks/test_openapi_service.py",
        "test_openapi_adyen_refund_with_overrides_and_its_declared_key_header",
    ),
    "docs/examples/openapi/gate.toml": (
        "tests/evals/test_openapi_run.py",
        "test_twice_run_suite_of_an_openapi_task_summary_report_and_gate",
    ),
    "docs/examples/openapi/refund_agent.py": (
        "tests/evals/test_serve_openapi.py",
        "test_serve_openapi_docs_agent_refunds_once_through_a_lost_reply",
    ),
    "docs/examples/openapi/refund_task.py": (
        "tests/tasks/test_openapi_task.py",
        "test_openapi_task_from_python_docs_example_is_a_task_of_your_own",
    ),
    "docs/examples/openapi/stripe_overrides.yaml": (
        "tests/evals/test_serve_openapi.py",
        "test_serve_openapi_stripe_sdk_own_retries_refund_once",
    ),
    "docs/examples/openapi/stripe_refunds.jsonl": (
        "tests/tasks/test_openapi_task.py",
        "test_openapi_task_tells_the_stub_controls_apart_under_a_lost_reply",
    ),
    "docs/examples/openapi/suite.toml": (
        "tests/evals/test_openapi_run.py",
        "test_twice_run_suite_of_an_openapi_task_summary_report_and_gate",
    ),
    "docs/examples/own_assertion.py": (
        "tests/test_docs_examples.py",
        "test_own_assertion_example_prints_what_the_page_shows",
    ),
    "docs/examples/own_task/courtesy.py": (
        "tests/evals/test_own_task.py",
        "test_twice_run_runs_a_task_file_of_your_own_beside_a_builtin",
    ),
    "docs/examples/own_task/courtesy.jsonl": (
        "tests/evals/test_own_task.py",
        "test_twice_run_runs_a_task_file_of_your_own_beside_a_builtin",
    ),
    "docs/examples/own_task/courtesy_agent.py": (
        "tests/evals/test_own_task.py",
        "test_agent_cmd_runs_a_task_of_your_own",
    ),
    "docs/examples/own_task/invoices.py": (
        "tests/evals/test_own_task.py",
        "test_the_readme_service_makes_one_effect_per_request_and_honours_keys",
    ),
    "docs/examples/proxy/refund_script.py": (
        "tests/evals/test_serve_upstream.py",
        "test_the_proxy_guide_script_refunds_twice_then_once_with_sdk_retries",
    ),
    "docs/examples/proxy/trial.json": (
        "tests/evals/test_serve_upstream.py",
        "test_the_proxy_guide_script_refunds_twice_then_once_with_sdk_retries",
    ),
    "docs/examples/tool_code/conftest.py": (
        "tests/assertions/test_pytest_plugin.py",
        "test_plugin_docs_example_passes",
    ),
    "docs/examples/tool_code/payments_client.py": (
        "tests/assertions/test_pytest_plugin.py",
        "test_plugin_docs_example_passes",
    ),
    "docs/examples/tool_code/test_payments_client.py": (
        "tests/assertions/test_pytest_plugin.py",
        "test_plugin_docs_example_passes",
    ),
    "docs/snippets/assertions.jsonl": (
        "tests/docs/test_docs_data.py",
        "test_assertion_lines_parse_and_round_trip",
    ),
    "docs/snippets/gate.toml": (
        "tests/docs/test_docs_data.py",
        "test_every_gate_toml_shown_loads",
    ),
    "docs/snippets/github-actions-gate.yml": (
        "tests/test_docs_examples.py",
        "test_the_github_actions_gate_is_a_workflow_of_real_commands",
    ),
    "docs/snippets/refund-record.json": (
        "tests/docs/test_docs_data.py",
        "test_the_refund_record_shown_is_the_datasets_first",
    ),
    "docs/snippets/report_api.py": (
        "tests/docs/test_docs_data.py",
        "test_the_report_api_snippet_writes_a_report",
    ),
    "docs/snippets/stripe_retries.py": (
        "tests/docs/test_docs_data.py",
        "test_the_stripe_snippet_refunds_once_then_twice",
    ),
    "docs/snippets/summary.json": (
        "tests/docs/test_docs_data.py",
        "test_the_summary_shown_has_only_keys_a_run_writes",
    ),
    "evals/conversation.toml": (
        "tests/tasks/test_conversation_faults.py",
        "test_the_conversation_suite_file_runs_the_controls_on_every_builtin_task",
    ),
    "evals/default.toml": (
        "tests/docs/test_docs_data.py",
        "test_every_shipped_suite_loads",
    ),
    "evals/gate.toml": (
        "tests/docs/test_docs_data.py",
        "test_every_gate_toml_shown_loads",
    ),
}


def blocks() -> list[tuple[Path, int, str, str]]:
    """Every fenced block of README.md and the site: (page, line, language, body)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((page, line, m.group("lang"), m.group("body")))
    return found


def included() -> dict[str, list[str]]:
    """Every snippet include on a page: included path -> the pages that include it."""
    pages: dict[str, list[str]] = {}
    for page, line, _, body in blocks():
        for text in body.splitlines():
            m = SNIPPET.match(text.strip())
            if m:
                pages.setdefault(m.group("path"), []).append(f"{page.relative_to(ROOT)}:{line}")
    return pages


def test_every_code_block_is_an_include_of_a_file_a_test_runs() -> None:
    copies = []
    for page, line, lang, body in blocks():
        if lang not in CODE_LANGUAGES:
            continue
        lines = [text.strip() for text in body.splitlines() if text.strip()]
        if not lines or not all(SNIPPET.match(text) for text in lines):
            copies.append(f"{page.relative_to(ROOT)}:{line} ({lang})")
    assert not copies, (
        "these code blocks are written into the page; move each into a file a test runs and "
        f'include it with --8<-- "PATH" (listed in RUN_BY): {copies}'
    )
    for path, pages in included().items():
        assert (ROOT / path).is_file(), f"{pages} include {path}, which does not exist"
        assert path in RUN_BY, f"{pages} include {path}: name the test that runs it in RUN_BY"


def test_every_file_in_run_by_is_run_by_the_test_named() -> None:
    for path, (test_file, name) in RUN_BY.items():
        test = f"{test_file}::{name}"
        assert (ROOT / path).is_file(), path
        source = (ROOT / test_file).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{test} does not exist"
        # The test reads the file by its path, or by its name under docs/examples.
        assert Path(path).name in source or "EXAMPLES" in source or "examples" in source, (
            f"{test} does not name {path}"
        )


def test_every_example_is_on_a_page_once_anchored() -> None:
    assert EXAMPLES
    pages = included()
    for path in EXAMPLES:
        name = path.relative_to(ROOT).as_posix()
        assert name in pages, f"no page includes {name}"
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    for m in re.finditer(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", text, re.S):
        assert m.group(2) == f'--8<-- "{m.group(1)}"\n', f"example {m.group(1)} is not its file"


def test_the_old_headings_have_pages() -> None:
    # Other pages and issues link to these two guides by name.
    assert (
        (ROOT / "docs/guides/own-assertion.md")
        .read_text()
        .startswith("# Write your own assertion\n")
    )
    assert (
        (ROOT / "docs/guides/tool-code.md")
        .read_text()
        .startswith("# Test your own tool code in pytest\n")
    )


def test_own_assertion_example_prints_what_the_page_shows(
    readme_blocks: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    runpy.run_path(str(ROOT / "docs" / "examples" / "own_assertion.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "refunded total of order_1042: expected at most 499 cents, observed 998 cents" in printed
    assert printed == readme_blocks["output: docs/examples/own_assertion.py"]


# -- commands shown ----------------------------------------------------------------------------


def twice_commands(text: str) -> list[str]:
    """The ``twice ...`` command lines of a shell block (continuations joined, comments and
    output dropped)."""
    commands, current = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if current:
            current += " " + line.rstrip("\\").strip()
        elif re.match(r"^(\$ )?twice ", line):
            current = line.removeprefix("$ ").rstrip("\\").strip()
        else:
            continue
        if not line.endswith("\\"):
            commands.append(current)
            current = ""
    return commands


def check_command(command: str) -> None:
    """Raise AssertionError unless ``command`` names a real subcommand and real options."""
    words = shlex.split(command.split(" #")[0].split("&&")[0], comments=True)[1:]
    group: click.Command = cli
    while isinstance(group, click.Group) and words and not words[0].startswith("-"):
        sub = group.get_command(click.Context(group), words[0])
        assert sub is not None, f"{command!r}: no subcommand {words[0]!r}"
        group, words = sub, words[1:]
    known = {opt for p in group.params for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    for word in words:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            option = word.split("=")[0]
            assert option in known, f"{command!r}: {option} is not an option of it"


def test_every_twice_command_shown_names_real_subcommands_and_options() -> None:
    checked = 0
    for page, line, lang, body in blocks():
        if lang in SHELL_LANGUAGES or lang == "":
            for command in twice_commands(body):
                try:
                    check_command(command)
                except AssertionError as ex:
                    raise AssertionError(f"{page.relative_to(ROOT)}:{line}: {ex}") from None
                checked += 1
    assert checked > 30


def test_the_github_actions_gate_is_a_workflow_of_real_commands() -> None:
    workflow = yaml.safe_load((ROOT / "docs/snippets/github-actions-gate.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    runs = [step["run"] for step in steps if "run" in step]
    commands = [c for run in runs for c in twice_commands(run.replace("\n", " "))]
    assert len(commands) == 2, runs
    for command in commands:
        check_command(command)
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in steps)


def test_the_command_checker_catches_a_misspelt_option() -> None:
    with pytest.raises(AssertionError, match="--epoch is not an option"):
        check_command("twice run --epoch 3")
    with pytest.raises(AssertionError, match="no subcommand 'gates'"):
        check_command("twice gates logs")
    check_command("twice local-model install")


# -- no file names a document it does not contain ----------------------------------------------

TOP = ("docs", "tests", "mocks", "tasks", "assertions", "evals", "reports", "bench")
NAMED = re.compile(
    r"(?<![\w./-])(?:(?:" + "|".join(TOP) + r")/[\w./-]*?[\w-]+\.(?:md|py|toml|jsonl?|ya?ml|mjs)"
    r"|[\w-]+\.md)(?![\w/])"
)
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+?)(?:#[^)]*)?\)")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".txt", ".mjs", ".cfg", ""}


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    files = [ROOT / name for name in out.splitlines()]
    return [
        f
        for f in files
        if f.is_file() and f.suffix in TEXT_SUFFIXES and f.stat().st_size < 2_000_000
    ]


def missing_documents(path: Path, text: str, names: set[str]) -> list[str]:
    """The documents ``text`` (of the file ``path``) names or links to that the repository lacks.

    A Markdown link must resolve from the page's folder; a path under one of the repository's
    top folders must exist (from the root or the file's folder); a bare ``NAME.md`` must be
    some file's name. A prompt file of the user's own in a command (``--prompt mine.md``) is
    not a document of the repository.
    """
    missing = []
    if path.suffix == ".md":
        for m in LINK.finditer(text):
            if not (path.parent / m.group(1)).exists():
                missing.append(m.group(1))
    for m in NAMED.finditer(text):
        name = m.group(0)
        if "/" in name:
            if not ((ROOT / name).exists() or (path.parent / name).exists()):
                missing.append(name)
        elif name not in names and not text[: m.start()].endswith("--prompt "):
            missing.append(name)
    return missing


def documentation_text(path: Path) -> str:
    """What of a file speaks to a reader: all of it, except in tests, whose strings are data
    (the files a test writes): there only the comments."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".py" and path.relative_to(ROOT).parts[0] == "tests":
        return "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    return text


def test_no_file_names_a_document_it_does_not_contain() -> None:
    files = tracked_text_files()
    names = {f.name for f in files}
    problems = []
    for path in files:
        if path.suffix == "" and path.name != "Makefile":
            continue
        found = missing_documents(path, documentation_text(path), names)
        problems += [f"{path.relative_to(ROOT)}: {name}" for name in found]
    assert not problems, problems


def test_the_document_check_catches_a_missing_design_doc_and_a_moved_test() -> None:
    names = {"README.md"}
    assert missing_documents(ROOT / "README.md", "see HANDBOOK.md", names) == ["HANDBOOK.md"]
    moved = "asserted in `tests/test_reference_results.py`"
    assert missing_documents(ROOT / "README.md", moved, names) == [
        "tests/test_reference_results.py"
    ]
    assert missing_documents(ROOT / "README.md", "[x](docs/nowhere.md)", names) == [
        "docs/nowhere.md", "docs/nowhere.md"
    ]  # fmt: skip
    assert missing_documents(ROOT / "README.md", "twice run --prompt mine.md", names) == []
    assert missing_documents(ROOT / "README.md", "[x](docs/index.md) README.md", names) == []
