"""The tool layer shared by every task: protections, honest errors, and ledger upkeep.

Tools call the mock services through a real httpx client (the trial's respx router is its
transport). This module turns what happened on the wire into what the model is told:

* a delivered 2xx is a result;
* a delivered 4xx is a definite failure (``ToolError`` saying nothing was made);
* a timeout or a 5xx is an *unknown* outcome (``ToolError`` saying the action may or may not
  have happened) — never dressed up as a failure, because after a lost reply it is not one.

Idempotency keys are made here, from the trial's run id, never by the model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from inspect_ai.tool import Tool, ToolDef, ToolError, ToolParams
from inspect_ai.util import store

from mocks import (
    BACKOFF_HEADER,
    CALL_HEADER,
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

MAX_IN_FLIGHT_POLLS = 5
BASE_BACKOFF = 0.5


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
    client: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = self.services.client(timeout=httpx.Timeout(10.0))

    def observe(self, text: str) -> str:
        """Record a text the agent is shown (for ``unseen_effects``) and return it."""
        self.services.ledger.observations.append(text)
        return text

    def sync(self) -> None:
        """Copy the ledger into the sample store, so it is in the log even if the trial dies."""
        store().set(LEDGER_STORE_KEY, self.services.ledger.to_dict())


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
    """
    p = ctx.protection
    ctx.calls += 1
    call_no = ctx.calls
    intent = _intent_id(route, identity)
    first_source = "model" if intent in ctx.intents_seen else "initial"
    ctx.intents_seen.add(intent)

    # The key is made once per call, outside the retry loop (except the random-key bug).
    key: str | None = None
    if p.key == "step":
        key = f"{ctx.run_id}:{call_no}"
    elif p.key == "intent":
        key = f"{ctx.run_id}:" + hashlib.sha256(intent.encode()).hexdigest()[:24]

    last_problem = ""
    backoff = 0.0
    tries = 1 + p.transport_retries
    n = 0
    for n in range(1, tries + 1):
        if n > 1 and p.lookup and lookup is not None:
            found = await lookup()
            if found is not None:
                return Mutation(found, found_by_lookup=True, attempts=n - 1)
        if p.key == "random":
            key = uuid.uuid4().hex
        source = first_source if n == 1 else "transport"
        polls = 0
        while True:
            headers = {SOURCE_HEADER: source, CALL_HEADER: str(call_no), BACKOFF_HEADER: f"{backoff:g}"}
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
                continue
            break
        backoff = BASE_BACKOFF * 2 ** (n - 1)
        if response is None:
            continue
        status = response.status_code
        if status < 400:
            return Mutation(response.json(), attempts=n)
        if status == 429:
            retry_after = response.headers.get("Retry-After", "")
            try:
                backoff = max(backoff, float(retry_after))
            except ValueError:
                pass
            last_problem = f"the {api} is rate limiting requests (HTTP 429)"
            if n < tries:
                continue
            raise ToolError(
                f"The {api} refused the request with HTTP 429 (too many requests; retry after "
                f"{retry_after or 'a while'} s). No {noun} was made by this request."
            )
        if status < 500:
            raise ToolError(
                f"The {api} rejected the request with HTTP {status}: "
                f"{_server_message(response).rstrip('.')}. No {noun} was made by this request."
            )
        last_problem = f"the {api} answered HTTP {status} ({_server_message(response)})"

    made = f"{n} attempt{'s' if n != 1 else ''}"
    raise ToolError(
        f"{last_problem[0].upper()}{last_problem[1:]} after {made}; "
        f"the {noun} {UNKNOWN_OUTCOME} made. The outcome is unknown."
    )


async def read(ctx: TrialContext, url: str, *, api: str, params: dict[str, Any] | None = None) -> Any:
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
) -> Tool:
    """Turn an async function into an inspect tool bound to a trial.

    The function's docstring is the tool's prompt (first paragraph → description, ``Args:`` →
    parameter descriptions). Every text the agent is shown is recorded as an observation and
    the ledger is copied to the store after each call.

    Args:
        ctx: The trial context.
        fn: ``async def name(...) -> str``.
        idempotency: The class of a mutating tool; recorded in the tool's schema options
            (``options["twice"]["idempotency"]``). None for read-only tools.
        parallel: Let several calls in one assistant turn run concurrently (mutating tools
            set this so that parallel duplicates really race).
    """

    @functools.wraps(fn)
    async def execute(*args: Any, **kwargs: Any) -> str:
        try:
            text = await fn(*args, **kwargs)
        except ToolError as err:
            ctx.observe(err.message)
            raise
        else:
            ctx.observe(text)
            return text
        finally:
            ctx.sync()

    options: dict[str, object] = {
        "twice": {"mutating": idempotency is not None, "idempotency": idempotency or "read"}
    }
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
