"""What a tool declares: its idempotency class, its undo, and the call being executed.

Every mutating tool declares its idempotency class in ``make_tool`` (recorded in its schema's
``options["twice"]``): ``safe``, ``keyed``, ``compensable`` (declared with its
:class:`Compensation`, the undo the tool layer registers for each committed call) or
``unsafe``. Under the ``declared`` protection the send path enforces the class.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

IdempotencyClass = Literal["safe", "keyed", "compensable", "unsafe"]
"""How a mutating tool may be retried: ``safe`` (naturally idempotent), ``keyed`` (retry
only with the same key), ``compensable`` (has a registered undo), ``unsafe`` (never retry an
unknown outcome blindly)."""

IDEMPOTENCY_CLASSES: tuple[str, ...] = get_args(IdempotencyClass)


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
    """What ``make_tool`` knows about a tool: its name and declared idempotency class."""

    name: str
    idempotency: IdempotencyClass | None
    """None for read-only tools."""
    compensation: Compensation | None = None
    verify_with: str | None = None
    """A read tool that tells whether this tool's action already happened."""


@dataclass
class CallFrame:
    """The tool call being executed (a context variable, so parallel calls stay apart)."""

    spec: ToolSpec
    undos: list[Undo] = field(default_factory=list)


CURRENT_CALL: ContextVar[CallFrame | None] = ContextVar("twice_tool_call", default=None)
"""The frame of the tool call running in this context, set by ``make_tool``'s wrapper."""
