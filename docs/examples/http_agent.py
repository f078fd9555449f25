"""A refund agent outside twice: plain HTTP to the model and to the payments API.

twice run --task refund --model stub/retry --agent-cmd "python docs/examples/http_agent.py"
"""

import json
import os
import urllib.error
import urllib.request

PAYMENTS = os.environ["TWICE_PAYMENTS_URL"]
MODEL_URL = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": "Refund money to the customer for an order.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "amount": {"type": "number", "description": "US dollars"},
                    "reason": {"type": "string"},
                },
                "required": ["order_id", "amount"],
            },
        },
    }
]


def http(url, body=None, headers=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout) as r:
        return json.load(r)


def issue_refund(order_id, amount, reason=""):
    body = {"order_id": order_id, "amount": round(amount * 100), "reason": reason}
    try:
        # A lost reply is held open until this timeout gives up: keep it short.
        refund = http(f"{PAYMENTS}/v1/refunds", body, timeout=2)
    except urllib.error.HTTPError as ex:
        return f"Error: HTTP {ex.code}; no refund was made."
    except OSError:  # the connection died or timed out: we do not know what happened
        return "Error: the payments API did not answer; the refund may or may not have been made."
    return f"Created refund {refund['id']}."


# The session's earlier turns: empty, or the first exchange when the user asks again.
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
        result = issue_refund(**json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
