"""``twice serve --upstream``: a trial's requests forwarded to a real service on loopback (a
second ``twice serve`` as "staging", or a small Starlette app with its own idempotency), with
the fault applied around the real call. Never another address."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
from twice.evals.serve import ServeError, running_server
from twice.evals.serve._upstream import infer_route, parse_upstreams

SECRET = "sk_test_proxy_secret_never_logged"
REFUND = {"order_id": "order_1042", "amount": 499}


@pytest.fixture(scope="module")
def staging() -> Iterator[str]:
    """A second ``twice serve`` on loopback: the user's "staging" payments service."""
    with running_server() as running:
        yield running.url


def _staging_payments(staging: str) -> tuple[str, str]:
    """A fresh fault-free refund trial on staging: (its id, its payments URL)."""
    r = httpx.post(f"{staging}/_twice/trials", json={"task": "refund"})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["urls"]["payments"]


def _staging_refunds(staging: str, trial_id: str) -> list[str]:
    effects = httpx.get(f"{staging}/_twice/trials/{trial_id}/ledger").json()["effects"]
    return [e["id"] for e in effects]


@pytest.fixture
def proxied(staging: str, tmp_path: Path) -> Iterator[Callable[..., dict[str, Any]]]:
    """``proxied(fault=...)``: a proxy in front of a new staging trial, and a trial on it.

    Returns the proxy trial with ``proxy`` (the proxy's URL), ``staging_id`` and ``db``.
    """
    stack: list[Any] = []

    def make(**body: Any) -> dict[str, Any]:
        staging_id, upstream = _staging_payments(staging)
        db = tmp_path / f"proxy-{len(stack)}.sqlite"
        ctx = running_server(db, upstreams=[f"payments={upstream}"])
        running = ctx.__enter__()
        stack.append(ctx)
        r = httpx.post(
            f"{running.url}/_twice/trials", json={"task": "refund", "hang_seconds": 3, **body}
        )
        assert r.status_code == 201, r.text
        return {**r.json(), "proxy": running.url, "staging_id": staging_id, "db": db}

    yield make
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)


def _ledger(t: dict[str, Any]) -> dict[str, Any]:
    return dict(httpx.get(f"{t['proxy']}/_twice/trials/{t['id']}/ledger").json())


def _verdict(t: dict[str, Any]) -> dict[str, Any]:
    return dict(httpx.get(f"{t['proxy']}/_twice/trials/{t['id']}/verdict").json())


@pytest.fixture
def stripe_sdk() -> Iterator[Callable[[str, float], None]]:
    """Point the module-level Stripe API at a URL: ``point(url, timeout)``."""
    saved = (
        stripe.api_key,
        stripe.api_base,
        stripe.default_http_client,
        stripe.max_network_retries,
    )

    def point(url: str, timeout: float) -> None:
        stripe.api_key = SECRET
        stripe.api_base = url
        stripe.default_http_client = stripe.RequestsClient(timeout=timeout)

    yield point
    stripe.api_key, stripe.api_base, stripe.default_http_client, stripe.max_network_retries = saved


# -- the Stripe SDK through the proxy in front of a loopback twice serve -------------------


def test_upstream_stripe_sdk_own_retries_refund_once_under_lost_reply(
    staging: str, proxied: Callable[..., dict[str, Any]], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = proxied(fault="lost_reply")
    stripe_sdk(t["urls"]["payments"], 1)
    stripe.max_network_retries = 2
    start = time.monotonic()
    refund = stripe.Refund.create(payment_intent="order_1042", amount=499)
    assert time.monotonic() - start >= 1.0  # a real read timeout came first
    assert refund.id == "re_1"
    assert _staging_refunds(staging, t["staging_id"]) == ["re_1"]
    first, second = _ledger(t)["attempts"]
    assert (first["fault"], first["delivered"], first["status"], first["effect_ids"]) == (
        "lost_reply",
        False,
        200,
        ["re_1"],
    )
    assert first["reply"]["id"] == "re_1"  # the upstream's real body
    # The SDK's retry reused its key; staging replayed its saved reply.
    assert second["key"] == first["key"] and second["replayed"] and not second["effect_ids"]
    metrics = _verdict(t)["metrics"]
    assert (metrics["exactly_once"], metrics["completed"], metrics["duplicated"]) == (1, 1, 0)


def test_upstream_stripe_sdk_application_retry_refunds_twice(
    staging: str, proxied: Callable[..., dict[str, Any]], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = proxied(fault="lost_reply")
    stripe_sdk(t["urls"]["payments"], 1)
    stripe.max_network_retries = 0
    made = None
    for _ in range(2):  # the application's own retry: every call gets a new key
        try:
            made = stripe.Refund.create(payment_intent="order_1042", amount=499)
            break
        except stripe.APIConnectionError:
            continue
    assert made is not None and made.id == "re_2"
    assert _staging_refunds(staging, t["staging_id"]) == ["re_1", "re_2"]
    assert [e["id"] for e in _ledger(t)["effects"]] == ["re_1", "re_2"]
    body = _verdict(t)
    assert body["metrics"]["duplicated"] == 1.0
    assert "re_1" in body["explanation"] and "re_2" in body["explanation"]


def test_upstream_credentials_never_reach_the_log_ledger_or_verdict(
    staging: str, proxied: Callable[..., dict[str, Any]], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = proxied(fault="reset_after_commit")
    stripe_sdk(t["urls"]["payments"], 5)
    stripe.max_network_retries = 2
    assert stripe.Refund.create(payment_intent="order_1042", amount=499).id == "re_1"
    shown = json.dumps(_ledger(t)) + json.dumps(_verdict(t))
    rows = sqlite3.connect(t["db"]).execute("SELECT data FROM log").fetchall()
    logged = " ".join(row[0] for row in rows)
    assert "payment_intent" in logged  # the log holds the forwards ...
    for text in (shown, logged):  # ... and never the key or its header
        assert SECRET not in text and "authorization" not in text.lower()


# -- faults around the real call ---------------------------------------------------------


def test_upstream_timeout_before_commit_never_forwards(
    staging: str, proxied: Callable[..., dict[str, Any]]
) -> None:
    t = proxied(fault="timeout_before_commit")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND, timeout=1)
    assert _staging_refunds(staging, t["staging_id"]) == []
    (attempt,) = _ledger(t)["attempts"]
    assert (attempt["status"], attempt["reply"], attempt["outcome"]) == (None, None, "unknown")
    assert _verdict(t)["metrics"]["completed"] == 0.0


def test_upstream_reset_after_commit_closes_after_the_real_commit(
    staging: str, proxied: Callable[..., dict[str, Any]]
) -> None:
    t = proxied(fault="reset_after_commit")
    url = f"{t['urls']['payments']}/v1/refunds"
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(url, json=REFUND, headers={"Idempotency-Key": "k-1"}, timeout=10)
    assert _staging_refunds(staging, t["staging_id"]) == ["re_1"]
    # A keyed retry gets staging's saved reply: recognised as a replay, no second effect.
    again = httpx.post(url, json=REFUND, headers={"Idempotency-Key": "k-1"})
    assert again.json()["id"] == "re_1" and again.headers["idempotent-replayed"] == "true"
    assert [e["id"] for e in _ledger(t)["effects"]] == ["re_1"]
    assert _verdict(t)["metrics"]["exactly_once"] == 1.0


def test_upstream_error_after_commit_is_a_502_after_the_real_commit(
    staging: str, proxied: Callable[..., dict[str, Any]]
) -> None:
    t = proxied(fault="error_after_commit")
    r = httpx.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND)
    assert r.status_code == 502
    assert _staging_refunds(staging, t["staging_id"]) == ["re_1"]
    (attempt,) = _ledger(t)["attempts"]
    assert (attempt["status"], attempt["effect_ids"], attempt["reply"]["id"]) == (
        502,
        ["re_1"],
        "re_1",
    )


@pytest.mark.parametrize(("fault", "status"), [("rate_limited", 429), ("error_before_commit", 503)])
def test_upstream_fault_before_commit_answers_without_forwarding(
    staging: str, proxied: Callable[..., dict[str, Any]], fault: str, status: int
) -> None:
    t = proxied(fault=fault)
    url = f"{t['urls']['payments']}/v1/refunds"
    assert httpx.post(url, json=REFUND).status_code == status
    assert _staging_refunds(staging, t["staging_id"]) == []
    assert httpx.post(url, json=REFUND).json()["id"] == "re_1"  # the next one goes through
    assert _verdict(t)["metrics"]["safe_success"] == 1.0


def test_upstream_refusal_passes_the_fault_to_the_next_attempt(
    staging: str, proxied: Callable[..., dict[str, Any]]
) -> None:
    t = proxied(fault="lost_reply")
    url = f"{t['urls']['payments']}/v1/refunds"
    bad = httpx.post(url, json={"order_id": "order_9999", "amount": 499})
    assert bad.status_code == 404  # staging's own answer, delivered: no work to lose
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=REFUND, timeout=1)
    assert [a["fault"] for a in _ledger(t)["attempts"]] == [None, "lost_reply"]


def test_upstream_restart_rebuilds_the_ledger_without_forwarding_again(
    staging: str, tmp_path: Path
) -> None:
    staging_id, upstream = _staging_payments(staging)
    db = tmp_path / "proxy.sqlite"
    with running_server(db, upstreams=[f"payments={upstream}"]) as running:
        t = httpx.post(f"{running.url}/_twice/trials", json={"task": "refund"}).json()
        httpx.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND)
        before = httpx.get(f"{running.url}/_twice/trials/{t['id']}/ledger").json()
    with running_server(db, upstreams=[f"payments={upstream}"]) as running:
        after = httpx.get(f"{running.url}/_twice/trials/{t['id']}/ledger").json()
    assert after == before and [e["id"] for e in after["effects"]] == ["re_1"]
    assert _staging_refunds(staging, staging_id) == ["re_1"]


# -- a small app of the user's with its own idempotency ------------------------------------


@pytest.fixture(scope="module")
def shop() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A Starlette app on loopback: orders with an Idempotency-Key of its own, that returns
    the same order for a repeated key without saying it is a replay. Yields its URL and the
    headers of every request it received."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    orders: dict[str, dict[str, Any]] = {}
    by_key: dict[str, str] = {}
    seen: list[dict[str, str]] = []

    async def create(request: Request) -> JSONResponse:
        seen.append(dict(request.headers))
        key = request.headers.get("idempotency-key")
        if key in by_key:
            return JSONResponse(orders[by_key[key]], status_code=201)
        body = await request.json()
        order = {"id": f"ord_{len(orders) + 1}", "sku": body["sku"], "qty": body["qty"]}
        orders[order["id"]] = order
        if key:
            by_key[key] = order["id"]
        return JSONResponse(order, status_code=201)

    async def echo(request: Request) -> JSONResponse:
        # A careless error page: it names the credentials it was sent.
        given = {"auth": request.headers.get("authorization"), **request.query_params}
        return JSONResponse({"error": f"bad credentials {given}"}, status_code=401)

    app = Starlette(
        routes=[
            Route("/api/orders", create, methods=["POST"]),
            Route("/api/echo", echo, methods=["GET", "POST"]),
        ]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", seen
    server.should_exit = True
    thread.join(10)


def test_upstream_same_id_for_the_same_key_is_a_replay_and_headers_pass_through(
    shop: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = shop
    with running_server(upstreams=[f"shop={url}"]) as running:
        t = httpx.post(f"{running.url}/_twice/trials", json={"task": "refund"}).json()
        assert t["urls"]["shop"] == f"{running.url}/t/{t['id']}/shop"
        headers = {"Idempotency-Key": "o-1", "Authorization": f"Bearer {SECRET}"}
        for _ in range(2):
            r = httpx.post(
                f"{t['urls']['shop']}/api/orders", json={"sku": "mug", "qty": 1}, headers=headers
            )
            assert (r.status_code, r.json()["id"]) == (201, "ord_1")
        data = httpx.get(f"{running.url}/_twice/trials/{t['id']}/ledger").json()
    assert seen[-1]["authorization"] == f"Bearer {SECRET}"  # the credential reached the app
    assert seen[-1]["host"] == url.removeprefix("http://")
    first, second = data["attempts"]
    assert (first["route"], first["effect_ids"], second["replayed"]) == (
        "shop.order.create",
        ["ord_1"],
        True,
    )
    (effect,) = data["effects"]
    assert effect["fields"] == {"sku": "mug", "qty": 1}
    assert SECRET not in json.dumps(data)


# -- options -------------------------------------------------------------------------------


def test_upstream_off_loopback_needs_the_host_named() -> None:
    with pytest.raises(ServeError, match=r"host 'staging\.example\.com' is not loopback.*"
                       r"--upstream-allow staging\.example\.com"):  # fmt: skip
        parse_upstreams(["payments=https://staging.example.com/v1"])
    (up,) = parse_upstreams(
        ["payments=https://staging.example.com/"], allow=["staging.example.com"]
    )
    assert (up.name, up.url) == ("payments", "https://staging.example.com")
    assert parse_upstreams(["a=http://localhost:1", "b=http://[::1]:2/x"])[1].url == (
        "http://[::1]:2/x"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("payments", "is not NAME=URL"),
        ("Pay=http://127.0.0.1:1", "is not a service name"),
        ("mcp=http://127.0.0.1:1", "is not a service name"),
        ("payments=ftp://127.0.0.1/x", "must be http"),
        ("payments=http://u@127.0.0.1/x", "must be http"),
    ],
)
def test_upstream_bad_spec_names_the_value(spec: str, message: str) -> None:
    with pytest.raises(ServeError, match=message):
        parse_upstreams([spec])


def test_upstream_cli_exits_2_naming_the_host(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from twice.evals.cli import cli

    result = CliRunner().invoke(
        cli,
        ["serve", "--port", "0", "--db", str(tmp_path / "x.sqlite"), "--upstream",
         "payments=http://10.1.2.3:8000"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "host '10.1.2.3' is not loopback" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.sqlite").exists()


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("POST", "/v1/refunds", "payments.refund.create"),
        ("GET", "/v1/refunds", "payments.refund.list"),
        ("GET", "/v1/refunds/re_1", "payments.refund.get"),
        ("POST", "/v1/refunds/re_1", "payments.refund.update"),
        ("DELETE", "/api/v2/categories/c_1", "payments.category.delete"),
        ("POST", "/v1/refunds/re_1/cancel", "payments.refund.cancel"),
    ],
)
def test_upstream_infers_effect_names_the_rest_way(method: str, path: str, name: str) -> None:
    assert infer_route("payments", method, path) == name


# -- the guide's example ---------------------------------------------------------------------

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "proxy"


def test_the_proxy_guide_script_refunds_twice_then_once_with_sdk_retries(
    staging: str, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    config = json.loads((EXAMPLE / "trial.json").read_text())
    seen = []
    for sdk_retries, expected in (("0", ["re_1", "re_2"]), ("2", ["re_1"])):
        staging_id, upstream = _staging_payments(staging)
        with running_server(upstreams=[f"payments={upstream}"]) as running:
            t = httpx.post(f"{running.url}/_twice/trials", json=config).json()
            env = {
                **os.environ,
                "PAYMENTS_URL": t["urls"]["payments"],
                "TIMEOUT": "1",
                "SDK_RETRIES": sdk_retries,
                "STRIPE_API_KEY": SECRET,
            }
            out = subprocess.run(
                [sys.executable, str(EXAMPLE / "refund_script.py"), "order_1042", "499"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == expected[-1]
            assert _staging_refunds(staging, staging_id) == expected
            body = httpx.get(f"{running.url}/_twice/trials/{t['id']}/verdict").json()
            seen.append(body["metrics"]["exactly_once"])
            assert SECRET not in json.dumps(body)
    assert seen == [0.0, 1.0]


def test_upstream_trial_intents_are_checked_and_judged(
    shop: tuple[str, list[dict[str, str]]],
) -> None:
    url, _ = shop
    intent = {"effect": "shop.order.create", "identity": {"sku": "tea"}, "expected": 1}
    with running_server(upstreams=[f"shop={url}"]) as running:
        trials = f"{running.url}/_twice/trials"
        bad = httpx.post(trials, json={"task": "refund", "intents": [{"identity": {}}]})
        assert bad.status_code == 400 and "intents[0]" in bad.json()["error"]["message"]
        assert httpx.post(trials, json={"task": "refund", "intents": "x"}).status_code == 400
        # No task: the trial is the upstreams alone, judged by its own intents.
        t = httpx.post(trials, json={"intents": [intent]}).json()
        assert (t["task"], t["intents"], set(t["urls"])) == ("upstreams", [intent], {"shop", "mcp"})
        refused = httpx.post(trials, json={"sample": "refund-001"})
        assert refused.status_code == 400 and "has no task" in refused.json()["error"]["message"]
        for key in ("t-1", "t-2"):  # two keys: the app makes two orders
            httpx.post(
                f"{t['urls']['shop']}/api/orders",
                json={"sku": "tea", "qty": 2},
                headers={"Idempotency-Key": key},
            )
        body = httpx.get(f"{trials}/{t['id']}/verdict").json()
    assert body["metrics"]["duplicated"] == 1.0
    assert "shop.order.create where sku='tea': expected 1, observed 2" in body["explanation"]


def test_upstream_replay_puts_overlapping_forwards_back_in_attempt_order() -> None:
    from twice.evals.serve._upstream import replay_upstream
    from twice.mocks import Attempt, Services

    services = Services([])

    def logged(n: int) -> dict[str, Any]:
        attempt = Attempt(n, "shop", "POST", "/orders", "shop.order.create", True, None, {})
        attempt.effect_ids = [f"ord_{n}"]
        effect = {"id": f"ord_{n}", "name": "shop.order.create", "attempt": n, "fields": {}}
        return {"attempt": attempt.__dict__, "effects": [effect], "deferred": 0}

    # The first forward was slower: the second was logged before it.
    for n in (2, 1):
        replay_upstream(services, logged(n))
    assert [a.n for a in services.ledger.attempts] == [1, 2]
    assert services.ledger.attempt(1).effect_ids == ["ord_1"]
    assert [e.id for e in services.ledger.effects] == ["ord_1", "ord_2"]


def test_upstream_mcp_tools_act_on_the_real_service_under_the_fault(
    staging: str, proxied: Callable[..., dict[str, Any]]
) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from twice.mocks import UNKNOWN_OUTCOME

    t = proxied(fault="lost_reply")
    args = {"order_id": "order_1042", "amount": 4.99, "reason": "cracked"}

    async def session() -> list[Any]:
        async with (
            streamable_http_client(t["urls"]["mcp"]) as (read, write, *_),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            return [await mcp.call_tool("issue_refund", args) for _ in range(2)]

    lost, again = asyncio.run(session())
    assert lost.is_error and UNKNOWN_OUTCOME in lost.content[0].text
    assert not again.is_error and "re_2" in again.content[0].text
    # Both refunds were made by staging, and the proxy's ledger counts them.
    assert _staging_refunds(staging, t["staging_id"]) == ["re_1", "re_2"]
    first = _ledger(t)["attempts"][0]
    assert (first["service"], first["fault"], first["reply"]["id"]) == (
        "payments",
        "lost_reply",
        "re_1",
    )
    assert _verdict(t)["metrics"]["duplicated"] == 1.0


def test_upstream_credentials_an_upstream_echoes_are_not_recorded(
    shop: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, _ = shop
    db = tmp_path / "proxy.sqlite"
    with running_server(db, upstreams=[f"shop={url}"]) as running:
        t = httpx.post(f"{running.url}/_twice/trials", json={"task": "refund"}).json()
        r = httpx.post(
            f"{t['urls']['shop']}/api/echo?api_key=qk_{SECRET}&sku=mug",
            json={"client_secret": f"cs_{SECRET}", "qty": 1},
            headers={"Authorization": f"Bearer {SECRET}"},
        )
        assert r.status_code == 401 and SECRET in r.text  # the client gets its reply as sent
        data = httpx.get(f"{running.url}/_twice/trials/{t['id']}/ledger").json()
    (attempt,) = data["attempts"]
    assert attempt["params"] == {
        "api_key": "[redacted]",
        "sku": "mug",
        "client_secret": "[redacted]",
        "qty": 1,
    }
    assert "[redacted]" in attempt["reply"]["error"]
    rows = sqlite3.connect(db).execute("SELECT data FROM log").fetchall()
    for text in (json.dumps(data), " ".join(row[0] for row in rows)):
        assert SECRET not in text


def test_upstream_unreachable_passes_the_fault_to_the_next_attempt() -> None:
    from twice.evals.serve._upstream import TrialProxy, Upstream
    from twice.mocks import LostReply, Services

    calls = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"id": "ord_1"})

    services = Services([], fault=LostReply())
    client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    proxy = TrialProxy(
        [Upstream("shop", "http://127.0.0.1:1")], services, lambda *_: None, lambda: client
    )

    async def post() -> httpx.Response:
        return await proxy.forward("shop", "POST", "/orders", "", [], b'{"sku": "mug"}')

    assert asyncio.run(post()).status_code == 502  # the upstream's absence, not the fault
    with pytest.raises(httpx.ReadTimeout):  # the fault hits the next attempt instead
        asyncio.run(post())
    assert [a.fault for a in services.ledger.attempts] == [None, "lost_reply"]
    assert [e.id for e in services.ledger.effects] == ["ord_1"]


def test_upstream_trial_without_a_task_survives_a_restart(
    shop: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = shop
    db = tmp_path / "proxy.sqlite"
    intent = {"effect": "shop.order.create", "identity": {"sku": "jam"}, "expected": 1}
    with running_server(db, upstreams=[f"shop={url}"]) as running:
        t = httpx.post(f"{running.url}/_twice/trials", json={"intents": [intent]}).json()
        httpx.post(f"{t['urls']['shop']}/api/orders", json={"sku": "jam", "qty": 1})
        sent = len(seen)
    with running_server(db, upstreams=[f"shop={url}"]) as running:
        body = httpx.get(f"{running.url}/_twice/trials/{t['id']}/verdict").json()
    assert body["metrics"]["safe_success"] == 1.0 and len(seen) == sent


ORDERS = [{"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}]


def _mixed_trial(fault: Any) -> tuple[Any, Callable[[], httpx.Response]]:
    """A trial with a mock payments service and an upstream shop: (its services, a POST to
    the shop through the proxy)."""
    from twice.evals.serve._upstream import TrialProxy, Upstream
    from twice.mocks import PaymentsService, Services

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, json={"id": "ord_1"})

    services = Services([PaymentsService(orders=ORDERS)], fault=fault)
    client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    proxy = TrialProxy(
        [Upstream("shop", "http://127.0.0.1:1")], services, lambda *_: None, lambda: client
    )

    def order() -> httpx.Response:
        body = b'{"sku": "mug"}'
        return asyncio.run(proxy.forward("shop", "POST", "/orders", "", [], body))

    return services, order


def _refund(services: Any, amount: int = 499) -> httpx.Response:
    with services.sync_client() as client:
        url = "https://payments.twice.test/v1/refunds"
        return client.post(url, json={"order_id": "order_1042", "amount": amount})


def test_upstream_and_mock_attempts_are_counted_as_one_trial() -> None:
    from twice.mocks import LostReply

    services, order = _mixed_trial(LostReply())
    with pytest.raises(httpx.ReadTimeout):  # the trial's first mutating attempt
        order()
    assert _refund(services).status_code == 200  # its second: the fault is spent
    assert [a.fault for a in services.ledger.attempts] == ["lost_reply", None]


def test_upstream_takes_a_hit_a_mock_request_could_not() -> None:
    from twice.mocks import LostReply

    services, order = _mixed_trial(LostReply())
    assert _refund(services, amount=100_000).status_code == 400  # no work: passed on
    with pytest.raises(httpx.ReadTimeout):
        order()
    assert _refund(services).status_code == 200
    assert [a.fault for a in services.ledger.attempts] == [None, "lost_reply", None]


def test_upstream_replay_restores_the_faults_count_and_owed_hits() -> None:
    from twice.evals.serve._upstream import replay_upstream
    from twice.mocks import Attempt, LostReply, PaymentsService, Schedule, Services

    def logged(deferred: int) -> dict[str, Any]:
        attempt = Attempt(1, "shop", "POST", "/orders", "shop.order.create", True, None, {})
        return {"attempt": attempt.__dict__, "effects": [], "deferred": deferred}

    # The forward took the first mutating attempt: the mock's refund is the second.
    services = Services([PaymentsService(orders=ORDERS)], fault=LostReply())
    replay_upstream(services, logged(0))
    assert _refund(services).status_code == 200
    # A hit the forward could not take is owed to the mock's refund.
    services = Services(
        [PaymentsService(orders=ORDERS)], fault=LostReply(schedule=Schedule(attempts=(9,)))
    )
    replay_upstream(services, logged(1))
    with pytest.raises(httpx.ReadTimeout):
        _refund(services)
