"""Protections: what the tool layer does about retries (the README's "Protections")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KeyStrategy = Literal["none", "random", "step", "intent"]


@dataclass(frozen=True)
class Protection:
    """A tool-layer retry policy.

    Attributes:
        name: CLI / ``-T protection=`` value.
        transport_retries: Retries the tool layer makes on its own after an unknown outcome
            (a timeout or 5xx) or a 429, with virtual exponential backoff.
        key: Which Idempotency-Key is sent: ``none``; ``random``, a fresh one per attempt (the
            common bug); ``step``, ``run_id:step`` made once per tool call, outside the retry
            loop; ``intent``, derived from the run and the intent's identity fields, so a
            *model* retry of the same action reuses it.
        lookup: After an unknown outcome, look the effect up by its client reference before
            retrying, and stop if it exists.
        summary: One line for ``twice list`` and the report.
        by_class: Enforce each tool's declared idempotency class instead of one policy for
            every tool (``declared``): ``safe`` retries freely without a key; ``keyed`` and
            ``compensable`` always carry an intent key the model did not choose and retry it;
            ``unsafe`` never retries an unknown outcome and tells the model to verify or
            escalate. ``transport_retries`` is then the retry budget of the retrying classes.
        action_log: Keep a durable action log: the tool layer's own record of dispatched
            calls, their keys and results, outside the model's context. A call repeating an
            intent the log holds a result for returns that result instead of being sent again
            (what saves a restarted run), and a repeat of a call whose outcome is unknown
            reuses the recorded key.
    """

    name: str
    transport_retries: int
    key: KeyStrategy
    lookup: bool
    summary: str
    by_class: bool = False
    action_log: bool = False


PROTECTIONS: dict[str, Protection] = {
    p.name: p
    for p in (
        Protection("bare", 0, "none", False, "no retries, no key: the model sees every error"),
        Protection("retry-nokey", 2, "none", False, "2 transport retries, no key"),
        Protection(
            "retry-randomkey", 2, "random", False, "2 retries, a fresh random key per attempt (bug)"
        ),
        Protection(
            "retry-stepkey", 2, "step", False, "2 retries, key run_id:step made once per call"
        ),
        Protection("intent-key", 0, "intent", False, "no retries, key from run + intent identity"),
        Protection("lookup", 2, "none", True, "2 retries, looks the effect up before each retry"),
        Protection(
            "declared",
            2,
            "intent",
            False,
            "enforces each tool's idempotency class; durable action log",
            by_class=True,
            action_log=True,
        ),
    )
}


def get_protection(name: str) -> Protection:
    """The protection called ``name``.

    Raises:
        ValueError: naming the bad value and the accepted ones.
    """
    try:
        return PROTECTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown protection {name!r}; expected one of: {', '.join(PROTECTIONS)}"
        ) from None
