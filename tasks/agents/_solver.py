"""Run an agent under test as a trial's solver, through inspect's in-process agent bridge."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from inspect_ai.agent import agent_bridge
from inspect_ai.log import transcript
from inspect_ai.model import ChatMessageTool, ModelOutput
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import LimitExceededError, store
from twice.mocks import Ledger, RunError, raise_if_stub_could_not_play

from .._conversation import CompactingFilter
from .._inspect_compat import cache_installed_versions
from .._redact import scrub, scrub_value, scrubbed_fields, secret_values
from ._attribute import attribute_attempts, intent_identity, mark_source, model_tool_calls
from ._context import AgentContext, AgentLimitError
from ._hosts import parse_hosts, serve_trial
from ._load import DUMMY_KEY, PLACEHOLDER_KEYS, load_agent

if TYPE_CHECKING:
    from .._context import TrialContexts

AGENT_STORE_KEY = "twice:agent"
"""Store key of what the agent solver records: ``{"agent", "crashed", "error"}``."""

MAX_ERROR_CHARS = 500
"""How much of a crashed agent's exception message is kept (a framework's can be huge)."""

EVAL_ONLY_METADATA = frozenset({"plan", "intents", "state"})
"""Sample metadata an agent is not shown: the stubs' gold plan, the expected effects and the
services' starting state are the eval's ground truth, not the user's request."""


def _find_limit(ex: BaseException) -> AgentLimitError | None:
    """An :class:`AgentLimitError` anywhere in the exception's cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = ex
    while current is not None and id(current) not in seen:
        if isinstance(current, AgentLimitError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


_time_limit: float | None = None
"""Seconds an in-process agent may run in one trial (None: no bound): :func:`agent_time_limit`."""


@contextmanager
def agent_time_limit(seconds: float | None) -> Iterator[None]:
    """While evals run: an agent still running after ``seconds`` in a trial is cancelled and
    the trial counts as crashed ("timed out"), as an ``--agent-cmd`` command is stopped.
    Cancelling needs the agent to await: one blocking the event loop (``time.sleep``) is not
    reached until it yields, and counts as timed out when it ends past its deadline."""
    global _time_limit
    before, _time_limit = _time_limit, seconds
    try:
        yield
    finally:
        _time_limit = before


class AgentTimedOut(RunError):
    """The agent was still running when the trial's time limit ended."""


def scrub_agent_trace(state: TaskState, since: int) -> None:
    """Scrub the environment's credentials from what an agent under test put in the log: the
    conversation and final answer on ``state``, every transcript event from event ``since``
    on (its model calls, whose input is the agent's own text; its sandbox commands and their
    output), and the transcript's attachments (inspect moves a model call's raw request and
    response text there as it records the event, leaving ``attachment://`` in its place).

    An agent is the user's code, and it holds the environment: it may put a key into a
    prompt or its answer. Inspect writes all of these to the .eval log, its sample
    summaries and the eval-set listing; CI uploads log directories. Scrubbed in place
    before the sample ends, so every copy inspect makes of them is clean. Not reached:
    inspect's bounded transcript mode (``INSPECT_TRANSCRIPT_BOUNDED``, whose evicted events
    are copies) and its realtime buffer, which a crashed eval's ``inspect log recover`` reads."""
    secrets = secret_values()
    if not secrets:
        return
    state.messages = scrub_value(state.messages, secrets)
    state.output = scrub_value(state.output, secrets)
    for event in transcript().events[since:]:
        for name, value in scrubbed_fields(event, secrets).items():
            setattr(event, name, value)
    attachments = transcript().attachments
    for key, text in list(attachments.items()):
        cleaned = scrub_value(text, secrets)
        if cleaned is not text:
            attachments[key] = cleaned


def _describe(ex: BaseException) -> str:
    text = " ".join(str(ex).split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + "…"
    return f"{type(ex).__name__}: {text}" if text else type(ex).__name__


@solver
def agent_solver(
    agent: str,
    contexts: TrialContexts,
    task: str,
    prompt_text: str,
    mocks: Mapping[str, str] | None = None,
    follow_up: Callable[[str | int, int], str] | None = None,
    compaction: bool = False,
) -> Solver:
    """Run ``agent`` on the trial's request; score what the services saw, even if it crashed.

    The trial's services (from ``trial_setup``) serve the agent's ``httpx`` requests to their
    base URLs and to the hosts in ``mocks``; its model requests for ``inspect`` go to the eval's
    model. An exception from the agent is a result: the trial is marked ``crashed`` (store key
    :data:`AGENT_STORE_KEY`) and scored from the ledger, and the exception is not re-raised
    into inspect (whose traceback rendering of framework exceptions can run for minutes). A
    documented bridge limit (:class:`AgentLimitError`) is re-raised as a short sample error.

    Args:
        agent: A built-in agent name or ``path.py:function`` / ``module:function``.
        contexts: The task's live trial contexts (filled by ``trial_setup``).
        task: The task name (given to the agent in its context).
        prompt_text: The cell's system prompt (the agent's instructions).
        mocks: Production URL by service name, served by the trial's services.
        follow_up: The ``ask_again`` fault: the user's follow-up for a trial (by sample id and
            epoch). The agent is called a second time with it and the first exchange in
            ``ctx.history``; the mutating attempts of that call carry the retry source
            ``user``.
        compaction: The ``compaction`` fault: from the model turn after the first mutating
            call's reply reached the agent, the model reads the conversation compacted
            (``CompactingFilter`` on the bridge); the mutating attempts after it that repeat
            an earlier request carry the retry source ``compaction``.
    """
    fn = load_agent(agent)
    mock_hosts = dict(mocks or {})
    cache_installed_versions()  # the bridge checks openai's version on every model call

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        ctx = contexts.pop((state.sample_id, state.epoch))
        services = ctx.services
        urls = {name: s.base_url for name, s in services.services.items()}
        hosts = parse_hosts(mock_hosts, urls)
        actx = AgentContext(
            urls=urls,
            instructions=prompt_text,
            task=task,
            sample_id=state.sample_id,
            epoch=state.epoch,
            metadata={k: v for k, v in state.metadata.items() if k not in EVAL_ONLY_METADATA},
        )
        for var in PLACEHOLDER_KEYS:
            os.environ.setdefault(var, DUMMY_KEY)
        record: dict[str, Any] = {"agent": agent, "crashed": False, "error": ""}
        asked_from: int | None = None
        bridge = None
        answer = ""
        first_event = len(transcript().events)

        async def ledger() -> Ledger:
            return services.ledger

        compactor = CompactingFilter(ledger) if compaction else None
        try:
            with serve_trial(services, hosts):
                async with agent_bridge(filter=compactor) as bridge:
                    seconds = _time_limit
                    with anyio.move_on_after(seconds) as scope:
                        result = await fn(state.input_text, actx)
                        if follow_up is not None and isinstance(result, str):
                            text = follow_up(state.sample_id, state.epoch)
                            asked = dataclasses.replace(
                                actx, history=(("user", state.input_text), ("assistant", result))
                            )
                            if compactor is not None:
                                compactor.end()
                            asked_from = len(services.ledger.attempts)
                            transcript().info(f"twice: the user asks again: {text!r}")
                            result = await fn(text, asked)
                    if scope.cancel_called:  # also when the agent swallowed the cancel
                        raise AgentTimedOut(f"timed out after {seconds:g} s (--agent-timeout)")
                    if anyio.current_time() > scope.deadline:
                        # An agent that blocked the event loop past its deadline is never
                        # cancelled (the timer cannot fire), yet it overran all the same.
                        raise AgentTimedOut(
                            f"timed out: ran past {seconds:g} s (--agent-timeout) while "
                            "blocking the event loop, so it could not be cancelled"
                        )
                    if not isinstance(result, str):  # str(None) would pass for an answer
                        raise TypeError(
                            f"the agent returned {type(result).__name__} {result!r:.80}, not "
                            "its final answer (a str)"
                        )
                    answer = result
        except LimitExceededError:
            raise  # inspect's own message/token/time limits end the sample as usual
        except Exception as ex:
            limit = _find_limit(ex)
            if limit is not None:
                raise AgentLimitError(str(limit)) from None
            # The agent's own exception text: it may carry the environment's credentials.
            record.update(crashed=True, error=scrub(_describe(ex)))
            transcript().info(f"twice: agent {agent!r} crashed: {record['error']}")
        finally:
            if bridge is not None and bridge.state.messages:
                state.messages = list(bridge.state.messages)
            for message in state.messages:
                if isinstance(message, ChatMessageTool):
                    ctx.observe(message.text)
            # Before the scorer reads the ledger: its verdict names who sent each effect.
            # The agent's own tools say nothing of who sent an attempt: every mutating one
            # the follow-up caused is the user's, a repeat after a compaction the compaction's.
            identity = intent_identity(state.metadata)
            if compactor is not None and compactor.since is not None:
                mark_source(
                    services.ledger, compactor.since, "compaction", identity, repeats_only=True
                )
            if asked_from is not None:
                mark_source(services.ledger, asked_from, "user")
            attribute_attempts(
                services.ledger, model_tool_calls(transcript().events[first_event:]), identity
            )
            store().set(AGENT_STORE_KEY, record)
            scrub_agent_trace(state, since=first_event)  # also when a limit ends the sample
        raise_if_stub_could_not_play()  # whatever the agent made of it: an error, not a result
        state.output = ModelOutput.from_content(str(state.model), scrub(answer))
        return state

    return solve
