"""Your own agent, unchanged: the OpenAI async client, a tool loop, httpx to your payments API.

Run it under twice with its production URL served by the trial's mock payments service:

    twice run --agent docs/examples/my_agent.py:agent --mock payments=https://api.example.com \
        --task refund --fault lost_reply --model stub/retry --model stub/verify
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
from openai import AsyncOpenAI

PAYMENTS_URL = os.environ.get("PAYMENTS_URL", "https://api.example.com")
MODEL = os.environ.get("AGENT_MODEL", "gpt-5-mini")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": "Refund money to the customer for an order. This moves real money.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": 'e.g. "order_1042"'},
                    "amount": {"type": "number", "description": "US dollars, e.g. 4.99"},
                    "reason": {"type": "string"},
                },
                "required": ["order_id", "amount"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "find_refunds",
            "description": "List the refunds already made on an order. Read-only.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
]


async def run_tool(http: httpx.AsyncClient, name: str, args: dict[str, Any]) -> str:
    """Call the payments API; tell the model honestly what happened."""
    try:
        if name == "issue_refund":
            cents = round(float(args["amount"]) * 100)
            reason = args.get("reason", "")
            payload = {"order_id": args["order_id"], "amount": cents, "reason": reason}
            response = await http.post(f"{PAYMENTS_URL}/v1/refunds", json=payload)
            response.raise_for_status()
            return f"Created refund {response.json()['id']}."
        if name == "find_refunds":
            params = {"order_id": args["order_id"]}
            response = await http.get(f"{PAYMENTS_URL}/v1/refunds", params=params)
            response.raise_for_status()
            ids = [r["id"] for r in response.json()["data"]]
            return f"Refunds: {', '.join(ids)}." if ids else "No refunds found."
        return f"Error: unknown tool {name!r}."
    except httpx.TimeoutException:
        return "Error: the payments API timed out; the refund may or may not have been made."
    except httpx.HTTPStatusError as ex:
        return f"Error: the payments API answered HTTP {ex.response.status_code}."


async def agent(request: str, ctx: Any = None) -> str:
    """Answer one support request. ``ctx`` is twice's AgentContext when run under twice."""
    model = ctx.model if ctx is not None else MODEL  # "inspect" under twice
    system = ctx.instructions if ctx is not None else "You are a support agent."
    client = AsyncOpenAI()
    messages: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": request},
    ]
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(10):
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                args = json.loads(call.function.arguments or "{}")
                result = await run_tool(http, call.function.name, args)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "I could not finish within 10 steps."
