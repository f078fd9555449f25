"""An agent outside twice on a task of your own: plain HTTP to the model and the payments API.

twice run --task docs/examples/own_task/courtesy.py:courtesy_refund --model stub/retry \
  --agent-cmd "python docs/examples/own_task/courtesy_agent.py"
"""

import json
import os
import urllib.parse
import urllib.request

PAYMENTS = os.environ["TWICE_PAYMENTS_URL"]
MODEL_URL = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
ORDER = {"order_id": {"type": "string"}}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": text, "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}
    for name, text, props in [
        ("refund_order", "Refund part of an order as a courtesy (US cents). Moves real money.",
         {**ORDER, "cents": {"type": "integer"}}),
        ("list_refunds", "List the refunds already made on an order.", ORDER),
    ]
]  # fmt: skip


def http(url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=60) as r:
        return json.load(r)


def refund_order(order_id, cents):
    body = {"order_id": order_id, "amount": cents, "reason": "courtesy"}
    try:
        return "Created refund " + http(PAYMENTS + "/v1/refunds", body)["id"]
    except OSError:  # the connection died or timed out: we do not know what happened
        return "Error: the payments API did not answer; the refund may or may not have been made."


def list_refunds(order_id):
    query = urllib.parse.urlencode({"order_id": order_id})
    return ", ".join(r["id"] for r in http(f"{PAYMENTS}/v1/refunds?{query}")["data"]) or "none"


messages = [
    {"role": "system", "content": os.environ["TWICE_SYSTEM_PROMPT"]},
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
        tool = {"refund_order": refund_order, "list_refunds": list_refunds}
        result = tool[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
