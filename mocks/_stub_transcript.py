"""What a stub reads back from a conversation: whether a tool result is an error and of which
kind, the ids it gives its tool calls, and a history a framework wrote as text (smolagents)
turned back into tool-call messages, so a stub keeps its place in the plan whatever shape
the framework hands the conversation back in."""

from __future__ import annotations

import ast
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

UNKNOWN_OUTCOME = "may or may not have been"
"""Phrase in every unknown-outcome tool error (timeouts, 5xx): the action may have happened."""

ERROR_TEXT = re.compile(
    r"^\s*error\b|^\s*\{\s*\"error\"|an error occurred while running the tool|"
    # Google ADK's ReflectAndRetryToolPlugin: a JSON object naming the exception's type.
    r"^\s*\{[^\n]*\"error_type\"\s*:|"
    r"fix the errors and try again|"
    # A ReAct agent that gave up on a tool after its own attempts (CrewAI's ToolUsage).
    r"i encountered an error while trying to use the tool|"
    # A framework that hands the model the bare error message (the Vercel AI SDK): Node's
    # fetch when the connection failed or its AbortSignal.timeout fired, and a tool's own
    # error for a reply that was not 2xx.
    r"^\s*(?:TypeError: )?fetch failed|the operation was aborted due to timeout|"
    r"^\s*HTTP [45]\d\d\b|" + re.escape(UNKNOWN_OUTCOME),
    re.IGNORECASE,
)
"""A tool result whose text matches this is an error even when it arrives as plain text."""
TIMEOUT_TEXT = re.compile(
    r"timeout|timed out|"
    # A connection closed after the request went out (reset_after_commit), as httpx, Node and
    # the connection itself name it: the reply was lost, not the request.
    r"server disconnected|connection (?:was )?(?:closed|reset)|RemoteProtocolError|"
    r"ECONNRESET|UND_ERR_SOCKET|other side closed",
    re.IGNORECASE,
)
"""An error whose text matches this (or says :data:`UNKNOWN_OUTCOME`) is an unknown outcome:
a timeout, or a connection closed before the reply."""

ID_PREFIX = "call_stub_"
"""How a stub's tool-call ids begin: ``call_`` as OpenAI's do, since some frameworks (Agno)
replace an id of another shape with one of their own, and the stub would lose its place."""
STUB_ID = re.compile(r"^(?:call_)?stub_(?:r\d+_)?s(?P<step>\d+)_(?P<kind>[avc])(?P<n>\d+)")
"""A stub's tool-call id: the plan step, the kind of call (action, verify, call) and its count."""


MCP_TOOL = re.compile(r"^mcp__(?P<server>.+?)__(?P<tool>.+)$")
"""How the Claude Code CLI (the Claude Agent SDK) names a tool of an MCP server it offers the
model: ``mcp__<server>__<tool>``."""

FINAL_ANSWER_TOOL = "final_answer"
"""The tool a smolagents agent ends its run with (its ``FinalAnswerTool``): offered it, a stub
gives its final answer by calling it, as the agent's system prompt asks a model to."""

_CALLING = re.compile(r"^\s*Calling tools:\s*(?P<calls>\[.*\])\s*$", re.DOTALL)
_RESULT = re.compile(
    r"^\s*(?:Call id: (?P<id>\S+)\s*)?(?P<text>(?:Observation|Error):.*)$", re.DOTALL
)
_TOOL_FAILED = re.compile(r"Error executing tool '(?P<tool>[^']+)' with arguments")


def offered_name(tool: str, names: set[str]) -> str:
    """The name under which the agent offers the task's tool ``tool``: its own, else the one
    ``mcp__<server>__<tool>`` name that stands for it (a task's tools served to the model
    through an MCP server, as the Claude Agent SDK does), else ``tool`` unchanged."""
    if tool in names:
        return tool
    served = [n for n in names if (m := MCP_TOOL.match(n)) is not None and m["tool"] == tool]
    return served[0] if len(served) == 1 else tool


def as_final_answer(out: ModelOutput, names: set[str]) -> ModelOutput:
    """A text answer as a call of the agent's final-answer tool, when it offers one."""
    if FINAL_ANSWER_TOOL not in names or out.message.tool_calls:
        return out
    call = ToolCall(
        id=f"{ID_PREFIX}final", function=FINAL_ANSWER_TOOL, arguments={"answer": out.completion}
    )
    final = ModelOutput.from_message(
        ChatMessageAssistant(content="", tool_calls=[call], model=out.model),
        stop_reason="tool_calls",
    )
    final.usage = out.usage
    return final


def from_text_transcript(
    messages: list[ChatMessage], plan: list[dict[str, Any]]
) -> list[ChatMessage]:
    """A conversation whose tool calls the agent wrote as text, as tool-call messages.

    smolagents sends its ``ToolCallingAgent``'s history as text: an assistant turn
    ``Calling tools: [{'id': ..., 'function': {'name': ..., 'arguments': ...}}]`` and a user
    turn ``Observation: ...`` or ``Error: ...``. A tool that raised leaves no call at all, only
    ``Error: Error executing tool 'NAME' with arguments {...}: ...``: the call is rebuilt from
    the plan (the step whose action or lookup is that tool, the next attempt of it), as a
    model reading the error knows what it had called. Any other conversation is unchanged."""
    if not any(
        isinstance(m, ChatMessageAssistant) and not m.tool_calls and _CALLING.match(m.text)
        for m in messages
    ) and not any(isinstance(m, ChatMessageUser) and _TOOL_FAILED.search(m.text) for m in messages):
        return messages
    out: list[ChatMessage] = []
    pending: list[ToolCall] = []  # calls of the last assistant turn not yet answered
    made: list[str] = []  # ids of the calls so far
    for m in messages:
        if (
            isinstance(m, ChatMessageAssistant)
            and not m.tool_calls
            and (found := _CALLING.match(m.text)) is not None
        ):
            try:
                listed = ast.literal_eval(found["calls"])
            except (ValueError, SyntaxError):
                listed = []
            pending = [
                ToolCall(
                    id=str(c.get("id")),
                    function=c["function"]["name"],
                    arguments=dict(c["function"].get("arguments") or {}),
                )
                for c in listed
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
            made += [c.id for c in pending]
            out.append(ChatMessageAssistant(content="", tool_calls=pending, model=m.model))
            continue
        result = _RESULT.match(m.text) if isinstance(m, ChatMessageUser) else None
        if result is not None:
            failed = _TOOL_FAILED.search(m.text)
            if not pending and failed is not None:
                call = _rebuilt_call(failed["tool"], plan, made)
                if call is not None:
                    made.append(call.id)
                    if (
                        out
                        and isinstance(out[-1], ChatMessageAssistant)
                        and not out[-1].tool_calls
                        and not out[-1].text.strip()
                    ):
                        out.pop()  # the empty turn that made the call
                    out.append(ChatMessageAssistant(content="", tool_calls=[call]))
                    pending = [call]
            if pending:
                call = next((c for c in pending if c.id == result["id"]), pending[0])
                pending = [c for c in pending if c is not call]
                out.append(
                    ChatMessageTool(
                        content=result["text"], tool_call_id=call.id, function=call.function
                    )
                )
                continue
        pending = []
        out.append(m)
    return out


def _rebuilt_call(tool: str, plan: list[dict[str, Any]], made: list[str]) -> ToolCall | None:
    """The call a stub made of ``tool`` that the transcript lost: the first plan step whose
    action (else lookup) is ``tool``, as its next attempt after the ones in ``made``."""
    for kind, key in (("a", "call"), ("v", "verify")):
        for step, spec in enumerate(plan):
            action = spec.get(key) or {}
            if action.get("tool") != tool:
                continue
            n = 1 + sum(
                1
                for i in made
                if (m := STUB_ID.match(i)) is not None
                and int(m["step"]) == step
                and m["kind"] == kind
            )
            return ToolCall(
                id=f"{ID_PREFIX}s{step}_{kind}{n}",
                function=tool,
                arguments=dict(action.get("args") or {}),
            )
    return None


def is_error(result: ChatMessageTool) -> bool:
    """Whether a tool result is an error: inspect's error field, or error text (bridged).

    A result that is nothing but the exception's message (AutoGen and Agno send
    ``str(exception)``: "timed out waiting for the response") is an error when that message
    opens with a timeout or a lost connection: no tool's success text does."""
    text = result.text
    return (
        result.error is not None
        or ERROR_TEXT.search(text) is not None
        or TIMEOUT_TEXT.match(text.lstrip()) is not None
    )


def is_unknown(text: str) -> bool:
    """Whether an error text says the outcome is unknown (the action may have happened)."""
    return UNKNOWN_OUTCOME in text or TIMEOUT_TEXT.search(text) is not None
