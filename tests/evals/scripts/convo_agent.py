"""An agent command for the conversation faults' tests: plain HTTP to the model and to the
payments API, with a lookup tool (so stub/verify can look first).

``--intent-key``: every refund carries an Idempotency-Key derived from the order (the intent),
so a repeat is replayed. ``--no-history``: ignores TWICE_HISTORY, as an agent command written
before it did.
"""

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

PAYMENTS = os.environ["TWICE_PAYMENTS_URL"]
MODEL_URL = os.environ["OPENAI_BASE_URL"] + "/chat/completions"


def tool(name, description, **properties):
    params = {"type": "object", "properties": properties, "required": ["order_id"]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


TOOLS = [
    tool(
        "issue_refund",
        "Refund money to the customer for an order.",
        order_id={"type": "string"},
        amount={"type": "number"},
        reason={"type": "string"},
    ),
    tool(
        "find_refunds", "List the refunds already made for an order.", order_id={"type": "string"}
    ),
]


def http(url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=60) as r:
        return json.load(r)


def issue_refund(order_id, amount, reason=""):
    body = {"order_id": order_id, "amount": round(amount * 100), "reason": reason}
    key = {"Idempotency-Key": f"refund:{order_id}"} if "--intent-key" in sys.argv else {}
    try:
        return f"Created refund {http(f'{PAYMENTS}/v1/refunds', body, key)['id']}."
    except urllib.error.HTTPError as ex:
        return f"Error: HTTP {ex.code}; no refund was made."
    except OSError:
        return "Error: the payments API did not answer; the refund may or may not have been made."


def find_refunds(order_id):
    query = urllib.parse.urlencode({"order_id": order_id})
    found = http(f"{PAYMENTS}/v1/refunds?{query}")["data"]
    return "; ".join(f"{r['id']} of {r['amount']} cents" for r in found) or "No refunds."


history = []
if "--no-history" not in sys.argv:
    with open(os.environ["TWICE_HISTORY"], encoding="utf-8") as f:
        history = json.load(f)
messages = [
    {"role": "system", "content": os.environ["TWICE_SYSTEM_PROMPT"]},
    *history,
    {"role": "user", "content": os.environ["TWICE_INPUT"]},
]
auth = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
for _ in range(10):
    reply = http(MODEL_URL, {"model": "inspect", "messages": messages, "tools": TOOLS}, auth)
    message = reply["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        print(message.get("content"))
        break
    for call in message["tool_calls"]:
        fn = {"issue_refund": issue_refund, "find_refunds": find_refunds}[call["function"]["name"]]
        result = fn(**json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
