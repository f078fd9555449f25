"""``twice serve --openapi``: a service made from Stripe's published document, over loopback,
driven by the official Stripe SDK unchanged."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
from twice.evals.serve import ServeError, running_server
from twice.evals.serve._server import openapi_tasks

DOCS = Path(__file__).parents[1] / "mocks" / "openapi_docs"
STRIPE = DOCS / "stripe.json"
TWILIO = DOCS / "twilio_messages.json"
EXAMPLES = Path(__file__).parents[2] / "docs" / "examples" / "openapi"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server(
        openapi=[f"stripe={STRIPE},{EXAMPLES / 'stripe_overrides.yaml'}", f"twilio={TWILIO}"]
    ) as running:
        yield running.url


@pytest.fixture
def trial(server: str) -> Callable[..., dict[str, Any]]:
    def make(**body: Any) -> dict[str, Any]:
        r = httpx.post(f"{server}/_twice/trials", json={"task": "stripe", **body})
        assert r.status_code == 201, r.text
        return dict(r.json())

    return make


def ledger(server: str, trial: dict[str, Any]) -> dict[str, Any]:
    r = httpx.get(f"{server}/_twice/trials/{trial['id']}/ledger")
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture
def stripe_sdk() -> Iterator[Callable[[str], None]]:
    saved = (
        stripe.api_key,
        stripe.api_base,
        stripe.default_http_client,
        stripe.max_network_retries,
    )

    def point(url: str) -> None:
        stripe.api_key = "sk_test_twice_not_a_secret"
        stripe.api_base = url
        stripe.default_http_client = stripe.RequestsClient(timeout=5)

    yield point
    stripe.api_key, stripe.api_base, stripe.default_http_client, stripe.max_network_retries = saved


def test_serve_openapi_trial_has_the_generated_service(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial()
    assert t["urls"]["stripe"] == f"{server}/t/{t['id']}/stripe"
    assert t["sample"] == "stripe-1"
    r = httpx.get(f"{t['urls']['stripe']}/v1/refunds")
    assert r.status_code == 200 and r.json()["data"] == []


def test_serve_openapi_stripe_sdk_own_retries_refund_once(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str], None]
) -> None:
    t = trial(fault="reset_after_commit")
    stripe_sdk(t["urls"]["stripe"])
    stripe.max_network_retries = 2
    refund = stripe.Refund.create(charge="ch_1", amount=499)
    assert (refund.id, refund.amount, refund.object) == ("re_1", 499, "refund")
    attempts = ledger(server, t)["attempts"]
    assert attempts[0]["key"] == attempts[1]["key"] and attempts[1]["replayed"]
    assert [e["id"] for e in ledger(server, t)["effects"]] == ["re_1"]


def test_serve_openapi_stripe_sdk_application_retry_refunds_twice(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str], None]
) -> None:
    t = trial(fault="reset_after_commit")
    stripe_sdk(t["urls"]["stripe"])
    stripe.max_network_retries = 0
    made = None
    for _ in range(2):  # the application's own retry: every call gets a new key
        try:
            made = stripe.Refund.create(charge="ch_1", amount=499)
            break
        except stripe.APIConnectionError:
            continue
    assert made is not None and made.id == "re_2"
    effects = ledger(server, t)["effects"]
    assert [(e["id"], e["name"]) for e in effects] == [
        ("re_1", "stripe.refund.create"),
        ("re_2", "stripe.refund.create"),
    ]


def test_serve_openapi_stripe_sdk_sees_a_validation_error(
    trial: Callable[..., Any], stripe_sdk: Callable[[str], None]
) -> None:
    t = trial()
    stripe_sdk(t["urls"]["stripe"])
    with pytest.raises(stripe.InvalidRequestError, match="reason"):
        stripe.Refund.create(charge="ch_1", reason="because")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("stripe", "expected NAME=PATH"),
        ("=x.json", "expected NAME=PATH"),
        ("refund=" + str(STRIPE), "built-in task"),
        ("pay=/no/such.json", "cannot read"),
    ],
)
def test_serve_openapi_bad_value_is_named(spec: str, says: str) -> None:
    with pytest.raises(ServeError, match=says):
        openapi_tasks([spec])


AGENT = EXAMPLES / "refund_agent.py"


def test_serve_openapi_docs_agent_refunds_once_through_a_lost_reply(
    server: str, trial: Callable[..., Any]
) -> None:
    # The guide's agent, unchanged, pointed by its base URL at a trial whose first reply is
    # lost after the commit: the SDK's own keyed retry gets the saved reply.
    t = trial(fault="reset_after_commit")
    env = {**os.environ, "STRIPE_API_BASE": t["urls"]["stripe"]}
    done = subprocess.run(
        [sys.executable, str(AGENT), "ch_1", "499"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "re_1"
    assert [e["id"] for e in ledger(server, t)["effects"]] == ["re_1"]


@pytest.mark.parametrize("task", ["stripe", "refund"])
def test_serve_path_parameter_with_a_control_character_is_a_404(server: str, task: str) -> None:
    # The failing path (schemathesis found it): the decoded path went into the URL as is,
    # and a tab in it made the request itself invalid: a 500 with a traceback.
    t = httpx.post(f"{server}/_twice/trials", json={"task": task}).json()
    service = "stripe" if task == "stripe" else "payments"
    path = "/v1/refunds/re%09x%C3%A9" if task == "stripe" else "/v1/orders/o%09x%C3%A9"
    r = httpx.get(t["urls"][service] + path)
    assert r.status_code == 404, r.text
    assert "No such" in r.json()["error"]["message"]


@pytest.mark.parametrize("split", [0, 20_000], ids=["one-write", "split-past-16-kib"])
def test_serve_path_too_long_for_a_url_is_a_414(server: str, split: int) -> None:
    # The failing paths: a 5000-character id of 4-byte characters, quoted, passed httpx's URL
    # limit (a 500 with a traceback; schemathesis found it); and the same head reaching the
    # server in two reads, the first past h11's own 16 KiB bound (a reset instead of a reply,
    # whenever a loaded machine split it).
    t = httpx.post(f"{server}/_twice/trials", json={"task": "stripe"}).json()
    url = httpx.URL(t["urls"]["stripe"])
    target = url.path + "/v1/refunds/" + "%F3%BC%B3%93" * 6000
    head = f"GET {target} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n\r\n".encode()
    # A raw socket: httpx refuses to send a URL that long itself.
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        if split:
            sock.sendall(head[:split])
            time.sleep(0.3)  # the server reads the first part by itself
        sock.sendall(head[split:])
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        status, body = reply.status, json.loads(reply.read())
    assert status == 414 and "too long" in body["error"]["message"]


CHECKS = "not_a_server_error,response_schema_conformance"
"""No 5xx, and every JSON reply valid against the document. Not content_type_conformance:
uvicorn itself answers a request head past its bound with a plain-text 400 before any
service sees it."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "doc", "overrides"),
    [
        ("stripe", STRIPE, EXAMPLES / "stripe_overrides.yaml"),
        ("twilio", TWILIO, None),
        ("adyen", DOCS / "adyen_checkout.json", EXAMPLES / "adyen_overrides.yaml"),
    ],
)
def test_serve_openapi_schemathesis_finds_no_5xx_and_no_reply_breaking_the_document(
    tmp_path: Path, name: str, doc: Path, overrides: Path | None
) -> None:
    pytest.importorskip("schemathesis")
    spec = f"{name}={doc}" + (f",{overrides}" if overrides else "")
    with running_server(openapi=[spec]) as running:
        t = httpx.post(f"{running.url}/_twice/trials", json={"task": name}).json()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "schemathesis"), "run", str(doc),
             "--url", t["urls"][name], "--checks", CHECKS, "--max-examples", "5",
             "--seed", "1", "--phases", "examples,coverage,fuzzing"],
            cwd=tmp_path, capture_output=True, text=True, timeout=500, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]


def test_serve_openapi_dataset_gives_state_and_intents_to_the_verdict(tmp_path: Path) -> None:
    dataset = tmp_path / "refunds.jsonl"
    sample = {
        "id": "refund-old-charge",
        "input": "Refund $4.99 of charge ch_7.",
        "state": {"refunds": [{"id": "re_old", "amount": 100, "charge": "ch_1"}]},
        "intents": [
            {"effect": "pay.refund.create", "identity": {"charge": "ch_7"},
             "values": {"amount": 499}}
        ],
        "plan": [],
    }  # fmt: skip
    dataset.write_text(json.dumps(sample) + "\n")
    overrides = EXAMPLES / "stripe_overrides.yaml"
    with running_server(openapi=[f"pay={STRIPE}:{dataset},{overrides}"]) as running:
        t = httpx.post(f"{running.url}/_twice/trials", json={"task": "pay"}).json()
        assert t["sample"] == "refund-old-charge"
        api = t["urls"]["pay"]
        assert httpx.get(f"{api}/v1/refunds/re_old").json()["amount"] == 100
        for _ in range(2):  # a retry without a key: two refunds for one intent
            made = httpx.post(f"{api}/v1/refunds", data={"charge": "ch_7", "amount": "499"})
            assert made.status_code == 200, made.text
        r = httpx.get(f"{running.url}/_twice/trials/{t['id']}/verdict")
    metrics = r.json()["metrics"]
    assert metrics["duplicated"] == 1.0 and metrics["completed"] == 1.0
    assert metrics["exactly_once"] == 0.0
    sample["intents"][0]["effect"] = "stripe.refund.create"  # the document's, not this name's
    dataset.write_text(json.dumps(sample) + "\n")
    with pytest.raises(ServeError, match=r"'stripe\.refund\.create' is not one the pay service"):
        openapi_tasks([f"pay={STRIPE}:{dataset}"])


def test_serve_cli_bad_openapi_value_exits_2_in_one_line() -> None:
    from click.testing import CliRunner
    from twice.evals.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--openapi", "x=/nope.yaml", "--db", ":memory:"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "'/nope.yaml'" in result.output
