"""Fixtures for the runner, gate and CLI tests: stub runs, fake providers, secret scans."""

from __future__ import annotations

import json
import math
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import pytest_httpx2  # noqa: F401  (registers respx's "httpcore2" mocker: openai/anthropic use httpx2)
import respx
import zipfile_zstd  # noqa: F401  (inspect's .eval archives are zstd-compressed zip files)
from click.testing import CliRunner
from twice.evals import run_suite, suite_from_flags
from twice.evals.cli import cli
from twice.mocks import UNKNOWN_OUTCOME
from twice.reports import CELL, METRICS

FAKE_OPENAI_KEY = "sk-test-SECRET123"
FAKE_ANTHROPIC_KEY = "sk-ant-test-SECRET456"


# -- running the CLI -----------------------------------------------------------------------


@dataclass
class Invocation:
    """What a ``twice`` command did."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def twice() -> Callable[..., Invocation]:
    """Run ``twice ARGS...`` in-process (so respx mocks apply) and capture its output."""

    def invoke(*args: str | Path) -> Invocation:
        result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
        return Invocation(result.exit_code, result.stdout, result.stderr)

    return invoke


# -- stub runs shared by the gate and report tests -----------------------------------------


@pytest.fixture(scope="session")
def stub_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stub/retry and stub/verify on the first 24 refund samples under lost_reply."""
    log_dir = tmp_path_factory.mktemp("stub-run") / "logs"
    suite = suite_from_flags(
        config=None,
        models=["stub/retry", "stub/verify"],
        prompts=[],
        tasks=["refund"],
        faults=["lost_reply"],
        protections=[],
        epochs=None,
        limit=24,
    )
    result = run_suite(suite, log_dir, display="none", report=False)
    assert result.ok, result.failed
    return log_dir


@pytest.fixture
def make_trials() -> Callable[..., pd.DataFrame]:
    """Build a synthetic trial frame: ``make_trials(n, duplicated=k, model=...)``.

    The first ``k`` trials are duplicated, the first ``completed`` are completed (default all);
    the first ``wrong`` have one effect with values other than asked (and are not completed);
    the first ``agent_crashed`` scored trials had an agent under test that raised;
    ``errors`` more trials are appended as crashed (metrics NaN, an error message).
    """

    def make(
        n: int,
        *,
        duplicated: int = 0,
        completed: int | None = None,
        errors: int = 0,
        agent_crashed: int = 0,
        wrong: int = 0,
        **cell: str,
    ) -> pd.DataFrame:
        keys = {"model": "m/a", "prompt": "baseline", "task": "refund", "fault": "lost_reply"}
        keys |= {"protection": "bare", "agent": "react"} | cell
        done = n if completed is None else completed
        rows: list[dict[str, Any]] = []
        for i in range(n + errors):
            crashed = i >= n
            dup = float(i < duplicated)
            bad = float(i < wrong)
            comp = float(i < done) * (1.0 - bad)
            row: dict[str, Any] = {k: keys[k] for k in CELL}
            row |= {m: math.nan if crashed else 0.0 for m in METRICS}
            if not crashed:
                row |= {
                    "completed": comp,
                    "duplicated": dup,
                    "excess_effects": dup,
                    "exactly_once": 1.0 - dup,
                    "safe_success": comp * (1.0 - dup),
                    "wrong": bad,
                    "wrong_effects": bad,
                }
            row |= {
                "epoch": 1,
                "sample": f"s{i}",
                "error": "RuntimeError('boom')" if crashed else "",
                "crashed": float(i < agent_crashed),
            }
            rows.append(row)
        return pd.DataFrame(rows)

    return make


# -- secrets -------------------------------------------------------------------------------


@pytest.fixture
def find_secret() -> Callable[[Path, str], list[str]]:
    """``find_secret(dir, secret)`` → every file (or ``file!member`` of a .eval) holding it."""

    def scan(root: Path, secret: str) -> list[str]:
        needle = secret.encode()
        hits = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes()
            if needle in data:
                hits.append(str(path))
            if zipfile.is_zipfile(path):
                with zipfile.ZipFile(path) as archive:
                    for member in archive.namelist():
                        if needle in archive.read(member):
                            hits.append(f"{path}!{member}")
        return hits

    return scan


# -- fake model providers (offline, through respx on httpx2) -------------------------------

_ORDER = re.compile(r"order_\d+")
_AMOUNT = re.compile(r"\$(\d+(?:\.\d+)?)")


def _intent(user_text: str) -> dict[str, Any]:
    """What a naive model would call: the order and amount named in the ticket."""
    order = _ORDER.search(user_text)
    amount = _AMOUNT.search(user_text)
    assert order and amount, f"fake model cannot read the ticket: {user_text!r}"
    return {"order_id": order.group(0), "amount": float(amount.group(1)), "reason": "per ticket"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(c) for c in content)
    if isinstance(content, dict):
        return _text(content.get("text") or content.get("content") or content.get("output") or "")
    return "" if content is None else str(content)


@dataclass
class FakeLLM:
    """A provider endpoint answering like a naive agent that retries after a lost reply.

    It refunds what the ticket asks; when the tool result says the outcome is unknown
    ("may or may not have been"), it calls the refund again; otherwise it reports done.
    """

    router: respx.Router
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def decide(self, api: str, body: dict[str, Any], user: str, last_tool: str | None) -> bool:
        """Record the request; True when the next turn is a refund call."""
        self.requests.append((api, body))
        return last_tool is None or UNKNOWN_OUTCOME in last_tool

    # Chat Completions -------------------------------------------------------------------
    def chat(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        msgs = body["messages"]
        user = next(_text(m["content"]) for m in msgs if m["role"] == "user")
        last = msgs[-1]
        last_tool = _text(last["content"]) if last["role"] == "tool" else None
        n = sum(m["role"] == "assistant" for m in msgs)
        if self.decide("chat", body, user, last_tool):
            call = {"name": "issue_refund", "arguments": json.dumps(_intent(user))}
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}],
            }
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": "The refund is done."}, "stop"
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320},
            },
        )

    # Responses API ----------------------------------------------------------------------
    def responses(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        items = body["input"]
        user = next(_text(i["content"]) for i in items if i.get("role") == "user")
        last = items[-1]
        last_tool = _text(last["output"]) if last.get("type") == "function_call_output" else None
        n = sum(i.get("type") == "function_call" for i in items)
        if self.decide("responses", body, user, last_tool):
            output: list[dict[str, Any]] = [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": "issue_refund",
                    "arguments": json.dumps(_intent(user)),
                    "status": "completed",
                }
            ]
        else:
            text = {"type": "output_text", "text": "The refund is done.", "annotations": []}
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [text],
                }
            ]
        usage = {
            "input_tokens": 300,
            "output_tokens": 20,
            "total_tokens": 320,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        return httpx.Response(
            200,
            json={
                "id": f"resp_{n}",
                "object": "response",
                "created_at": 0,
                "model": body["model"],
                "status": "completed",
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": usage,
            },
        )

    # Anthropic Messages (inspect streams it: server-sent events) ------------------------
    def anthropic(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        msgs = body["messages"]
        user = _text(msgs[0]["content"])
        last = msgs[-1]["content"]
        results = (
            [c for c in last if c.get("type") == "tool_result"] if isinstance(last, list) else []
        )
        last_tool = _text(results[-1].get("content")) if results else None
        n = sum(m["role"] == "assistant" for m in msgs)
        if self.decide("anthropic", body, user, last_tool):
            content = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{n}",
                    "name": "issue_refund",
                    "input": _intent(user),
                }
            ]
            stop = "tool_use"
        else:
            content, stop = [{"type": "text", "text": "The refund is done."}], "end_turn"
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "stop_sequence": None,
        }
        if not body.get("stream"):
            usage = {"input_tokens": 300, "output_tokens": 20}
            return httpx.Response(
                200, json={**message, "content": content, "stop_reason": stop, "usage": usage}
            )
        events: list[str] = []

        def emit(kind: str, data: dict[str, Any]) -> None:
            events.append(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n")

        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 300, "output_tokens": 1},
        }
        emit("message_start", {"message": start})
        for i, block in enumerate(content):
            if block["type"] == "tool_use":
                emit("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            else:
                emit(
                    "content_block_start",
                    {"index": i, "content_block": {"type": "text", "text": ""}},
                )
                delta = {"type": "text_delta", "text": block["text"]}
            emit("content_block_delta", {"index": i, "delta": delta})
            emit("content_block_stop", {"index": i})
        emit(
            "message_delta",
            {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 20}},
        )
        emit("message_stop", {})
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content="".join(events).encode()
        )


@pytest.fixture
def fake_llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    """Fake OpenAI (Chat Completions and Responses) and Anthropic endpoints, offline.

    Fake keys are set in the environment (the only place twice takes keys from); any request
    to an unmocked host fails the test.
    """
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_ANTHROPIC_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with respx.mock(using="httpcore2", assert_all_called=False, assert_all_mocked=True) as router:
        fake = FakeLLM(router)
        router.post("https://api.openai.com/v1/chat/completions", name="chat").mock(
            side_effect=fake.chat
        )
        router.post("https://api.openai.com/v1/responses", name="responses").mock(
            side_effect=fake.responses
        )
        router.post(url__regex=r"^https://api\.anthropic\.com/v1/messages", name="anthropic").mock(
            side_effect=fake.anthropic
        )
        yield fake


@pytest.fixture
def logged_text() -> Callable[[Path], str]:
    """Every log of a directory as JSON text, to search (a .eval is a zip of compressed
    members, so its bytes cannot be searched)."""
    from inspect_ai.log import read_eval_log

    def read(log_dir: Path) -> str:
        return "".join(read_eval_log(str(p)).model_dump_json() for p in log_dir.glob("*.eval"))

    return read


# -- a fake model endpoint on a real socket (outages, rate limits) -------------------------


@dataclass
class LLMServer:
    """The naive agent of :class:`FakeLLM` behind a real HTTP server on 127.0.0.1, for the
    ``openai-api/fake/<model>`` provider (Chat Completions), with outages on demand.

    ``fault(n)`` decides request ``n`` (0-based, counted across the server's life): None
    answers it; ``(status, headers)`` answers that error instead.
    """

    url: str
    fake: FakeLLM
    fault: Callable[[int], tuple[int, dict[str, str]] | None] = lambda n: None
    log: list[tuple[float, int, bool]] = field(default_factory=list)
    """Per request: when it arrived (monotonic), the status sent, and whether it started a
    trial (no assistant message yet)."""

    def starts(self, since: int = 0) -> int:
        """Trials started from request ``since`` on (first requests that were answered)."""
        return sum(1 for _, status, first in self.log[since:] if first and status == 200)


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    """A :class:`LLMServer`; the model string is ``openai-api/fake/refunder``."""
    import http.server
    import threading
    import time

    monkeypatch.setenv("FAKE_API_KEY", FAKE_OPENAI_KEY)
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            first = not any(m.get("role") == "assistant" for m in json.loads(body)["messages"])
            with lock:
                n = len(server.log)
                fault = server.fault(n)
                server.log.append((time.monotonic(), fault[0] if fault else 200, first))
            if fault is not None:
                status, headers = fault
                error = {"type": "overloaded_error", "message": f"HTTP {status} from the fake"}
                reply = httpx.Response(status, json={"error": error}, headers=headers)
            else:
                request = httpx.Request("POST", f"{server.url}{self.path[3:]}", content=body)
                reply = server.fake.chat(request)
            content = reply.read()
            self.send_response(reply.status_code)
            for key, value in reply.headers.items():
                if key.lower() not in ("content-length", "content-encoding"):
                    self.send_header(key, value)
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args: Any) -> None:
            pass

    http_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http_server.daemon_threads = True
    url = f"http://127.0.0.1:{http_server.server_address[1]}/v1"
    server = LLMServer(url, FakeLLM(respx.Router(assert_all_called=False)))
    monkeypatch.setenv("FAKE_BASE_URL", url)
    thread = threading.Thread(target=http_server.serve_forever, daemon=True)
    thread.start()
    yield server
    http_server.shutdown()
    http_server.server_close()
