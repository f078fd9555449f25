"""The real-provider path, offline: inspect's openai and anthropic providers against fakes.

The fake endpoints (conftest ``fake_llm``) answer like a naive agent: refund what the ticket
asks, and call the refund again when the tool says the outcome is unknown. Under
``lost_reply`` the service committed the first refund, so the ledger must show two.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log
from twice.mocks import LEDGER_STORE_KEY, UNKNOWN_OUTCOME

Twice = Callable[..., Any]

PROVIDERS = [
    pytest.param("openai/gpt-4o-mini", ["-M", "responses_api=false"], "chat", id="openai-chat"),
    pytest.param(
        "openai/gpt-4o-mini", ["-M", "responses_api=true"], "responses", id="openai-responses"
    ),
    pytest.param("anthropic/claude-sonnet-4-5", [], "anthropic", id="anthropic"),
]
SECRETS = ["sk-test-SECRET123", "sk-ant-test-SECRET456"]


def _run(twice: Twice, log_dir: Path, model: str, extra: list[str]) -> Any:
    return twice(
        "run", "--model", model, *extra, "--task", "refund", "--fault", "lost_reply",
        "--limit", "2", "--log-dir", log_dir, "--display", "none",
    )  # fmt: skip


@pytest.mark.parametrize(("model", "extra", "route"), PROVIDERS)
def test_real_provider_retry_after_lost_reply_duplicates_the_refund(
    twice: Twice,
    fake_llm: Any,
    find_secret: Callable[[Path, str], list[str]],
    tmp_path: Path,
    model: str,
    extra: list[str],
    route: str,
) -> None:
    log_dir = tmp_path / "logs"
    result = _run(twice, log_dir, model, extra)
    assert result.exit_code == 0, result.output

    # The provider really went through the mocked endpoint, and the model saw the lost reply.
    assert fake_llm.router.routes[route].call_count == 6  # 2 trials × (call, retry, answer)
    assert {api for api, _ in fake_llm.requests} == {route}
    assert any(UNKNOWN_OUTCOME in json.dumps(body) for _, body in fake_llm.requests)

    # The ledger (ground truth, not the transcript) holds both refunds of each order.
    (log_file,) = log_dir.glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "success" and log.eval.model == model
    assert log.samples is not None and len(log.samples) == 2
    for sample in log.samples:
        effects = sample.store[LEDGER_STORE_KEY]["effects"]
        orders = [e["fields"]["order_id"] for e in effects]
        assert len(effects) == 2 and len(set(orders)) == 1, effects
        assert sample.scores is not None
        assert sample.scores["side_effects"].value["duplicated"] == 1.0

    summary = json.loads((log_dir / "summary.json").read_text())
    (cell,) = summary["cells"]
    assert (cell["model"], cell["duplication_rate"], cell["completion_rate"]) == (model, 1.0, 1.0)
    assert cell["tokens_mean"] == 3 * 320  # the fake's usage, three calls per trial

    # Keys came from the environment and went nowhere else (logs, summary.json, report.html).
    assert (log_dir / "report.html").is_file()
    for secret in SECRETS:
        assert find_secret(log_dir, secret) == []


def test_real_provider_openai_api_service_reads_base_url_and_key_from_env(
    twice: Twice, fake_llm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # openai-api/<service>/<model>: <SERVICE>_BASE_URL and <SERVICE>_API_KEY.
    monkeypatch.setenv("ACME_BASE_URL", "https://llm.acme.test/v1")
    monkeypatch.setenv("ACME_API_KEY", "acme-SECRET789")
    route = fake_llm.router.post("https://llm.acme.test/v1/chat/completions", name="acme")
    route.mock(side_effect=fake_llm.chat)
    log_dir = tmp_path / "logs"
    result = _run(twice, log_dir, "openai-api/acme/acme-large", [])
    assert result.exit_code == 0, result.output
    assert route.call_count == 6
    assert route.calls[0].request.headers["authorization"] == "Bearer acme-SECRET789"
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["cells"][0]["duplication_rate"] == 1.0


def test_real_provider_secret_scan_finds_a_planted_key(
    find_secret: Callable[[Path, str], list[str]], stub_logs: Path, tmp_path: Path
) -> None:
    # The scanner must be able to fail: plant the key in a plain file and inside a .eval.
    import shutil
    import zipfile

    logs = tmp_path / "logs"
    shutil.copytree(stub_logs, logs)
    (logs / "summary.json").write_text('{"key": "sk-test-SECRET123"}')
    eval_file = next(logs.glob("*.eval"))
    with zipfile.ZipFile(eval_file, "a") as archive:
        archive.writestr("planted.json", '{"api_key": "sk-test-SECRET123"}')
    hits = find_secret(logs, "sk-test-SECRET123")
    assert str(logs / "summary.json") in hits
    assert f"{eval_file}!planted.json" in hits
