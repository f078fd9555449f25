"""The tool layer shared by every task: protections, honest errors, and ledger upkeep.

Tools call the mock services through a real httpx client (the trial's respx router is its
transport). This module turns what happened on the wire into what the model is told:

* a delivered 2xx is a result;
* a delivered 4xx is a definite failure (``ToolError`` saying nothing was made);
* a timeout or a 5xx is an *unknown* outcome (``ToolError`` saying the action may or may not
  have happened) — never dressed up as a failure, because after a lost reply it is not one.

Idempotency keys are made here, from the trial's run id, never by the model.

Every mutating tool declares its idempotency class in :func:`make_tool` (recorded in its
schema's ``options["twice"]``): ``safe``, ``keyed``, ``compensable`` (declared with its
:class:`Compensation`, the undo the tool layer registers for each committed call) or
``unsafe``. Under the ``declared`` protection :func:`mutate` enforces the class.

The tool layer may also keep a durable :class:`ActionLog` (its own record of dispatched calls,
keys and results, outside the model's context). When the ``crash_after_commit`` fault kills the
run after a commit, :class:`RunCrashed` ends the agent loop and ``resumable_generate`` restarts
it from the conversation as it stood before the call; attempts the restarted run re-sends carry
the retry source ``resume``, and the action log is what lets the tool layer skip them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import httpx
from inspect_ai.tool import Tool, ToolDef, ToolError, ToolParams
from inspect_ai.util import store
from twice.mocks import (
    BACKOFF_HEADER,
    CALL_HEADER,
    CRASH_HEADER,
    KEY_HEADER,
    LEDGER_STORE_KEY,
    SOURCE_HEADER,
    UNKNOWN_OUTCOME,
    Services,
)

from ._protections import Protection

IdempotencyClass = Literal["safe", "keyed", "compensable", "unsafe"]
"""How a mutating tool may be retried: ``safe`` (naturally idempotent), ``keyed`` (retry
only with the same key), ``compensable`` (has a registered undo), ``unsafe`` (never retry an
unknown outcome blindly)."""

IDEMPOTENCY_CLASSES: tuple[str, ...] = get_args(IdempotencyClass)

MAX_IN_FLIGHT_POLLS = 5
BASE_BACKOFF = 0.5

ACTION_LOG_STORE_KEY = "twice:action_log"
"""Store key of the durable action log (``ActionLog.to_list()``), when the trial keeps one."""
COMPENSATIONS_STORE_KEY = "twice:compensations"
"""Store key of the undos registered by ``compensable`` calls (a list of :class:`Undo`)."""


@dataclass(frozen=True)
class Compensation:
    """How to undo a ``compensable`` tool's call, declared next to the forward action.

    Attributes:
        tool: Name of the compensating tool (it must be in the same toolset).
        args: Builds the compensating tool's arguments from the forward call's response body
            (e.g. ``lambda booking: {"booking_id": booking["id"]}``).
    """

    tool: str
    args: Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class Undo:
    """A compensation registered by a committed ``compensable`` call."""

    forward_tool: str
    forward_id: str
    """The id of what the forward call made (``fb_1``)."""
    tool: str
    args: dict[str, Any]

    def describe(self) -> str:
        """``cancel_flight(booking_id='fb_1')``."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.tool}({args})"


@dataclass(frozen=True)
class ToolSpec:
    """What :func:`make_tool` knows about a tool: its name and declared idempotency class."""

    name: str
    idempotency: IdempotencyClass | None
    """None for read-only tools."""
    compensation: Compensation | None = None
    verify_with: str | None = None
    """A read tool that tells whether this tool's action already happened."""


@dataclass
class _CallFrame:
    """The tool call being executed (a context variable, so parallel calls stay apart)."""

    spec: ToolSpec
    undos: list[Undo] = field(default_factory=list)


_CALL: ContextVar[_CallFrame | None] = ContextVar("twice_tool_call", default=None)


@dataclass
class ActionRecord:
    """One dispatched mutating call in the action log."""

    intent: str
    route: str
    call: int
    key: str | None
    payload: dict[str, Any]
    state: Literal["dispatched", "done", "failed"] = "dispatched"
    """``dispatched``: sent, outcome unknown so far; ``done``: a 2xx (or a lookup) came back;
    ``failed``: a definite 4xx."""
    body: dict[str, Any] | None = None


class ActionLog:
    """The orchestrator's durable record of dispatched calls, outside the model's context.

    Written before a mutating request is sent and updated when its reply arrives, it survives a
    restarted run (it lives in the trial context and the sample store, not in the messages).
    """

    def __init__(self) -> None:
        self.records: list[ActionRecord] = []

    def latest(self, intent: str) -> ActionRecord | None:
        """The most recent record of an intent, or None."""
        for record in reversed(self.records):
            if record.intent == intent:
                return record
        return None

    def begin(
        self, *, intent: str, route: str, call: int, key: str | None, payload: dict[str, Any]
    ) -> ActionRecord:
        """Record a call about to be dispatched."""
        record = ActionRecord(intent, route, call, key, dict(payload))
        self.records.append(record)
        return record

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-ready records, as stored in the sample store."""
        return [asdict(r) for r in self.records]


class RunCrashed(Exception):
    """The agent run died right after a commit (the ``crash_after_commit`` fault).

    Raised by the tool layer; ``resumable_generate`` catches it and restarts the agent loop
    from the conversation as it stood before the call. Anything else that sees it has no
    restart logic, and the sample fails with this message.
    """

    def __init__(self, ctx: TrialContext, call: int, route: str) -> None:
        super().__init__(
            f"the agent run crashed right after call {call} ({route}) committed "
            "(crash_after_commit); only twice's resumable agent loop can restart it"
        )
        self.ctx = ctx
        self.call = call
        self.route = route


@dataclass
class TrialContext:
    """Per-trial state of the tool layer: one per sample × epoch.

    Attributes:
        services: The trial's mock services (and ledger).
        protection: The retry policy in force.
        run_id: Stable id of this run of the agent; keys derive from it.
    """

    services: Services
    protection: Protection
    run_id: str = field(default_factory=lambda: f"run_{uuid.uuid4().hex[:12]}")
    calls: int = 0
    intents_seen: set[str] = field(default_factory=set)
    action_log: ActionLog | None = None
    """The durable action log, when the trial keeps one (None: it does not)."""
    compensations: list[Undo] = field(default_factory=list)
    """Undos registered by committed ``compensable`` calls, in order."""
    tool_specs: dict[str, ToolSpec] = field(default_factory=dict)
    """Every tool made for this trial by :func:`make_tool`, by name."""
    restarts: int = 0
    dispatched: list[tuple[int, str]] = field(default_factory=list)
    """``(call number, intent)`` of every mutating call (to attribute ``resume`` retries)."""
    resume_pending: set[str] = field(default_factory=set)
    """Intents dispatched in a crashed turn and not yet re-sent by the restarted run."""
    client: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = self.services.client(timeout=httpx.Timeout(10.0))

    def restart(self, calls: int) -> None:
        """Restart the run from a checkpoint taken when ``calls`` mutating calls had been made.

        The call counter (the step number keys like ``run_id:step`` use) goes back to the
        checkpoint; the action log and registered compensations are durable and stay.
        """
        self.restarts += 1
        self.resume_pending = {intent for n, intent in self.dispatched if n > calls}
        self.calls = calls

    def check_tools(self) -> None:
        """Check that every declared compensation and verify tool is in the toolset.

        Raises:
            ValueError: naming the tool that refers to a missing one, and the tools there are.
        """
        names = sorted(self.tool_specs)
        for spec in self.tool_specs.values():
            refs = [spec.verify_with, spec.compensation.tool if spec.compensation else None]
            for ref in refs:
                if ref is not None and ref not in self.tool_specs:
                    raise ValueError(
                        f"tool {spec.name!r} refers to tool {ref!r}, which is not in the "
                        f"trial's toolset ({', '.join(names)})"
                    )

    def undo_for(self, forward_id: str) -> Undo | None:
        """The registered undo of what a ``compensable`` call made (``fb_1``), if any."""
        return next((u for u in self.compensations if u.forward_id == forward_id), None)

    def observe(self, text: str) -> str:
        """Record a text the agent is shown (for ``unseen_effects``) and return it."""
        self.services.ledger.observations.append(text)
        return text

    def sync(self) -> None:
        """Copy the ledger into the sample store, so it is in the log even if the trial dies."""
        store().set(LEDGER_STORE_KEY, self.services.ledger.to_dict())
        if self.action_log is not None:
            store().set(ACTION_LOG_STORE_KEY, self.action_log.to_list())
        if self.compensations:
            store().set(COMPENSATIONS_STORE_KEY, [asdict(u) for u in self.compensations])

    def _register_undo(self, spec: ToolSpec | None, body: dict[str, Any]) -> Undo | None:
        if spec is None or spec.compensation is None or "id" not in body:
            return None
        existing = self.undo_for(str(body["id"]))
        if existing is not None:
            return existing
        comp = spec.compensation
        undo = Undo(spec.name, str(body["id"]), comp.tool, comp.args(body))
        self.compensations.append(undo)
        return undo


def _intent_id(route: str, identity: dict[str, Any]) -> str:
    return route + ":" + json.dumps(identity, sort_keys=True, default=str)


def _server_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("error", {}).get("message") or response.reason_phrase)
    except ValueError:
        return response.reason_phrase


@dataclass
class Mutation:
    """The result of a mutating call that succeeded (or was found to have succeeded)."""

    body: dict[str, Any]
    found_by_lookup: bool = False
    attempts: int = 1
    from_action_log: bool = False
    """The result was returned from the action log: nothing was sent this time."""


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


async def mutate(
    ctx: TrialContext,
    *,
    route: str,
    method: str,
    url: str,
    payload: dict[str, Any],
    identity: dict[str, Any],
    noun: str,
    api: str,
    lookup: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
) -> Mutation:
    """Send one mutating request under the trial's protection.

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

    Raises:
        ToolError: with an honest message: definitely not made, or outcome unknown.
        RunCrashed: when the ``crash_after_commit`` fault ends the run after the commit.
        RuntimeError: under a protection that enforces classes (``declared``), when the
            calling tool declared none.
    """
    p = ctx.protection
    frame = _CALL.get()
    spec = frame.spec if frame is not None else None
    policy = _policy(p, spec, route)
    ctx.calls += 1
    call_no = ctx.calls
    intent = _intent_id(route, identity)
    if intent in ctx.resume_pending:
        first_source = "resume"
        ctx.resume_pending.discard(intent)
    elif intent in ctx.intents_seen:
        first_source = "model"
    else:
        first_source = "initial"
    ctx.intents_seen.add(intent)
    ctx.dispatched.append((call_no, intent))

    def succeeded(result: Mutation) -> Mutation:
        undo = ctx._register_undo(spec, result.body)
        if undo is not None and frame is not None:
            frame.undos.append(undo)
        return result

    # The key is made once per call, outside the retry loop (except the random-key bug).
    key: str | None = None
    if policy.key == "step":
        key = f"{ctx.run_id}:{call_no}"
    elif policy.key == "intent":
        key = f"{ctx.run_id}:" + hashlib.sha256(intent.encode()).hexdigest()[:24]

    record: ActionRecord | None = None
    if ctx.action_log is not None:
        prior = ctx.action_log.latest(intent)
        if prior is not None and prior.state == "done" and prior.body is not None:
            # The log says this action already happened: return its result, send nothing.
            return succeeded(Mutation(dict(prior.body), attempts=0, from_action_log=True))
        if prior is not None and prior.state == "dispatched" and prior.key is not None:
            # Sent before with an unknown outcome: only the same key makes a repeat safe.
            key = prior.key
        record = ctx.action_log.begin(
            intent=intent, route=route, call=call_no, key=key, payload=payload
        )

    last_problem = ""
    backoff = 0.0
    tries = 1 + policy.transport_retries
    n = 0
    for n in range(1, tries + 1):
        if n > 1 and policy.lookup and lookup is not None:
            found = await lookup()
            if found is not None:
                if record is not None:
                    record.state, record.body = "done", dict(found)
                return succeeded(Mutation(found, found_by_lookup=True, attempts=n - 1))
        if policy.key == "random":
            key = uuid.uuid4().hex
            if record is not None:
                record.key = key
        source = first_source if n == 1 else "transport"
        polls = 0
        while True:
            headers = {
                SOURCE_HEADER: source,
                CALL_HEADER: str(call_no),
                BACKOFF_HEADER: f"{backoff:g}",
            }
            if key is not None:
                headers[KEY_HEADER] = key
            try:
                response = await ctx.client.request(method, url, json=payload, headers=headers)
            except httpx.TimeoutException:
                last_problem = f"timed out waiting for the {api}"
                response = None
            except httpx.TransportError as ex:
                last_problem = f"could not reach the {api} ({type(ex).__name__})"
                response = None
            if (
                response is not None
                and response.status_code == 409
                and key is not None
                and polls < MAX_IN_FLIGHT_POLLS
            ):
                # Same key still in flight: polling with the same key is safe by construction.
                polls += 1
                backoff = BASE_BACKOFF * polls
                source = "transport"
                # Virtual wait: yield so the in-flight request can finish; no wall time passes.
                await asyncio.sleep(0)
                continue
            break
        backoff = BASE_BACKOFF * 2 ** (n - 1)
        if response is None:
            if not policy.retry_unknown:
                break
            continue
        status = response.status_code
        if status < 400:
            result = succeeded(Mutation(response.json(), attempts=n))
            if record is not None:
                record.state, record.body = "done", dict(result.body)
            if response.headers.get(CRASH_HEADER):
                # The run dies here: after the commit (and after the durable log write),
                # before the result reaches the conversation.
                ctx.sync()
                raise RunCrashed(ctx, call_no, route)
            return result
        if response.headers.get(CRASH_HEADER):
            ctx.sync()
            raise RunCrashed(ctx, call_no, route)
        if status == 429:
            retry_after = response.headers.get("Retry-After", "")
            with contextlib.suppress(ValueError):
                backoff = max(backoff, float(retry_after))
            last_problem = f"the {api} is rate limiting requests (HTTP 429)"
            if n < tries:
                continue
            if record is not None:
                record.state = "failed"
            raise ToolError(
                f"The {api} refused the request with HTTP 429 (too many requests; retry after "
                f"{retry_after or 'a while'} s). No {noun} was made by this request."
            )
        if status < 500:
            if record is not None:
                record.state = "failed"
            raise ToolError(
                f"The {api} rejected the request with HTTP {status}: "
                f"{_server_message(response).rstrip('.')}. No {noun} was made by this request."
            )
        last_problem = f"the {api} answered HTTP {status} ({_server_message(response)})"
        if not policy.retry_unknown:
            break

    made = f"{n} attempt{'s' if n != 1 else ''}"
    raise ToolError(
        f"{last_problem[0].upper()}{last_problem[1:]} after {made}; "
        f"the {noun} {UNKNOWN_OUTCOME} made. The outcome is unknown." + _unknown_advice(p, spec)
    )


async def read(
    ctx: TrialContext, url: str, *, api: str, params: dict[str, Any] | None = None
) -> Any:
    """GET a resource; a failure becomes a ToolError the model can read."""
    try:
        response = await ctx.client.get(url, params=params)
    except httpx.HTTPError as ex:
        raise ToolError(f"Could not read from the {api}: {type(ex).__name__}.") from None
    if response.status_code >= 400:
        raise ToolError(
            f"The {api} answered HTTP {response.status_code}: {_server_message(response)}"
        )
    return response.json()


def make_tool(
    ctx: TrialContext,
    fn: Callable[..., Awaitable[str]],
    *,
    idempotency: IdempotencyClass | None = None,
    parallel: bool = False,
    compensation: Compensation | None = None,
    verify_with: str | None = None,
) -> Tool:
    """Turn an async function into an inspect tool bound to a trial.

    The function's docstring is the tool's prompt (first paragraph → description, ``Args:`` →
    parameter descriptions). Every text the agent is shown is recorded as an observation and
    the ledger is copied to the store after each call.

    Args:
        ctx: The trial context.
        fn: ``async def name(...) -> str``.
        idempotency: The class of a mutating tool: ``safe``, ``keyed``, ``compensable`` or
            ``unsafe``; recorded in the tool's schema options
            (``options["twice"]["idempotency"]``, in every model event of the log) and
            enforced by the ``declared`` protection. None for read-only tools.
        parallel: Let several calls in one assistant turn run concurrently (mutating tools
            set this so that parallel duplicates really race).
        compensation: The undo of a ``compensable`` tool (required for that class, refused
            for the others). Each committed call registers it in ``ctx.compensations`` and
            its result tells the model how to undo it.
        verify_with: Name of a read tool that tells whether this tool's action already
            happened; named in the ``declared`` protection's advice after an unknown outcome.

    Raises:
        ValueError: for an unknown class or a compensation that does not fit the class.
    """
    if idempotency is not None and idempotency not in IDEMPOTENCY_CLASSES:
        raise ValueError(
            f"unknown idempotency class {idempotency!r} for tool {fn.__name__!r}; expected "
            f"one of: {', '.join(IDEMPOTENCY_CLASSES)} (or None for a read-only tool)"
        )
    if idempotency == "compensable" and compensation is None:
        raise ValueError(
            f"tool {fn.__name__!r} is declared compensable but has no compensation; pass "
            "compensation=Compensation(tool=..., args=...) naming its undo"
        )
    if compensation is not None and idempotency != "compensable":
        raise ValueError(
            f"tool {fn.__name__!r} declares a compensation but its class is {idempotency!r}; "
            "only 'compensable' tools register a compensation"
        )
    spec = ToolSpec(fn.__name__, idempotency, compensation, verify_with)
    ctx.tool_specs[spec.name] = spec

    @functools.wraps(fn)
    async def execute(*args: Any, **kwargs: Any) -> str:
        frame = _CallFrame(spec)
        token = _CALL.set(frame)
        try:
            text = await fn(*args, **kwargs)
            for undo in frame.undos:
                text = f"{text} To undo it: {undo.describe()}."
        except ToolError as err:
            ctx.observe(err.message)
            raise
        else:
            ctx.observe(text)
            return text
        finally:
            _CALL.reset(token)
            ctx.sync()

    twice: dict[str, object] = {
        "mutating": idempotency is not None,
        "idempotency": idempotency or "read",
    }
    if compensation is not None:
        twice["compensation"] = compensation.tool
    if verify_with is not None:
        twice["verify_with"] = verify_with
    options: dict[str, object] = {"twice": twice}
    description, parameters = _schema(fn, execute)
    return ToolDef(
        execute,
        name=fn.__name__,
        description=description,
        parameters=parameters,
        parallel=parallel,
        options=options,
    ).as_tool()


_SCHEMAS: dict[tuple[object, ...], tuple[str, ToolParams]] = {}


def _schema(fn: Callable[..., Any], execute: Callable[..., Any]) -> tuple[str, ToolParams]:
    """The tool description and parameters parsed from ``fn``'s docstring and signature.

    Tools are closures made afresh for every trial, so inspect's own cache (by function
    identity) never hits; parsing the docstring again is most of a trial's setup. The same
    code, name, docstring, defaults and annotations give the same schema, so parse once.
    """
    key = (
        fn.__code__,
        fn.__name__,
        fn.__doc__,
        repr(fn.__defaults__),
        repr(fn.__kwdefaults__),
        repr(fn.__annotations__),
    )
    cached = _SCHEMAS.get(key)
    if cached is None:
        parsed = ToolDef(execute, name=fn.__name__)
        cached = _SCHEMAS[key] = (parsed.description, parsed.parameters)
    return cached
