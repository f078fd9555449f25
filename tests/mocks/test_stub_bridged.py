"""Stubs read a failure from a tool result's text when it comes from an agent outside inspect.

Through inspect's agent bridge, a tool result is plain text (``error`` is None), so a stub that
looked only at ``error`` would take "Error: ... may or may not have been made" for a success.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
)
from inspect_ai.tool import ToolCall, ToolCallError, ToolInfo
from inspect_ai.util import store
from twice.mocks import STUB_STORE_KEY, StubAPI, StubCannotPlay

PLAN = [
    {
        "call": {"tool": "issue_refund", "args": {"order_id": "order_1042", "amount": 4.99}},
        "verify": {"tool": "find_refunds", "args": {"order_id": "order_1042"}},
        "found_pattern": r"re_\d+",
    }
]


TOOLS = [ToolInfo(name=name, description=name) for name in ("issue_refund", "find_refunds")]


def _after(result: str) -> list[object]:
    call = ToolCall(id="stub_s0_a1", function="issue_refund", arguments=PLAN[0]["call"]["args"])
    return [
        ChatMessageUser(content="Refund order_1042."),
        ChatMessageAssistant(content="", tool_calls=[call]),
        ChatMessageTool(content=result, tool_call_id="stub_s0_a1", function="issue_refund"),
    ]


def _next_call(behaviour: str, result: str, tools: list[ToolInfo] = TOOLS) -> str | None:
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    out = asyncio.run(
        StubAPI(behaviour).generate(_after(result), tools, "auto", GenerateConfig())  # type: ignore[arg-type]
    )
    calls = out.message.tool_calls
    return calls[0].function if calls else None


UNKNOWN = "Error: the payments API did not answer; the refund may or may not have been made."


@pytest.mark.parametrize(
    ("behaviour", "then"), [("retry", "issue_refund"), ("verify", "find_refunds")]
)
def test_stub_sees_a_plain_text_error_from_a_bridged_agent(behaviour: str, then: str) -> None:
    assert _next_call(behaviour, UNKNOWN) == then


def test_stub_takes_a_plain_text_success_as_success() -> None:
    assert _next_call("retry", "Created refund re_1.") is None


def test_stub_verify_offered_no_lookup_gives_up_rather_than_calling_it() -> None:
    # The failing path: it called find_refunds, which the agent did not offer (the README's
    # own --agent-cmd example then crashed on every trial).
    assert _next_call("verify", UNKNOWN, TOOLS[:1]) is None
    assert _next_call("retry", UNKNOWN, TOOLS[:1]) == "issue_refund"


@pytest.mark.parametrize("behaviour", ["retry", "verify", "no-retry"])
def test_stub_whose_action_the_agent_does_not_offer_is_an_error_naming_both(
    behaviour: str,
) -> None:
    # The failing path: every stub called issue_refund anyway; the framework raised "tool not
    # found", so every control crashed alike with 0% duplicated, and exit 0.
    renamed = [ToolInfo(name=n, description=n) for n in ("create_refund", "list_refunds")]
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    first = [ChatMessageUser(content="Refund order_1042.")]
    with pytest.raises(StubCannotPlay, match="next call is issue_refund, but the agent offered "
                       "create_refund, list_refunds"):  # fmt: skip
        asyncio.run(StubAPI(behaviour).generate(first, renamed, "auto", GenerateConfig()))  # type: ignore[arg-type]
    with pytest.raises(StubCannotPlay, match="the agent offered no tools"):
        asyncio.run(StubAPI(behaviour).generate(first, [], "auto", GenerateConfig()))  # type: ignore[arg-type]


MCP_TOOLS = [
    ToolInfo(name=f"mcp__twice__{name}", description=name)
    for name in ("issue_refund", "find_refunds", "get_order")
] + [ToolInfo(name="DeferredToolPlaceholder", description="a tool of the CLI's own")]
"""The task's tools as the Claude Code CLI (the Claude Agent SDK) offers them: through an MCP
server, each named ``mcp__<server>__<tool>``, beside a tool of its own."""


@pytest.mark.parametrize(
    ("behaviour", "then"),
    [("retry", "mcp__twice__issue_refund"), ("verify", "mcp__twice__find_refunds")],
)
def test_stub_calls_the_tasks_tools_by_the_mcp_names_an_agent_offers(
    behaviour: str, then: str
) -> None:
    # The failing path: the stub called issue_refund, which the agent offered only as
    # mcp__twice__issue_refund, and every control refused to play (StubCannotPlay).
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    first = asyncio.run(
        StubAPI(behaviour).generate(
            [ChatMessageUser(content="Refund order_1042.")], MCP_TOOLS, "auto", GenerateConfig()
        )  # type: ignore[arg-type]
    )
    (call,) = first.message.tool_calls or []
    assert call.function == "mcp__twice__issue_refund"
    assert call.arguments == PLAN[0]["call"]["args"]
    # The CLI's error text for a tool that raised with an empty message: an error (its
    # is_error flag) of no known kind.
    history = [
        ChatMessageUser(content="Refund order_1042."),
        first.message,
        ChatMessageTool(
            content="Command failed with no output",
            tool_call_id=call.id,
            function=call.function,
            error=ToolCallError("unknown", "Command failed with no output"),
        ),
    ]
    again = asyncio.run(StubAPI(behaviour).generate(history, MCP_TOOLS, "auto", GenerateConfig()))  # type: ignore[arg-type]
    if behaviour == "retry":
        assert [c.function for c in again.message.tool_calls or []] == [then]
    else:
        # stub/verify looks first only after an unknown outcome, which this text does not say.
        assert not again.message.tool_calls
    timeout = [*history[:2], ChatMessageTool(content="Error: ReadTimeout", tool_call_id=call.id)]
    looked = asyncio.run(StubAPI(behaviour).generate(timeout, MCP_TOOLS, "auto", GenerateConfig()))  # type: ignore[arg-type]
    assert [c.function for c in looked.message.tool_calls or []] == [then]


def test_stub_does_not_guess_between_two_mcp_servers_offering_one_tool() -> None:
    two = [ToolInfo(name=f"mcp__{s}__issue_refund", description="refund") for s in ("a", "b")]
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    first = [ChatMessageUser(content="Refund order_1042.")]
    with pytest.raises(StubCannotPlay, match="next call is issue_refund, but the agent offered "
                       "mcp__a__issue_refund, mcp__b__issue_refund"):  # fmt: skip
        asyncio.run(StubAPI("retry").generate(first, two, "auto", GenerateConfig()))  # type: ignore[arg-type]


def test_stub_tool_call_ids_have_openais_shape_so_frameworks_keep_them() -> None:
    # Agno replaces a tool-call id that does not start with ``call_`` (and is longer than 40
    # characters) with ``call_000…``: a stub whose ids did not look like OpenAI's lost its
    # place, took the lost reply for its first turn's answer and never retried.
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    first = asyncio.run(
        StubAPI("retry").generate(
            [ChatMessageUser(content="Refund.")], TOOLS, "auto", GenerateConfig()
        )  # type: ignore[arg-type]
    )
    (call,) = first.message.tool_calls or []
    assert call.id.startswith("call_") and len(call.id) <= 40
    # Its own earlier calls are still found by that id: the retry follows the error.
    history = [
        ChatMessageUser(content="Refund."),
        first.message,
        ChatMessageTool(content="timed out waiting for the response", tool_call_id=call.id),
    ]
    again = asyncio.run(StubAPI("retry").generate(history, TOOLS, "auto", GenerateConfig()))  # type: ignore[arg-type]
    assert [c.function for c in again.message.tool_calls or []] == ["issue_refund"]
    assert (again.message.tool_calls or [])[0].id != call.id


FINAL = ToolInfo(name="final_answer", description="Provides a final answer to the given problem.")
LOST = (
    "Error:\nError executing tool 'issue_refund' with arguments {'order_id': 'order_1042', "
    "'amount': 4.99}: ReadTimeout: timed out waiting for the response\nPlease try again or use "
    "another tool\nNow let's retry: take care not to repeat previous errors!"
)


def _generate(behaviour: str, messages: list[object], tools: list[ToolInfo]) -> Any:
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    out = asyncio.run(StubAPI(behaviour).generate(messages, tools, "auto", GenerateConfig()))  # type: ignore[arg-type]
    return out.message


@pytest.mark.parametrize(
    ("behaviour", "then"),
    [("retry", "issue_refund"), ("verify", "find_refunds"), ("no-retry", "final_answer")],
)
def test_stub_reads_a_smolagents_text_transcript_whose_failed_call_was_dropped(
    behaviour: str, then: str
) -> None:
    # smolagents keeps no record of a call whose tool raised: the model gets an empty turn
    # and the error as a user message. The failing path: every stub took it for the start of
    # the task and refunded again, and, never calling final_answer, looped to max_steps.
    messages = [
        ChatMessageUser(content="New task:\nRefund order_1042."),
        ChatMessageAssistant(content=""),
        ChatMessageUser(content=LOST),
    ]
    (call,) = _generate(behaviour, messages, [*TOOLS, FINAL]).tool_calls or []
    assert call.function == then
    if then == "issue_refund":
        assert call.id == "call_stub_s0_a2"  # the second attempt: the first was rebuilt


def test_stub_reads_smolagents_calling_tools_text_and_answers_through_final_answer() -> None:
    calls = (
        "\nCalling tools:\n[{'id': 'call_stub_s0_a2', 'type': 'function', 'function': "
        "{'name': 'issue_refund', 'arguments': {'order_id': 'order_1042', 'amount': 4.99}}}]"
    )
    messages = [
        ChatMessageUser(content="New task:\nRefund order_1042."),
        ChatMessageAssistant(content=""),
        ChatMessageUser(content=LOST),
        ChatMessageAssistant(content=calls),
        ChatMessageUser(content="Observation:\nCreated refund re_2 of $4.99 on order order_1042."),
    ]
    (call,) = _generate("retry", messages, [*TOOLS, FINAL]).tool_calls or []
    assert call.function == "final_answer"
    assert "re_2" in call.arguments["answer"]
    # Without a final_answer tool on offer, the same answer is plain text.
    assert not _generate("retry", messages, TOOLS).tool_calls
