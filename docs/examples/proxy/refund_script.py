"""A refund script of yours, unchanged: the official Stripe SDK, its base URL from the
environment. Pointed at twice's proxy, it talks to your staging service through a lost reply.

PAYMENTS_URL=http://127.0.0.1:8766/t/ID/payments python refund_script.py order_1042 499
"""

import os
import sys

import stripe

stripe.api_key = os.environ.get("STRIPE_API_KEY", "sk_test_staging")
stripe.api_base = os.environ["PAYMENTS_URL"]
stripe.default_http_client = stripe.RequestsClient(timeout=float(os.environ.get("TIMEOUT", "5")))
stripe.max_network_retries = int(os.environ.get("SDK_RETRIES", "0"))


def refund(order_id: str, cents: int) -> str:
    for _ in range(2):
        try:
            return str(stripe.Refund.create(payment_intent=order_id, amount=cents).id)
        except stripe.APIConnectionError:
            continue  # "the network blipped": the application tries once more
    raise SystemExit("the refund failed twice")


if __name__ == "__main__":
    print(refund(sys.argv[1], int(sys.argv[2])))
