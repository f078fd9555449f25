"""The conversation faults: the user asks again, and the context is compacted.

Nothing goes wrong on the wire; twice's agent loop changes the conversation the way a
support agent's conversation changes in production:

* ``ask_again``: after the agent's final answer the user writes again (one of
  :data:`FOLLOW_UPS`, picked per trial), and the agent gets another turn. The user still wants
  the action done once. A call that repeats an action already sent carries the retry source
  ``user``.
* ``compaction``: as soon as the result of the agent's first mutating call that got one is in
  the conversation, before the model's next turn, inspect's edit compaction
  (``CompactionEdit``) replaces every tool result with its placeholder, and a note tells the
  agent the context was compacted and asks it to continue. The goal (the user's request) and
  the calls the agent made stay; what they returned is gone. A call that repeats an action
  already sent carries the retry source ``compaction``.

A fault name carries at most one of them, alone (``ask_again``) or after a wire fault
(``lost_reply+ask_again``): see ``twice.mocks.get_fault``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from inspect_ai.model import ChatMessage, ChatMessageUser, CompactionEdit, get_model

if TYPE_CHECKING:
    from ._context import TrialContext

FOLLOW_UPS: tuple[str, ...] = (
    "Did {thing} go through? I want to be sure it was done.",
    "I don't see {thing} on my side yet. Can you check it went through?",
    "Can you make sure {thing} actually happened? The customer is asking.",
)
"""What the user writes after the agent's final answer (``ask_again``): asks whether it went
through, says they do not see it yet, asks to make sure. None asks for it to be done again."""

THINGS: dict[str, str] = {
    "refund": "the refund",
    "send_email": "the email",
    "create_ticket": "the ticket",
    "place_order": "the order",
    "travel_booking": "the booking",
    "archive_record": "the archiving",
}
"""What the follow-ups call the task's action, by built-in task; other tasks: ``it``."""

COMPACTION_NOTE = (
    "This conversation was compacted to fit the context window: the results of earlier tool "
    "calls were removed. Continue with the user's request."
)
"""What the agent is told after a compaction (agent frameworks add such a note)."""


def follow_up(task: str, sample_id: str | int, epoch: int) -> str:
    """The user's follow-up in one trial: the same trial always gets the same one."""
    digest = hashlib.sha256(f"{task}:{sample_id}:{epoch}".encode()).digest()
    template = FOLLOW_UPS[digest[0] % len(FOLLOW_UPS)]
    return template.format(thing=THINGS.get(task, "it"))


def has_mutating_result(ctx: TrialContext) -> bool:
    """Whether a mutating call of the trial has had its reply delivered (a result to forget)."""
    return any(a.mutating and a.outcome == "ok" for a in ctx.services.ledger.attempts)


async def compact(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The conversation after a compaction: inspect's ``CompactionEdit`` with no tool result
    kept, then :data:`COMPACTION_NOTE` as the user's turn."""
    # keep_thinking_turns="all": clearing reasoning asks the model's provider whether it can,
    # and there is no reasoning in a stub's turns to clear.
    strategy = CompactionEdit(keep_tool_uses=0, keep_thinking_turns="all", memory=False)
    compacted, _ = await strategy.compact(get_model(), list(messages), [])
    return [*compacted, ChatMessageUser(content=COMPACTION_NOTE)]
