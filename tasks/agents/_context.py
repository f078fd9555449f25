"""What an agent under test is given, and the errors twice raises about agents."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twice.mocks import RunError, UsageError

BRIDGE_MODEL = "inspect"
"""The model name an agent must send for inspect's agent bridge to answer with the eval's model."""


class AgentError(UsageError, ValueError):
    """An agent that cannot be run as asked: names the bad value and what is accepted."""


class AgentLimitError(RunError, RuntimeError):
    """The agent did something the in-process agent bridge cannot serve (a documented limit).

    Raised out of the agent's trial as a sample error (not scored as ``crashed``): it is a
    problem with how the agent is wired to twice, not a finding about the agent.
    """


@dataclass(frozen=True)
class AgentContext:
    """What an agent function is given next to the user's request.

    Attributes:
        urls: Base URL of each mock service of the trial, by service name
            (``{"payments": "https://payments.twice.test"}``). Requests to these URLs (or to
            hosts declared with ``--mock SERVICE=URL``) from any ``httpx`` client are served
            by the trial's services, with its fault, keys and ledger.
        model: The model name to send to the OpenAI or Anthropic async client: ``inspect``,
            which the agent bridge routes to the eval's model (stub models included).
        instructions: The system prompt of the cell's prompt (``baseline``...), for agents that
            take instructions.
        task: The twice task name (``refund``).
        sample_id: The dataset sample's id.
        epoch: The epoch (1-based).
        metadata: The sample's own metadata, minus what only the eval may see (the stubs' gold
            plan, the expected effects, the services' starting state).
        history: The conversation's earlier turns as ``(role, text)`` pairs (``"user"``,
            ``"assistant"``), oldest first: empty on the first request; under the
            ``ask_again`` fault the user's request and the agent's answer when the agent is
            called again with the user's follow-up, as a chat product keeps a session.
    """

    urls: Mapping[str, str]
    model: str = BRIDGE_MODEL
    instructions: str = ""
    task: str = ""
    sample_id: str | int = ""
    epoch: int = 1
    metadata: Mapping[str, Any] = field(default_factory=dict)
    history: tuple[tuple[str, str], ...] = ()


AgentFunction = Callable[[str, AgentContext], Awaitable[str]]
"""An agent under test: ``async def agent(request: str, ctx: AgentContext) -> str``.

It is given the user's request and an :class:`AgentContext`, and returns its final answer.
"""
