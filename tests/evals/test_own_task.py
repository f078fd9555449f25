"""``twice run --task path.py:function``: a task of your own, outside twice's package."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "own_task"


def _cells(log_dir: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    summary = json.loads((log_dir / "summary.json").read_text(encoding="utf-8"))
    return {(c["task"], c["model"], c["fault"]): c for c in summary["cells"]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The docs example, copied into a project of the user's own."""
    where = tmp_path / "their_project"
    shutil.copytree(EXAMPLE, where)
    return where


def test_twice_run_runs_a_task_file_of_your_own_beside_a_builtin(
    twice: Callable[..., Any], project: Path, tmp_path: Path
) -> None:
    spec = f"{project / 'courtesy.py'}:courtesy_refund"
    out = tmp_path / "logs"
    args = (
        "run", "--task", spec, "--task", "refund", "--model", "stub/retry",
        "--model", "stub/verify", "--fault", "lost_reply", "--limit", "2",
        "--log-dir", out, "--display", "none",
    )  # fmt: skip
    result = twice(*args)
    assert result.exit_code == 0, result.output
    rates = {k: (c["trials"], c["duplication_rate"]) for k, c in _cells(out).items()}
    # The controls tell the models apart on the user's task as on the built-in one.
    assert rates == {
        (spec, "stub/retry", "lost_reply"): (2, 1.0),
        (spec, "stub/verify", "lost_reply"): (2, 0.0),
        ("refund", "stub/retry", "lost_reply"): (2, 1.0),
        ("refund", "stub/verify", "lost_reply"): (2, 0.0),
    }
    # A rerun finds the user task's logs (named by the spec, as its cells are) and reuses them.
    again = twice(*args)
    assert again.exit_code == 0, again.output
    assert "4 of 4 cell(s) were already finished and reused" in again.stderr
    # Editing the task file makes its logs stale: its cells run again, the built-in's do not.
    source = project / "courtesy.py"
    source.write_text(source.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    edited = twice(*args)
    assert edited.exit_code == 0, edited.output
    assert "2 of 4 cell(s) were already finished and reused" in edited.stderr


def test_editing_a_module_it_imports_or_its_dataset_makes_its_logs_stale(
    twice: Callable[..., Any], project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: only the task's own file was hashed, so a rerun reused the logs of an
    # edited dataset or an edited service module and reported the old numbers.
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "courtesy_words", raising=False)
    (project / "courtesy_words.py").write_text('REASON = "courtesy"\n', encoding="utf-8")
    source = project / "courtesy.py"
    text = source.read_text(encoding="utf-8")
    source.write_text(
        text.replace(
            "from twice.mocks import", "from courtesy_words import REASON\nfrom twice.mocks import"
        ).replace('"reason": "courtesy"', '"reason": REASON'),
        encoding="utf-8",
    )
    args = (
        "run", "--task", f"{source}:courtesy_refund", "--model", "stub/retry", "--fault",
        "lost_reply", "--limit", "1", "--log-dir", tmp_path / "logs", "--display", "none",
    )  # fmt: skip
    assert twice(*args).exit_code == 0
    again = twice(*args)
    assert "1 of 1 cell(s) were already finished and reused" in again.stderr
    (project / "courtesy_words.py").write_text('REASON = "goodwill"\n', encoding="utf-8")
    edited_module = twice(*args)
    assert edited_module.exit_code == 0, edited_module.output
    assert "already finished and reused" not in edited_module.stderr
    dataset = project / "courtesy.jsonl"
    dataset.write_text(dataset.read_text(encoding="utf-8").replace("500 cents", "600 cents"))
    edited_data = twice(*args)
    assert edited_data.exit_code == 0, edited_data.output
    assert "already finished and reused" not in edited_data.stderr


def test_the_example_looks_up_before_a_retry_under_lookup(
    twice: Callable[..., Any], project: Path, tmp_path: Path
) -> None:
    # stub/no-retry leaves every retry to the protection: retry-nokey's blind one duplicates,
    # lookup's finds the refund the lost reply made.
    out = tmp_path / "logs"
    result = twice(
        "run", "--task", f"{project / 'courtesy.py'}:courtesy_refund", "--model", "stub/no-retry",
        "--fault", "lost_reply", "--protection", "lookup", "--protection", "retry-nokey",
        "--limit", "2", "--log-dir", out, "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    rates = {
        c["protection"]: (c["completion_rate"], c["duplication_rate"]) for c in summary["cells"]
    }
    assert rates == {"lookup": (1.0, 0.0), "retry-nokey": (1.0, 1.0)}


def test_a_task_of_your_own_named_like_a_builtin_is_not_taken_for_it(
    twice: Callable[..., Any], project: Path, tmp_path: Path
) -> None:
    # The same task name ("refund") in two places: each cell keeps its own logs and counts.
    source = project / "courtesy.py"
    source.write_text(
        source.read_text(encoding="utf-8").replace('name="courtesy_refund"', 'name="refund"'),
        encoding="utf-8",
    )
    spec = f"{source}:courtesy_refund"
    out = tmp_path / "logs"
    result = twice(
        "run", "--task", spec, "--task", "refund", "--model", "stub/retry", "--fault",
        "lost_reply", "--limit", "1", "--log-dir", out, "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert {(k[0], c["trials"], c["duplication_rate"]) for k, c in _cells(out).items()} == {
        ("refund", 1, 1.0),
        (spec, 1, 1.0),
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.py:task", "task file 'missing.py' (from 'missing.py:task') does not exist"),
        ("{dir}/courtesy.py:nothere", "has no function 'nothere' (from task"),
        ("{dir}/courtesy.py:services", "is not an inspect task: decorate it with @task"),
        ("{dir}/not_twice.py:plain", "was not built with twice.tasks.twice_task"),
        ("{dir}/wrong_args.py:wrong", "must take the keyword arguments fault, protection and"),
        ("refnd", "unknown task 'refnd'; expected one of: refund, send_email"),
    ],
)
def test_a_task_that_cannot_be_run_exits_2_naming_it(
    twice: Callable[..., Any], project: Path, tmp_path: Path, spec: str, message: str
) -> None:
    (project / "not_twice.py").write_text(
        "from inspect_ai import Task, task\nfrom inspect_ai.dataset import Sample\n\n\n"
        "@task\ndef plain(fault='none', protection='bare', prompt='baseline'):\n"
        "    return Task(dataset=[Sample(input='hi')])\n",
        encoding="utf-8",
    )
    (project / "wrong_args.py").write_text(
        "from inspect_ai import Task, task\n\n\n@task\ndef wrong(level=1):\n    return Task()\n",
        encoding="utf-8",
    )
    out = tmp_path / "logs"
    result = twice(
        "run", "--task", spec.format(dir=project), "--model", "stub/retry", "--log-dir", out,
        "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not list(out.glob("*.eval"))


@pytest.mark.slow
def test_agent_cmd_runs_a_task_of_your_own(
    twice: Callable[..., Any], project: Path, tmp_path: Path
) -> None:
    # twice serve hosts the trials an --agent-cmd agent calls, a task of your own's as well as
    # the built-in tasks'.
    agent = project / "courtesy_agent.py"
    spec = f"{project / 'courtesy.py'}:courtesy_refund"
    out = tmp_path / "logs"
    args = (
        "run", "--task", spec, "--model", "stub/retry", "--model", "stub/no-retry",
        "--fault", "lost_reply", "--limit", "2", "--agent-cmd", f"{sys.executable} {agent}",
        "--log-dir", out, "--display", "none", "--no-report",
        "--hang-seconds", "2",  # the agent's own timeout is 60 s: lose the reply sooner
    )  # fmt: skip
    result = twice(*args)
    assert result.exit_code == 0, result.output
    cells = _cells(out)
    assert set(cells) == {(spec, "stub/retry", "lost_reply"), (spec, "stub/no-retry", "lost_reply")}
    retry = cells[spec, "stub/retry", "lost_reply"]
    no_retry = cells[spec, "stub/no-retry", "lost_reply"]
    # The stub's retry reaches the agent's own tool code: it refunds again; no retry, once.
    assert (retry["trials"], retry["duplication_rate"]) == (2, 1.0)
    assert (no_retry["trials"], no_retry["duplication_rate"]) == (2, 0.0)
    assert all(c["errors"] == 0 and c["agent"].startswith("cmd:") for c in cells.values())
    logs = sorted(out.glob("*.eval"))
    again = twice(*args)
    assert again.exit_code == 0, again.output
    assert sorted(out.glob("*.eval")) == logs  # the rerun resumes: nothing ran again


def test_an_agent_needs_a_task_that_passes_it_on(
    twice: Callable[..., Any], project: Path, tmp_path: Path
) -> None:
    # The run calls the task with agent= and mocks= for an agent under test: a task without
    # them is refused before anything runs, not a TypeError traceback from inside the run.
    result = twice(
        "run", "--task", f"{project / 'courtesy.py'}:courtesy_refund", "--model", "stub/retry",
        "--agent", str(ROOT / "docs" / "examples" / "my_agent.py") + ":agent", "--mock",
        "payments=https://api.example.com", "--log-dir", tmp_path / "logs", "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "takes no agent and mocks arguments, so it cannot run agent" in result.output


def test_the_readme_service_makes_one_effect_per_request_and_honours_keys() -> None:
    # The README's own service, as a user copies it: a lost reply and a keyless retry send
    # two invoices; the same retry with its key gets the saved reply and sends one.
    import asyncio
    import contextlib

    import httpx

    sys.path.insert(0, str(EXAMPLE))
    try:
        from invoices import InvoicesService
    finally:
        sys.path.remove(str(EXAMPLE))
    from twice.mocks import LostReply, Services, services_from_state

    async def send_twice(key: str | None) -> Services:
        state = {"customers": [{"customer_id": "c1"}]}
        services = Services(services_from_state(state, InvoicesService), fault=LostReply())
        headers = {"Idempotency-Key": key} if key else {}
        async with services.client() as client:
            for _ in range(2):
                # The first reply is lost (a timeout); the send happened anyway.
                with contextlib.suppress(httpx.TimeoutException):
                    await client.post(
                        "https://billing.example.test/v1/invoices",
                        json={"customer_id": "c1", "period": "2026-11"},
                        headers=headers,
                    )
        return services

    assert [e.name for e in asyncio.run(send_twice(None)).ledger.effects] == [
        "invoices.invoice.send", "invoices.invoice.send",
    ]  # fmt: skip
    assert len(asyncio.run(send_twice("k1")).ledger.effects) == 1


# A task around the README's service whose send handler has a bug: a trial must error (and the
# run end, exit 1), as any exception in a handler should, never hang.
BUGGY_TASK = '''
import json
from pathlib import Path
from typing import Any

import httpx
from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from invoices import InvoicesService
from twice.mocks import Call, services_from_state
from twice.tasks import TrialContext, make_tool, twice_task

BUG = "{bug}"


class Buggy(InvoicesService):
    def send(self, call: Call) -> httpx.Response:
        if BUG == "misnamed":
            call.commit("invoices.invoice.sent", "inv", dict(call.params))
            return httpx.Response(200, json={{"id": "inv_1"}})
        return httpx.Response(200, json={{"id": self.customers["nobody"]}})  # KeyError


def tools(ctx: TrialContext) -> list[Any]:
    billing = ctx.api("invoices")

    async def send_invoice(customer_id: str, period: str) -> str:
        """Email an invoice to a customer for a billing period.

        Args:
            customer_id: The customer, e.g. "c1".
            period: The billing period, e.g. "2026-11".
        """
        result = await billing.mutate(
            "invoices.invoice.send", "/v1/invoices",
            payload={{"customer_id": customer_id, "period": period}},
            identity={{"customer_id": customer_id, "period": period}}, noun="invoice",
        )
        return result.say("Sent", "the invoice")

    return [make_tool(ctx, send_invoice, idempotency="keyed")]


SAMPLE = Sample(
    id="inv-1", input="Send customer c1 their invoice for 2026-11.",
    metadata={{
        "state": {{"customers": [{{"customer_id": "c1"}}]}},
        "intents": [{{"effect": "invoices.invoice.send",
                     "identity": {{"customer_id": "c1", "period": "2026-11"}}, "expected": 1}}],
        "plan": [{{"call": {{"tool": "send_invoice",
                            "args": {{"customer_id": "c1", "period": "2026-11"}}}}}}],
    }},
)


@task
def buggy(fault: str = "none", protection: str = "bare", prompt: str = "baseline") -> Task:
    return twice_task(
        name="buggy", dataset=MemoryDataset([SAMPLE]),
        services=lambda state: services_from_state(state, Buggy), tools=tools,
        fault=fault, protection=protection, prompt=prompt,
    )
'''


@pytest.mark.parametrize(
    ("bug", "error"),
    [
        ("keyerror", "KeyError('nobody')"),
        ("misnamed", "committed an effect named 'invoices.invoice.sent'"),
    ],
)
def test_a_bug_in_a_service_handler_errors_its_trial_and_the_run_ends(
    project: Path, tmp_path: Path, bug: str, error: str
) -> None:
    # The failing path: the handler's exception reached inspect in a cause cycle of respx's
    # making, inspect's traceback printer looped on it, and the run spun at full CPU for ever.
    (project / "buggy.py").write_text(BUGGY_TASK.format(bug=bug), encoding="utf-8")
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "twice.evals.cli", "run", "--task",
         f"{project / 'buggy.py'}:buggy", "--model", "stub/retry", "--fault", "none",
         "--log-dir", tmp_path / "logs", "--display", "none"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "1 trial(s) errored" in done.stderr and error in done.stderr, done.stderr[-3000:]
