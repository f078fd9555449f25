"""A stub playing a text (ReAct) agent: a request that offers the model no tools but whose
prompt lists them and asks for the classic ReAct format (``Thought:`` / ``Action:`` /
``Action Input: {json}``, then ``Final Answer:``), as an agent framework does for a model
served without function calling (CrewAI when ``supports_function_calling()`` is False).

The conversation is read back as tool-call messages (each ``Action`` a call, each
``Observation:`` its result), the stub decides as it does with native tool calls, and its
answer is written back in the format the prompt asked for. A text call carries no id, so each
is given the stub id of the plan step it calls (by tool and arguments), as the next attempt of
that step: a stub keeps its place in the plan from the text alone."""

from __future__ import annotations

import json
import re
from typing import Any

from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    ChatMessageUser,
    ModelOutput,
)
from inspect_ai.tool import ToolCall

from ._stub_transcript import ID_PREFIX, STUB_ID, offered_name

_ASKS_FORMAT = re.compile(r"^\s*Action:.*^\s*Action Input:", re.MULTILINE | re.DOTALL)
_ACTION = re.compile(
    r"^\s*Action:\s*(?P<tool>[^\n]+?)\s*\n\s*Action Input:\s*(?P<input>.*)\Z",
    re.MULTILINE | re.DOTALL,
)
_OBSERVATION = re.compile(r"^\s*Observation:", re.MULTILINE)


def plan_tools(plan: list[dict[str, Any]]) -> list[str]:
    """The names of the tools a plan calls: its actions, lookups and compensations."""
    return [
        spec[key]["tool"]
        for spec in plan
        for key in ("call", "verify", "compensate")
        if isinstance(spec.get(key), dict) and spec[key].get("tool")
    ]


def react_tools(
    messages: list[ChatMessage], plan: list[dict[str, Any]], offered: set[str]
) -> set[str] | None:
    """The plan's tools a ReAct prompt names, or None when the request is not one for ReAct
    text: it ``offered`` some of the plan's tools as tools, or no message asks for the format.

    A prompt asks for ReAct when one of its system or user messages holds ``Action:`` and
    ``Action Input:`` lines (the format's instructions); the tools it offers are the plan's
    tools whose names appear in that prompt's text."""
    if offered & {offered_name(t, offered) for t in plan_tools(plan)}:
        return None
    prompts = [
        m.text
        for m in messages
        if not isinstance(m, ChatMessageAssistant | ChatMessageTool) and _ASKS_FORMAT.search(m.text)
    ]
    if not prompts:
        return None
    text = "\n".join(prompts)
    return {t for t in plan_tools(plan) if re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text)}


def _arguments(text: str) -> dict[str, Any]:
    """The JSON object of an ``Action Input``, fences and trailing text ignored."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return {}
    try:
        found = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) else {}


def react_action(text: str) -> tuple[str, dict[str, Any]] | None:
    """The tool call a ReAct text asks for: the tool named by its last ``Action:`` line and the
    JSON object of the ``Action Input:`` after it (before any ``Observation:``), or None when
    the text asks for none (a ``Final Answer``, plain prose).

    Args:
        text: A model's reply, or an agent's record of it.

    Returns:
        The tool's name and arguments (empty when the input is not a JSON object), or None.
    """
    head = text.partition("\nObservation:")[0]
    found = _ACTION.search(head)
    if found is None:
        return None
    return found["tool"], _arguments(found["input"])


def _call_id(tool: str, args: dict[str, Any], plan: list[dict[str, Any]], made: list[str]) -> str:
    """The stub id of a text call: the plan step it calls (by tool, then arguments, the
    first such step when none has the same arguments), as the next attempt after ``made``."""
    steps = [
        (step, kind, spec[key])
        for kind, key in (("a", "call"), ("v", "verify"), ("c", "compensate"))
        for step, spec in enumerate(plan)
        if isinstance(spec.get(key), dict) and spec[key].get("tool") == tool
    ]
    if not steps:
        return f"{ID_PREFIX}text_{len(made)}"
    same = [s for s in steps if (s[2].get("args") or {}) == args]
    step, kind, _ = (same or steps)[0]
    n = 1 + sum(
        1
        for i in made
        if (m := STUB_ID.match(i)) is not None and int(m["step"]) == step and m["kind"] == kind
    )
    return f"{ID_PREFIX}s{step}_{kind}{n}"


def from_react_transcript(
    messages: list[ChatMessage], plan: list[dict[str, Any]]
) -> list[ChatMessage]:
    """A ReAct conversation as tool-call messages.

    An assistant turn ``... Action: NAME / Action Input: {...}`` becomes a call; its
    ``Observation: ...`` (in the same turn, as CrewAI appends it, or in the user turn that
    follows, as the classic loop sends it) becomes the call's result. Other messages are kept."""
    out: list[ChatMessage] = []
    made: list[str] = []
    pending: ToolCall | None = None
    for m in messages:
        if isinstance(m, ChatMessageAssistant) and not m.tool_calls:
            head, _, observed = m.text.partition("\nObservation:")
            if m.text.lstrip().startswith("Observation:"):
                head, observed = "", m.text.lstrip()[len("Observation:") :]
            action = react_action(head)
            if action is None:
                out.append(m)
                continue
            tool, args = action
            call = ToolCall(id=_call_id(tool, args, plan, made), function=tool, arguments=args)
            made.append(call.id)
            out.append(ChatMessageAssistant(content="", tool_calls=[call], model=m.model))
            pending = call
            if observed:
                out.append(_result(observed, call))
                pending = None
            continue
        if pending is not None and isinstance(m, ChatMessageUser) and _OBSERVATION.match(m.text):
            out.append(_result(_OBSERVATION.split(m.text, maxsplit=1)[1], pending))
            pending = None
            continue
        if isinstance(m, ChatMessageUser) and any(isinstance(o, ChatMessageTool) for o in out[-1:]):
            # A nudge the framework adds after a result ("reason about it"): not the user
            # writing again, which would start a new round of the plan.
            continue
        out.append(m)
    return out


def _result(text: str, call: ToolCall) -> ChatMessageTool:
    return ChatMessageTool(content=text.strip(), tool_call_id=call.id, function=call.function)


def as_react_text(out: ModelOutput) -> ModelOutput:
    """A stub's answer written in the ReAct format: its first tool call as ``Thought`` /
    ``Action`` / ``Action Input`` (the format takes one action a turn), else its text as the
    ``Final Answer``."""
    calls = out.message.tool_calls or []
    if calls:
        call = calls[0]
        text = (
            f"Thought: I should use {call.function}.\n"
            f"Action: {call.function}\n"
            f"Action Input: {json.dumps(call.arguments)}"
        )
    else:
        text = f"Thought: I now know the final answer\nFinal Answer: {out.completion}"
    said = ModelOutput.from_content(out.model, text)
    said.usage = out.usage
    return said
