"""``twice serve`` under load on loopback: 64 concurrent clients, and 1000 same-key POSTs.

The server runs in its own process (``twice serve --port 0`` on a fresh SQLite file), so the
clients here do not share its interpreter; on a 2-core machine they still share the cores.
The baseline is the same HTTP stack with nothing behind it: uvicorn (h11) serving a raw ASGI
app that answers every request with a fixed refund JSON. ``serve_rps_ratio`` is twice's
throughput over that floor's, measured back to back in this process.

Each client owns one trial and one connection and loops: a keyed refund POST (a new key per
request), then a GET of the order. ``serve_p99_ms`` is the 99th percentile of every request's
latency. ``serve_same_key`` fires 1000 POSTs with one Idempotency-Key at one trial at once
(1000 connections) and counts the refunds the server committed: it must be 1.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

BARE_APP = """
import json, sys, socket
import uvicorn
BODY = json.dumps({"id": "re_1", "object": "refund", "status": "succeeded",
                   "order_id": "order_1042", "amount": 1}).encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})
# IPPROTO_TCP, as uvicorn's own bind from host and port gets it: asyncio then turns Nagle off.
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0)); sock.listen(2048)
print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
config = uvicorn.Config(app, http="h11", lifespan="off", log_level="warning", access_log=False)
uvicorn.Server(config).run(sockets=[sock])
"""


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    proc.kill()
    raise RuntimeError("server did not start:\n" + "".join(seen))


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


async def _client(urls: dict[str, str], n: int, latencies: list[float], tag: int) -> None:
    refunds = f"{urls['payments']}/v1/refunds"
    order = f"{urls['payments']}/v1/orders/order_1042"
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1)) as client:
        for i in range(n):
            t0 = time.perf_counter()
            r = await client.post(
                refunds,
                json={"order_id": "order_1042", "amount": 1},
                headers={"Idempotency-Key": f"c{tag}-{i}"},
            )
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            t0 = time.perf_counter()
            (await client.get(order)).raise_for_status()
            latencies.append(time.perf_counter() - t0)


async def _load(trials: list[dict[str, str]], n: int) -> dict[str, float]:
    latencies: list[float] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(u, n, latencies, k) for k, u in enumerate(trials)))
    wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "requests": float(len(latencies)),
        "seconds": wall,
        "rps": len(latencies) / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3,
    }


async def _same_key(urls: dict[str, str], n: int) -> dict[str, Any]:
    url = f"{urls['payments']}/v1/refunds"
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        t0 = time.perf_counter()
        responses = await asyncio.gather(
            *(
                client.post(
                    url,
                    json={"order_id": "order_1042", "amount": 499},
                    headers={"Idempotency-Key": "one-key"},
                )
                for _ in range(n)
            )
        )
        seconds = time.perf_counter() - t0
    ids = {r.json().get("id") for r in responses}
    statuses: dict[int, int] = {}
    for r in responses:
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    return {"ids": sorted(map(str, ids)), "statuses": statuses, "seconds": seconds}


def serve_load(clients: int, per_client: int, same_key: int) -> dict[str, Any]:
    """Run the load against ``twice serve`` and the bare floor; the figures and the details."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench-serve.sqlite"
        proc, url = _start(
            [
                "-c",
                "from twice.evals.cli import main; main()",
                "serve",
                "--port",
                "0",
                "--db",
                str(db),
            ]
        )
        try:
            trials = [
                httpx.post(f"{url}/_twice/trials", json={"task": "refund"}, timeout=60).json()[
                    "urls"
                ]
                for _ in range(clients)
            ]
            asyncio.run(_load(trials[:4], 2))  # warm up
            twice = asyncio.run(_load(trials, per_client))
            storm_trial = httpx.post(
                f"{url}/_twice/trials", json={"task": "refund"}, timeout=60
            ).json()
            storm = asyncio.run(_same_key(storm_trial["urls"], same_key))
            effects = httpx.get(
                f"{url}/_twice/trials/{storm_trial['id']}/ledger", timeout=60
            ).json()["effects"]
            db_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
        finally:
            _stop(proc)
    bare_proc, bare_url = _start(["-c", BARE_APP])
    try:
        bare_trials = [{"payments": bare_url}] * clients
        asyncio.run(_load(bare_trials[:4], 2))
        bare = asyncio.run(_load(bare_trials, per_client))
    finally:
        _stop(bare_proc)
    return {
        "serve_rps": twice["rps"],
        "serve_p99_ms": twice["p99_ms"],
        "serve_same_key": {"effects": len(effects), "posts": same_key},
        "serve_rps_ratio": twice["rps"] / bare["rps"],
        "details": {
            "twice": twice,
            "bare": bare,
            "same_key": storm,
            "db_mb": db_mb,
            "load_average": list(os.getloadavg()),
        },
    }
