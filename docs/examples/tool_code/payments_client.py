"""Your own tool code, unchanged: it refunds through a payments API over httpx."""

import uuid

import httpx

PAYMENTS_URL = "https://payments.example.com"


def refund(order_id: str, cents: int, retries: int = 2) -> str:
    """Refund an order and return the refund id; retries timeouts safely."""
    key = f"refund-{uuid.uuid4().hex}"  # made once, outside the retry loop
    for attempt in range(retries + 1):
        try:
            response = httpx.post(
                f"{PAYMENTS_URL}/v1/refunds",
                json={"order_id": order_id, "amount": cents},
                headers={"Idempotency-Key": key},
            )
        except httpx.TimeoutException:
            if attempt == retries:
                raise
            continue
        response.raise_for_status()
        return str(response.json()["id"])
    raise AssertionError("unreachable")
