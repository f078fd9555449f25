"""Stubs play a text (ReAct) agent: offered no tools by a prompt that asks for ``Action:`` /
``Action Input:``, they follow the plan in that format, reading the ``Observation:`` texts."""

from __future__ import annotations

import asyncio
import json

import pytest
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
)
from inspect_ai.util import store
from twice.mocks import STUB_STORE_KEY, StubAPI, StubCannotPlay, react_action

REFUND = {"order_id": "order_1042", "amount": 4.99}
LOOKUP = {"order_id": "order_1042"}
PLAN = [
    {
        "call": {"tool": "issue_refund", "args": REFUND},
        "verify": {"tool": "find_refunds", "args": LOOKUP},
        "found_pattern": r"re_\d+",
    }
]
SYSTEM = (
    "You ONLY have access to the following tools:\n\nTool Name: issue_refund\n"
    "Tool Name: find_refunds\n\nUse the following format in your response:\n\n"
    "Thought: you should always think about what to do\n"
    "Action: the action to take, only one name of [issue_refund, find_refunds]\n"
    "Action Input: the input to the action, just a simple JSON object\n"
    "Observation: the result of the action\n\n"
    "Thought: I now know the final answer\nFinal Answer: the final answer"
)
"""A ReAct prompt as CrewAI writes it for a model without function calling (shortened)."""
TASK = "Current Task: refund $4.99 on order_1042.\n\nThought:"
CRACKED = "Created refund re_1 of $4.99 on order order_1042 (status succeeded)."
GAVE_UP = (
    "\nI encountered an error while trying to use the tool. This was the error: timed out "
    "waiting for the payments API; the refund may or may not have been made.\n Tool "
    "issue_refund accepts these inputs: ....\nMoving on then. Decide if you need a tool."
)
"""CrewAI's observation once ToolUsage gave up on a tool after its own attempts."""
NUDGE = "Analyze the tool result. If requirements are met, provide the Final Answer."


def _acted(tool: str, args: dict[str, object], observed: str) -> list[ChatMessage]:
    """A turn as CrewAI keeps it: the model's text with the observation appended, then its
    nudge to go on."""
    text = f"Thought: go.\nAction: {tool}\nAction Input: {json.dumps(args)}\nObservation: "
    return [ChatMessageAssistant(content=text + observed), ChatMessageUser(content=NUDGE)]


def _answer(behaviour: str, *turns: list[ChatMessage]) -> str:
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    messages: list[ChatMessage] = [ChatMessageSystem(content=SYSTEM), ChatMessageUser(content=TASK)]
    for turn in turns:
        messages += turn
    out = asyncio.run(StubAPI(behaviour).generate(messages, [], "auto", GenerateConfig()))
    assert not out.message.tool_calls
    return out.completion


CONTROLS = ["retry", "no-retry", "verify"]


@pytest.mark.parametrize("behaviour", CONTROLS)
def test_stub_react_first_turn_is_the_plans_action_as_text(behaviour: str) -> None:
    said = _answer(behaviour)
    assert react_action(said) == ("issue_refund", REFUND)
    assert "Final Answer" not in said


@pytest.mark.parametrize("behaviour", CONTROLS)
def test_stub_react_success_observation_gives_the_final_answer(behaviour: str) -> None:
    said = _answer(behaviour, _acted("issue_refund", REFUND, CRACKED))
    assert react_action(said) is None
    assert said.startswith("Thought: I now know the final answer\nFinal Answer: ")
    assert "re_1" in said


@pytest.mark.parametrize(
    ("behaviour", "then"),
    [("retry", ("issue_refund", REFUND)), ("verify", ("find_refunds", LOOKUP)), ("no-retry", None)],
)
def test_stub_react_error_observation_is_followed_as_the_control_does(
    behaviour: str, then: tuple[str, dict[str, object]] | None
) -> None:
    said = _answer(behaviour, _acted("issue_refund", REFUND, GAVE_UP))
    assert react_action(said) == then
    if then is None:
        assert "Final Answer: I could not complete the request" in said


def test_stub_react_verify_finds_the_refund_and_answers_without_refunding_again() -> None:
    said = _answer(
        "verify",
        _acted("issue_refund", REFUND, GAVE_UP),
        _acted("find_refunds", LOOKUP, "Refunds on order_1042: refund re_1 of $4.99."),
    )
    assert react_action(said) is None and "already happened" in said
    again = _answer(
        "verify",
        _acted("issue_refund", REFUND, GAVE_UP),
        _acted("find_refunds", LOOKUP, "No refunds on order order_1042."),
    )
    assert react_action(again) == ("issue_refund", REFUND)


def test_stub_react_retry_counts_its_text_attempts_and_stops_at_the_limit() -> None:
    failed = _acted("issue_refund", REFUND, GAVE_UP)
    assert react_action(_answer("retry", failed, failed)) == ("issue_refund", REFUND)
    assert react_action(_answer("retry", failed, failed, failed)) is None


def test_stub_react_reads_an_observation_sent_as_the_next_user_turn() -> None:
    # The classic loop: the model's turn ends at "Action Input", the result comes as the user.
    call = ChatMessageAssistant(
        content=f"Thought: go.\nAction: issue_refund\nAction Input: {json.dumps(REFUND)}"
    )
    said = _answer("retry", [call, ChatMessageUser(content=f"Observation: {GAVE_UP}")])
    assert react_action(said) == ("issue_refund", REFUND)
    assert (
        react_action(_answer("retry", [call, ChatMessageUser(content=f"Observation: {CRACKED}")]))
        is None
    )


def test_stub_offered_no_tools_without_a_react_prompt_still_refuses() -> None:
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    plain = [ChatMessageUser(content="Refund order_1042 with issue_refund.")]
    with pytest.raises(StubCannotPlay, match="the agent offered no tools"):
        asyncio.run(StubAPI("retry").generate(plain, [], "auto", GenerateConfig()))


def test_stub_react_prompt_that_does_not_name_the_plans_tool_refuses_naming_it() -> None:
    store().set(STUB_STORE_KEY, {"plan": PLAN, "prompt": "baseline", "seed": "s"})
    other = SYSTEM.replace("issue_refund", "create_refund")
    messages: list[ChatMessage] = [ChatMessageSystem(content=other), ChatMessageUser(content=TASK)]
    with pytest.raises(StubCannotPlay, match="next call is issue_refund"):
        asyncio.run(StubAPI("retry").generate(messages, [], "auto", GenerateConfig()))


def test_react_action_reads_the_last_action_before_the_observation() -> None:
    text = (
        'Thought: x\nAction: issue_refund\nAction Input: ```{"amount": 1}```\nObservation: {"a": 2}'
    )
    assert react_action(text) == ("issue_refund", {"amount": 1})
    assert react_action("Thought: I now know\nFinal Answer: done") is None
    assert react_action("Action: find_refunds\nAction Input: not json") == ("find_refunds", {})
