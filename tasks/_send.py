"""The send path: one mutating call from the tool to the wire and back to a sentence.

Tools call the mock services through a real httpx client (the trial's respx router is its
transport). :func:`mutate` turns what happened on the wire into what the model is told, in
stages a reader can follow top to bottom (the way httpx layers its send path):

1. :func:`_open` numbers the call, names its intent and retry source, picks the policy (the
   protection's, or under ``declared`` the tool's class) and makes the key -- here, from the
   trial's run id, never by the model.
2. :func:`_consult_log` asks the durable action log: a result it holds is returned without
   sending anything; a call sent before with an unknown outcome reuses its key.
3. :func:`_send` runs the retry loop; each try is :func:`_attempt` (one request, polling a
   same-key request still in flight), and :func:`_judge` says what its reply means:

   * a delivered 2xx is a result (a replay, if the service says so);
   * a delivered 4xx is a definite failure (``ToolError`` saying nothing was made);
   * a 429 is a definite refusal, retried after its ``Retry-After``;
   * a timeout, a connection closed before a reply, or a 5xx is an *unknown* outcome --
     never dressed up as a failure, because after a lost reply it is not one.

4. :func:`_settle` records the result (action log, registered undo); the tool then asks the
   :class:`Mutation` for its sentence (:meth:`Mutation.say`), which says what really
   happened: made now, made on a retry, replayed for the same key, found by a lookup, or
   returned from the action log with nothing sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx
from inspect_ai.tool import ToolError
from twice.mocks import (
    BACKOFF_HEADER,
    CALL_HEADER,
    CRASH_HEADER,
    FORM_TYPE,
    KEY_HEADER,
    REPLAYED_HEADER,
    SOURCE_HEADER,
    UNKNOWN_OUTCOME,
    RunError,
)

from ._action_log import ActionLog, ActionRecord
from ._declare import CURRENT_CALL, IDEMPOTENCY_CLASSES, CallFrame, ToolSpec, Undo

if TYPE_CHECKING:
    from ._protections import Protection

MAX_IN_FLIGHT_POLLS = 5
BASE_BACKOFF = 0.5

Lookup = Callable[[], Awaitable[dict[str, Any] | None]]
"""Finds an existing effect (by the client reference) for the ``lookup`` protection."""


class TrialState(Protocol):
    """What the send path reads and updates of a trial (``TrialContext`` is one).

    A protocol, so that the per-trial context can hand out service handles that call this
    module without the two modules importing each other.
    """

    protection: Protection
    run_id: str
    calls: int
    restarts: int
    intents_seen: set[str]
    dispatched: list[tuple[int, str]]
    resume_pending: set[str]
    repeat_source: str
    action_log: ActionLog | None
    client: httpx.AsyncClient

    def register_undo(self, spec: ToolSpec | None, body: dict[str, Any]) -> Undo | None:
        """Register the undo of a committed ``compensable`` call."""
        ...

    def restart(self, calls: int) -> None:
        """Restart the run from the checkpoint taken after ``calls`` mutating calls."""
        ...


class RunCrashed(RunError):
    """The agent run died right after a commit (the ``crash_after_commit`` fault).

    Raised by the tool layer; ``resumable_generate`` catches it and restarts the agent loop
    from the conversation as it stood before the call. Anything else that sees it has no
    restart logic, and the sample fails with this message.
    """

    def __init__(self, ctx: TrialState, call: int, route: str) -> None:
        super().__init__(
            f"the agent run crashed right after call {call} ({route}) committed "
            "(crash_after_commit); only twice's resumable agent loop can restart it"
        )
        self.ctx = ctx
        self.call = call
        self.route = route


@dataclass(frozen=True)
class Problem:
    """What went wrong on one attempt that got no result."""

    text: str
    """``timed out waiting for the payments API``."""
    unknown: bool
    """The attempt may have done the work (a timeout, a connection closed before a reply, a
    5xx); False for a definite no."""


@dataclass
class Mutation:
    """The result of a mutating call that succeeded (or was found to have succeeded)."""

    body: dict[str, Any]
    found_by_lookup: bool = False
    attempts: int = 1
    from_action_log: bool = False
    """The result was returned from the action log: nothing was sent this time."""
    after_restart: bool = False
    """The call was the restarted run's repeat of one made before the run crashed."""
    replayed: bool = False
    """The service returned the saved result of an earlier request with the same key."""
    problems: list[Problem] = field(default_factory=list)
    """What went wrong on the attempts before the one that got this result, in order."""
    keyed: bool = False
    """Every attempt of this call carried the same idempotency key."""
    api: str = "API"
    noun: str = "action"

    def say(self, done: str, what: str) -> str:
        """The sentence the agent is told: what happened, then what was made.

        Args:
            done: What the tool says when its request did the work now ("Created").
            what: The thing, described ("refund re_1 of $4.99 on order order_1042").

        Returns:
            ``"Created refund re_1 ..."`` when the first attempt made it; otherwise a sentence
            that says how the result was really obtained (an earlier attempt's outcome, a
            replay for the same key, a lookup, the action log), never "Created" for a thing
            this call did not make.
        """
        if self.from_action_log:
            # "Restarted" only when it was: a model repeating a call in one run is told so.
            when = "before the run restarted" if self.after_restart else "earlier in this run"
            return f"Already done {when} (from the action log; nothing was sent this time): {what}."
        earlier = self._earlier()
        if self.found_by_lookup:
            return (
                f"{earlier}. A lookup then found it already made, so it was not sent again: {what}."
            )
        if self.replayed:
            if not self.problems:
                return (
                    f"Already done: the {self.api} returned the saved result of an earlier "
                    f"request with the same idempotency key, so nothing new was made: {what}."
                )
            return (
                f"{earlier}. Attempt {self.attempts}, sent with the same idempotency key, got "
                f"back the saved result of the earlier attempt, so it was made once: {what}."
            )
        if not self.problems:
            return f"{done} {what}."
        if self.keyed:
            after = "every attempt carried the same idempotency key, so none made another"
        elif any(p.unknown for p in self.problems):
            after = f"that outcome is unknown, so another {self.noun} may have been made by it"
        else:
            after = f"no {self.noun} was made by it"
        return f"{done} {what}, on attempt {self.attempts}. {earlier}; {after}."

    def _earlier(self) -> str:
        parts = [f"attempt {i}: {p.text}" for i, p in enumerate(self.problems, start=1)]
        text = "; ".join(parts)
        return text[:1].upper() + text[1:]


# -- stage 1: open the call ----------------------------------------------------------------


@dataclass(frozen=True)
class _Policy:
    transport_retries: int
    key: str
    lookup: bool
    retry_unknown: bool = True


def _policy(p: Protection, spec: ToolSpec | None, route: str) -> _Policy:
    """The retry policy for one call: the protection's, or (``declared``) the tool's class."""
    if not p.by_class:
        return _Policy(p.transport_retries, p.key, p.lookup)
    if spec is None or spec.idempotency is None:
        where = f"tool {spec.name!r}" if spec else "code outside a tool made by make_tool()"
        raise RuntimeError(
            f"{where} made a mutating call ({route}) without declaring an idempotency class; "
            f"the {p.name!r} protection needs make_tool(..., idempotency=...) with one of: "
            + ", ".join(IDEMPOTENCY_CLASSES)
        )
    if spec.idempotency == "safe":
        return _Policy(p.transport_retries, "none", False)
    if spec.idempotency in ("keyed", "compensable"):
        return _Policy(p.transport_retries, "intent", False)
    return _Policy(p.transport_retries, "none", False, retry_unknown=False)


@dataclass
class _Call:
    """One mutating tool call on its way through the send path."""

    route: str
    method: str
    url: str
    payload: dict[str, Any]
    intent: str
    api: str
    noun: str
    frame: CallFrame | None
    key_header: str = KEY_HEADER
    """The header the service reads its idempotency key from."""
    form: bool = False
    """Send the payload as a form body (``a[b]=c`` brackets), not JSON."""
    params: dict[str, Any] | None = None
    """Query parameters."""
    # Set by _open:
    number: int = 0
    policy: _Policy = _Policy(0, "none", False)
    source: str = "initial"
    """Retry source of the first attempt: ``initial``, ``model``, ``resume``, ``user`` or
    ``compaction``."""
    key: str | None = None
    record: ActionRecord | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def spec(self) -> ToolSpec | None:
        return self.frame.spec if self.frame is not None else None

    def result(self, body: dict[str, Any], **how: Any) -> Mutation:
        return Mutation(
            dict(body),
            problems=list(self.problems),
            keyed=self.key is not None and self.policy.key != "random",
            api=self.api,
            noun=self.noun,
            **how,
        )


def _intent_id(route: str, identity: dict[str, Any]) -> str:
    return route + ":" + json.dumps(identity, sort_keys=True, default=str)


def _open(ctx: TrialState, call: _Call) -> None:
    """Number the call, name its retry source, pick its policy and make its key."""
    call.policy = _policy(ctx.protection, call.spec, call.route)
    ctx.calls += 1
    call.number = ctx.calls
    if call.intent in ctx.resume_pending:
        call.source = "resume"
        ctx.resume_pending.discard(call.intent)
    elif call.intent in ctx.intents_seen:
        call.source = ctx.repeat_source
    ctx.intents_seen.add(call.intent)
    ctx.dispatched.append((call.number, call.intent))
    # The key is made once per call, outside the retry loop (except the random-key bug).
    if call.policy.key == "step":
        call.key = f"{ctx.run_id}:{call.number}"
    elif call.policy.key == "intent":
        call.key = f"{ctx.run_id}:" + hashlib.sha256(call.intent.encode()).hexdigest()[:24]


# -- stage 2: the action log ---------------------------------------------------------------


def _consult_log(ctx: TrialState, call: _Call) -> Mutation | None:
    """A result the action log holds for this intent (nothing is sent), else None; records
    the call as dispatched."""
    if ctx.action_log is None:
        return None
    prior = ctx.action_log.latest(call.intent)
    if prior is not None and prior.state == "done" and prior.body is not None:
        return call.result(
            prior.body, attempts=0, from_action_log=True, after_restart=call.source == "resume"
        )
    if prior is not None and prior.state == "dispatched" and prior.key is not None:
        # Sent before with an unknown outcome: only the same key makes a repeat safe.
        call.key = prior.key
    call.record = ctx.action_log.begin(
        intent=call.intent, route=call.route, call=call.number, key=call.key, payload=call.payload
    )
    return None


# -- stage 3: send, with retries -----------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _parsed(url: str) -> httpx.URL:
    """``url`` parsed as httpx parses it. A tool calls the same few endpoints in every trial,
    and httpx would parse the string again on every request (an ``httpx.URL`` is immutable,
    so one is safely shared)."""
    return httpx.URL(url)


def form_pairs(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A value as form fields the way Stripe's SDKs send them: ``metadata[k]=v`` for a
    mapping, ``expand[0]=a`` for a list, ``true``/``false`` for a boolean, an empty value
    for null (the generated services read these brackets back)."""
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out += form_pairs(v, f"{prefix}[{k}]" if prefix else str(k))
        return out
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in form_pairs(v, f"{prefix}[{i}]")]
    if isinstance(value, bool):
        return [(prefix, "true" if value else "false")]
    return [(prefix, "" if value is None else str(value))]


def _server_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("error", {}).get("message") or response.reason_phrase)
    except ValueError:
        return response.reason_phrase


async def _attempt(
    ctx: TrialState, call: _Call, source: str, backoff: float
) -> httpx.Response | Problem:
    """One attempt: a response, or the transport problem that lost it. A 409 for the same key
    (still in flight) is polled with that key, which is safe by construction."""
    polls = 0
    while True:
        headers = {SOURCE_HEADER: source, CALL_HEADER: str(call.number)}
        headers[BACKOFF_HEADER] = f"{backoff:g}"
        if call.key is not None:
            headers[call.key_header] = call.key
        body: dict[str, Any] = {"json": call.payload}
        if call.form:
            headers["Content-Type"] = FORM_TYPE
            body = {"content": urllib.parse.urlencode(form_pairs(call.payload)).encode()}
        try:
            response = await ctx.client.request(
                call.method, _parsed(call.url), params=call.params, headers=headers, **body
            )
        except httpx.TimeoutException:
            return Problem(f"timed out waiting for the {call.api}", unknown=True)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            # The request went out and the connection ended before a reply (a reset after
            # the commit): as unknown as a timeout, never the "not sent" of a connect error.
            closed = f"the connection to the {call.api} was closed before a reply"
            return Problem(closed, unknown=True)
        except httpx.TransportError as ex:
            return Problem(f"could not reach the {call.api} ({type(ex).__name__})", unknown=True)
        if response.status_code != 409 or call.key is None or polls >= MAX_IN_FLIGHT_POLLS:
            return response
        polls += 1
        backoff = BASE_BACKOFF * polls
        source = "transport"
        # Virtual wait: yield so the in-flight request can finish; no wall time passes.
        await asyncio.sleep(0)


_Meaning = Literal["done", "crashed", "refused", "rejected", "unknown"]


def _judge(response: httpx.Response) -> _Meaning:
    """What a delivered response means for the call."""
    if response.headers.get(CRASH_HEADER):
        return "crashed"
    if response.status_code < 400:
        return "done"
    if response.status_code == 429:
        return "refused"
    if response.status_code < 500:
        return "rejected"
    return "unknown"


def _failed(call: _Call) -> None:
    if call.record is not None:
        call.record.state = "failed"


async def _send(ctx: TrialState, call: _Call, lookup: Lookup | None) -> Mutation:
    """The retry loop: try until a result, a definite failure, or the policy's budget ends."""
    tries = 1 + call.policy.transport_retries
    backoff = 0.0
    for n in range(1, tries + 1):
        if n > 1 and call.policy.lookup and lookup is not None:
            found = await lookup()
            if found is not None:
                return call.result(found, found_by_lookup=True, attempts=n - 1)
        if call.policy.key == "random":
            call.key = uuid.uuid4().hex
            if call.record is not None:
                call.record.key = call.key
        reply = await _attempt(ctx, call, call.source if n == 1 else "transport", backoff)
        backoff = BASE_BACKOFF * 2 ** (n - 1)
        if isinstance(reply, Problem):
            call.problems.append(reply)
            if not call.policy.retry_unknown:
                break
            continue
        meaning = _judge(reply)
        if meaning == "crashed":
            if reply.status_code < 400:
                _settle(ctx, call, call.result(reply.json(), attempts=n))
            # The run dies here: after the commit (and after the durable log write),
            # before the result reaches the conversation.
            raise RunCrashed(ctx, call.number, call.route)
        if meaning == "done":
            replayed = reply.headers.get(REPLAYED_HEADER) == "true"
            return call.result(reply.json(), attempts=n, replayed=replayed)
        if meaning == "refused":
            retry_after = reply.headers.get("Retry-After", "")
            with contextlib.suppress(ValueError):
                backoff = max(backoff, float(retry_after))
            call.problems.append(
                Problem(f"the {call.api} is rate limiting requests (HTTP 429)", unknown=False)
            )
            if n < tries:
                continue
            _failed(call)
            raise ToolError(
                f"The {call.api} refused the request with HTTP 429 (too many requests; retry "
                f"after {retry_after or 'a while'} s). No {call.noun} was made by this request."
            )
        if meaning == "rejected":
            _failed(call)
            raise ToolError(
                f"The {call.api} rejected the request with HTTP {reply.status_code}: "
                f"{_server_message(reply).rstrip('.')}. No {call.noun} was made by this request."
            )
        call.problems.append(
            Problem(
                f"the {call.api} answered HTTP {reply.status_code} ({_server_message(reply)})",
                unknown=True,
            )
        )
        if not call.policy.retry_unknown:
            break
    raise _unknown_error(ctx.protection, call)


def _unknown_error(p: Protection, call: _Call) -> ToolError:
    """The error after the last attempt left the outcome unknown."""
    n = len(call.problems)
    last = call.problems[-1].text
    made = f"{n} attempt{'s' if n != 1 else ''}"
    return ToolError(
        f"{last[0].upper()}{last[1:]} after {made}; the {call.noun} {UNKNOWN_OUTCOME} made. "
        "The outcome is unknown." + _unknown_advice(p, call.spec)
    )


def _unknown_advice(p: Protection, spec: ToolSpec | None) -> str:
    """What the ``declared`` protection adds to an unknown-outcome error, per class."""
    if not p.by_class or spec is None:
        return ""
    if spec.idempotency == "unsafe":
        verify = f"verify with {spec.verify_with or 'a lookup tool'}"
        return (
            f" {spec.name} is declared unsafe to retry, so it was not retried automatically. "
            f"Do not repeat it blindly: {verify} first, or escalate to a human."
        )
    if spec.compensation is not None:
        return f" If it was made and is not wanted, undo it with {spec.compensation.tool}."
    return ""


# -- stage 4: settle -----------------------------------------------------------------------


def _settle(ctx: TrialState, call: _Call, result: Mutation) -> Mutation:
    """Record a result: the action log's entry, and the undo a compensable tool registers."""
    if call.record is not None and not result.from_action_log:
        call.record.state, call.record.body = "done", dict(result.body)
    undo = ctx.register_undo(call.spec, result.body)
    if undo is not None and call.frame is not None and undo not in call.frame.undos:
        call.frame.undos.append(undo)
    return result


# -- the two entry points ------------------------------------------------------------------


async def mutate(
    ctx: TrialState,
    *,
    route: str,
    method: str,
    url: str,
    payload: dict[str, Any],
    identity: dict[str, Any],
    noun: str,
    api: str,
    lookup: Lookup | None = None,
    key_header: str = KEY_HEADER,
    form: bool = False,
    params: dict[str, Any] | None = None,
) -> Mutation:
    """Send one mutating request under the trial's protection.

    Tools usually call it through their service handle (``ctx.api("payments").mutate(...)``),
    which fills in ``url`` and ``api``.

    Args:
        ctx: The trial context.
        route: The effect name (``payments.refund.create``); with ``identity`` it names the
            intent, so an intent key and model-retry detection can be derived.
        method: HTTP method.
        url: Absolute URL.
        payload: JSON body.
        identity: The intent's discriminating fields (``{"order_id": ...}``).
        noun: What gets made, for messages ("refund").
        api: Which API, for messages ("payments API").
        lookup: Finds an existing effect by the client reference, for the ``lookup``
            protection; returns its JSON or None.
        key_header: The header the service reads the idempotency key from (the service's
            ``key_header``: an API may declare its own name).
        form: Send the payload as a form body (``metadata[k]=v`` brackets) instead of JSON.
        params: Query parameters.

    Returns:
        The result; :meth:`Mutation.say` gives the sentence the agent is told.

    Raises:
        ToolError: with an honest message: definitely not made, or outcome unknown.
        RunCrashed: when the ``crash_after_commit`` fault ends the run after the commit.
        RuntimeError: under a protection that enforces classes (``declared``), when the
            calling tool declared none; under ``lookup``, when no ``lookup`` is given.
    """
    call = _Call(
        route, method, url, dict(payload), _intent_id(route, identity), api, noun,
        frame=CURRENT_CALL.get(), key_header=key_header, form=form, params=params,
    )  # fmt: skip
    _open(ctx, call)
    if call.policy.lookup and lookup is None:
        # Without a lookup this protection would retry blind: a cell labelled `lookup`
        # measuring retry-nokey, with nothing said.
        where = f"tool {call.spec.name!r}" if call.spec else "code outside a tool"
        raise RuntimeError(
            f"{where} made a mutating call ({route}) without a lookup; the 'lookup' protection "
            "looks the effect up before each retry: pass lookup= to mutate() (an async "
            "function returning the existing effect's JSON or None), or leave 'lookup' out "
            "of this task's protections"
        )
    result = _consult_log(ctx, call) or await _send(ctx, call, lookup)
    return _settle(ctx, call, result)


async def read(ctx: TrialState, url: str, *, api: str, params: dict[str, Any] | None = None) -> Any:
    """GET a resource; a failure becomes a ToolError the model can read."""
    try:
        response = await ctx.client.get(_parsed(url), params=params)
    except httpx.HTTPError as ex:
        raise ToolError(f"Could not read from the {api}: {type(ex).__name__}.") from None
    if response.status_code >= 400:
        raise ToolError(
            f"The {api} answered HTTP {response.status_code}: {_server_message(response)}"
        )
    return response.json()
