"""Per-trial metrics (the README's "What it measures"), computed from the ledger and the
sample's intents.

Nothing here reads the transcript: what the agent said it did is not evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from twice.mocks import RETRY_SOURCES, Effect, Ledger

METRICS: tuple[str, ...] = (
    "completed",
    "duplicated",
    "excess_effects",
    "diverged",
    "wrong",
    "wrong_effects",
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
        values: What the request asked for beyond the identity, as the service commits it
            (``{"amount": 499}``: cents, as the payments service records a refund). An
            effect of the intent whose field differs from one of them is *wrong* (see
            :func:`wrong_values`) and does not complete the intent. Only for an intent
            expected at least once: an effect of an intent expected 0 times is already
            excess, whatever its values.

    Raises:
        ValueError: for a values field that is also an identity field (identity is already
            compared exactly), or values on an intent expected 0 times.
    """

    effect: str
    identity: Mapping[str, Any]
    expected: int = 1
    values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if both := sorted(set(self.identity) & set(self.values)):
            raise ValueError(
                f"intent {self.label()}: {', '.join(both)} is both an identity field and a "
                "value; identity fields are already compared exactly, so state it once, in "
                "identity"
            )
        if self.values and self.expected < 1:
            raise ValueError(
                f"intent {self.label()} is expected {self.expected} times and states values "
                f"{dict(self.values)!r}; values describe an action that should happen, so "
                "they need expected >= 1"
            )

    def matches(self, effect: Effect) -> bool:
        """Whether a committed effect is (an instance of) this intent."""
        return effect.name == self.effect and all(
            k in effect.fields and effect.fields[k] == v for k, v in self.identity.items()
        )

    def label(self) -> str:
        """``payments.refund.create where order_id='order_1042'``."""
        where = ", ".join(f"{k}={v!r}" for k, v in self.identity.items())
        return f"{self.effect} where {where}" if where else self.effect

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Intent:
        """Build from dataset JSON: ``{"effect", "identity", "expected", "values"}``
        (``values`` optional)."""
        return cls(
            effect=str(data["effect"]),
            identity=dict(data.get("identity", {})),
            expected=int(data.get("expected", 1)),
            values=dict(data.get("values") or {}),
        )


def same_value(committed: Any, asked: Any) -> bool:
    """Whether a committed field equals the value asked for: exact equality of the JSON
    values, as the service committed them (cents, strings case and all), except that a
    boolean never equals a number (``True == 1`` in Python, not in a request)."""
    if isinstance(committed, bool) != isinstance(asked, bool):
        return False
    return bool(committed == asked)


def wrong_values(effect: Effect, values: Mapping[str, Any]) -> list[str]:
    """The fields of ``effect`` that differ from ``values``, each as ``amount 3997, asked
    499`` (empty when every value matches). A field the effect lacks differs."""
    return [
        f"{k} {_shown(effect.fields.get(k))}, asked {_shown(v)}"
        if k in effect.fields
        else f"no {k}, asked {_shown(v)}"
        for k, v in values.items()
        if k not in effect.fields or not same_value(effect.fields[k], v)
    ]


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def check_value_fields(ledger: Ledger, effect: str, values: Mapping[str, Any]) -> None:
    """Refuse a value no committed ``effect`` has as a field.

    A misspelt field (``"amout"``) would make every effect of the name wrong, so it is an
    error instead. Nothing is checked while no such effect is committed (the fields of an
    effect are known only then).

    Raises:
        ValueError: naming the value and the effect's fields.
    """
    named = [e for e in ledger.effects if e.name == effect]
    for key in values:
        if named and not any(key in e.fields for e in named):
            fields = sorted({k for e in named for k in e.fields})
            raise ValueError(
                f"value {key!r} is not a field of {effect} effects; their fields are: "
                f"{', '.join(fields)}"
            )


def _check_value_fields(ledger: Ledger, intent: Intent) -> None:
    try:
        check_value_fields(ledger, intent.effect, intent.values)
    except ValueError as ex:
        raise ValueError(f"intent {intent.label()}: {ex}") from None


def matching(ledger: Ledger, effect: str, where: Mapping[str, Any]) -> list[Effect]:
    """Effects called ``effect`` whose fields equal every ``where`` value: what an assertion
    and an intent count.

    Raises:
        ValueError: when no service of a live trial makes effects of that name (a misspelt
            name), or effects of that name exist but none has a ``where`` field (a misspelt
            filter): an assertion over either would pass vacuously.
    """
    named = [e for e in ledger.effects if e.name == effect]
    known = ledger.known_effects
    if known is not None and not named and effect not in known:
        raise ValueError(
            f"no service of this trial makes {effect!r} effects, so a check of them would "
            f"pass vacuously (a misspelt name?); their routes are: {', '.join(sorted(known))}"
        )
    for key in where:
        if named and not any(key in e.fields for e in named):
            fields = sorted({k for e in named for k in e.fields})
            raise ValueError(
                f"no {effect} effect has a field {key!r}; its fields are: {', '.join(fields)}"
            )
    return [e for e in named if all(k in e.fields and e.fields[k] == v for k, v in where.items())]


@dataclass
class IntentResult:
    """The evidence for one intent: which effects matched it."""

    intent: str
    expected: int
    observed: int
    effects: list[str]
    evidence: list[str]
    diverged_fields: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    """What the intent asked for beyond its identity (empty: nothing)."""
    wrong: list[str] = field(default_factory=list)
    """Ids of its effects whose values differ from :attr:`values`."""
    wrong_values: list[str] = field(default_factory=list)
    """One line per wrong effect: ``re_1: amount 3997, asked 499``."""


@dataclass
class EffectFacts:
    """What the scorer decided about one committed effect: the per-effect contract.

    Written into the score metadata (``metadata["effects"]``) so readers of the log (the
    report's drill-down and retry-source table) use the scorer's judgement instead of
    re-deriving it from the raw ledger.
    """

    id: str
    name: str
    attempt: int
    """Number of the attempt that committed it."""
    source: str
    """Retry source of that attempt (one of ``mocks.RETRY_SOURCES``)."""
    intent: str | None
    """Label of the intent it matched, or None when it matches no intent."""
    excess: bool
    """Beyond its intent's expected count (the later ones are the repeats), or unmatched."""
    seen: bool
    """Its id appeared, as a whole word, in a tool result the agent was shown."""
    wrong: bool = False
    """Its values differ from what its intent asked for (``IntentResult.values``)."""


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
    effects: list[EffectFacts] = field(default_factory=list)
    """One entry per committed effect, in ledger order."""
    wrong_effects: int = 0
    """Effects of an intent whose values differ from what it asked for."""

    @property
    def wrong(self) -> bool:
        """Some effect has values other than its intent asked for."""
        return self.wrong_effects > 0

    def values(self) -> dict[str, float]:
        """The metric values as floats (booleans as 0/1), for an inspect Score."""
        return {name: float(getattr(self, name)) for name in METRICS}

    def evidence(self) -> dict[str, Any]:
        """JSON-ready evidence for the log."""
        return {
            "intents": [asdict(r) for r in self.intents],
            "unmatched": self.unmatched,
            "end_state": self.end_state,
            "effects": [asdict(f) for f in self.effects],
        }

    def explanation(self) -> str:
        """A one-paragraph human verdict, e.g. for ``Score.explanation``."""
        lines = [
            f"{r.intent}: expected {r.expected}, observed {r.observed}"
            + (f" ({'; '.join(r.evidence)})" if r.evidence else "")
            + (f"; wrong values: {'; '.join(r.wrong_values)}" if r.wrong_values else "")
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

    Raises:
        ValueError: for an intent whose identity names a field no committed effect of its
            name has, or (on a live trial's ledger) an effect name no service makes.
    """
    results = [_intent_result(ledger, intent) for intent in intents]
    matched: set[str] = set()
    intent_of: dict[str, str] = {}
    excess_ids: set[str] = set()
    wrong_ids: set[str] = set()
    completed = end_state_error is None
    excess = 0
    for r in results:
        matched.update(r.effects)
        for effect_id in r.effects:
            intent_of.setdefault(effect_id, r.intent)
        excess_ids.update(r.effects[max(0, r.expected) :])
        wrong_ids.update(r.wrong)
        # A wrong effect is a try at the intent (it counts toward duplicates and excess),
        # but it is not the action asked for: only an effect with the asked values completes.
        if r.expected >= 1 and r.observed - len(r.wrong) < 1:
            completed = False
        excess += max(0, r.observed - r.expected)
    unmatched = [e for e in ledger.effects if e.id not in matched]
    excess += len(unmatched)
    excess_ids.update(e.id for e in unmatched)
    facts = [
        EffectFacts(
            id=e.id,
            name=e.name,
            attempt=e.attempt,
            source=_source(ledger, e),
            intent=intent_of.get(e.id),
            excess=e.id in excess_ids,
            seen=ledger.seen(e),
            wrong=e.id in wrong_ids,
        )
        for e in ledger.effects
    ]
    exactly_once = not unmatched and all(r.observed == r.expected for r in results)
    return TrialMetrics(
        completed=completed,
        duplicated=any(r.observed > r.expected for r in results),
        excess_effects=excess,
        diverged=any(r.diverged_fields for r in results),
        exactly_once=exactly_once,
        safe_success=completed and exactly_once,
        unseen_effects=sum(not f.seen for f in facts),
        intents=results,
        unmatched=[f"{e.name} {ledger.describe_effect(e)}" for e in unmatched],
        end_state=end_state_error,
        effects=facts,
        wrong_effects=len(wrong_ids),
    )


def _intent_result(ledger: Ledger, intent: Intent) -> IntentResult:
    """The effects of the ledger that match ``intent``, and what is wrong with them.

    Raises:
        ValueError: for an identity field no effect of the intent's name has (a misspelt
            "order_idd"): the intent would match nothing, and a trial that refunded twice
            would score "not duplicated" (excess effects, but no intent over its expected
            count). Also for a value field no such effect has.
    """
    try:
        effects = matching(ledger, intent.effect, intent.identity)
    except ValueError as ex:
        raise ValueError(f"intent {intent.label()}: {ex}") from None
    _check_value_fields(ledger, intent)
    wrong = [(e, w) for e in effects if (w := wrong_values(e, intent.values))]
    return IntentResult(
        intent=intent.label(),
        expected=intent.expected,
        observed=len(effects),
        effects=[e.id for e in effects],
        evidence=[ledger.describe_effect(e) for e in effects],
        diverged_fields=_diverged_fields(effects, intent.identity),
        values=dict(intent.values),
        wrong=[e.id for e, _ in wrong],
        wrong_values=[f"{e.id}: {', '.join(w)}" for e, w in wrong],
    )


def _source(ledger: Ledger, effect: Effect) -> str:
    try:
        source = ledger.attempt(effect.attempt).source
    except IndexError:  # an effect whose attempt the ledger does not hold
        return "unknown"
    return source if source in RETRY_SOURCES else "unknown"
