"""``make_tool``: an async function becomes an inspect tool bound to a trial.

The function's docstring is the tool's prompt; the tool's declared idempotency class goes in
its schema's options; every text the agent is shown is recorded as an observation.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

# inspect's own registry calls (what its @tool decorator does): its public ToolDef.as_tool()
# always attaches a per-object description, which is what bind_tools avoids.
from inspect_ai.tool import Tool, ToolDef, ToolError, ToolParams

from ._context import TrialContext
from ._declare import (
    CURRENT_CALL,
    IDEMPOTENCY_CLASSES,
    CallFrame,
    Compensation,
    IdempotencyClass,
    ToolSpec,
)
from ._inspect_compat import registry_info, set_registry_info, set_registry_params
from ._interfaces import shape_key


def make_tool(
    ctx: TrialContext,
    fn: Callable[..., Awaitable[str]],
    *,
    idempotency: IdempotencyClass | None = None,
    parallel: bool = False,
    compensation: Compensation | None = None,
    verify_with: str | None = None,
    name: str | None = None,
    description: str | None = None,
    parameters: ToolParams | None = None,
) -> Tool:
    """Turn an async function into an inspect tool bound to a trial.

    The function's docstring is the tool's prompt (first paragraph → description, ``Args:`` →
    parameter descriptions). Every text the agent is shown is recorded as an observation.

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
        name: The tool's name (default: the function's).
        description: With ``parameters``, the tool's schema as data, for a tool made from
            a description rather than a docstring (``fn`` then takes ``**kwargs: Any``).
        parameters: The JSON schema of the tool's arguments (see ``description``).

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
    if (description is None) != (parameters is None):
        raise ValueError(
            f"tool {name or fn.__name__!r}: give description and parameters together (a "
            "schema as data), or neither (the schema from the function's docstring)"
        )
    spec = ToolSpec(name or fn.__name__, idempotency, compensation, verify_with)
    ctx.tool_specs[spec.name] = spec

    @functools.wraps(fn)
    async def execute(*args: Any, **kwargs: Any) -> str:
        frame = CallFrame(spec)
        token = CURRENT_CALL.set(frame)
        try:
            text = await fn(*args, **kwargs)
            for undo in frame.undos:
                text = f"{text} To undo it: {undo.describe()}."
        except ToolError as err:
            ctx.observe(err.message)
            # A ToolError is the message the model gets, not a bug report. Inspect formats
            # the traceback of every failed tool call into its trace log, one source line
            # parsed per frame; the send path's frames were most of a lost reply's extra
            # cost (docs/BENCHMARKS.md). The error keeps its message, cause and context.
            raise err.with_traceback(None)  # noqa: B904 (re-raising the same error)
        else:
            ctx.observe(text)
            return text
        finally:
            CURRENT_CALL.reset(token)

    twice: dict[str, object] = {
        "mutating": idempotency is not None,
        "idempotency": idempotency or "read",
    }
    if compensation is not None:
        twice["compensation"] = compensation.tool
    if verify_with is not None:
        twice["verify_with"] = verify_with
    options: dict[str, object] = {"twice": twice}
    if description is not None and parameters is not None:
        # No stand-in: its schema is data, which inspect takes as given, without parsing.
        return ToolDef(
            execute,
            name=spec.name,
            description=description,
            parameters=parameters,
            parallel=parallel,
            options=options,
        ).as_tool()
    key = shape_key(fn)
    description, parameters = _schema(key, fn, execute)
    made = ToolDef(
        execute,
        name=spec.name,
        description=description,
        parameters=parameters,
        parallel=parallel,
        options=options,
    ).as_tool()
    shape = (key, spec.name, parallel, repr(options))
    stand_in = _STAND_INS.get(shape)
    if stand_in is None:
        stand_in = _STAND_INS[shape] = _stand_in(made)
    setattr(made, _STAND_IN, stand_in)
    return made


_BOUND: ContextVar[dict[str, Tool]] = ContextVar("twice_trial_tools")
"""The tools of the trial running in this context, by name (set by :func:`bind_tools`)."""
_STAND_IN = "__twice_stand_in__"
_STAND_INS: dict[tuple[object, ...], Tool] = {}


def bind_tools(tools: list[Tool]) -> list[Tool]:
    """The trial's tools as inspect should hold them: one stand-in per tool shape, made once
    per process, that calls the tool of the trial running in the current context.

    A tool made afresh for every trial costs inspect real work on every model turn: its
    schema is a per-object description, so inspect rebuilds and deep-copies the tool's
    parameters each time it lists the tools (about 2.5 ms of a 31 ms stub trial). A stand-in
    is the same function object in every trial, registered like an ``@tool`` function, so
    inspect parses its docstring once and reuses it. Tools not made by :func:`make_tool` are
    kept as they are. Call from the trial's own context (its setup solver): the binding
    holds for that sample's later solvers and tool calls, not for other samples.
    """
    _BOUND.set({registry_info(t).name: t for t in tools if hasattr(t, _STAND_IN)})
    return [getattr(t, _STAND_IN, t) for t in tools]


def _stand_in(made: Tool) -> Tool:
    info = registry_info(made)
    name = info.name

    async def call(*args: Any, **kwargs: Any) -> Any:
        bound = _BOUND.get(None)
        if bound is None or name not in bound:
            raise RuntimeError(
                f"tool {name!r} was called outside the trial that bound it (bind_tools)"
            )
        try:
            return await bound[name](*args, **kwargs)
        except ToolError as err:
            # As the tool itself does (``execute``): inspect formats the traceback of every
            # failed call, so the error leaves with this frame alone (~25 µs less a call).
            raise err.with_traceback(None)  # noqa: B904 (re-raising the same error)

    # The signature, docstring and annotations of the tool (inspect reads them), not its
    # attributes: those carry the per-object description this stand-in exists to avoid.
    functools.update_wrapper(call, made, updated=())
    set_registry_info(call, info)
    set_registry_params(call, {})
    return call


_SCHEMAS: dict[tuple[object, ...], tuple[str, ToolParams]] = {}


def _schema(
    key: tuple[object, ...], fn: Callable[..., Any], execute: Callable[..., Any]
) -> tuple[str, ToolParams]:
    """The tool description and parameters parsed from ``fn``'s docstring and signature.

    Tools are closures made afresh for every trial, so inspect's own cache (by function
    identity) never hits; parsing the docstring again is most of a trial's setup. The same
    code, name, docstring, defaults and annotations give the same schema, so parse once.
    """
    cached = _SCHEMAS.get(key)
    if cached is None:
        parsed = ToolDef(execute, name=fn.__name__)
        cached = _SCHEMAS[key] = (parsed.description, parsed.parameters)
    return cached
