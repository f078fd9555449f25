"""Stubs read a failure from a tool result's text when it comes from an agent outside inspect.

Through inspect's agent bridge, a tool result is plain text (``error`` is None), so a stub that
looked only at ``error`` would take "Error: ... may or may not have been made" for a success.
"""

from __future__ import annotations

import asyncio

import pytest
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
)
from inspect_ai.tool import ToolCall
from inspect_ai.util import store
from twice.mocks import STUB_STORE_KEY, StubAPI

PLAN = [
    {
        "call": {"tool": "issue_refund", "args": {"order_id": "order_1042", "amount": 4.99}},
        "verify": {"tool": "find_refunds", "args": {"order_id": "order_1042"}},
        "found_pattern": r"re_\d+",
    }
]


def _after(result: str) -> list[object]:
    call = ToolCall(id="stub_s0_a1", function="issue_refund", arguments=PLAN[0]["call"]["args"])
    return [
        ChatMessageUser(content="Refund order_1042."),
        ChatMessageAssistant(content="", tool_calls=[call]),
        ChatMessageTool(content=result, tool_call_id="stub_s0_a1", function="issue_refund"),
    ]


def _next_call(behaviour: str, result: str) -> str | None:
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    out = asyncio.run(
        StubAPI(behaviour).generate(_after(result), [], "auto", GenerateConfig())  # type: ignore[arg-type]
    )
    calls = out.message.tool_calls
    return calls[0].function if calls else None


@pytest.mark.parametrize(
    ("behaviour", "then"), [("retry", "issue_refund"), ("verify", "find_refunds")]
)
def test_stub_sees_a_plain_text_error_from_a_bridged_agent(behaviour: str, then: str) -> None:
    text = "Error: the payments API did not answer; the refund may or may not have been made."
    assert _next_call(behaviour, text) == then


def test_stub_takes_a_plain_text_success_as_success() -> None:
    assert _next_call("retry", "Created refund re_1.") is None
