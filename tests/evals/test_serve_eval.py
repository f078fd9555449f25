"""An eval whose stub models drive a served trial over MCP reproduces the refund reference
table (the README's "Reference results") through inspect's ``mcp_server_http``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from inspect_ai import eval as inspect_eval
from twice.evals import running_server, served_task

CASES = [
    # (fault, protection, model, refunds)
    ("lost_reply", "bare", "stub/retry", 2),
    ("lost_reply", "bare", "stub/no-retry", 1),
    ("lost_reply", "bare", "stub/verify", 1),
    ("timeout_before_commit", "bare", "stub/retry", 1),
    ("timeout_before_commit", "bare", "stub/no-retry", 0),
    ("timeout_before_commit", "bare", "stub/verify", 1),
    ("lost_reply", "retry-nokey", "stub/no-retry", 2),
    ("lost_reply", "retry-randomkey", "stub/no-retry", 2),
    ("lost_reply", "retry-stepkey", "stub/no-retry", 1),
    ("lost_reply", "lookup", "stub/no-retry", 1),
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server() as running:
        yield running.url


@pytest.mark.slow
def test_served_eval_over_mcp_reproduces_the_reference_table(server: str, tmp_path: Path) -> None:
    by_cell = {}
    for fault, protection in sorted({(f, p) for f, p, _, _ in CASES}):
        models = [m for f, p, m, _ in CASES if (f, p) == (fault, protection)]
        task = served_task("refund", server, fault=fault, protection=protection)
        logs = inspect_eval(
            task, model=models, limit=1, display="none", log_dir=str(tmp_path), max_tasks=3
        )
        for log in logs:
            assert log.status == "success", log.error
            sample = log.samples[0]
            assert sample.error is None, sample.error
            # The ledger is in the sample store, as in any twice log.
            effects = sample.store["twice:ledger"]["effects"]
            by_cell[(fault, protection, log.eval.model)] = len(effects)
            score = sample.scores["side_effects"]
            assert score.value["duplicated"] == float(len(effects) > 1)
    assert by_cell == {(f, p, m): n for f, p, m, n in CASES}


@pytest.mark.slow
def test_served_eval_with_a_token_keeps_it_out_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "tok-" + "7" * 24
    monkeypatch.setenv("TWICE_SERVE_TOKEN", token)
    with running_server(token=token) as running:
        task = served_task("refund", running.url, fault="lost_reply")
        [log] = inspect_eval(
            task, model="stub/no-retry", limit=1, display="none", log_dir=str(tmp_path)
        )
    assert log.status == "success" and log.samples[0].error is None
    assert len(log.samples[0].store["twice:ledger"]["effects"]) == 1
    # The .eval file is a zip: look in what it holds, not its compressed bytes.
    from inspect_ai.log import read_eval_log

    assert token not in read_eval_log(log.location).model_dump_json()


def test_served_and_local_tasks_log_the_same_prompt_facts(tmp_path: Path) -> None:
    # Every log header carries the eval's metadata: a served task logged its prompt's whole
    # text there, a local task a digest, the size and an excerpt. Both now log the latter.
    from twice.tasks import refund

    prompt = tmp_path / "long.txt"
    prompt.write_text("Refund the customer exactly once. " * 2000, encoding="utf-8")
    served = served_task("refund", "http://127.0.0.1:9", prompt=str(prompt)).metadata["twice"]
    local = refund(prompt=str(prompt)).metadata["twice"]
    facts = ("prompt", "prompt_source", "prompt_sha256", "prompt_text", "prompt_bytes")
    assert {k: served[k] for k in facts} == {k: local[k] for k in facts}
    assert served["prompt_bytes"] == 68_000 and len(served["prompt_text"]) < 68_000 // 10


@pytest.mark.parametrize("fault", ["ask_again", "timeout_before_commit+compaction"])
def test_served_task_mcp_agent_refuses_a_conversation_fault(fault: str) -> None:
    # The MCP agent is inspect's generate over the server's tools: nothing would ask it again
    # or compact what its model reads, so the cell would measure the wire fault alone.
    with pytest.raises(ValueError, match=re.escape(f"fault {fault!r} changes the conversation")):
        served_task("refund", "http://127.0.0.1:1", fault=fault)


def test_requests_to_the_server_load_the_ca_bundle_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx builds a TLS context for every new client (about 30 ms of CPU, the CA bundle
    # read again), and a served trial makes three clients.
    import ssl

    from twice.evals.serve import _eval

    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    _eval._tls.cache_clear()
    for _ in range(3):
        _eval.server_client()
    assert len(loads) == 1
