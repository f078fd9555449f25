"""Shared fixtures for twice's tests."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from mocks import SOURCE_HEADER, Ledger, PaymentsService, Services, get_fault

pytest_plugins = ["pytester"]

ORDERS = [
    {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997},
    {"order_id": "order_1054", "customer": "Sam Lee", "amount": 9850},
]


@pytest.fixture
def payments() -> Callable[[str], Services]:
    """Build a payments trial under a fault: ``payments("lost_reply")``."""

    def make(fault: str = "none") -> Services:
        return Services([PaymentsService(orders=ORDERS)], fault=get_fault(fault))

    return make


@pytest.fixture
def naive_refund() -> Callable[..., None]:
    """A client that retries a timed-out refund without a key (the seed's bug)."""

    def refund(services: Services, order_id: str = "order_1042", tries: int = 2) -> None:
        with services.sync_client(base_url="https://payments.twice.test") as client:
            for n in range(tries):
                source = "initial" if n == 0 else "model"
                try:
                    client.post(
                        "/v1/refunds",
                        json={"order_id": order_id, "amount": 499},
                        headers={SOURCE_HEADER: source},
                    )
                    return
                except httpx.TimeoutException:
                    continue

    return refund


@pytest.fixture
def duplicated(payments: Callable[[str], Services], naive_refund: Callable[..., None]) -> Ledger:
    """The seed's ledger: reply lost on re_1, a retry made re_2."""
    services = payments("lost_reply")
    naive_refund(services)
    return services.ledger


@pytest.fixture(scope="session")
def readme_blocks() -> dict[str, str]:
    """README's fenced blocks that follow an ``<!-- example: PATH -->`` or
    ``<!-- output: NAME -->`` anchor, by anchor (``"example: docs/examples/x.py"``)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    pattern = re.compile(r"<!-- ((?:example|output): [^>]+?) -->\n```[a-z]*\n(.*?)```", re.S)
    return {anchor: body for anchor, body in pattern.findall(text)}
