"""The mock services alone: one attempt vs a bare httpx round trip, and one key under load."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

import httpx
from _common import Paired, Sample, paired
from twice.mocks import (
    BACKOFF_HEADER,
    CALL_HEADER,
    KEY_HEADER,
    SOURCE_HEADER,
    PaymentsService,
    Services,
)

BASE = PaymentsService.default_base_url
URL = f"{BASE}/v1/refunds"
ORDER = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 10**9, "currency": "usd"}
PER_TRIAL = 5
"""Attempts per Services set: a trial's worth, so the ledger stays trial-sized."""
REFUND = {
    "id": "re_1",
    "object": "refund",
    "status": "succeeded",
    "order_id": "order_1042",
    "amount": 499,
    "reason": "arrived cracked",
}


def _headers(call: int, key: str) -> dict[str, str]:
    # What the tool layer sends on a keyed mutating call.
    return {SOURCE_HEADER: "initial", CALL_HEADER: str(call), BACKOFF_HEADER: "0", KEY_HEADER: key}


def _payload() -> dict[str, Any]:
    return {"order_id": ORDER["order_id"], "amount": 499, "reason": "arrived cracked"}


def _bare_handler(request: httpx.Request) -> httpx.Response:
    """The floor: answers what the payments service answers, and does nothing else."""
    return httpx.Response(200, json=REFUND)


async def _attempts(clients: list[httpx.AsyncClient]) -> None:
    for c, client in enumerate(clients):
        for i in range(PER_TRIAL):
            response = await client.post(URL, json=_payload(), headers=_headers(i, f"k{c}:{i}"))
            if response.status_code != 200:
                raise RuntimeError(
                    f"benchmark attempt got HTTP {response.status_code}: {response.text}"
                )


def _self_timed(make_clients: Callable[[], list[httpx.AsyncClient]]) -> Callable[[], Sample]:
    def run() -> Sample:
        clients = make_clients()  # outside the clock: a trial makes its client once
        w0, c0 = time.perf_counter(), time.process_time()
        asyncio.run(_attempts(clients))
        return Sample(time.perf_counter() - w0, time.process_time() - c0)

    return run


def attempt_cost(attempts: int, reps: int) -> tuple[float, Paired]:
    """One keyed POST through Services (routing, ledger, key store) vs a bare MockTransport.

    The timed part is the attempts alone, ``PER_TRIAL`` per Services set; building the
    services and clients is a trial's setup, not an attempt.
    """
    sets = max(1, attempts // PER_TRIAL)

    def bare() -> list[httpx.AsyncClient]:
        transport = httpx.MockTransport(_bare_handler)
        return [httpx.AsyncClient(transport=transport) for _ in range(sets)]

    def subject() -> list[httpx.AsyncClient]:
        return [Services([PaymentsService(orders=[ORDER])]).client() for _ in range(sets)]

    result = paired(_self_timed(bare), _self_timed(subject), reps, self_timed=True)
    return result.ratio(), result


def concurrent_same_key(n: int) -> dict[str, Any]:
    """``n`` concurrent attempts with one key: effects committed and attempts per second."""
    services = Services([PaymentsService(orders=[ORDER])])

    async def storm() -> list[int]:
        async with services.client() as client:
            responses = await asyncio.gather(
                *(
                    client.post(URL, json=_payload(), headers=_headers(1, "one-key"))
                    for _ in range(n)
                )
            )
        return [r.status_code for r in responses]

    w0 = time.perf_counter()
    statuses = asyncio.run(storm())
    wall = time.perf_counter() - w0
    return {
        "effects": len(services.ledger.effects),
        "attempts_per_second": n / wall,
        "attempts": len(services.ledger.attempts),
        "statuses": {str(k): v for k, v in sorted(collections.Counter(statuses).items())},
        "seconds": wall,
    }
