"""What an agent command is told of the session's earlier turns (``TWICE_HISTORY``), and the
conversation of a trial whose command ran twice (the ``ask_again`` fault)."""

from __future__ import annotations

import json
from pathlib import Path

from inspect_ai.model import ChatMessage, ChatMessageAssistant, ChatMessageUser, ModelOutput

HISTORY_ENV = "TWICE_HISTORY"
"""Environment variable an agent command is given: the path of a JSON file holding the
session's earlier turns, ``[{"role": "user" | "assistant", "content": TEXT}, ...]``, oldest
first: an empty list on the user's first request; under ``ask_again``, when the command is
run again with the follow-up in ``TWICE_INPUT``, the first request and the agent's answer."""


def write_history(path: Path, turns: list[tuple[str, str]]) -> None:
    """Write ``turns`` (``(role, text)``, oldest first) where :data:`HISTORY_ENV` points."""
    data = [{"role": role, "content": text} for role, text in turns]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def final_answer(output: ModelOutput, messages: list[ChatMessage]) -> str:
    """The agent's final answer: the model's last output's text, else the conversation's
    last assistant text (empty when it gave none)."""
    if output.completion:
        return output.completion
    said = (m.text for m in reversed(messages) if isinstance(m, ChatMessageAssistant) and m.text)
    return next(said, "")


def joined(first: list[ChatMessage], second: list[ChatMessage], asked: str) -> list[ChatMessage]:
    """The trial's conversation across both runs of the command: the first run's, then the
    second's from the user's follow-up ``asked`` on (an agent that passed its history on
    sent the first exchange again, which is not repeated).

    A second run that never sent the follow-up to the model keeps its whole conversation
    (but system messages), after the follow-up."""
    for i in range(len(second) - 1, -1, -1):
        m = second[i]
        if isinstance(m, ChatMessageUser) and m.text == asked:
            return [*first, *second[i:]]
    rest = [m for m in second if m.role != "system"]
    return [*first, ChatMessageUser(content=asked), *rest]
