"""Verdicts: what an assertion found in a ledger, with the ledger lines behind it.

A verdict is plain data. Its message follows one shape everywhere (pytest output, inspect
score explanations, the report)::

    payments.refund.create where order_id='order_1042': expected exactly 1, observed 2
    (re_1 at attempt 1, reply lost; re_2 at attempt 2)

and :func:`describe_attempt` renders the attempts behind it, one line each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from twice.mocks import Attempt, Effect, Ledger, describe_effect

_KEY_SHOWN = 32


def _short_key(key: str) -> str:
    return key if len(key) <= _KEY_SHOWN else key[: _KEY_SHOWN - 1] + "…"


def describe_attempt(attempt: Attempt) -> str:
    """One ledger line for an attempt.

    ``attempt 1 POST /v1/refunds (initial, no key, fault lost_reply): committed re_1, reply lost``
    """
    # "unknown" means the client did not say who sent it (code outside twice's tool layer).
    tags = [] if attempt.source == "unknown" else [attempt.source]
    tags.append(f"key {_short_key(attempt.key)}" if attempt.key else "no key")
    if attempt.fault:
        tags.append(f"fault {attempt.fault}")
    if attempt.replayed:
        did = "replayed the saved response"
    elif attempt.effect_ids:
        did = "committed " + ", ".join(attempt.effect_ids)
    else:
        did = "nothing committed"
    if not attempt.delivered:
        # Committed-then-lost and timed-out-before-commit look the same to the client; the
        # ledger knows which one it was.
        seen = "reply lost" if attempt.effect_ids else "timed out"
    elif attempt.status is None:
        seen = "no response"
    else:
        unknown = " (outcome unknown)" if attempt.outcome == "unknown" else ""
        seen = f"HTTP {attempt.status}{unknown}"
    return f"attempt {attempt.n} {attempt.method} {attempt.path} ({', '.join(tags)}): {did}, {seen}"


def attempts_behind(ledger: Ledger, effects: Iterable[Effect]) -> tuple[Attempt, ...]:
    """The attempts that committed ``effects``, in ledger order, each once."""
    numbers = sorted({e.attempt for e in effects})
    return tuple(ledger.attempt(n) for n in numbers if 1 <= n <= len(ledger.attempts))


@dataclass(frozen=True)
class Verdict:
    """What one assertion found in a ledger.

    Attributes:
        ok: Whether the assertion holds.
        subject: What was checked (``payments.refund.create where order_id='order_1042'``).
        expected: The expectation in words (``exactly 1``, ``none``).
        observed: What the ledger shows: a count, or a short description.
        effects: The committed effects the verdict rests on (the matching ones).
        attempts: The attempts behind those effects, plus related attempts that committed
            nothing (a timeout before the commit point), in ledger order.
    """

    ok: bool
    subject: str
    expected: str
    observed: int | str
    effects: tuple[Effect, ...] = ()
    attempts: tuple[Attempt, ...] = ()

    def __post_init__(self) -> None:
        # A truthy stand-in passes silently where it should fail: ok="no" is truthy, and so
        # is ok=len(found) - 1 whenever the count is wrong by more than one.
        if isinstance(self.ok, bool):
            return
        if type(self.ok).__module__ == "numpy" and type(self.ok).__name__ in ("bool_", "bool"):
            object.__setattr__(self, "ok", bool(self.ok))  # a comparison of pandas counts
            return
        raise TypeError(
            f"a Verdict's ok must be True or False, got {self.ok!r} "
            f"({type(self.ok).__name__}); compare explicitly, e.g. ok=len(effects) == 1"
        )

    @classmethod
    def from_effects(
        cls,
        ledger: Ledger,
        effects: Sequence[Effect],
        *,
        ok: bool,
        subject: str,
        expected: str,
        observed: int | str | None = None,
    ) -> Verdict:
        """A verdict resting on ``effects``; the attempts behind them come from ``ledger``.

        Args:
            ledger: The ledger the effects come from.
            effects: The effects the verdict is about.
            ok: Whether the assertion holds.
            subject: What was checked.
            expected: The expectation in words.
            observed: What was observed; defaults to ``len(effects)``.
        """
        return cls(
            ok=ok,
            subject=subject,
            expected=expected,
            observed=len(effects) if observed is None else observed,
            effects=tuple(effects),
            attempts=attempts_behind(ledger, effects),
        )

    @property
    def evidence(self) -> list[str]:
        """One short line per effect: ``re_1 at attempt 1, reply lost``."""
        by_n = {a.n: a for a in self.attempts}
        return [describe_effect(e, by_n.get(e.attempt), brief=True) for e in self.effects]

    @property
    def message(self) -> str:
        """``subject: expected X, observed Y (evidence; evidence)``."""
        evidence = self.evidence
        tail = f" ({'; '.join(evidence)})" if evidence else ""
        return f"{self.subject}: expected {self.expected}, observed {self.observed}{tail}"

    def ledger_lines(self) -> list[str]:
        """The attempts behind the verdict, one :func:`describe_attempt` line each."""
        return [describe_attempt(a) for a in self.attempts]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for inspect score metadata and reports)."""
        return {
            "ok": self.ok,
            "subject": self.subject,
            "expected": self.expected,
            "observed": self.observed,
            "message": self.message,
            "effects": [e.id for e in self.effects],
            "ledger": self.ledger_lines(),
        }

    def __str__(self) -> str:
        return ("ok: " if self.ok else "FAILED: ") + self.message


def format_failures(verdicts: Sequence[Verdict], ledger: Ledger | None = None) -> str:
    """The text of the one AssertionError that lists every failed verdict.

    Args:
        verdicts: Every verdict checked (passing ones only count towards the header).
        ledger: When given, a verdict with no attempts behind it says how much the ledger
            holds, so "observed 0" reads as "nothing reached the services" or not.
    """
    failed = [v for v in verdicts if not v.ok]
    noun = "assertion" if len(verdicts) == 1 else "assertions"
    lines = [f"{len(failed)} of {len(verdicts)} side-effect {noun} failed:"]
    for v in failed:
        lines.append(v.message)
        ledger_lines = v.ledger_lines()
        if not ledger_lines and ledger is not None:
            ledger_lines = [
                f"no attempt behind this (the ledger holds {len(ledger.attempts)} attempt(s) "
                f"and {len(ledger.effects)} effect(s))"
            ]
        lines += ["    " + line for line in ledger_lines]
    return "\n".join(lines)
