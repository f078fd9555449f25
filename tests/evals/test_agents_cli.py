"""``twice run --agent``: a user's agent file outside the package, crashes, and bad usage."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twice.evals import SuiteError, load_suite, suite_from_flags

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "my_agent.py"


def _cells(log_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    summary = json.loads((log_dir / "summary.json").read_text(encoding="utf-8"))
    return {(c["model"], c["fault"]): c for c in summary["cells"]}


def _run_agent(
    twice: Callable[..., Any],
    agent: Path,
    out: Path,
    fault: str,
    *extra: str,
    model: str = "stub/retry",
) -> Any:
    """``twice run`` of a user agent file on one refund trial (stub/retry unless told)."""
    return twice(
        "run", "--agent", f"{agent}:agent", "--task", "refund", "--fault", fault,
        "--model", model, "--limit", "1", "--log-dir", out, "--display", "none", *extra,
    )  # fmt: skip


def test_twice_run_runs_a_user_agent_file_with_its_production_url(
    twice: Callable[..., Any], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "their_project" / "agent.py"
    elsewhere.parent.mkdir()
    shutil.copy(EXAMPLE, elsewhere)
    spec = f"{elsewhere}:agent"
    out = tmp_path / "logs"
    result = twice(
        "run", "--agent", spec, "--mock", "payments=https://api.example.com",
        "--task", "refund", "--fault", "lost_reply", "--fault", "timeout_before_commit",
        "--model", "stub/retry", "--model", "stub/no-retry", "--model", "stub/verify",
        "--limit", "2", "--log-dir", out, "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cells = _cells(out)
    assert {c["agent"] for c in cells.values()} == {spec}
    assert {c["protection"] for c in cells.values()} == {"bare"}
    rates = {k: (c["duplication_rate"], c["completion_rate"]) for k, c in cells.items()}
    assert rates == {
        ("stub/retry", "lost_reply"): (1.0, 1.0),
        ("stub/retry", "timeout_before_commit"): (0.0, 1.0),
        ("stub/no-retry", "lost_reply"): (0.0, 1.0),
        ("stub/no-retry", "timeout_before_commit"): (0.0, 0.0),
        ("stub/verify", "lost_reply"): (0.0, 1.0),
        ("stub/verify", "timeout_before_commit"): (0.0, 1.0),
    }
    assert all(c["crashed_rate"] == 0.0 for c in cells.values())
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["agents"] == [spec]
    assert summary["run"]["mocks"] == {"payments": "https://api.example.com"}
    assert "agent.py:agent" in result.stdout  # the table's agent column
    assert f"stub/retry · {spec}" in (out / "report.html").read_text(encoding="utf-8")


def test_a_mock_of_a_service_the_task_lacks_is_a_usage_error_before_the_run(
    twice: Callable[..., Any], tmp_path: Path
) -> None:
    # It ran every trial, each ending in the same sample error, exit 1.
    agent = tmp_path / "agent.py"
    agent.write_text("async def agent(request, ctx):\n    return 'ok'\n", encoding="utf-8")
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none", "--mock", "nosvc=https://api.example.com")
    assert result.exit_code == 2, result.output
    assert "this task has no service 'nosvc'; its services are: payments" in result.output
    assert not out.exists()


@pytest.mark.parametrize("returned", ["42", "None"])
def test_an_agent_returning_no_answer_crashed_saying_so(
    twice: Callable[..., Any], tmp_path: Path, returned: str
) -> None:
    # str() made any value an answer: exit 0, not crashed, the final answer "42" or "None".
    agent = tmp_path / "wrong.py"
    agent.write_text(f"async def agent(request, ctx):\n    return {returned}\n", encoding="utf-8")
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none")
    assert result.exit_code == 0, result.output
    (cell,) = _cells(out).values()
    assert cell["crashed_rate"] == 1.0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "not its final answer (a str)" in html


def test_an_agent_file_imports_its_neighbours_and_builds_its_client_at_import(
    twice: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing paths: `import helper` beside the agent file was ModuleNotFoundError, and a
    # client built at import (no key in the environment) failed with "Missing credentials":
    # the placeholder key was set only once a trial ran.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the run puts the agent's folder on it
    project = tmp_path / "their_agent"
    project.mkdir()
    (project / "agent_helper_words.py").write_text('ANSWER = "done"\n', encoding="utf-8")
    agent = project / "agent.py"
    agent.write_text(
        "from openai import AsyncOpenAI\n"
        "from agent_helper_words import ANSWER\n\n"
        "client = AsyncOpenAI()\n\n\n"
        "async def agent(request, ctx):\n"
        "    return ANSWER\n",
        encoding="utf-8",
    )
    monkeypatch.delitem(sys.modules, "agent_helper_words", raising=False)
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none")
    assert result.exit_code == 0, result.output
    (cell,) = _cells(out).values()
    assert cell["crashed_rate"] == 0.0


def test_an_agents_own_retrying_transport_runs_and_its_retry_is_counted(
    twice: Callable[..., Any], tmp_path: Path, retrying_transports: str
) -> None:
    # The failing path: respx swapped the agent's client transport for its mock, so the
    # retry inside it never ran: stub/no-retry under lost_reply showed 0% duplicated where
    # the same agent in production makes two refunds.
    agent = tmp_path / "agent.py"
    source = EXAMPLE.read_text(encoding="utf-8").replace(
        "httpx.AsyncClient(timeout=10)",
        "httpx.AsyncClient(timeout=10, transport=AsyncRetrying(httpx.AsyncHTTPTransport()))",
    )
    agent.write_text(source + retrying_transports, encoding="utf-8")
    out = tmp_path / "logs"
    mock = ("--mock", "payments=https://api.example.com")
    result = _run_agent(twice, agent, out, "lost_reply", *mock, model="stub/no-retry")
    assert result.exit_code == 0, result.output
    (cell,) = _cells(out).values()
    assert (cell["duplication_rate"], cell["crashed_rate"]) == (1.0, 0.0)


def test_an_agent_file_named_like_an_installed_package_does_not_hide_it(
    twice: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: the file's folder went first on sys.path, so `from agents import
    # Agent` in a file named agents.py imported the file itself (and, for the rest of the
    # process, the built-in openai-agents agent did too).
    monkeypatch.setattr(sys, "path", list(sys.path))
    agent = tmp_path / "mine" / "agents.py"
    agent.parent.mkdir()
    agent.write_text(
        "from agents import Agent\n\n\nasync def agent(request, ctx):\n"
        "    return Agent.__module__\n",
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none")
    assert result.exit_code == 0, result.output
    (cell,) = _cells(out).values()
    assert cell["crashed_rate"] == 0.0


HUNG = "timed out after 1 s (--agent-timeout)"
BLOCKED = "ran past 1 s (--agent-timeout) while blocking the event loop"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # --agent-timeout was refused for --agent ("there is none to bound"), and a hung
        # in-process agent held its trial until the run was killed.
        ("await asyncio.sleep(3600)", HUNG),
        # It swallows the cancellation and answers: still past its time, still crashed.
        ("try:\n        await asyncio.sleep(3600)\n    except asyncio.CancelledError:\n"
         "        return 'I give up'", HUNG),
        # Blocking the event loop past the deadline, the agent was never cancelled (the timer
        # could not fire) and counted as a clean trial, crashed 0%, even when it awaited
        # after its deadline before answering.
        ("time.sleep(2)", BLOCKED),
        ("time.sleep(2)\n    await asyncio.sleep(0)", BLOCKED),
    ],
)  # fmt: skip
def test_an_agent_still_running_at_agent_timeout_crashed_saying_so(
    twice: Callable[..., Any], tmp_path: Path, body: str, expected: str
) -> None:
    agent = tmp_path / "late.py"
    agent.write_text(
        "import asyncio\nimport time\n\n\nasync def agent(request, ctx):\n"
        f"    {body}\n    return 'late'\n",
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none", "--agent-timeout", "1")
    assert result.exit_code == 0, result.output
    (cell,) = _cells(out).values()
    assert cell["crashed_rate"] == 1.0 and cell["errors"] == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert expected in html


def test_twice_run_scores_a_crashing_agent_and_reports_it(
    twice: Callable[..., Any], tmp_path: Path
) -> None:
    agent = tmp_path / "crashy.py"
    agent.write_text(
        "import httpx\n\n\n"
        "async def agent(request, ctx):\n"
        "    async with httpx.AsyncClient() as http:\n"
        "        await http.post(ctx.urls['payments'] + '/v1/refunds',\n"
        "                        json={'order_id': 'order_1042', 'amount': 499})\n"
        "    return 'done'\n",
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "lost_reply")
    assert result.exit_code == 0, result.output  # a crashed agent is a result, not an error
    (cell,) = _cells(out).values()
    assert cell["crashed_rate"] == 1.0 and cell["errors"] == 0
    assert cell["completion_rate"] == 1.0  # the refund was made before the agent crashed
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Agents that crashed" in html and "ReadTimeout" in html
    # completed and not duplicated: only a rule on crashed_rate keeps this release back
    gate = tmp_path / "gate.toml"
    gate.write_text(
        '[[rule]]\nname = "no dup"\nmetric = "duplication_rate"\nmax = 0.0\n'
        'statistic = "point"\n\n'
        '[[rule]]\nname = "no crash"\nmetric = "crashed_rate"\nmax = 0.0\n'
        'statistic = "point"\n',
        encoding="utf-8",
    )
    result = twice("gate", out, "--config", gate)
    assert result.exit_code == 1, result.output
    assert "gate FAILED: 1 passed, 1 failed" in result.stdout
    assert "point of crashed_rate = 100.0% > max 0.0%" in result.stdout


def test_an_agent_crash_that_quotes_a_credential_is_logged_scrubbed(
    twice: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logged_text: Callable[[Path], str],
) -> None:
    # The report showed "[redacted]", but the log kept the agent's error text as raised (in
    # the trial's store and in an info event), and CI uploads log directories.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    agent = tmp_path / "leaky.py"
    agent.write_text(
        "import os\n\n\n"
        "async def agent(request, ctx):\n"
        "    raise RuntimeError('auth failed for ' + os.environ['MY_SERVICE_TOKEN'])\n",
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none")
    assert result.exit_code == 0, result.output
    logged = logged_text(out)
    assert "auth failed for [redacted]" in logged
    assert "tok-SECRET789" not in logged
    assert "tok-SECRET789" not in (out / "report.html").read_text(encoding="utf-8")


def test_an_agent_that_puts_a_credential_in_its_prompt_and_answer_is_logged_scrubbed(
    twice: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logged_text: Callable[[Path], str],
    find_secret: Callable[[Path, str], list[str]],
) -> None:
    # Only a crash's text was scrubbed: an agent that sent a key to the model in its prompt
    # and returned it in its answer put it in the sample's messages, output and score, the
    # model events and their attachments, the sample summaries and logs.json.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    agent = tmp_path / "leaky.py"
    agent.write_text(
        "import os\n"
        "from openai import AsyncOpenAI\n\n"
        "TOOL = {'type': 'function', 'function': {'name': 'issue_refund',\n"
        "        'description': 'refund',\n"
        "        'parameters': {'type': 'object', 'properties': {}}}}\n\n\n"
        "async def agent(request, ctx):\n"
        "    token = os.environ['MY_SERVICE_TOKEN']\n"
        "    system = ctx.instructions + ' Your token is ' + token\n"
        "    await AsyncOpenAI().chat.completions.create(model=ctx.model, tools=[TOOL],\n"
        "        messages=[{'role': 'system', 'content': system},\n"
        "                  {'role': 'user', 'content': request}])\n"
        "    return 'done with ' + token\n",
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    result = _run_agent(twice, agent, out, "none")
    assert result.exit_code == 0, result.output
    logged = logged_text(out)
    assert "Your token is [redacted]" in logged and "done with [redacted]" in logged
    assert find_secret(out, "tok-SECRET789") == []  # every .eval member, every file


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "langchain"], "unknown agent 'langchain'; expected 'react'"),
        (["--agent", "missing.py:agent"], "agent file 'missing.py' (from 'missing.py:agent')"),
        (
            ["--agent", "langgraph", "--protection", "lookup"],
            "protection 'lookup' is twice's own tool layer",
        ),
        (
            ["--agent", "openai-agents", "--task", "place_order"],
            "has no tools for task 'place_order'",
        ),
        (
            ["--agent", "pydantic-ai", "--fault", "crash_after_commit"],
            "fault 'crash_after_commit' restarts the run",
        ),
        (["--mock", "payments"], "'payments' is not SERVICE=URL"),
        (["--mock", "payments=https://a.example"], "--mock applies to an agent under test"),
    ],
)
def test_twice_run_agent_bad_usage_exits_2(
    twice: Callable[..., Any], args: list[str], message: str
) -> None:
    result = twice("run", "--model", "stub/retry", *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_suite_file_agents_axis(tmp_path: Path) -> None:
    suite_file = tmp_path / "suite.toml"
    suite_file.write_text(
        '[[matrix]]\nmodels = ["stub/retry"]\nagents = ["react", "langgraph"]\n'
        'tasks = ["refund"]\nfaults = ["lost_reply"]\n',
        encoding="utf-8",
    )
    suite = load_suite(suite_file)
    suite.validate()
    assert [c.agent for c in suite.cells()] == ["react", "langgraph"]
    assert suite.agents() == ["react", "langgraph"]
    with pytest.raises(SuiteError, match="protection 'lookup'"):
        suite.override(protections=["bare", "lookup"]).validate()


def test_flags_with_a_framework_agent_default_to_its_tasks() -> None:
    suite = suite_from_flags(
        config=None, models=(), prompts=(), tasks=(), faults=(), protections=(),
        epochs=None, limit=None, agents=("langgraph",),
    )  # fmt: skip
    assert {c.task for c in suite.cells()} == {"refund", "send_email", "create_ticket"}


RENAMED_TOOLS = (
    "[{'type': 'function', 'function': {'name': 'create_refund', 'description': 'refund',"
    " 'parameters': {'type': 'object', 'properties': {'order_id': {'type': 'string'}}}}}]"
)


@pytest.mark.parametrize("how", ["--agent", "--agent-cmd"])
def test_an_agent_whose_tools_the_stub_cannot_call_is_an_error_not_a_crash(
    twice: Callable[..., Any], tmp_path: Path, how: str
) -> None:
    # The failing path: every stub called issue_refund, which the agent did not offer: each
    # control "crashed" alike with 0% duplicated, and twice run exited 0.
    if how == "--agent":
        agent = tmp_path / "renamed.py"
        agent.write_text(
            "from openai import AsyncOpenAI\n\n\nasync def agent(request, ctx):\n"
            "    r = await AsyncOpenAI().chat.completions.create(model=ctx.model, "
            f"messages=[{{'role': 'user', 'content': request}}], tools={RENAMED_TOOLS})\n"
            "    return r.choices[0].message.content or ''\n",
            encoding="utf-8",
        )
        spec = f"{agent}:agent"
    else:
        agent = tmp_path / "renamed_cmd.py"
        agent.write_text(
            "import json, os, urllib.request\n"
            "body = {'model': 'inspect', 'tools': " + RENAMED_TOOLS + ",\n"
            "        'messages': [{'role': 'user', 'content': os.environ['TWICE_INPUT']}]}\n"
            "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',"
            " json.dumps(body).encode(), {'Content-Type': 'application/json', "
            "'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
            "urllib.request.urlopen(request, timeout=60)\n",
            encoding="utf-8",
        )
        spec = f"{sys.executable} {agent}"
    out = tmp_path / "logs"
    result = twice(
        "run", how, spec, "--task", "refund", "--fault", "lost_reply", "--model", "stub/retry",
        "--limit", "1", "--log-dir", out, "--display", "none", "--no-report",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    (cell,) = _cells(out).values()
    assert cell["errors"] == 1
    assert "next call is issue_refund, but the agent offered create_refund" in result.stderr
