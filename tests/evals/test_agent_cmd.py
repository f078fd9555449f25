"""``twice run --agent-cmd``: an agent outside twice, over real HTTP, scored like any trial."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from twice.evals.cli import cli
from twice.evals.serve import _eval as _serve_eval
from twice.evals.serve._eval import server_url
from twice.evals.suite import SuiteError, command_agent_name, load_suite, suite_from_flags
from twice.reports import trials_frame
from twice.tasks import secret_values

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "docs" / "examples" / "http_agent.py"


def _no_retry_run(out: Path, script: Path, limit: int) -> Result:
    """``twice run --agent-cmd "python SCRIPT"``: the refund task, stub/no-retry, no fault."""
    return CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "none", "--limit",
         str(limit), "--no-report", "--display", "none", "--log-dir", str(out),
         "--agent-cmd", f"{sys.executable} {script}"],
    )  # fmt: skip


@pytest.mark.slow
def test_run_agent_cmd_scores_the_external_agents_ledger(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--task",
            "refund",
            "--model",
            "stub/retry",
            "--model",
            "stub/no-retry",
            "--model",  # offered no lookup tool, it gives up: it called find_refunds, and crashed
            "stub/verify",
            "--fault",
            "lost_reply",
            "--limit",
            "1",
            "--no-report",
            "--display",
            "none",
            "--log-dir",
            str(out),
            "--agent-cmd",
            f"{sys.executable} {AGENT}",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    dup = {c["model"]: c["duplication_rate"] for c in summary["cells"]}
    # The stub's retry reaches the agent's own tool code: the retry refunds again.
    assert dup == {"stub/retry": 1.0, "stub/no-retry": 0.0, "stub/verify": 0.0}
    assert all(c["errors"] == 0 and c["completion_rate"] == 1.0 for c in summary["cells"])
    assert all(c["crashed_rate"] == 0.0 for c in summary["cells"])  # it exited 0
    assert summary["run"]["agent_cmd"].endswith("http_agent.py")


@pytest.mark.slow
def test_trials_side_by_side_each_reach_their_own_model(tmp_path: Path) -> None:
    # One model endpoint answers every trial of the process, each by its own key.
    out = tmp_path / "logs"
    result = _no_retry_run(out, AGENT, limit=2)
    assert result.exit_code == 0, result.output
    (cell,) = json.loads((out / "summary.json").read_text())["cells"]
    assert cell["trials"] == 2 and cell["errors"] == 0 and cell["completion_rate"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("pause", [0.0, 1.5], ids=["exits-at-once", "runs-on-after-printing"])
def test_a_failed_agent_command_crashed_and_what_it_printed_is_logged_scrubbed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logged_text: Callable[[Path], str],
    pause: float,
) -> None:
    # The command's output tails (twice's info event) and inspect's sandbox events kept a
    # credential the command printed. inspect polls a running command and records each poll
    # as a sandbox event: output printed before the command's last poll (the pause) lands in
    # an earlier event than the last, which was once the only one scrubbed.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    script = tmp_path / "prints.py"
    script.write_text(
        "import os, sys, time\n"
        "print('token is', os.environ['MY_SERVICE_TOKEN'], flush=True)\n"
        "print('and again', os.environ['MY_SERVICE_TOKEN'], file=sys.stderr, flush=True)\n"
        f"time.sleep({pause})\n"
        "sys.exit(3)\n"
    )
    out = tmp_path / "logs"
    result = _no_retry_run(out, script, limit=1)
    assert result.exit_code == 0, result.output
    logged = logged_text(out)
    assert "token is [redacted]" in logged and "and again [redacted]" in logged
    assert "tok-SECRET789" not in logged
    # A command that fails is an agent that crashed, not a clean run.
    (cell,) = json.loads((out / "summary.json").read_text())["cells"]
    assert cell["crashed_rate"] == 1.0 and cell["errors"] == 0
    assert "exit 3: and again [redacted]" in logged


@pytest.mark.slow
def test_what_an_agent_command_sends_the_model_is_logged_scrubbed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logged_text: Callable[[Path], str],
    find_secret: Callable[[Path, str], list[str]],
) -> None:
    # Only the command's output and the sandbox events were scrubbed: a key the command put
    # in its prompt was in the sample's messages, the model events and their attachments.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    script = tmp_path / "prompts.py"
    script.write_text(
        "import json, os, urllib.request\n"
        "tool = {'type': 'function', 'function': {'name': 'issue_refund',\n"
        "        'description': 'refund', 'parameters': {'type': 'object', 'properties': {}}}}\n"
        "body = {'model': 'inspect', 'tools': [tool], 'messages': [\n"
        "    {'role': 'system', 'content': 'Your token is ' + os.environ['MY_SERVICE_TOKEN']},\n"
        "    {'role': 'user', 'content': os.environ['TWICE_INPUT']}]}\n"
        "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',\n"
        "    json.dumps(body).encode(), {'Content-Type': 'application/json'})\n"
        "urllib.request.urlopen(request, timeout=60).read()\n"
    )
    out = tmp_path / "logs"
    result = _no_retry_run(out, script, limit=1)
    assert result.exit_code == 0, result.output
    assert "Your token is [redacted]" in logged_text(out)
    assert find_secret(out, "tok-SECRET789") == []


@pytest.mark.slow
def test_what_an_agent_command_sent_before_a_limit_ended_it_is_logged_scrubbed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    find_secret: Callable[[Path, str], list[str]],
) -> None:
    # Scrubbing ran only when the command returned: a message limit ending the sample from
    # inside the bridge left the first call's prompt, key included, in the log.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    script = tmp_path / "loops.py"
    script.write_text(
        "import json, os, urllib.request\n"
        "tool = {'type': 'function', 'function': {'name': 'issue_refund',\n"
        "        'description': 'refund', 'parameters': {'type': 'object', 'properties': {}}}}\n"
        "for n in (1, 40):  # the second call is past the task's message limit (30)\n"
        "    messages = [{'role': 'user', 'content': 'token ' + os.environ['MY_SERVICE_TOKEN']}]\n"
        "    body = {'model': 'inspect', 'tools': [tool], 'messages': messages * n}\n"
        "    url = os.environ['OPENAI_BASE_URL'] + '/chat/completions'\n"
        "    request = urllib.request.Request(\n"
        "        url, json.dumps(body).encode(), {'Content-Type': 'application/json'})\n"
        "    try:\n"
        "        urllib.request.urlopen(request, timeout=60).read()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    out = tmp_path / "logs"
    result = _no_retry_run(out, script, limit=1)
    assert result.exit_code == 0, result.output
    from inspect_ai.log import read_eval_log

    (log,) = [read_eval_log(str(p)) for p in out.glob("*.eval")]
    assert log.samples and log.samples[0].limit is not None  # the limit ended it
    assert "[redacted]" in log.model_dump_json()
    assert find_secret(out, "tok-SECRET789") == []


def _run_keyed(tmp_path: Path, written: str, logged_text: Callable[[Path], str]) -> str:
    """Run an agent that prints its arguments, ``written`` on its command line; check that
    ``SECRET`` appears nowhere twice wrote, and return the logs' text."""
    script = tmp_path / "agent.py"
    script.write_text("import sys\nprint(sys.argv[1:], flush=True)\nsys.exit(0)\n")
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "none", "--limit",
         "1", "--display", "none", "--log-dir", str(out),
         "--agent-cmd", f"{sys.executable} {script} {written}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "SECRET" not in result.output
    logged = logged_text(out)
    assert "[redacted]" in logged and "SECRET" not in logged
    for path in out.rglob("*"):
        if path.is_file() and path.suffix != ".eval":
            assert b"SECRET" not in path.read_bytes(), path.name
    return logged


def test_a_key_written_on_the_agent_command_is_in_no_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged_text: Callable[[Path], str]
) -> None:
    # The failing path: the cell label, summary and report said "[redacted]", but inspect
    # logged the solver's arguments as given: every .eval's plan and logs.json held the key.
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    logged = _run_keyed(tmp_path, "--flag tok-SECRET789-never-logged", logged_text)
    assert "--flag [redacted]" in logged


@pytest.mark.parametrize(
    "written",
    ["--token cmdline-SECRET-4567", "--api-key=cmdline-SECRET-4567",
     "-H 'Authorization: Bearer cmdline-SECRET-4567'", "MY_API_KEY=cmdline-SECRET-4567"],
)  # fmt: skip
def test_a_key_only_on_the_agent_command_line_is_in_no_log(
    tmp_path: Path, logged_text: Callable[[Path], str], written: str
) -> None:
    # The failing path: only the environment's keys were scrubbed, so a key written on the
    # command line and nowhere else was logged as given: in the agent axis (summary.json,
    # the report), the logged plan, and what the agent printed of its own arguments.
    _run_keyed(tmp_path, written, logged_text)


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("OPENAI_API_KEY=sk-abcdefgh123 python a.py", ["sk-abcdefgh123"]),
        ("node a.js --token=tok_12345678 --verbose", ["tok_12345678"]),
        ("curl -H 'Authorization: Basic dXNlcjpwYXNz' https://u:pass12345678@h/x",
         ["dXNlcjpwYXNz", "pass12345678"]),
        ("python agent.py --model gpt-5 --max-tokens 4096 --timeout 30", []),
        ("python agent.py 'unclosed --secret s3cr3t-value", ["s3cr3t-value"]),
        # What a review found taken for keys (and then replaced everywhere as "[redacted]")...
        ("python agent.py --key-strategy intent-key --sort-key timestamp1", []),
        ("python a.py --idempotency-key-header Idempotency-Key --no-auth --model-name abcdefgh",
         []),
        ("python a.py --api-key-env OPENAI_API_KEY --token $MY_TOKEN_VALUE", []),
        # ... and missed.
        ("export OPENAI_API_KEY=sk-live-abcdef123456; python a.py", ["sk-live-abcdef123456"]),
        ("python a.py --api-key=sk-live-abcdef123456;", ["sk-live-abcdef123456"]),
        ("bash -c 'cd a && python run.py --api-key sk-live-abcdef123456'",
         ["sk-live-abcdef123456"]),
        ("curl -H 'x-api-key: sk-ant-abcdef123' -H 'api-key: azkey12345678'",
         ["sk-ant-abcdef123", "azkey12345678"]),
        # The whole script was taken for the key's value too: redacted, two agents' commands
        # became the same agent label.
        ("bash -c 'OPENAI_API_KEY=sk-abcdefgh123 node agent_a.js'", ["sk-abcdefgh123"]),
        ("sh -lc 'export MY_TOKEN=tok-abcdefgh123; node a.js'", ["tok-abcdefgh123"]),
    ],
)  # fmt: skip
def test_command_secrets_finds_what_a_command_line_carries(command: str, found: list[str]) -> None:
    from twice.tasks._redact import command_secrets

    assert command_secrets(command) == found


def test_two_scripts_with_a_key_are_two_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twice.tasks._redact._REMEMBERED", set())
    names = {
        command_agent_name(f"bash -c 'OPENAI_API_KEY=sk-abcdefgh123 node {agent}.js'")
        for agent in ("agent_a", "agent_b")
    }
    assert names == {
        "cmd:bash -c 'OPENAI_API_KEY=[redacted] node agent_a.js'",
        "cmd:bash -c 'OPENAI_API_KEY=[redacted] node agent_b.js'",
    }


def test_an_agent_cmd_run_resumes_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: the solver's logged arguments (the cell's identity to eval_set) held
    # the working directory, so the same command rerun from elsewhere ran every trial again.
    script = tmp_path / "agent.py"
    script.write_text("import sys\nsys.exit(0)\n")
    out = tmp_path / "logs"
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        result = _no_retry_run(out, script, limit=1)
        assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.eval"))) == 1
    assert "1 of 1 cell(s) were already finished and reused" in result.output


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX's")
@pytest.mark.parametrize(
    ("ending", "crashed"),
    [
        # Runs out of --agent-timeout: stopped, with the child the shell waits for. Killing
        # only the shell would leave the trial waiting for the child (which holds its output
        # pipes), to end as a sample error with an empty message.
        ("wait", True),
        # Exits, leaving a background job behind, which held the pipes: the trial waited
        # for the job.
        ("exit 0", False),
    ],
)
def test_an_agent_command_and_every_process_it_started_end_with_its_trial(
    tmp_path: Path, logged_text: Callable[[Path], str], ending: str, crashed: bool
) -> None:
    pid_file = tmp_path / "child.pid"
    out = tmp_path / "logs"
    command = f"sleep 3600 & echo $! > {pid_file}; {ending}"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "twice.evals.cli", "run", "--task", "refund", "--model",
             "stub/no-retry", "--fault", "none", "--limit", "1", "--no-report", "--display",
             "none", "--log-dir", str(out), "--agent-cmd", command, "--agent-timeout", "3"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert not _alive(int(pid_file.read_text()))
    finally:
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    (cell,) = json.loads((out / "summary.json").read_text())["cells"]
    assert cell["errors"] == 0 and cell["crashed_rate"] == (1.0 if crashed else 0.0)
    if crashed:
        assert "timed out after 3 s (--agent-timeout)" in logged_text(out)


def test_agent_timeout_needs_an_agent_under_test_and_a_positive_number(tmp_path: Path) -> None:
    run = ["run", "--task", "refund", "--model", "stub/retry", "--log-dir", str(tmp_path / "l")]
    bad = CliRunner().invoke(cli, [*run, "--agent-timeout", "5"])
    assert bad.exit_code == 2 and "agent_timeout bounds an agent under test" in bad.output
    bad = CliRunner().invoke(cli, [*run, "--agent-cmd", "true", "--agent-timeout", "0"])
    assert bad.exit_code == 2 and "--agent-timeout" in bad.output
    toml = tmp_path / "suite.toml"
    toml.write_text(
        'agent_cmd = "true"\nagent_timeout = "soon"\n[[matrix]]\nmodels = ["stub/retry"]\n'
    )
    with pytest.raises(SuiteError, match="agent_timeout must be a positive number of seconds"):
        load_suite(toml).validate()


def test_hang_seconds_bounds_an_agent_cmd_runs_held_replies_and_nothing_else(
    tmp_path: Path,
) -> None:
    toml = tmp_path / "suite.toml"
    toml.write_text('agent_cmd = "true"\nhang_seconds = 5\n[[matrix]]\nmodels = ["stub/retry"]\n')
    assert load_suite(toml).hang_seconds == 5
    flags = ["run", "--model", "stub/retry", "--task", "refund", "--display", "none"]
    for extra, said in [
        (["--hang-seconds", "5"], "hang_seconds bounds how long an --agent-cmd agent's trials"),
        (["--hang-seconds", "0", "--agent-cmd", "true"], "hang_seconds 0.0 must be a number in"),
        (["--hang-seconds", "nan", "--agent-cmd", "true"], "hang_seconds NaN must be a number"),
    ]:
        result = CliRunner().invoke(cli, flags + extra)
        assert result.exit_code == 2, result.output
        assert said in result.output


def test_agent_cmd_in_toml_and_its_bad_values(tmp_path: Path) -> None:
    good = tmp_path / "suite.toml"
    good.write_text('agent_cmd = "node my_agent.js"\n[[matrix]]\nmodels = ["stub/retry"]\n')
    assert load_suite(good).agent_cmd == "node my_agent.js"
    bad = tmp_path / "bad.toml"
    bad.write_text('agent_cmd = ["node"]\n[[matrix]]\nmodels = ["stub/retry"]\n')
    with pytest.raises(SuiteError, match="'agent_cmd' must be a string"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="agent_cmd is empty"):
        suite_from_flags(
            config=None,
            models=["stub/retry"],
            prompts=[],
            tasks=[],
            faults=[],
            protections=[],
            epochs=None,
            limit=None,
            agent_cmd="  ",
        )


@pytest.mark.slow
def test_an_agent_cmd_run_resumes_and_its_cells_are_its_own(tmp_path: Path) -> None:
    # Its cells are its own, not twice's own loop's (`react`), and a rerun runs no trial again:
    # the run's server, on a new port each run, must not be an argument of any task.
    out = tmp_path / "logs"
    command = f"{sys.executable} {AGENT}"
    args = ["run", "--task", "refund", "--model", "stub/retry", "--fault", "lost_reply",
            "--fault", "none", "--limit", "1", "--no-report", "--display", "none",
            "--log-dir", str(out), "--agent-cmd", command]  # fmt: skip
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    logs = sorted(out.glob("*.eval"))
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert "2 of 2 cell(s) were already finished and reused" in again.output
    assert sorted(out.glob("*.eval")) == logs  # nothing ran again
    summary = json.loads((out / "summary.json").read_text())
    assert {c["agent"] for c in summary["cells"]} == {f"cmd:{command}"}
    assert summary["run"]["agents"] == [f"cmd:{command}"]
    assert {c["fault"]: c["duplication_rate"] for c in summary["cells"]} == {
        "lost_reply": 1.0,
        "none": 0.0,
    }
    # Twice's own loop in the same directory is another agent: its cells run, and the
    # command's logs are not taken for them.
    react = CliRunner().invoke(cli, args[:-2])
    assert react.exit_code == 0, react.output
    assert "were already finished and reused" not in react.output
    cells = json.loads((out / "summary.json").read_text())["cells"]
    assert {c["agent"] for c in cells} == {"react"}


def test_agent_cmd_names_its_agent_and_refuses_other_agents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    assert command_agent_name(" node a.js ") == "cmd:node a.js"
    named = command_agent_name("MY_SERVICE_TOKEN=tok-SECRET789-never-logged node a.js")
    assert "tok-SECRET789" not in named and named.startswith("cmd:MY_SERVICE_TOKEN=")
    flags = dict(config=None, models=["stub/retry"], prompts=[], tasks=["refund"], faults=[],
                 protections=[], epochs=None, limit=None, agent_cmd="node a.js")  # fmt: skip
    suite = suite_from_flags(**flags)  # type: ignore[arg-type]
    assert {c.agent for c in suite.cells()} == {"cmd:node a.js"}
    with pytest.raises(SuiteError, match="does not combine with --agent 'openai-agents'"):
        suite_from_flags(**flags, agents=["openai-agents"])  # type: ignore[arg-type]
    with pytest.raises(SuiteError, match="--mock applies to an in-process agent"):
        suite_from_flags(**flags, mocks={"payments": "https://api.stripe.com"})  # type: ignore[arg-type]


def test_a_served_server_named_by_variable_is_read_when_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert server_url("http://127.0.0.1:8765") == "http://127.0.0.1:8765"
    monkeypatch.setenv("MY_TWICE", "http://127.0.0.1:9999")
    assert server_url("$MY_TWICE") == "http://127.0.0.1:9999"
    monkeypatch.delenv("MY_TWICE")
    with pytest.raises(RuntimeError, match="MY_TWICE is not set"):
        server_url("$MY_TWICE")


@pytest.mark.slow
def test_a_command_that_cannot_run_errors_its_trials_and_the_terminal_says_why(
    tmp_path: Path,
) -> None:
    # The terminal said only "1 trial(s) crashed in <cell>": why was in the log alone.
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "none", "--limit",
         "1", "--no-report", "--display", "none", "--log-dir", str(tmp_path / "logs"),
         "--agent-cmd", "no_such_binary_xyz"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "error: 1 trial(s) errored in stub/no-retry / cmd:no_such_binary_xyz" in result.output
    assert (
        "; the first: RuntimeError(\"agent command 'no_such_binary_xyz' could not run (exit 127)"
        in result.output
    )


def _info_events(log_dir: Path) -> dict[str | None, Any]:
    """The one trial's info events' data, by source."""
    from inspect_ai.event import InfoEvent
    from inspect_ai.log import read_eval_log

    (path,) = log_dir.glob("*.eval")
    (sample,) = read_eval_log(str(path), resolve_attachments=True).samples or []
    return {e.source: e.data for e in sample.events if isinstance(e, InfoEvent)}


def _agent_output_event(log_dir: Path) -> dict[str, Any]:
    """The one trial's info event of how its agent command ended and what it printed."""
    data = _info_events(log_dir)[_serve_eval.AGENT_OUTPUT_SOURCE]
    assert isinstance(data, dict)
    return data


@pytest.mark.slow
def test_an_agent_commands_stderr_is_kept_with_its_trial_scrubbed_and_shown_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An agent's stderr is its own account of why it did what it did. Only its last 2000
    # characters were logged, and the report never showed it.
    monkeypatch.setenv("MY_AGENT_TOKEN", "tok-AGENT-SECRET-4242-never-logged")
    writes = tmp_path / "writes.py"
    writes.write_text(
        "import os, sys\n"
        "for n in range(2000):\n"
        "    print(f'filler {n:04d} ' + '.' * 90, file=sys.stderr)\n"  # 200,000 bytes
        "print('agent: the refund timed out, so I retried it', file=sys.stderr)\n"
        "print('agent: token', os.environ['MY_AGENT_TOKEN'], file=sys.stderr)\n"
        "print(\"<script>window.__pwned = 'stderr'</script>\", file=sys.stderr)\n"
    )
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/retry", "--fault", "lost_reply",
         "--limit", "1", "--display", "none", "--log-dir", str(out),
         "--agent-cmd", f"{sys.executable} {AGENT} && {sys.executable} {writes}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    logged = _agent_output_event(out)
    stderr = logged["stderr"]
    assert stderr.endswith(
        "agent: the refund timed out, so I retried it\n"
        "agent: token [redacted]\n"
        "<script>window.__pwned = 'stderr'</script>\n"
    )
    assert "tok-AGENT-SECRET" not in json.dumps(logged)
    assert logged["stderr_truncated"] is True
    assert logged["stderr_bytes"] > 200_000 and logged["tail_bytes"] == 64 * 1024
    assert 60 * 1024 < len(stderr.encode()) <= 64 * 1024
    assert "filler 0000" not in stderr and "filler 1999" in stderr
    # inspect view renders a text info event as Markdown: the stream, as a code block.
    assert _info_events(out)["twice:agent_cmd stderr (last 64 KiB)"] == f"```text\n{stderr}\n```"
    # The trial duplicated, so the report drills into it and shows the stderr, as text.
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "What the agent command wrote to stderr" in page
    assert "(last 64 KiB)" in page
    assert "agent: the refund timed out, so I retried it\nagent: token [redacted]\n" in page
    assert "&lt;script&gt;window.__pwned = &#39;stderr&#39;&lt;/script&gt;" in page
    assert "<script" not in page and "tok-AGENT-SECRET" not in page


def _run(command: str) -> _serve_eval.CommandRun:
    return asyncio.run(_serve_eval.run_command(command, {}, os.getcwd(), timeout=60))


SECRET = "sk-STRADDLE-0123456789abcdefghij"


@pytest.mark.parametrize(
    ("written", "at", "more"),
    [
        # The tail's first byte falls inside the credential: the whole stream was held.
        (70_000, 70_000 - 64 * 1024 - 10, 0),
        # Longer than was held: the tail's first byte falls inside a credential...
        (300_000, 300_000 - 64 * 1024 - 10, 0),
        # ...or that of what was held does, and the credentials after it, once scrubbed,
        # leave room in the last 64 KiB for what was held before them.
        (300_000, 300_000 - 80 * 1024 - 10, 1500),
    ],
    ids=["tail-cuts-it", "long-tail-cuts-it", "held-part-cuts-it"],
)
def test_no_part_of_a_credential_the_tail_cuts_is_logged(
    monkeypatch: pytest.MonkeyPatch, written: int, at: int, more: int
) -> None:
    monkeypatch.setenv("MY_AGENT_TOKEN", SECRET)
    script = (
        "import sys; s = sys.argv[1]; n, at, k = map(int, sys.argv[2:]); "
        "end = (s + '\\n') * k; "
        "sys.stderr.write('.' * at + s + '.' * (n - at - len(s) - len(end)) + end)"
    )
    result = _run(f"{sys.executable} -c {shlex.quote(script)} {SECRET} {written} {at} {more}")
    assert result.stderr_bytes == written
    tail, truncated = _serve_eval.output_tail(result.stderr, result.stderr_bytes, secret_values())
    assert truncated and len(tail.encode()) <= 64 * 1024
    assert tail.count("[redacted]") >= more
    pieces = {SECRET[i : i + 6] for i in range(len(SECRET) - 5)}
    assert not [p for p in pieces if p in tail]


def test_output_tail_keeps_a_short_stream_whole_and_scrubbed() -> None:
    assert _serve_eval.output_tail("why: A\nkey sk-1234567890\n", 24, ["sk-1234567890"]) == (
        "why: A\nkey [redacted]\n",
        False,
    )


@pytest.mark.parametrize(
    ("text", "block"),
    [
        ("why: A\n# not a heading", "```text\nwhy: A\n# not a heading\n```"),
        ("a ``` fence and `x`", "````text\na ``` fence and `x`\n````"),
    ],
)
def test_an_output_tail_is_a_code_block_nothing_in_it_ends(text: str, block: str) -> None:
    assert _serve_eval.code_block(text) == block


def test_a_command_writing_much_is_read_in_bounded_memory() -> None:
    # 64 MiB to stderr: only the tail (and one read's worth) is ever held.
    tracemalloc.start()
    try:
        result = _run("head -c 67108864 /dev/zero | tr '\\0' x >&2; echo done >&2")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.stderr_bytes == 64 * 1024 * 1024 + 5
    assert result.stderr.endswith("xxxdone\n")
    assert peak < 2 * 1024 * 1024, peak


NODE_AGENT = ROOT / "tests" / "evals" / "scripts" / "retry_on.mjs"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
@pytest.mark.parametrize(
    ("retry_on", "duplicated"),
    [
        # lost_reply is a read timeout on the agent's own clock; reset_after_commit is the
        # connection closed at once. Each fault catches the agent that retries on it.
        ("timeout", {"lost_reply": 1.0, "reset_after_commit": 0.0}),
        ("connection", {"lost_reply": 0.0, "reset_after_commit": 1.0}),
    ],
)
def test_a_node_agent_meets_a_timeout_under_lost_reply_and_a_reset_under_reset_after_commit(
    tmp_path: Path, retry_on: str, duplicated: dict[str, float]
) -> None:
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "lost_reply",
         "--fault", "reset_after_commit", "--limit", "1", "--no-report", "--display", "none",
         "--log-dir", str(out), "--hang-seconds", "5",
         "--agent-cmd", f"node {NODE_AGENT} {retry_on}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cells = json.loads((out / "summary.json").read_text())["cells"]
    assert {c["fault"]: c["duplication_rate"] for c in cells} == duplicated
    assert all(c["completion_rate"] == 1.0 and c["crashed_rate"] == 0.0 for c in cells)


RETRYING_AGENT = ROOT / "docs" / "examples" / "retrying_agent.mjs"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_a_node_agents_own_retry_loop_is_charged_to_the_framework_not_the_model(
    tmp_path: Path,
) -> None:
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "lost_reply",
         "--limit", "1", "--no-report", "--display", "none", "--log-dir", str(out),
         "--hang-seconds", "5", "--agent-cmd", f"node {RETRYING_AGENT}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (cell,) = json.loads((out / "summary.json").read_text())["cells"]
    assert cell["duplication_rate"] == 1.0
    assert cell["framework_duplication_rate"] == 1.0
    assert cell["model_duplication_rate"] == 0.0
    frame = trials_frame(out)
    assert frame.iloc[0]["excess_framework"] == 1 and frame.iloc[0]["attempts_initial"] == 1


ANTHROPIC_AGENT = """
import json, os, urllib.error, urllib.request
import anthropic

PAYMENTS = os.environ["TWICE_PAYMENTS_URL"]
TOOL = {"name": "issue_refund", "description": "Refund money to the customer for an order.",
        "input_schema": {"type": "object", "required": ["order_id", "amount"], "properties": {
            "order_id": {"type": "string"}, "amount": {"type": "number"}}}}

def issue_refund(order_id, amount, reason=""):
    body = json.dumps({"order_id": order_id, "amount": round(amount * 100)}).encode()
    request = urllib.request.Request(f"{PAYMENTS}/v1/refunds", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return f"Created refund {json.load(r)['id']}."
    except OSError:
        return "Error: the payments API did not answer; the refund may or may not have been made."

client = anthropic.Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY
messages = [{"role": "user", "content": os.environ["TWICE_INPUT"]}]
for _ in range(10):
    with client.messages.stream(model="inspect", max_tokens=1000, tools=[TOOL],
                                system=os.environ["TWICE_SYSTEM_PROMPT"],
                                messages=messages) as stream:
        message = stream.get_final_message()
    messages.append({"role": "assistant", "content": message.content})
    calls = [block for block in message.content if block.type == "tool_use"]
    if not calls:
        break
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": issue_refund(**call.input)}
        for call in calls]})
"""


@pytest.mark.slow
def test_an_anthropic_sdk_agent_streams_its_model_calls_and_refunds_as_its_model_decides(
    tmp_path: Path,
) -> None:
    # The command is given ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY beside the OpenAI pair,
    # and the endpoint streams Messages as the anthropic SDK reads them.
    script = tmp_path / "claude_agent.py"
    script.write_text(ANTHROPIC_AGENT)
    out = tmp_path / "logs"
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/retry", "--model", "stub/no-retry",
         "--fault", "lost_reply", "--limit", "1", "--no-report", "--display", "none",
         "--log-dir", str(out), "--agent-cmd", f"{sys.executable} {script}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cells = {c["model"]: c for c in json.loads((out / "summary.json").read_text())["cells"]}
    assert all(c["crashed_rate"] == 0.0 and c["errors"] == 0 for c in cells.values()), cells
    assert cells["stub/retry"]["duplication_rate"] == 1.0
    assert cells["stub/no-retry"]["duplication_rate"] == 0.0
    assert cells["stub/no-retry"]["completion_rate"] == 1.0


def _most_at_once(marks: str) -> int:
    """The most agent commands running at once, from their ``+`` (start) and ``-`` (end) lines."""
    running = most = 0
    for mark in marks.split():
        running += 1 if mark == "+" else -1
        most = max(most, running)
    return most


@pytest.mark.parametrize(("cpus", "flags", "at_once"), [(1, [], 1), (2, [], 2), (1, ["3"], 3)])
def test_agent_commands_run_one_per_usable_cpu_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpus: int, flags: list[str], at_once: int
) -> None:
    # Six trials at once on a small machine starve the run's own server (its connections
    # close before their first byte is read): commands wait for a slot, as inspect's own
    # subprocesses do; --max-agent-cmds gives more slots to agents that mostly wait.
    monkeypatch.setattr(_serve_eval, "usable_cpus", lambda: cpus)
    marks = tmp_path / "marks"
    script = tmp_path / "marking_agent.sh"
    script.write_text(
        f"echo + >> {shlex.quote(str(marks))}\nsleep 0.3\n"
        f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENT))}\nstatus=$?\n"
        f"echo - >> {shlex.quote(str(marks))}\nexit $status\n"
    )
    result = CliRunner().invoke(
        cli,
        ["run", "--task", "refund", "--model", "stub/no-retry", "--fault", "none", "--limit",
         "6", "--no-report", "--display", "none", "--log-dir", str(tmp_path / "logs"),
         "--agent-cmd", f"sh {script}", *(["--max-agent-cmds", *flags] if flags else [])],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = marks.read_text()
    assert text.split().count("+") == 6
    assert _most_at_once(text) == at_once


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-agent-cmds", "2"], "max_agent_cmds bounds how many --agent-cmd commands run"),
        (["--max-agent-cmds", "0", "--agent-cmd", "true"], "'--max-agent-cmds': 0 is not in"),
    ],
)
def test_max_agent_cmds_is_refused_without_an_agent_command_or_below_1(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(
        cli, ["run", "--model", "stub/retry", "--log-dir", str(tmp_path / "logs"), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "logs").exists()


def test_the_runs_server_waits_for_a_slow_clients_first_byte(tmp_path: Path) -> None:
    # A busy run keeps its own event loop and its agents from writing for seconds: the run's
    # server waits for a request head as long as a public web server does, not twice serve's
    # default few seconds (which closed such connections: a ReadError, an errored trial).
    script = tmp_path / "slow_client.py"
    script.write_text(
        "import os, socket, sys, time, urllib.parse\n"
        "url = urllib.parse.urlsplit(os.environ['TWICE_PAYMENTS_URL'])\n"
        "with socket.create_connection((url.hostname, url.port)) as s:\n"
        "    time.sleep(6)\n"
        "    s.sendall(f'GET {url.path}/v1/refunds HTTP/1.1\\r\\nHost: {url.netloc}\\r\\n'\n"
        "              'Connection: close\\r\\n\\r\\n'.encode())\n"
        "    sys.exit(0 if s.recv(64).startswith(b'HTTP/1.1 ') else 3)\n"
    )
    out = tmp_path / "logs"
    result = _no_retry_run(out, script, limit=1)
    assert result.exit_code == 0, result.output
    (cell,) = json.loads((out / "summary.json").read_text())["cells"]
    assert cell["errors"] == 0 and cell["crashed_rate"] == 0.0, cell


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4", None),
        ("0", "max_agent_cmds must be a positive whole number, got 0"),
        ("2.5", "max_agent_cmds must be a positive whole number, got 2.5"),
        ("true", "max_agent_cmds must be a positive whole number, got True"),
    ],
)
def test_a_suite_file_sets_max_agent_cmds(tmp_path: Path, value: str, message: str | None) -> None:
    toml = tmp_path / "suite.toml"
    toml.write_text(
        f'agent_cmd = "true"\nmax_agent_cmds = {value}\n[[matrix]]\nmodels = ["stub/retry"]\n'
    )
    if message is None:
        assert load_suite(toml).max_agent_cmds == 4
    else:
        with pytest.raises(SuiteError, match=message):
            load_suite(toml).validate()
