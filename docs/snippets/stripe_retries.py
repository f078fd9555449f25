import os

import httpx
import stripe

SERVER = os.environ.get("TWICE_SERVE_URL", "http://127.0.0.1:8765")  # where `twice serve` listens


def new_trial() -> dict:  # the fault hits a trial's first refund, so each case gets its own
    body = {"task": "refund", "fault": "reset_after_commit"}
    return httpx.post(f"{SERVER}/_twice/trials", json=body).json()


stripe.api_key = "sk_test_anything"  # never checked, never logged
stripe.api_base = new_trial()["urls"]["payments"]
stripe.Refund.create(payment_intent="order_1042", amount=499)  # re_1, once: its retry replays

stripe.api_base = new_trial()["urls"]["payments"]
stripe.max_network_retries = 0  # now the application retries
for _ in range(2):
    try:
        stripe.Refund.create(payment_intent="order_1042", amount=499)
        break
    except stripe.APIConnectionError:  # the reply was lost; the retry's new key makes re_2
        continue
