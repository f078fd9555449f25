"""Per-trial metrics of DESIGN.md, computed from the ledger and the sample's intents.

Nothing here reads the transcript: what the agent said it did is not evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from twice.mocks import Effect, Ledger

METRICS: tuple[str, ...] = (
    "completed",
    "duplicated",
    "excess_effects",
    "diverged",
    "exactly_once",
    "safe_success",
    "unseen_effects",
)
"""Per-trial metric names, in report order. Rates of the booleans are per cell."""


@dataclass(frozen=True)
class Intent:
    """One action the user wants done ``expected`` times, identified by its discriminating fields.

    Attributes:
        effect: The effect name (``payments.refund.create``).
        identity: Fields that say which action this is (``{"order_id": "order_1042"}``);
            other fields (amount, reason) may legitimately vary and are not identity.
        expected: How many effects should exist (usually 1; 0 for "must not happen").
    """

    effect: str
    identity: Mapping[str, Any]
    expected: int = 1

    def matches(self, effect: Effect) -> bool:
        """Whether a committed effect is (an instance of) this intent."""
        return effect.name == self.effect and all(
            effect.fields.get(k) == v for k, v in self.identity.items()
        )

    def label(self) -> str:
        """``payments.refund.create where order_id='order_1042'``."""
        where = ", ".join(f"{k}={v!r}" for k, v in self.identity.items())
        return f"{self.effect} where {where}" if where else self.effect

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Intent:
        """Build from dataset JSON: ``{"effect", "identity", "expected"}``."""
        return cls(
            effect=str(data["effect"]),
            identity=dict(data.get("identity", {})),
            expected=int(data.get("expected", 1)),
        )


@dataclass
class IntentResult:
    """The evidence for one intent: which effects matched it."""

    intent: str
    expected: int
    observed: int
    effects: list[str]
    evidence: list[str]
    diverged_fields: list[str] = field(default_factory=list)


@dataclass
class TrialMetrics:
    """Every per-trial metric, plus the evidence behind it."""

    completed: bool
    duplicated: bool
    excess_effects: int
    diverged: bool
    exactly_once: bool
    safe_success: bool
    unseen_effects: int
    intents: list[IntentResult]
    unmatched: list[str]
    """Evidence lines for mutating effects that match no intent."""
    end_state: str | None = None
    """Why the task's end-state check failed, or None when it held."""

    def values(self) -> dict[str, float]:
        """The metric values as floats (booleans as 0/1), for an inspect Score."""
        return {name: float(getattr(self, name)) for name in METRICS}

    def evidence(self) -> dict[str, Any]:
        """JSON-ready evidence for the log."""
        return {
            "intents": [asdict(r) for r in self.intents],
            "unmatched": self.unmatched,
            "end_state": self.end_state,
        }

    def explanation(self) -> str:
        """A one-paragraph human verdict, e.g. for ``Score.explanation``."""
        lines = [
            f"{r.intent}: expected {r.expected}, observed {r.observed}"
            + (f" ({'; '.join(r.evidence)})" if r.evidence else "")
            for r in self.intents
        ]
        lines += [f"unmatched effect: {u}" for u in self.unmatched]
        if self.end_state:
            lines.append(f"end state: {self.end_state}")
        return "\n".join(lines)


def _diverged_fields(effects: list[Effect], identity: Iterable[str]) -> list[str]:
    ids = set(identity)
    names: set[str] = set()
    for e in effects[1:]:
        first = effects[0].fields
        for k in set(first) | set(e.fields):
            if k not in ids and first.get(k) != e.fields.get(k):
                names.add(k)
    return sorted(names)


def trial_metrics(
    ledger: Ledger, intents: Iterable[Intent], end_state_error: str | None = None
) -> TrialMetrics:
    """Compute every per-trial metric from a ledger.

    Args:
        ledger: The trial's ledger (the ground truth).
        intents: What the user asked for.
        end_state_error: The task's end-state check result: None when it held, otherwise why
            not (e.g. "flight fl_1 booked but the trip failed and it was not cancelled").
    """
    intents = list(intents)
    results: list[IntentResult] = []
    matched: set[str] = set()
    completed = end_state_error is None
    duplicated = diverged = False
    excess = 0
    for intent in intents:
        effects = [e for e in ledger.effects if intent.matches(e)]
        matched.update(e.id for e in effects)
        n = len(effects)
        if intent.expected >= 1 and n < 1:
            completed = False
        if n > intent.expected:
            duplicated = True
            excess += n - intent.expected
        fields = _diverged_fields(effects, intent.identity)
        diverged = diverged or bool(fields)
        results.append(
            IntentResult(
                intent=intent.label(),
                expected=intent.expected,
                observed=n,
                effects=[e.id for e in effects],
                evidence=[ledger.describe_effect(e) for e in effects],
                diverged_fields=fields,
            )
        )
    unmatched = [e for e in ledger.effects if e.id not in matched]
    excess += len(unmatched)
    exactly_once = not unmatched and all(r.observed == r.expected for r in results)
    return TrialMetrics(
        completed=completed,
        duplicated=duplicated,
        excess_effects=excess,
        diverged=diverged,
        exactly_once=exactly_once,
        safe_success=completed and exactly_once,
        unseen_effects=len(ledger.unseen_effects()),
        intents=results,
        unmatched=[f"{e.name} {ledger.describe_effect(e)}" for e in unmatched],
        end_state=end_state_error,
    )
