"""Model endpoints that cannot be reached end the run: bounded, exit 1, one line naming the
endpoint and the reason (with ``--display none`` too), and a key a gateway echoes back is
never written anywhere."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from twice.evals.run._endpoint import scrub_exception
from twice.evals.run._secrets import redact_url
from twice.tasks import REDACTED, scrub, scrub_value, secret_values

SECRET = "sk-test-ECHOED-KEY-0123456789"
Twice = Callable[..., Any]


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "401"
    requests: list[str]
    released: threading.Event
    """Set when the test ends: a request left hanging is let go."""

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.requests.append(self.path)
        HEADERS.append(dict(self.headers))
        if self.mode == "ok":  # a chat completions server whose model just says it is done
            self._reply(200, _done(json.loads(raw)["model"]))
            return
        if self.mode == "hang":
            self.released.wait(30)  # longer than any --timeout below
            return
        status = {"401": 401, "429": 429, "chat-only": 404}.get(self.mode, 500)
        # A careless gateway echoes the request's credentials into its error.
        message = f"rejected; Authorization: {self.headers.get('Authorization')}"
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
        self.send_response(status)
        if status == 429:
            self.send_header("retry-after", "0")
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def _reply(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _done(model: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": "Done."}
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32},
    }  # fmt: skip


REQUESTS: list[str] = []
"""The requests the endpoint fixture's servers got, in this test."""
HEADERS: list[dict[str, str]] = []
"""Their headers."""


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """``endpoint(mode)`` → a base URL on 127.0.0.1 that answers 401, 500, hangs, is dead, or
    (``ok``) answers chat completions."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    servers: list[http.server.ThreadingHTTPServer] = []
    requests = REQUESTS
    requests.clear()
    HEADERS.clear()

    def start(mode: str) -> str:
        if mode == "dead":
            with socket.socket() as s:  # a port nothing listens on
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            return f"http://127.0.0.1:{port}/v1"
        attrs = {"mode": mode, "requests": requests, "released": released}
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Handler,), attrs))
        # Request threads the server joins when closed: a hanging one left running would
        # outlive the test, and with it every later run in this process would start its
        # workers as fresh interpreters (a fork is ruled out while another thread runs).
        server.daemon_threads = False
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    released = threading.Event()
    yield start
    released.set()
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("401", "HTTP 401 unauthorized"),
        ("500", "HTTP 500 server error"),
        ("hang", "no answer within 2 s"),
        # A refused connection on a loaded machine may take the attempt's 2 s first: either
        # reason names what happened.
        ("dead", "APIConnectionError|no answer within 2 s"),
    ],
)
def test_endpoints_unreachable_model_exits_1_naming_endpoint_and_reason(
    twice: Twice,
    endpoint: Callable[[str], str],
    find_secret: Callable[[Path, str], list[str]],
    tmp_path: Path,
    mode: str,
    reason: str,
) -> None:
    url = endpoint(mode)
    log_dir = tmp_path / "logs"
    # Room on a loaded machine, so the 500 (not the attempt timeout) is what ends an attempt.
    timeout = "2" if mode in ("hang", "dead") else "20"
    started = time.monotonic()
    result = twice(
        "run", "--model", "openai/gpt-4o-mini", "-M", f"base_url={url}", "--task", "refund",
        "--fault", "none", "--limit", "6", "--log-dir", log_dir, "--display", "none",
        "--timeout", timeout, "--max-retries", "1",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: model 'openai/gpt-4o-mini' at {url} could not be reached: "
        + lines[0].split("could not be reached: ", 1)[1]
    ], result.stderr
    assert re.search(reason, lines[0])
    # Bounded: two attempts per call and then every other trial fails at once, well below
    # inspect's default of retrying without end.
    assert elapsed < 90, f"took {elapsed:.0f} s"
    assert find_secret(log_dir, SECRET) == []
    assert SECRET not in result.output
    summary = json.loads((log_dir / "summary.json").read_text())
    # Every trial errored: none is in the rates, and a rerun runs them again. The summary
    # said "complete": true, as if the run's numbers were final.
    assert summary["complete"] is False and summary["status"] == "incomplete"
    assert summary["errored"] == 6 and "missing" not in summary
    report = (log_dir / "report.html").read_text(encoding="utf-8")
    assert "The run is incomplete: 6 trial(s) errored and are left out of the rates" in report


@pytest.mark.parametrize("retries", [0, 1])
def test_endpoints_max_retries_is_the_number_of_requests_retried(
    twice: Twice, endpoint: Callable[[str], str], tmp_path: Path, retries: int
) -> None:
    # The failing path: the OpenAI client's own 2 retries ran inside each of inspect's
    # attempts, so --max-retries 0 sent 3 requests and the error line said "1 attempts".
    url = endpoint("500")
    result = twice(
        "run", "--model", "openai/gpt-4o-mini", "-M", f"base_url={url}", "--task", "refund",
        "--fault", "none", "--limit", "1", "--log-dir", tmp_path / "logs", "--display", "none",
        "--timeout", "20", "--max-retries", str(retries),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert len(REQUESTS) == retries + 1
    assert f"({retries + 1} attempt(s) of one call failed in a row and no call has" in (
        result.stderr
    )


def test_endpoints_a_rate_limit_on_every_attempt_says_so(
    twice: Twice, endpoint: Callable[[str], str], tmp_path: Path
) -> None:
    # The failing path: the line quoted tenacity's "RetryError(<Future at 0x... state=finished
    # raised RateLimitError>)", naming neither the 429 nor what to change.
    url = endpoint("429")
    result = twice(
        "run", "--model", "openai/gpt-4o-mini", "-M", f"base_url={url}", "--task", "refund",
        "--fault", "none", "--limit", "1", "--log-dir", tmp_path / "logs", "--display", "none",
        "--timeout", "20", "--max-retries", "0",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "RetryError" not in result.stderr
    line = " ".join(result.stderr.split())
    assert "could not be reached: HTTP 429 rate limited" in line, result.stderr
    assert "the endpoint kept refusing: give fewer --max-connections" in line


def test_endpoints_secret_echo_is_scrubbed_from_sample_errors_and_report(
    twice: Twice,
    endpoint: Callable[[str], str],
    find_secret: Callable[[Path, str], list[str]],
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "logs"
    result = twice(
        "run", "--model", "openai/gpt-4o-mini", "-M", f"base_url={endpoint('401')}",
        "--task", "refund", "--fault", "none", "--limit", "1", "--log-dir", log_dir,
        "--display", "none", "--max-retries", "0",
    )  # fmt: skip
    assert result.exit_code == 1
    assert find_secret(log_dir, SECRET) == []
    assert REDACTED in (log_dir / "report.html").read_text()
    report = tmp_path / "again.html"
    assert twice("report", log_dir, "-o", report).exit_code == 0
    assert SECRET not in report.read_text()


GATEWAY_KEY = "gw-SECRET-in-a-longer-value-0123"


def test_a_key_inside_longer_model_args_reaches_the_provider_and_no_file(
    twice: Twice,
    endpoint: Callable[[str], str],
    find_secret: Callable[[Path, str], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The failing path: only a model arg *equal* to a key was refused or scrubbed; one holding
    # it (a gateway's key in the base_url path or fragment, an organization built from it)
    # went to inspect as it was, which wrote it into header.json, _journal/start.json,
    # logs.json and eval-set.json (its trace file has a test of its own, below).
    from inspect_ai.log import read_eval_log

    monkeypatch.setenv("GW_API_KEY", GATEWAY_KEY)
    url = endpoint("ok").removesuffix("/v1") + f"/{GATEWAY_KEY}/v1#{GATEWAY_KEY}"
    log_dir = tmp_path / "logs"
    result = twice(
        "run", "--model", "openai-api/gw/probe-model", "-M", f"base_url={url}",
        "-M", f"organization={GATEWAY_KEY}-suffix", "--task", "refund", "--fault", "none",
        "--limit", "1", "--log-dir", log_dir, "--display", "none", "--max-retries", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # The provider got the values as given: the call went where it was meant to.
    assert REQUESTS and REQUESTS[0] == f"/{GATEWAY_KEY}/v1/chat/completions"
    sent = {k.lower(): v for k, v in HEADERS[0].items()}
    assert sent.get("openai-organization") == f"{GATEWAY_KEY}-suffix", sorted(sent)
    # No file holds the key: the .eval members (zstd, read through zipfile_zstd),
    # logs.json, eval-set.json, summary.json, report.html.
    names = {p.name for p in log_dir.iterdir()}
    assert {"logs.json", "eval-set.json", "summary.json", "report.html"} <= names
    assert find_secret(log_dir, GATEWAY_KEY) == []
    assert GATEWAY_KEY not in result.output
    (log,) = log_dir.glob("*.eval")
    header = read_eval_log(str(log), header_only=True).eval
    assert header.model_args["organization"] == f"{REDACTED}-suffix"
    assert header.model_base_url == url.replace(GATEWAY_KEY, REDACTED)
    # A rerun into the same directory resumes the finished log: the recorded (scrubbed)
    # args are the task's identity on both sides.
    again = twice(
        "run", "--model", "openai-api/gw/probe-model", "-M", f"base_url={url}",
        "-M", f"organization={GATEWAY_KEY}-suffix", "--task", "refund", "--fault", "none",
        "--limit", "1", "--log-dir", log_dir, "--display", "none", "--max-retries", "0",
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert len(REQUESTS) == 1 and list(log_dir.glob("*.eval")) == [log]


def test_inspects_trace_file_has_a_key_inside_a_url_scrubbed(
    endpoint: Callable[[str], str], tmp_path: Path
) -> None:
    # Inspect logs each request's URL to a trace file of the process's own, in its data
    # directory, which keeps only the ten newest: a process of its own, with a data
    # directory of its own, so no other inspect process rotates the file away.
    data = tmp_path / "data"
    env = {**os.environ, "GW_API_KEY": GATEWAY_KEY, "XDG_DATA_HOME": str(data)}
    url = endpoint("ok").removesuffix("/v1") + f"/{GATEWAY_KEY}/v1#{GATEWAY_KEY}"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("twice")), "run", "--model",
         "openai-api/gw/probe-model", "-M", f"base_url={url}", "--task", "refund",
         "--fault", "none", "--limit", "1", "--log-dir", str(tmp_path / "logs"),
         "--display", "none", "--max-retries", "0", "--no-report"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert REQUESTS and REQUESTS[0] == f"/{GATEWAY_KEY}/v1/chat/completions"
    (path,) = data.rglob("trace-*.log*")
    trace = (
        gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    ).decode("utf-8")
    assert f"/{REDACTED}/v1/chat/completions" in trace
    assert GATEWAY_KEY not in trace


def test_a_model_name_holding_a_key_is_refused_naming_the_variable(
    twice: Twice,
    endpoint: Callable[[str], str],
    find_secret: Callable[[Path, str], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The failing path: the run went ahead and inspect wrote the name (key and all) into
    # every log file and model event.
    monkeypatch.setenv("GW_API_KEY", GATEWAY_KEY)
    log_dir = tmp_path / "logs"
    result = twice(
        "run", "--model", f"openai-api/gw/{GATEWAY_KEY}", "-M", f"base_url={endpoint('ok')}",
        "--task", "refund", "--fault", "none", "--limit", "1", "--log-dir", log_dir,
        "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert GATEWAY_KEY not in result.output
    assert "holds the value of GW_API_KEY" in result.stderr
    assert f"'openai-api/gw/{REDACTED}'" in result.stderr
    assert REQUESTS == [] and (not log_dir.exists() or find_secret(log_dir, GATEWAY_KEY) == [])


def test_endpoints_scrub_exception_follows_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    try:
        try:
            raise OSError(f"header x-api-key: {SECRET}")
        except OSError as inner:
            raise RuntimeError(f"wrapped {SECRET}") from inner
    except RuntimeError as ex:
        scrub_exception(ex)
        assert SECRET not in str(ex) and SECRET not in str(ex.__cause__)
        assert REDACTED in str(ex.__cause__)


def test_endpoints_secret_values_and_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_API_KEY", SECRET)
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to scrub without garbling text
    monkeypatch.setenv("HOME_DIR_NAME", "not-a-secret-at-all")
    values = secret_values()
    assert SECRET in values and "abc" not in values and "not-a-secret-at-all" not in values
    assert scrub(f"Bearer {SECRET}.") == f"Bearer {REDACTED}."
    assert redact_url("http://u:pw@host:8/v1?api-key=zz&x=1") == (
        f"http://{REDACTED}@host:8/v1?api-key={REDACTED}&x=1"
    )


def test_endpoints_a_base_url_password_is_scrubbed_as_sent_too() -> None:
    # The failing path: a gateway echoing the Authorization header of a base URL with
    # user:password@ put "Basic Ym9iOnB3..." (base64 of bob:pw-SECRET456) in the log.
    import base64

    env = {"OPENAI_BASE_URL": "http://bob:pw-SECRET456@127.0.0.1:18431/v1"}
    echoed = "you sent Basic " + base64.b64encode(b"bob:pw-SECRET456").decode()
    assert scrub(echoed, secret_values(env)) == f"you sent Basic {REDACTED}"
    assert "pw-SECRET456" not in scrub("userinfo bob:pw-SECRET456", secret_values(env))
    assert secret_values({"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}) == []


def test_scrub_value_reaches_into_inspect_objects_and_leaves_clean_ones_alone() -> None:
    from inspect_ai.model import ChatMessageSystem, ChatMessageUser, ContentText, ModelOutput

    secrets = ["tok-SECRET789"]
    clean = [ChatMessageUser(content="refund order_1")]
    assert scrub_value(clean, secrets) is clean  # nothing to scrub: the same objects
    leaky = [
        ChatMessageSystem(content="token tok-SECRET789"),
        ChatMessageUser(content=[ContentText(text="and tok-SECRET789 again")]),
    ]
    scrubbed = scrub_value(leaky, secrets)
    assert "tok-SECRET789" not in str([m.model_dump() for m in scrubbed])
    assert scrubbed[0].text == f"token {REDACTED}" and type(scrubbed[1]) is ChatMessageUser
    assert leaky[0].text == "token tok-SECRET789"  # a copy: the caller's objects are kept
    output = ModelOutput.from_content("m", "done with tok-SECRET789")
    assert scrub_value(output, secrets).completion == f"done with {REDACTED}"
    assert scrub_value(({"tok-SECRET789": 1},), secrets) == ({REDACTED: 1},)


def test_a_call_that_timed_out_on_every_attempt_names_timeout_not_only_retries() -> None:
    # The line said "(the model call's retries, --max-retries, ran out)": more retries of a
    # hanging model only wait longer; --timeout is the setting that decides.
    from twice.evals.run._summary import _readable

    gave_up = "RetryError(<Future at 0x7f3a2c state=finished raised {}>)"
    line = _readable(gave_up.format("APITimeoutError"))
    assert line.startswith("APITimeoutError on every attempt: the model did not answer within")
    assert "--timeout" in line
    assert "longer than --outage-window" in _readable(gave_up.format("APIConnectionError"))


def test_a_404_from_the_responses_api_says_how_to_reach_a_chat_only_server(
    twice: Twice, endpoint: Callable[[str], str], tmp_path: Path
) -> None:
    # "could not be reached: HTTP 404 not found" on a server that was up: inspect sends a
    # model name it does not know to /responses, which vLLM, llama.cpp and gateways lack.
    url = endpoint("chat-only")
    result = twice(
        "run", "--model", "openai/my-local-model", "-M", f"base_url={url}", "--task", "refund",
        "--fault", "none", "--limit", "1", "--log-dir", tmp_path / "logs", "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert REQUESTS and REQUESTS[0].endswith("/responses")
    assert "HTTP 404" in result.stderr
    assert "for a server with chat completions only, add -M responses_api=false" in " ".join(
        result.stderr.split()
    )


def test_scrub_agent_trace_reaches_a_model_calls_attachments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real provider's model event keeps its raw request and response (ModelCall); inspect
    # moves any long text of it into the transcript's attachments as it records the event,
    # leaving "attachment://<hash>". Scrubbing the events' fields left the key there.
    from inspect_ai.event import ModelEvent
    from inspect_ai.log._transcript import Transcript, init_transcript, transcript
    from inspect_ai.model import ChatMessageUser, GenerateConfig, ModelOutput
    from inspect_ai.model._model_call import ModelCall
    from inspect_ai.solver import TaskState
    from twice.tasks.agents import scrub_agent_trace

    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-SECRET789-never-logged")
    init_transcript(Transcript())
    long = "use tok-SECRET789-never-logged " + "x" * 200
    call = ModelCall.create(
        request={"messages": [{"role": "user", "content": long}]},
        response={"choices": [{"message": {"content": long}}]},
    )
    transcript()._event(
        ModelEvent(
            model="openai/gpt-4o", input=[ChatMessageUser(content=long)], tools=[],
            tool_choice="auto", config=GenerateConfig(),
            output=ModelOutput.from_content("openai/gpt-4o", long), call=call,
        )
    )  # fmt: skip
    assert any("SECRET789" in v for v in transcript().attachments.values())  # the premise
    state = TaskState(model="openai/gpt-4o", sample_id=1, epoch=1, input="hi", messages=[])
    scrub_agent_trace(state, since=0)
    assert "SECRET789" not in transcript().events[0].model_dump_json()
    assert not any("SECRET789" in v for v in transcript().attachments.values())
