"""Agents under test: the built-in framework agents' table, crashes, limits, concurrency."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from batch_eval import batch_eval
from inspect_ai import Task, task_with
from inspect_ai.log import EvalLog
from inspect_ai.model import ChatMessageTool, get_model
from twice.mocks import LEDGER_STORE_KEY
from twice.mocks._stub_transcript import is_error as _is_error
from twice.mocks._stub_transcript import is_unknown as _is_unknown
from twice.tasks import refund
from twice.tasks.agents import (
    AGENT_STORE_KEY,
    AgentError,
    AgentLimitError,
    check_agent,
    check_model_request,
    load_agent,
    parse_hosts,
    serve_trial,
    take_late_requests,
)

STUBS = ("stub/retry", "stub/no-retry", "stub/verify")
FAULTS = ("lost_reply", "timeout_before_commit")

# Refunds the payments service made, per agent × stub × fault (refund task): README's table.
TABLE: dict[str, dict[str, tuple[int, int, int]]] = {
    #                    retry, no-retry, verify
    "openai-agents": {"lost_reply": (2, 1, 1), "timeout_before_commit": (1, 0, 0)},
    "langgraph": {"lost_reply": (2, 1, 1), "timeout_before_commit": (1, 0, 1)},
    "langgraph-retry": {"lost_reply": (2, 2, 2), "timeout_before_commit": (1, 1, 1)},
    "pydantic-ai": {"lost_reply": (2, 1, 1), "timeout_before_commit": (1, 0, 1)},
}


def _run(tasks: list[Task], log_dir: Path, **kwargs: Any) -> list[EvalLog]:
    logs = batch_eval(tasks, log_dir=str(log_dir), **kwargs)
    assert all(log.status == "success" for log in logs), [log.error for log in logs]
    return logs


def _effects(sample: Any) -> list[dict[str, Any]]:
    return list(sample.store[LEDGER_STORE_KEY]["effects"])


@pytest.mark.slow
def test_builtin_agents_reproduce_the_table(tmp_path: Path) -> None:
    tasks = [
        task_with(
            refund(fault=fault, agent=agent), model=get_model(stub), name=f"{agent}|{stub}|{fault}"
        )
        for agent in TABLE
        for stub in STUBS
        for fault in FAULTS
    ]
    logs = _run(tasks, tmp_path, limit=1, max_tasks=8)
    seen = {}
    for log in logs:
        agent, stub, fault = log.eval.task.split("|")
        (sample,) = log.samples or []
        assert sample.store[AGENT_STORE_KEY] == {"agent": agent, "crashed": False, "error": ""}
        seen[agent, stub, fault] = len(_effects(sample))
    expected = {
        (agent, stub, fault): TABLE[agent][fault][STUBS.index(stub)]
        for agent in TABLE
        for stub in STUBS
        for fault in FAULTS
    }
    assert seen == expected
    # The named findings, stated once more on their own.
    assert seen["langgraph-retry", "stub/no-retry", "lost_reply"] == 2
    assert seen["langgraph", "stub/no-retry", "lost_reply"] == 1
    assert seen["openai-agents", "stub/retry", "lost_reply"] == 2
    assert seen["pydantic-ai", "stub/retry", "lost_reply"] == 2


@pytest.mark.slow
def test_builtin_agents_keep_every_trials_effects_its_own(tmp_path: Path) -> None:
    """28 samples × 2 epochs with 32 in flight, per framework: no trial sees another's."""
    tasks = [
        task_with(
            refund(fault="lost_reply", agent=agent), model=get_model("stub/retry"), name=agent
        )
        # The first four, and smolagents, which runs in worker threads and calls the model
        # through a sync client: the other framework agents await like the first four, and
        # each costs a minute here.
        for agent in (*TABLE, "smolagents")
    ]
    logs = _run(tasks, tmp_path, epochs=2, max_samples=32, max_tasks=1)
    for log in logs:
        samples = log.samples or []
        assert len(samples) == 56, log.eval.task
        for sample in samples:
            own = {i["identity"]["order_id"] for i in sample.metadata["intents"]}
            effects = _effects(sample)
            # The first refund's reply is lost and stub/retry repeats it: one extra refund.
            assert {e["fields"]["order_id"] for e in effects} == own, log.eval.task
            assert len(effects) == len(own) + 1, log.eval.task
            # Ids count from 1 in every trial: no other trial's refunds are in this service.
            assert [e["id"] for e in effects] == [f"re_{n}" for n in range(1, len(effects) + 1)]
            attempts = sample.store[LEDGER_STORE_KEY]["attempts"]
            assert {a["service"] for a in attempts} == {"payments"}


def _user_agent(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return f"{path}:agent"


def test_agent_that_raises_is_scored_as_crashed_not_an_error(tmp_path: Path) -> None:
    spec = _user_agent(
        tmp_path,
        "raises",
        """
        import httpx

        async def agent(request, ctx):
            async with httpx.AsyncClient() as http:
                # No error handling: the lost reply's ReadTimeout escapes the agent.
                await http.post(
                    ctx.urls["payments"] + "/v1/refunds",
                    json={"order_id": "order_1042", "amount": 499, "reason": "cracked"},
                )
            return "done"
        """,
    )
    (log,) = _run(
        [refund(fault="lost_reply", agent=spec)], tmp_path / "logs", limit=1, model="stub/retry"
    )
    (sample,) = log.samples or []
    assert sample.error is None
    record = sample.store[AGENT_STORE_KEY]
    assert record["crashed"] is True
    assert record["error"].startswith("ReadTimeout")
    assert len(_effects(sample)) == 1  # the refund was made; the agent never learned it
    assert sample.scores is not None
    assert sample.scores["side_effects"].value["completed"] == 1.0


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        (
            "sync_client",
            "from openai import OpenAI\n\nasync def agent(request, ctx):\n"
            "    OpenAI().chat.completions.create(model=ctx.model, messages=[])\n",
            "synchronous client",
        ),
        (
            "streaming",
            "from openai import AsyncOpenAI\n\nasync def agent(request, ctx):\n"
            "    await AsyncOpenAI().chat.completions.create(\n"
            "        model=ctx.model, messages=[], stream=True\n"
            "    )\n",
            "refuses streaming",
        ),
        (
            "previous_response",
            "from openai import AsyncOpenAI\n\nasync def agent(request, ctx):\n"
            "    await AsyncOpenAI().responses.create(\n"
            "        model=ctx.model, input=request, previous_response_id='resp_1'\n"
            "    )\n",
            "previous_response_id",
        ),
        (
            "hard_coded_model",
            "from openai import AsyncOpenAI\n\nasync def agent(request, ctx):\n"
            "    await AsyncOpenAI().chat.completions.create(model='gpt-4o', messages=[])\n",
            "only model 'inspect'",
        ),
    ],
)
def test_bridge_limits_end_the_trial_with_a_clear_error(
    tmp_path: Path, name: str, body: str, message: str
) -> None:
    sample = _limit_error(tmp_path, refund(fault="none", agent=_user_agent(tmp_path, name, body)))
    assert message in sample.error.message
    assert sample.store[LEDGER_STORE_KEY]["attempts"] == []  # nothing reached the network


def _limit_error(tmp_path: Path, task: Task) -> Any:
    """The one sample of ``task`` on stub/retry, which must have ended in an AgentLimitError."""
    logs = batch_eval(
        task,
        model="stub/retry",
        limit=1,
        log_dir=str(tmp_path / "logs"),
        fail_on_error=False,
    )
    (sample,) = logs[0].samples or []
    assert sample.error is not None and "AgentLimitError" in sample.error.message
    return sample


def test_check_model_request_refuses_each_limit_and_passes_the_rest() -> None:
    body = {"model": "inspect", "messages": []}
    check_model_request("/chat/completions", body, stream=False, sync=False)
    check_model_request("/models", {"model": "gpt-4o"}, stream=False, sync=True)  # not a model call
    for kwargs, text in [
        ({"stream": False, "sync": True}, "synchronous"),
        ({"stream": True, "sync": False}, "streaming"),
    ]:
        with pytest.raises(AgentLimitError, match=text):
            check_model_request("/chat/completions", body, **kwargs)
    with pytest.raises(AgentLimitError, match="previous_response_id"):
        check_model_request(
            "/responses", {**body, "previous_response_id": "r"}, stream=False, sync=False
        )
    with pytest.raises(AgentLimitError, match="'gpt-4o'"):
        check_model_request("/responses", {"model": "gpt-4o"}, stream=False, sync=False)


def test_user_agent_with_production_url_is_served_by_the_trial(tmp_path: Path) -> None:
    spec = _user_agent(
        tmp_path,
        "prod_url",
        """
        import httpx

        async def agent(request, ctx):
            async with httpx.AsyncClient() as http:
                r = await http.post(
                    "https://api.example.com/v1/refunds",
                    json={"order_id": "order_1042", "amount": 499, "reason": "cracked"},
                )
                return r.json()["id"]
        """,
    )
    task = refund(fault="none", agent=spec, mocks={"payments": "https://api.example.com"})
    (log,) = _run([task], tmp_path / "logs", limit=1, model="stub/retry")
    (sample,) = log.samples or []
    assert [e["id"] for e in _effects(sample)] == ["re_1"]
    assert sample.output.completion == "re_1"


@pytest.fixture
def production(tmp_path: Path) -> Any:
    """A stand-in for a production API on 127.0.0.1 that records every request it gets."""
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"id": "re_PROD"}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.hits = hits  # type: ignore[attr-defined]
    server.url = f"http://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


REFUND_CALL = (
    "httpx.Client(timeout=5).post(URL + '/v1/refunds', "
    "json={'order_id': 'order_1042', 'amount': 499, 'reason': 'cracked'}).status_code"
)


THREADS = {
    "executor": (
        "import asyncio, httpx\n\nasync def agent(request, ctx):\n"
        "    await asyncio.sleep(0.2)  # the two trials overlap\n"
        f"    run = lambda: {REFUND_CALL}\n"
        "    return str(await asyncio.get_running_loop().run_in_executor(None, run))\n"
    ),
    "thread": (
        "import asyncio, threading, httpx\n\nasync def agent(request, ctx):\n"
        "    await asyncio.sleep(0.2)\n    out = []\n"
        f"    t = threading.Thread(target=lambda: out.append({REFUND_CALL}))\n"
        "    t.start()\n    t.join()\n    return str(out[0])\n"
    ),
    "own_pool": (
        "import asyncio, httpx\nfrom concurrent.futures import ThreadPoolExecutor\n\n"
        "async def agent(request, ctx):\n    await asyncio.sleep(0.2)\n"
        "    with ThreadPoolExecutor(2) as pool:\n"
        f"        return str(pool.submit(lambda: {REFUND_CALL}).result())\n"
    ),
}


@pytest.mark.parametrize("name", sorted(THREADS))
def test_a_thread_the_agent_starts_is_served_by_its_own_trial(
    tmp_path: Path, production: Any, name: str
) -> None:
    # The failing path: threads from run_in_executor or threading.Thread did not carry the
    # trial's context, so the request passed through to the production URL behind --mock
    # and the trial counted as clean (then it was refused: which trial sent it was unknown).
    spec = _user_agent(tmp_path, name, f"URL = {production.url!r}\n" + THREADS[name])
    task = refund(fault="none", agent=spec, mocks={"payments": production.url})
    (log,) = _run([task], tmp_path / "logs", limit=1, epochs=2, model="stub/retry")
    samples = log.samples or []
    assert production.hits == []  # nothing reached "production"
    # each trial's refund in its own ledger, the two concurrent trials kept apart
    assert [[e["id"] for e in _effects(s)] for s in samples] == [["re_1"], ["re_1"]]
    assert [s.output.completion for s in samples] == ["200", "200"]


IMPORTED_THREAD = """
import asyncio, queue, threading, httpx
from openai import AsyncOpenAI

JOBS = queue.Queue()

def worker():  # started when the module is imported: outside any trial
    while True:
        job, out = JOBS.get()
        try:
            out.append(job())
        except Exception as ex:
            out.append(repr(ex))

threading.Thread(target=worker, daemon=True).start()

def ask_model():
    client = AsyncOpenAI(base_url=URL + "/v1", api_key="x", max_retries=0)
    return asyncio.run(client.chat.completions.create(
        model="inspect", messages=[{"role": "user", "content": "hi"}]))

async def agent(request, ctx):
    out = []
    JOBS.put((CALL, out))
    while not out:
        await asyncio.sleep(0.05)
    return "done: " + str(out[0])  # the refusal swallowed
"""


@pytest.mark.parametrize(
    ("call", "what"),
    [(f"lambda: {REFUND_CALL}", "POST http"), ("ask_model", "a model request ('inspect'")],
)
def test_a_request_from_a_thread_without_any_trials_context_is_refused(
    tmp_path: Path, production: Any, call: str, what: str
) -> None:
    # A thread started outside any trial: which trial sent its request is unknown. The
    # async model client's request from there went to the network with the user's text.
    source = f"URL = {production.url!r}\n" + IMPORTED_THREAD.replace("CALL,", f"{call},")
    spec = _user_agent(tmp_path, "imported_thread", source)
    sample = _limit_error(
        tmp_path, refund(fault="none", agent=spec, mocks={"payments": production.url})
    )
    assert production.hits == []
    assert what in sample.error.message and "carries no trial's context" in sample.error.message


def test_a_refused_model_call_errors_the_trial_even_when_the_agent_swallows_it(
    tmp_path: Path, production: Any
) -> None:
    body = (
        "import asyncio\nfrom openai import OpenAI\n\nasync def agent(request, ctx):\n"
        "    def run():\n        try:\n"
        "            OpenAI(base_url=URL + '/v1').chat.completions.create(\n"
        "                model=ctx.model, messages=[{'role': 'user', 'content': request}])\n"
        "        except Exception:\n            pass\n"
        "    await asyncio.get_running_loop().run_in_executor(None, run)\n"
        "    return 'asked'\n"
    )
    spec = _user_agent(tmp_path, "sync_model", f"URL = {production.url!r}\n" + body)
    sample = _limit_error(tmp_path, refund(fault="none", agent=spec))
    assert production.hits == []
    assert "through a synchronous client" in sample.error.message


def test_a_request_from_a_thread_that_outlives_its_trial_is_not_sent_on(
    tmp_path: Path, production: Any
) -> None:
    # The failing path: once the last trial ended the mock stopped, so the thread's late
    # request went to the production URL behind --mock.
    done = tmp_path / "late.txt"
    body = (
        "import threading, time, httpx\nfrom pathlib import Path\n"
        "from twice.evals.run import write_atomic\n\nasync def agent(request, ctx):\n"
        "    def run():\n        time.sleep(1.0)\n        try:\n"
        f"            {REFUND_CALL}\n"
        "        except Exception as ex:\n"
        # Whole or not at all: the test reads the file as soon as it exists.
        f"            write_atomic(Path({str(done)!r}), lambda tmp: tmp.write_text(\n"
        "                f'{type(ex).__name__}: {ex}'))\n"
        "    threading.Thread(target=run, daemon=True).start()\n"
        "    return 'refund queued'\n"
    )
    spec = _user_agent(tmp_path, "late", f"URL = {production.url!r}\n" + body)
    task = refund(fault="none", agent=spec, mocks={"payments": production.url})
    (log,) = _run([task], tmp_path / "logs", limit=1, model="stub/retry")
    deadline = time.monotonic() + 30
    while not done.exists():
        assert time.monotonic() < deadline, "the late thread never finished"
        time.sleep(0.1)
    assert production.hits == []
    assert "was sent after its trial ended" in done.read_text()
    assert _effects((log.samples or [])[0]) == []  # scored without it, as the message says


def test_parse_hosts_checks_service_and_url() -> None:
    urls = {"payments": "https://payments.twice.test"}
    assert parse_hosts({"payments": "https://api.example.com/"}, urls) == (
        ("https://api.example.com", "https://payments.twice.test"),
    )
    with pytest.raises(AgentError, match="no service 'email'; its services are: payments"):
        parse_hosts({"email": "https://mail.example.com"}, urls)
    with pytest.raises(AgentError, match="expected an http"):
        parse_hosts({"payments": "api.example.com"}, urls)
    # Spelt as httpx spells a request's URL: these matched nothing, and went to production.
    for spelt, prefix in [
        ("http://LocalHost:18555", "http://localhost:18555"),
        ("https://API.Example.com:443/v1/", "https://api.example.com/v1"),
        ("http://127.0.0.1:80", "http://127.0.0.1"),
    ]:
        assert parse_hosts({"payments": spelt}, urls)[0][0] == prefix
    with pytest.raises(AgentError, match="no query or fragment"):  # it matched nothing
        parse_hosts({"payments": "http://127.0.0.1:9/#prod"}, urls)
    # A key in the URL would be written to every log: refused, and not echoed.
    with pytest.raises(AgentError, match="carries credentials") as refused:
        parse_hosts({"payments": "https://user:sk-test-SECRET123@api.example.com"}, urls)
    assert "SECRET" not in str(refused.value)


def test_a_mock_url_spelt_otherwise_than_the_agents_is_served(
    tmp_path: Path, production: Any
) -> None:
    port = production.url.rsplit(":", 1)[1]
    body = (
        "import httpx\n\nasync def agent(request, ctx):\n"
        "    async with httpx.AsyncClient() as http:\n"
        f"        r = await http.post('http://localhost:{port}/v1/refunds',\n"
        "            json={'order_id': 'order_1042', 'amount': 499, 'reason': 'cracked'})\n"
        "    return r.json()['id']\n"
    )
    spec = _user_agent(tmp_path, "spelt", body)
    task = refund(fault="none", agent=spec, mocks={"payments": f"http://LocalHost:{port}/"})
    (log,) = _run([task], tmp_path / "logs", limit=1, model="stub/retry")
    assert production.hits == []
    assert [e["id"] for e in _effects((log.samples or [])[0])] == ["re_1"]


def test_load_agent_errors_name_the_bad_value(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="unknown agent 'langchain'; expected 'react'"):
        load_agent("langchain")
    with pytest.raises(AgentError, match="does not exist"):
        load_agent(str(tmp_path / "nope.py") + ":agent")
    sync = _user_agent(tmp_path, "sync_fn", "def agent(request, ctx):\n    return ''\n")
    with pytest.raises(AgentError, match="must be an async function"):
        load_agent(sync)
    one = _user_agent(tmp_path, "one_arg", "async def agent(request):\n    return ''\n")
    with pytest.raises(AgentError, match="two arguments"):
        load_agent(one)
    with pytest.raises(AgentError, match="has no function 'missing'"):
        load_agent(one.replace(":agent", ":missing"))
    with pytest.raises(AgentError, match="failed to import"):
        load_agent("twice_no_such_module:agent")


def test_missing_framework_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "langgraph" else real(name, *a),
    )
    with pytest.raises(AgentError, match=r"optional extra 'agents': pip install 'twice\[agents\]'"):
        check_agent("langgraph-retry")
    check_agent("openai-agents")


def test_framework_agent_cells_refuse_what_they_cannot_run() -> None:
    with pytest.raises(AgentError, match="protection 'lookup' is twice's own tool layer"):
        refund(fault="lost_reply", protection="lookup", agent="langgraph")
    with pytest.raises(AgentError, match="fault 'crash_after_commit' restarts the run"):
        refund(fault="crash_after_commit", agent="openai-agents")
    with pytest.raises(AgentError, match="has no tools for task 'place_order'"):
        check_agent("pydantic-ai", "place_order")
    with pytest.raises(AgentError, match="--mock applies to an agent under test"):
        refund(mocks={"payments": "https://api.example.com"})


def _tool(text: str) -> ChatMessageTool:
    return ChatMessageTool(content=text, tool_call_id="stub_s0_a1", function="issue_refund")


@pytest.mark.parametrize(
    ("text", "error", "unknown"),
    [
        ("An error occurred while running the tool. Please try again.", True, False),
        ("Error: ReadTimeout('timed out')\n Please fix your mistakes.", True, True),
        ('{"error":"issue_refund failed: ReadTimeout: timed out"}', True, True),
        ("Timed out; the refund may or may not have been made.", True, True),
        # A connection closed before the reply (reset_after_commit), as frameworks print it.
        (
            "Error: RemoteProtocolError('Server disconnected without sending a response.')\n"
            " Please fix your mistakes.",
            True,
            True,
        ),
        (
            '{"error":"issue_refund failed: RemoteProtocolError: Server disconnected without '
            'sending a response."}',
            True,
            True,
        ),
        ("Error: TypeError: fetch failed (UND_ERR_SOCKET: other side closed)", True, True),
        # The Vercel AI SDK hands the model error.message alone: Node's fetch timing out (an
        # unknown outcome), failing with its cause hidden (an error of unknown kind), and a
        # command agent's tool on a reply that was not 2xx.
        ("The operation was aborted due to timeout", True, True),
        ("fetch failed", True, False),
        ("HTTP 502 Bad Gateway from POST http://127.0.0.1:1/v1/refunds: {}", True, False),
        # A bare exception message (AutoGen, Agno): no "error" word, yet an unknown outcome.
        ("timed out waiting for the response", True, True),
        ("Server disconnected without sending a response.", True, True),
        ("Refund re_1 created; the timeout setting is 10 s.", False, True),
        (
            '{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN", "error_type": '
            '"ReadTimeout", "error_details": "timed out waiting for the response"}',
            True,
            True,
        ),
        ("Created refund re_1 of $4.99 on order order_1042 (status succeeded).", False, False),
        ("No refunds found for order order_1042.", False, False),
    ],
)
def test_stubs_recognise_error_text_across_the_bridge(
    text: str, error: bool, unknown: bool
) -> None:
    assert _is_error(_tool(text)) is error
    assert _is_unknown(text) is unknown


def test_agent_context_urls_are_the_trial_services(tmp_path: Path) -> None:
    spec = _user_agent(
        tmp_path,
        "echo_ctx",
        """
        async def agent(request, ctx):
            hidden = {"plan", "intents", "state"} & set(ctx.metadata)
            return f"{ctx.model} {dict(ctx.urls)} {ctx.task} {sorted(hidden)}"
        """,
    )
    (log,) = _run([refund(agent=spec)], tmp_path / "logs", limit=1, model="stub/retry")
    (sample,) = log.samples or []
    assert sample.output.completion == (
        "inspect {'payments': 'https://payments.twice.test'} refund []"
    )


def test_unmapped_hosts_pass_through(tmp_path: Path) -> None:
    """A request to a host the trial does not serve is not answered by twice."""
    from twice.tasks.agents._hosts import _side_effect

    request = httpx.Request("GET", "https://elsewhere.example.org/x")
    assert _side_effect(request) is request


def test_agents_package_all_is_sorted_and_importable() -> None:
    from twice.tasks import agents

    names = list(agents.__all__)
    assert names == sorted(names, key=lambda n: (not n.isupper(), n))
    assert all(hasattr(agents, n) for n in names)
    # Importing twice's agents must not import a framework: they are an optional extra.
    assert not {"agents", "langgraph", "pydantic_ai"} & set(dir(agents))


FIRE_AND_FORGET = """
import asyncio, httpx

async def post():
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            await http.post(URL + '/v1/refunds', json={'order_id': 'order_1042', 'amount': 499})
    except Exception as ex:
        open(DONE, 'w').write(str(ex))

async def agent(request, ctx):
    asyncio.get_running_loop().create_task(post())  # never awaited: runs once it returned
    return 'refund queued'
"""


def test_a_task_the_agent_does_not_await_is_refused_and_fails_the_run(
    tmp_path: Path, production: Any
) -> None:
    # The failing path: once the last trial ended the interception stopped (only threads
    # kept it), so the task's refund went to the production URL behind --mock, exit 0.
    from click.testing import CliRunner
    from twice.evals.cli import cli

    done = tmp_path / "late.txt"
    source = f"URL = {production.url!r}\nDONE = {str(done)!r}\n" + FIRE_AND_FORGET
    spec = _user_agent(tmp_path, "fire_and_forget", source)
    result = CliRunner().invoke(cli, [
        "run", "--agent", spec, "--mock", f"payments={production.url}", "--task", "refund",
        "--fault", "none", "--model", "stub/retry", "--limit", "1", "--display", "none",
        "--log-dir", str(tmp_path / "logs"), "--no-report",
    ])  # fmt: skip
    assert production.hits == []
    assert "was sent after its trial ended" in done.read_text()
    assert result.exit_code == 1, result.output
    assert "1 request(s) of in-process agents were refused because their trial" in result.output


CHILD_PROCESS = """
import multiprocessing, httpx

def post():
    try:
        httpx.Client(timeout=5).post(URL + '/v1/refunds', json={'order_id': 'order_1042'})
    except Exception as ex:
        open(DONE, 'w').write(str(ex))

async def agent(request, ctx):
    child = multiprocessing.get_context('fork').Process(target=post)
    child.start()
    child.join()
    return 'refunded'
"""


@pytest.mark.parametrize("context", [True, False])
def test_a_request_from_a_forked_child_process_is_refused(
    tmp_path: Path, production: Any, context: bool
) -> None:
    # The failing path: the child's copy of the trial served it, so the agent saw a refund
    # that the trial's ledger (in the eval's process) never had. A child forked without the
    # trial's context (from a fresh context) sent it on to production.
    done = tmp_path / "child.txt"
    source = f"URL = {production.url!r}\nDONE = {str(done)!r}\n" + CHILD_PROCESS
    if not context:
        source = source.replace(
            "    child.start()\n",
            "    import contextvars\n    contextvars.Context().run(child.start)\n",
        )
    spec = _user_agent(tmp_path, "child", source)
    sample = _limit_error(
        tmp_path, refund(fault="none", agent=spec, mocks={"payments": production.url})
    )
    assert production.hits == []
    assert "came from a child process" in done.read_text()
    # The child swallowed it; the trial errors all the same (review P: it was scored clean).
    assert "came from a child process" in sample.error.message


def test_a_requests_call_to_a_mocked_host_is_refused_not_sent(
    tmp_path: Path, production: Any
) -> None:
    # The failing path: twice serves httpx, so a tool using requests sent the refund to the
    # production URL behind --mock, uncounted, exit 0.
    body = (
        "import asyncio, requests\n\nasync def agent(request, ctx):\n"
        "    def call():\n        try:\n"
        "            return requests.post(URL + '/v1/refunds', json={'order_id': 'order_1042'})\n"
        "        except Exception as ex:\n            return str(ex)\n"
        "    return str(await asyncio.to_thread(call))\n"
    )
    spec = _user_agent(tmp_path, "uses_requests", f"URL = {production.url!r}\n" + body)
    sample = _limit_error(
        tmp_path, refund(fault="none", agent=spec, mocks={"payments": production.url})
    )
    assert production.hits == []
    assert "was sent with requests; twice serves only httpx" in sample.error.message


def _payments() -> Any:
    from twice.mocks import PaymentsService, Services, get_fault

    orders = [{"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}]
    return Services([PaymentsService(orders=orders)], fault=get_fault("none"))


def _urls(services: Any) -> dict[str, str]:
    return {name: s.base_url for name, s in services.services.items()}


def test_a_thread_ending_as_a_trial_starts_does_not_stop_its_interception(
    production: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path (review P): the interception was started, then the trial registered;
    # an earlier trial's thread ending in between saw no trial running and stopped it, so
    # the new trial's refund went to production (29 of 3000 trials in a stress run).
    import asyncio
    import threading

    from twice.tasks.agents import _hosts

    real = _hosts._Trial

    class Slow(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.2)  # the window, widened
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_hosts, "_Trial", Slow)

    async def main() -> int:
        first = _payments()
        with serve_trial(first, parse_hosts({"payments": production.url}, _urls(first))):
            threading.Thread(target=lambda: time.sleep(0.1)).start()  # not joined
        second = _payments()
        with serve_trial(second, parse_hosts({"payments": production.url}, _urls(second))):
            async with httpx.AsyncClient() as http:
                await http.post(production.url + "/v1/refunds", json={"order_id": "order_1042"})
        return len(second.ledger.effects)

    assert asyncio.run(main()) == 1
    assert production.hits == []


def test_executor_work_cancelled_before_it_ran_does_not_keep_the_interception_up() -> None:
    # The failing path (review P): the in-flight count dropped only when the work ran, so a
    # cancelled item kept respx patched into httpx for the rest of the process.
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from twice.tasks.agents import _hosts

    async def main() -> None:
        with serve_trial(_payments()), ThreadPoolExecutor(1) as pool:
            pool.submit(time.sleep, 0.2)
            assert pool.submit(time.sleep, 0.2).cancel()

    asyncio.run(main())
    assert _hosts._in_flight == {} and _hosts._mock is None


def test_a_late_requests_call_is_refused_and_reported_after_the_last_trial(
    production: Any,
) -> None:
    # The failing path (review P): the requests guard acted only while a trial ran, so a
    # thread's late call after the last trial went to production, unreported.
    import asyncio
    import threading

    import requests

    seen: list[str] = []

    def late() -> None:
        time.sleep(0.3)
        try:
            requests.post(production.url + "/v1/refunds", json={"order_id": "order_1042"})
        except Exception as ex:
            seen.append(type(ex).__name__)

    async def main() -> threading.Thread:
        services = _payments()
        with serve_trial(services, parse_hosts({"payments": production.url}, _urls(services))):
            thread = threading.Thread(target=late)
            thread.start()
        return thread

    take_late_requests()
    asyncio.run(main()).join()
    assert production.hits == [] and seen == ["AgentLimitError"]
    (late_request,) = take_late_requests()
    assert "(sent with requests) was sent after its trial ended" in late_request


def test_the_agent_guide_shows_the_table_the_slow_test_measures() -> None:
    # The guide's table of refunds per agent × fault × stub is TABLE, which
    # test_builtin_agents_reproduce_the_table measures.
    guide = Path(__file__).parents[2] / "docs" / "guides" / "own-agent.md"
    lines = guide.read_text(encoding="utf-8").splitlines()
    header = "| agent | fault | `stub/retry` | `stub/no-retry` | `stub/verify` |"
    start = lines.index(header)
    shown: dict[str, dict[str, tuple[int, ...]]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        agent, fault, *refunds = (c.strip().strip("`*") for c in line.strip("|").split("|"))
        counts = tuple(int(c.split()[0].strip("*")) for c in refunds)
        shown.setdefault(agent, {})[fault] = counts
    assert shown == TABLE


@pytest.mark.slow
def test_builtin_agents_name_who_sent_each_excess_refund(tmp_path: Path) -> None:
    """LangGraph's RetryPolicy re-sends a refund the model asked for once: the framework's.
    openai-agents and pydantic-ai show the model the error, and stub/retry asks again: the
    model's. The verdict says so."""
    runs = {
        ("langgraph-retry", "stub/no-retry"): "framework",
        ("openai-agents", "stub/retry"): "model",
        ("pydantic-ai", "stub/retry"): "model",
    }
    tasks = [
        task_with(
            refund(fault="lost_reply", agent=agent), model=get_model(stub), name=f"{agent}|{stub}"
        )
        for agent, stub in runs
    ]
    logs = _run(tasks, tmp_path, limit=1, max_tasks=3)
    for log in logs:
        agent, stub = log.eval.task.split("|")
        (sample,) = log.samples or []
        score = (sample.scores or {})["side_effects"]
        facts = score.metadata["effects"]
        assert [f["source"] for f in facts if f["excess"]] == [runs[agent, stub]], agent
        assert [f["source"] for f in facts if not f["excess"]] == ["initial"], agent
        if runs[agent, stub] == "framework":
            assert "re_2 at attempt 2 (framework: the model asked once)" in score.explanation
        else:
            assert "re_2 at attempt 2 (model)" in score.explanation
