"""Your agent's refund code, unchanged: it only needs its API's base URL.

STRIPE_API_BASE=http://127.0.0.1:8765/t/TRIAL/stripe python refund_agent.py ch_1 499
"""

import os
import sys

import stripe

stripe.api_key = os.environ.get("STRIPE_API_KEY", "sk_test_not_a_secret")
stripe.api_base = os.environ["STRIPE_API_BASE"]  # the generated service, not api.stripe.com
stripe.max_network_retries = 2  # the SDK retries with one Idempotency-Key: safe


def refund(charge: str, amount: int) -> str:
    made = stripe.Refund.create(charge=charge, amount=amount)
    return made.id


if __name__ == "__main__":
    print(refund(sys.argv[1], int(sys.argv[2])))
