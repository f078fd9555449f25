"""``make_tool``: an async function becomes an inspect tool bound to a trial.

The function's docstring is the tool's prompt; the tool's declared idempotency class goes in
its schema's options; every text the agent is shown is recorded as an observation, and the
ledger is copied to the sample store after each call.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

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
        frame = CallFrame(spec)
        token = CURRENT_CALL.set(frame)
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
            CURRENT_CALL.reset(token)
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
