"""The local model server: lifecycle, tool-call parsing into the ledger, counts, a dead server.

Tests with a scripted server (canned replies, no model) check the structure without depending
on what a model says; they need only Node.js. The ``real_model`` tests run the installed
Qwen model (``make real-setup``); CI installs it, elsewhere they skip when it is missing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log
from twice.evals import (
    LocalModelServer,
    ServerOptions,
    SuiteError,
    load_suite,
    local_model_server,
)
from twice.evals.local_model._server import MODEL, missing
from twice.reports import (
    PARSE_COLUMNS,
    parse_counts,
    read_log_dir,
    render_report,
    trials_frame,
)

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js on PATH")

FENCED_REFUND = (
    "I will issue the refund.\n```json\n"
    '{"name": "issue_refund", "arguments": {"order_id": "order_1042", "amount": 4.99, '
    '"reason": "arrived cracked"}}\n```'
)


def _suite(tmp_path: Path, replies: list[Any], **axes: str) -> Path:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    axes = {"tasks": "refund", "faults": "none", "protections": "bare", **axes}
    (tmp_path / "suite.toml").write_text(
        "epochs = 1\nlimit = 1\n"
        '[local_model]\nname = "scripted"\nscript = "replies.json"\n'
        '[[matrix]]\nmodels = ["openai-api/local/scripted"]\n'
        + "".join(f'{k} = ["{v}"]\n' for k, v in axes.items())
    )
    return tmp_path / "suite.toml"


def _port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


# -- without node: the parts that read logs and suite files ---------------------------------


def test_parse_counts_counts_each_shape_from_model_events() -> None:
    def event(shape: str) -> dict[str, Any]:
        return {"event": "model", "call": {"response": {"twice_parse": {"shape": shape}}}}

    counts = parse_counts([event("fenced"), event("fenced"), event("unparseable"), event("text")])
    assert counts == {
        "parse_tag": 0.0,
        "parse_fenced": 2.0,
        "parse_bare": 0.0,
        "parse_text": 1.0,
        "parse_unparseable": 1.0,
    }


def test_parse_counts_is_nan_for_a_model_not_served_by_twice() -> None:
    events = [{"event": "model", "call": {"response": {"choices": []}}}, {"event": "tool"}]
    assert all(math.isnan(v) for v in parse_counts(events).values())


def test_local_model_table_rejects_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[local_model]\nthreds = 2\n[[matrix]]\nmodels = ["stub/retry"]\n')
    with pytest.raises(SuiteError, match=r"unknown key\(s\) threds.*expected: name, threads"):
        load_suite(path)


def test_local_model_table_rejects_a_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[local_model]\nthreads = "two"\n[[matrix]]\nmodels = ["stub/retry"]\n')
    with pytest.raises(SuiteError, match=r"threads = 'two' is not a int"):
        load_suite(path)


@pytest.mark.parametrize(
    "line", ["threads = 0", "threads = -1", "context = 16", "temperature = -0.5",
             "max_tokens = 0", "startup_timeout = nan"],
)  # fmt: skip
def test_local_model_table_rejects_a_value_out_of_range(tmp_path: Path, line: str) -> None:
    # The failing path: types only were checked, so context = 16 ran every trial on a cut
    # prompt (counted as a valid 0% complete) and threads = 0 stalled every reply.
    path = tmp_path / "s.toml"
    path.write_text(f'[local_model]\n{line}\n[[matrix]]\nmodels = ["stub/retry"]\n')
    key = line.split(" = ")[0]
    with pytest.raises(SuiteError, match=rf"\[local_model\] {key} = .*; expected >= "):
        load_suite(path)


def test_real_suite_starts_the_local_model_at_temperature_zero_with_a_seed() -> None:
    suite = load_suite(Path(__file__).parents[2] / "evals" / "real.toml")
    local = suite.local_model
    assert local is not None
    assert f"openai-api/local/{local.name}" in suite.models()
    assert {"stub/retry", "stub/verify"} <= set(suite.models())
    config = local.generate_config()
    assert config["temperature"] == 0 and config["seed"] == 0


def test_server_refuses_to_start_without_the_install(tmp_path: Path) -> None:
    from twice.evals import LocalModelError

    with pytest.raises(LocalModelError, match=r"not installed.*make real-setup"):
        LocalModelServer(ServerOptions(home=tmp_path)).command()


def test_a_model_file_changed_at_its_size_is_refused_before_it_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: only the size was checked when the server started, so weights
    # damaged in place were served, and the run's numbers came from another model.
    import dataclasses
    import hashlib

    from twice.evals import LocalModelError
    from twice.evals.local_model import _server as _local

    fake = dataclasses.replace(_local.MODEL, file="m.gguf", size=3,
                               sha256=hashlib.sha256(b"abc").hexdigest())  # fmt: skip
    monkeypatch.setattr(_local, "MODEL", fake)
    weights = tmp_path / "models" / "m.gguf"
    weights.parent.mkdir()
    weights.write_bytes(b"abc")
    _local.verify_weights(tmp_path)  # hashed once, then remembered with the file's identity
    monkeypatch.setattr(_local, "sha256_of", lambda path: pytest.fail("hashed again"))
    _local.verify_weights(tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr(_local, "MODEL", fake)
    weights.write_bytes(b"abd")  # damaged in place, same size
    with pytest.raises(LocalModelError, match=r"m\.gguf has sha256 .*damaged or replaced"):
        _local.verify_weights(tmp_path)


def test_a_truncated_model_file_is_named_with_its_size(tmp_path: Path) -> None:
    # The failing path: "not installed (missing: the model file ...)" for a file that is
    # there, cut short (a copy that ran out of disk).
    weights = tmp_path / "models" / MODEL.file
    weights.parent.mkdir()
    weights.write_bytes(b"GGUF")
    assert f"the model file {weights} whole (4 bytes, not 491,400,064)" in missing(tmp_path)


def test_install_into_a_home_that_is_a_file_is_one_error(tmp_path: Path) -> None:
    # The failing path: a FileExistsError traceback (TWICE_LOCAL_MODEL_HOME naming a file).
    from twice.evals import LocalModelError
    from twice.evals.local_model._server import install

    home = tmp_path / "afile"
    home.write_text("")
    with pytest.raises(LocalModelError, match=r"cannot install into .*afile.*File exists"):
        install(home, say=lambda m: None)


# -- a scripted server (node, no model) --------------------------------------------------


@needs_node
@pytest.mark.slow
def test_scripted_server_starts_and_stops_cleanly(tmp_path: Path) -> None:
    script = tmp_path / "r.json"
    script.write_text(json.dumps(["hello"]))
    before = os.environ.get("LOCAL_BASE_URL")
    with local_model_server(ServerOptions(name="s", script=script)) as server:
        url = server.base_url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert os.environ["LOCAL_BASE_URL"] == url
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as r:
            assert json.loads(r.read())["status"] == "ok"
    assert server.returncode == 0  # SIGTERM → a clean exit, not a kill
    assert not _port_open(url)
    assert os.environ.get("LOCAL_BASE_URL") == before


@needs_node
@pytest.mark.slow
def test_a_server_whose_twice_process_is_gone_stops_itself(tmp_path: Path) -> None:
    # The failing path: a `twice run` killed with SIGKILL (or `twice local-model serve` with
    # SIGTERM) left the node server running for good, holding its port and ~800 MB.
    script = tmp_path / "r.json"
    script.write_text(json.dumps(["hello"]))
    parent = subprocess.Popen(["sleep", "60"])
    command = LocalModelServer(ServerOptions(name="s", script=script)).command()
    command[command.index("--parent") + 1] = str(parent.pid)
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline()  # it is up
        assert server.poll() is None
        parent.kill()
        parent.wait()
        assert server.wait(timeout=20) == 0
    finally:
        server.kill()
        parent.kill()


@needs_node
@pytest.mark.slow
def test_a_fenced_tool_call_becomes_an_attempt_on_the_ledger(tmp_path: Path, twice: Any) -> None:
    suite = _suite(tmp_path, [FENCED_REFUND, "The refund is done."])
    out = twice("run", "--config", str(suite), "--log-dir", str(tmp_path / "logs"))
    assert out.exit_code == 0, out.stderr
    frame = trials_frame(tmp_path / "logs")
    row = frame.iloc[0]
    assert row["attempts"] == 1 and row["effects"] == 1
    assert row["completed"] == 1 and row["duplicated"] == 0
    assert row["parse_fenced"] == 1 and row["parse_text"] == 1
    assert "local model replies: 2 (tag 0, fenced 1, bare 0, text 1, unparseable 0)" in out.stderr


@needs_node
@pytest.mark.slow
def test_every_reply_of_a_long_trial_is_counted(tmp_path: Path, twice: Any) -> None:
    # Inspect keeps the raw response of only the first 5 model calls per model per sample
    # unless log_model_api is on; the counts live in those responses, so turn 6 onwards went
    # uncounted (11 of 59 replies in a demo-real run).
    lookup = '```json\n{"name": "find_refunds", "arguments": {"order_id": "order_1042"}}\n```'
    suite = _suite(tmp_path, [lookup] * 7 + ["No refund needed."])
    out = twice("run", "--config", str(suite), "--log-dir", str(tmp_path / "logs"))
    assert out.exit_code == 0, out.stderr
    row = trials_frame(tmp_path / "logs").iloc[0]
    assert (row["parse_fenced"], row["parse_text"]) == (7, 1)


@needs_node
@pytest.mark.slow
def test_an_unparseable_reply_is_counted_and_reaches_the_report(tmp_path: Path, twice: Any) -> None:
    suite = _suite(tmp_path, ['<tool_call>{"name": "issue_refund", "arguments": {oops'])
    out = twice("run", "--config", str(suite), "--log-dir", str(tmp_path / "logs"))
    assert out.exit_code == 0, out.stderr
    frame = trials_frame(tmp_path / "logs")
    assert frame.iloc[0]["parse_unparseable"] == 1
    assert frame.iloc[0]["attempts"] == 0  # nothing reached the payments service
    html = render_report(frame)
    assert "Tool-call parsing by the local model server" in html
    assert '<td class="worse">1</td>' in html
    assert set(PARSE_COLUMNS) <= set(frame.columns)


@needs_node
@pytest.mark.slow
def test_a_dead_server_ends_the_run_with_exit_1(tmp_path: Path, twice: Any) -> None:
    suite = _suite(tmp_path, [{"exit": 3}])
    out = twice("run", "--config", str(suite), "--log-dir", str(tmp_path / "logs"))
    assert out.exit_code == 1
    assert "local model server exited with code 3 during the run" in out.stderr


def _until(tmp_path: Path, twice: Any, suite: Path, *extra: str) -> Any:
    """``twice run --config SUITE --until-decided GATE`` (a rule no single trial settles)."""
    gate = tmp_path / "gate.toml"
    gate.write_text('[[rule]]\nname = "dup"\nmetric = "duplication_rate"\nmax = 0.5\n')
    return twice("run", "--config", str(suite), "--until-decided", str(gate),
                 "--log-dir", str(tmp_path / "logs"), "--display", "none", *extra)  # fmt: skip


@needs_node
@pytest.mark.slow
def test_until_decided_starts_the_server_and_a_tool_call_reaches_the_ledger(
    tmp_path: Path, twice: Any
) -> None:
    suite = _suite(tmp_path, [FENCED_REFUND, "The refund is done."])
    # One trial is the cap: the round runs, then the cell stops undecided (exit 0: it all ran).
    out = _until(tmp_path, twice, suite, "--max-trials", "1")
    assert out.exit_code == 0, out.stderr
    assert "local model server ready at http://127.0.0.1:" in out.stderr
    assert "UNDECIDED at the 1-trial cap" in out.stdout
    row = trials_frame(tmp_path / "logs").iloc[0]
    assert row["attempts"] == 1 and row["effects"] == 1 and row["parse_fenced"] == 1
    assert "local model replies: 2 (tag 0, fenced 1, bare 0, text 1, unparseable 0)" in out.stderr
    # The suite's generate settings reached the eval (temperature 0, its seed).
    (log,) = read_log_dir(tmp_path / "logs").files
    config = read_eval_log(str(log), header_only=True).plan.config
    assert (config.temperature, config.seed) == (0, 0)


@needs_node
@pytest.mark.slow
def test_until_decided_ends_with_exit_1_when_the_server_dies(tmp_path: Path, twice: Any) -> None:
    suite = _suite(tmp_path, [{"exit": 3}])
    out = _until(tmp_path, twice, suite)
    assert out.exit_code == 1, out.output
    assert "local model server exited with code 3 during the run" in out.stderr
    assert out.stderr.count("twice: round:") == 1  # no round after the server died
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["complete"] is False and summary["status"] == "incomplete"


@needs_node
@pytest.mark.slow
def test_ctrl_c_during_a_local_model_run_exits_130_and_stops_the_server(tmp_path: Path) -> None:
    suite = _suite(tmp_path, [{"sleep": 120, "reply": "too late"}])
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "twice.evals.cli", "run", "--config", str(suite),
         "--log-dir", str(log_dir), "--display", "none"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # wait until the server is up, then for the eval to ask it
        lines.append(line)
        if "local model server ready at" in line:
            url = line.rsplit(" ", 1)[-1].strip()
            break
    else:
        raise AssertionError("".join(lines))
    deadline = time.monotonic() + 60
    while not list(log_dir.glob("*.eval")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the trial is now waiting on the slow reply
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[1]
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    assert "interrupted by SIGINT" in out and "local model server stopped" in out
    assert not _port_open(url)
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] == "SIGINT"


# -- the real model (installed by `make real-setup`) ------------------------------------------


def _real_installed() -> None:
    lacking = missing()
    if lacking:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the local model (make real-setup); missing: {lacking}")
        pytest.skip(f"the local model is not installed (make real-setup): {lacking}")


REFUND_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": "Issue a refund for an order.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": "The order id."},
                    "amount": {"type": "number", "description": "Amount in USD."},
                },
                "required": ["order_id", "amount"],
            },
        },
    }
]


@pytest.mark.slow
def test_real_model_server_answers_a_tool_request_and_stops_cleanly() -> None:
    _real_installed()
    body = {
        "model": MODEL.name,
        "messages": [{"role": "user", "content": "Refund $4.99 on order order_1042."}],
        "tools": REFUND_TOOLS,
        "max_tokens": 96,
    }
    with LocalModelServer(ServerOptions()) as server:
        request = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as r:
            reply = json.loads(r.read())
        url = server.base_url
    assert reply["object"] == "chat.completion"
    assert reply["twice_parse"]["shape"] in {"tag", "fenced", "bare", "text", "unparseable"}
    message = reply["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        assert call["function"]["name"] == "issue_refund"
        json.loads(call["function"]["arguments"])  # arguments are valid JSON
    assert reply["usage"]["prompt_tokens"] > 0
    assert server.returncode == 0
    assert not _port_open(url)


@pytest.mark.slow
def test_real_model_server_refuses_a_prompt_longer_than_its_context() -> None:
    # The failing path: a prompt over the context was cut and answered with a 200, so the
    # trial counted as a real result (0% complete) instead of an error.
    _real_installed()
    body = {
        "model": MODEL.name,
        "messages": [{"role": "user", "content": "refund order_1042 please. " * 200}],
        "max_tokens": 8,
    }
    with LocalModelServer(ServerOptions(context=512)) as server:
        request = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=600)
    assert refused.value.code == 400
    assert "more than the model's context of 512" in refused.value.read().decode()


@pytest.mark.slow
def test_real_model_trial_runs_through_inspects_openai_provider(tmp_path: Path, twice: Any) -> None:
    _real_installed()
    (tmp_path / "real.toml").write_text(
        "epochs = 1\nlimit = 1\n"
        f'[local_model]\nname = "{MODEL.name}"\nmax_tokens = 160\n'
        f'[[matrix]]\nmodels = ["openai-api/local/{MODEL.name}"]\n'
        'tasks = ["refund"]\nfaults = ["lost_reply"]\nprotections = ["bare"]\n'
    )
    out = twice("run", "--config", str(tmp_path / "real.toml"), "--log-dir", str(tmp_path / "logs"))
    assert out.exit_code == 0, out.stderr
    frame = trials_frame(tmp_path / "logs")
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["error"] == ""  # scored, whatever the model chose
    replies = sum(row[c] for c in PARSE_COLUMNS)
    assert replies >= 1  # every reply was read by the server and counted
    assert "local model server ready at http://127.0.0.1:" in out.stderr
