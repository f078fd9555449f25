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

An agent under test (``--agent``, ``--agent-cmd``) keeps its own conversation, which twice
does not hold; twice holds the model endpoint its turns go through. ``ask_again`` calls (or
runs) the agent a second time with the follow-up and the earlier turns as its history;
``compaction`` is done where twice stands, on the model's side of the bridge
(:class:`CompactingFilter`): from the model turn after the first mutating call's reply was
delivered on, the model reads the conversation compacted as above, with the same
:func:`compact`. What the agent's own process keeps (its variables, an action log of its
own) survives, as it does when a framework compacts the context in production.

A fault name carries at most one of them, alone (``ask_again``) or after a wire fault
(``lost_reply+ask_again``): see ``twice.mocks.get_fault``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from inspect_ai.log import transcript
from inspect_ai.model import (
    ChatMessage,
    ChatMessageUser,
    CompactionEdit,
    GenerateConfig,
    GenerateInput,
    Model,
    get_model,
)
from inspect_ai.tool import ToolChoice, ToolInfo
from twice.mocks import Ledger

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
    return mutating_result_delivered(ctx.services.ledger)


def mutating_result_delivered(ledger: Ledger) -> bool:
    """Whether a mutating attempt of ``ledger`` had its reply delivered (a result to forget)."""
    return any(a.mutating and a.outcome == "ok" for a in ledger.attempts)


async def compact(messages: list[ChatMessage], model: Model | None = None) -> list[ChatMessage]:
    """The conversation after a compaction: inspect's ``CompactionEdit`` with no tool result
    kept, then :data:`COMPACTION_NOTE` as the user's turn."""
    # keep_thinking_turns="all": clearing reasoning asks the model's provider whether it can,
    # and there is no reasoning in a stub's turns to clear.
    strategy = CompactionEdit(keep_tool_uses=0, keep_thinking_turns="all", memory=False)
    compacted, _ = await strategy.compact(model or get_model(), list(messages), [])
    return [*compacted, ChatMessageUser(content=COMPACTION_NOTE)]


class CompactingFilter:
    """The ``compaction`` fault for an agent under test: a generate filter for inspect's agent
    bridge (``agent_bridge(filter=...)``, ``sandbox_agent_bridge(filter=...)``).

    At the first model turn after a mutating call's reply was delivered, the conversation the
    agent sent is compacted (:func:`compact`: every tool result replaced, then
    :data:`COMPACTION_NOTE`), and from then on every turn's first part, up to that point, is
    sent compacted: the agent sends its whole conversation each turn, and what was compacted
    stays compacted, as in twice's own loop. What the agent's own process keeps is left alone.

    Args:
        ledger: Reads the trial's ledger as it stands (a served trial's over HTTP).

    Attributes:
        since: How many attempts the ledger held when the compaction happened (None: not
            yet): the attempts from there on came after it (:func:`mark_source`).
    """

    def __init__(self, ledger: Callable[[], Awaitable[Ledger]]) -> None:
        self._ledger = ledger
        self._cut: int | None = None
        self._ended = False
        self.since: int | None = None

    def end(self) -> None:
        """The session it compacts has ended: a later request (the user asking again, with
        the session's history as text) is sent as the agent sends it."""
        self._ended = True

    async def __call__(
        self,
        model: Model,
        messages: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice | None,
        config: GenerateConfig,
    ) -> GenerateInput | None:
        if self._ended:
            return None
        if self._cut is None:
            ledger = await self._ledger()
            if not mutating_result_delivered(ledger):
                return None
            self._cut, self.since = len(messages), len(ledger.attempts)
            transcript().info(
                f"twice: compacted the conversation the model reads ({self._cut} messages, "
                "tool results removed) after the first mutating call's reply was delivered"
            )
        head = await compact(messages[: self._cut], model)
        return GenerateInput([*head, *messages[self._cut :]], tools, tool_choice, config)
