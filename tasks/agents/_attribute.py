"""Who sent each attempt of an agent under test: the model, or its framework (or own code).

twice's own loop names the retry source of every request it sends (a header). An agent under
test sends plain requests, so twice works it out afterwards from the two sides it sees: the
model's tool calls (each model turn that went through the bridge twice gives the agent, with
the time its reply was complete) and the attempts the services received (with the time each
arrived). The rule, attempt by attempt in the order they arrived:

1. The attempt *answers* a tool call when the call was made before the attempt arrived, no
   earlier attempt of the same request answered it, and it fits: its tool is the one bound
   to the attempt's route (the first tool call a route's attempt answered binds that tool to
   the route), and every argument that shares a name with a request field of text agrees
   with it. Among the calls that fit, the one sharing most fields wins, then the earliest.
   Until a route is bound, a call must share at least one field with the request; if none
   does (the agent names its arguments otherwise), the first call of the model's latest turn
   is taken.
2. An attempt that answers a tool call is ``initial`` when it is the first attempt of its
   request, else ``model`` (the model asked again). One that answers none is ``framework``
   when an earlier attempt made the same request (the model asked once; something else sent
   it again), else ``unknown``.

A *request* is the route and the identity fields of the trial's intents for that route (so
a model retry that changed the amount is still the same request), or every request field
for a route no intent names. Attempts whose client named its source (twice's own tools) are
left alone; with no model turn seen (a ``twice serve`` client whose model twice does not
run), every attempt stays ``unknown``.

Limits: the attribution is by time and fit, not by a tag the agent carries. A framework that
re-sends a call while the model is already answering its next turn, and the model asks for
the same request again in that turn, may be read as the model's. A tool that turns one call
into two requests of the same route counts the second as ``framework``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inspect_ai.event import ModelEvent
from twice.mocks import Attempt, Ledger, react_action


@dataclass(frozen=True)
class ModelToolCall:
    """A tool call the model made, as twice saw it through the model endpoint it provides.

    Attributes:
        name: The tool's name.
        arguments: The call's arguments.
        at: When the model's reply holding it was complete (Unix seconds).
        turn: The number of the model turn (0-based) it came in.
    """

    name: str
    arguments: Mapping[str, Any]
    at: float
    turn: int = 0


def model_tool_calls(events: Iterable[object]) -> list[ModelToolCall]:
    """The tool calls of every model turn among inspect transcript ``events``, in order: the
    reply's tool calls, or, for a turn offered no tools, the ``Action`` its ReAct text names."""
    calls: list[ModelToolCall] = []
    turn = 0
    for event in events:
        if not isinstance(event, ModelEvent) or event.error:
            continue
        done = (event.completed or event.timestamp).timestamp()
        made = event.output.message.tool_calls if event.output.choices else None
        for call in made or []:
            args = call.arguments if isinstance(call.arguments, dict) else {}
            calls.append(ModelToolCall(call.function, args, done, turn))
        if not made and not event.tools and event.output.choices:
            # Offered no tools, a model on a text (ReAct) loop names its call in its reply.
            action = react_action(event.output.completion)
            if action is not None:
                calls.append(ModelToolCall(action[0], action[1], done, turn))
        turn += 1
    return calls


def intent_identity(metadata: Mapping[str, Any]) -> dict[str, list[str]]:
    """The identity fields of each effect the sample's intents name (its ``intents`` metadata)."""
    out: dict[str, list[str]] = {}
    for intent in metadata.get("intents") or []:
        if isinstance(intent, Mapping) and isinstance(intent.get("identity"), Mapping):
            out.setdefault(str(intent.get("effect")), list(intent["identity"]))
    return out


def _fit(args: Mapping[str, Any], params: Mapping[str, Any]) -> int | None:
    """How well a call's arguments fit a request's fields: None when a shared text field
    differs; else the shared fields that agree, less the call's arguments the request lacks
    (a lookup's request fits the lookup better than the create that shares its id)."""
    score = 0
    for name, value in args.items():
        if name not in params:
            score -= value not in ("", None)
            continue
        sent = params[name]
        if isinstance(value, str) and isinstance(sent, str):
            if value != sent:
                return None
            score += 1
        elif value == sent and not isinstance(value, dict | list):
            score += 1
    return score


def _request(attempt: Attempt, identity: Mapping[str, Sequence[str]]) -> tuple[str, str]:
    route = attempt.route or f"{attempt.method} {attempt.path}"
    fields = identity.get(route)
    if fields and all(f in attempt.params for f in fields):
        shown = {f: attempt.params[f] for f in fields}
    else:
        shown = dict(attempt.params)
    return route, json.dumps(shown, sort_keys=True, default=str)


def attribute_attempts(
    ledger: Ledger,
    calls: Sequence[ModelToolCall],
    identity: Mapping[str, Sequence[str]] | None = None,
) -> int:
    """Name the source of each attempt of an agent under test (see the module's rule).

    Sets ``source`` (``initial``, ``model``, ``framework`` or ``unknown``) and ``asked`` on
    every attempt whose client named no source and whose arrival time is known.

    Args:
        ledger: The trial's ledger (changed in place).
        calls: The model's tool calls in the trial, in order (:func:`model_tool_calls`).
        identity: Identity fields by effect name (:func:`intent_identity`).

    Returns:
        How many attempts were attributed (0 when no model turn was seen).
    """
    if not calls:
        return 0
    identity = identity or {}
    bound: dict[str, str] = {}
    answered: set[tuple[int, tuple[str, str]]] = set()
    asked: dict[tuple[str, str], int] = {}
    done = 0
    for attempt in ledger.attempts:
        if attempt.source != "unknown" or attempt.at is None:
            continue
        request = _request(attempt, identity)
        route = request[0]
        before = [(i, c) for i, c in enumerate(calls) if c.at <= attempt.at]
        fits = [
            (score, i, c)
            for i, c in before
            if (i, request) not in answered
            and (route not in bound or c.name == bound[route])
            and (score := _fit(c.arguments, attempt.params)) is not None
        ]
        best = max(fits, key=lambda f: (f[0], -f[1]), default=None)
        if best is not None and best[0] < 1 and route not in bound:
            latest = before[-1][1].turn  # ``fits`` is not empty, so neither is ``before``
            best = next((f for f in fits if f[2].turn == latest), None)
        seen_before = request in asked
        if best is not None:
            answered.add((best[1], request))
            bound.setdefault(route, best[2].name)
            asked[request] = asked.get(request, 0) + 1
            attempt.source = "model" if seen_before else "initial"
        else:
            attempt.source = "framework" if seen_before else "unknown"
            asked.setdefault(request, 0)
        attempt.asked = asked[request]
        done += 1
    return done


def mark_source(
    ledger: Ledger,
    since: int,
    source: str,
    identity: Mapping[str, Sequence[str]] | None = None,
    *,
    repeats_only: bool = False,
) -> int:
    """Name ``source`` on the mutating attempts from attempt index ``since`` on: what the
    conversation fault that happened at ``since`` caused (``user``: the follow-up, whose run
    sends every such attempt; ``compaction``).

    Run before :func:`attribute_attempts`, which then leaves them alone.

    Args:
        ledger: The trial's ledger (changed in place).
        since: How many attempts the ledger held when the fault happened.
        source: The retry source to name.
        identity: Identity fields by effect name (:func:`intent_identity`).
        repeats_only: Only the attempts that repeat a request sent before ``since`` (after
            a compaction, the agent's plan goes on: its next new step is not a repeat).

    Returns:
        How many attempts were named.
    """
    identity = identity or {}
    before = {_request(a, identity) for a in ledger.attempts[:since] if a.mutating}
    named = 0
    for attempt in ledger.attempts[since:]:
        if not attempt.mutating or (repeats_only and _request(attempt, identity) not in before):
            continue
        attempt.source = source
        named += 1
    return named
