"""Side-effect assertions: pure checks over a ledger that return verdicts.

An assertion is any object with ``check(ledger) -> Verdict`` (:class:`Assertion`). The built-in
ones count effects (:func:`exactly`, :func:`at_most`, :func:`at_least`, :func:`never`), check a
saga's compensations (:func:`compensated`), and check that the agent was shown every effect
(:func:`no_unseen_effects`). Each has a JSON form (``to_dict()`` / :func:`parse_assertion`) so a
dataset can carry its expectations as data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from twice.mocks import Effect, Ledger

from ._metrics import check_value_fields, matching, wrong_values
from ._verdict import Verdict, attempts_behind, format_failures


@runtime_checkable
class Assertion(Protocol):
    """Anything with ``check(ledger) -> Verdict``: no base class, no registry."""

    def check(self, ledger: Ledger) -> Verdict:
        """Judge one ledger."""
        ...


_EFFECT_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){2,}$")


def _check_effect_name(effect: object, what: str = "effect") -> str:
    if not isinstance(effect, str) or not _EFFECT_NAME.match(effect):
        raise ValueError(
            f"{what} must be a 'service.resource.verb' name such as 'payments.refund.create', "
            f"got {effect!r}"
        )
    return effect


def _where_label(effect: str, where: Mapping[str, Any]) -> str:
    if not where:
        return effect
    return effect + " where " + ", ".join(f"{k}={v!r}" for k, v in where.items())


def _uncommitted_attempts(ledger: Ledger, effect: str, where: Mapping[str, Any]) -> list[int]:
    """Attempts on the effect's route, with matching parameters, that committed nothing."""
    return [
        a.n
        for a in ledger.attempts
        if a.route == effect
        and not a.effect_ids
        and all(k in a.params and a.params[k] == v for k, v in where.items())
    ]


Bound = Literal["exactly", "at_most", "at_least", "never"]
_BOUNDS: tuple[str, ...] = ("exactly", "at_most", "at_least", "never")


@dataclass(frozen=True)
class Count:
    """How many effects called ``effect`` with fields matching ``where`` may be committed.

    With ``values``, each of those effects must also carry these values (compared exactly,
    as an intent's values are): an effect with another value is *wrong* and fails the check
    whatever the count, e.g. ``expected exactly 1 with amount=499, observed 1, wrong values:
    re_1: amount 3997, asked 499``.

    Build it with :func:`exactly`, :func:`at_most`, :func:`at_least` or :func:`never`.
    """

    bound: Bound
    n: int
    effect: str
    where: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.bound not in _BOUNDS:
            raise ValueError(f"unknown bound {self.bound!r}; expected one of: {', '.join(_BOUNDS)}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 0:
            raise ValueError(f"n must be a non-negative integer, got {self.n!r}")
        if self.bound == "at_least" and self.n == 0:
            raise ValueError("at_least(0, ...) always holds and proves nothing; use n >= 1")
        if self.bound == "never" and self.n != 0:
            raise ValueError(f"never() counts zero effects, got n={self.n!r}")
        _check_effect_name(self.effect)
        if not isinstance(self.values, Mapping):
            raise ValueError(f"values must be an object of field values, got {self.values!r}")
        if self.values and self.bound == "never":
            raise ValueError(
                f"never() with values {dict(self.values)!r}: no effect may exist, so there are "
                "no values to check; use where= to say which effects must not exist"
            )
        if both := sorted(set(self.where) & set(self.values)):
            raise ValueError(
                f"{', '.join(both)} is both a where filter and a value; a where field is "
                "matched exactly already: state it once"
            )

    @property
    def subject(self) -> str:
        """``payments.refund.create where order_id='order_1042'``."""
        return _where_label(self.effect, self.where)

    @property
    def expected(self) -> str:
        """``exactly 1``, ``at most 2``, ``at least 1`` or ``none``; with values, ``exactly 1
        with amount=499``."""
        if self.bound == "never":
            return "none"
        text = f"{self.bound.replace('_', ' ')} {self.n}"
        if self.values:
            text += " with " + ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return text

    def holds(self, observed: int) -> bool:
        """Whether ``observed`` effects satisfy the bound."""
        if self.bound == "at_least":
            return observed >= self.n
        if self.bound == "at_most":
            return observed <= self.n
        return observed == self.n  # exactly, never

    def check(self, ledger: Ledger) -> Verdict:
        """Count the matching effects in ``ledger`` (and check their values)."""
        effects = matching(ledger, self.effect, self.where)
        check_value_fields(ledger, self.effect, self.values)
        wrong = [f"{e.id}: {', '.join(w)}" for e in effects if (w := wrong_values(e, self.values))]
        behind = {a.n for a in attempts_behind(ledger, effects)}
        behind.update(_uncommitted_attempts(ledger, self.effect, self.where))
        observed: int | str = len(effects)
        if wrong:
            observed = f"{len(effects)}, wrong values: {'; '.join(wrong)}"
        return Verdict(
            ok=self.holds(len(effects)) and not wrong,
            subject=self.subject,
            expected=self.expected,
            observed=observed,
            effects=tuple(effects),
            attempts=tuple(ledger.attempt(n) for n in sorted(behind)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form read by :func:`parse_assertion`."""
        data: dict[str, Any] = {"assert": self.bound}
        if self.bound != "never":
            data["n"] = self.n
        data["effect"] = self.effect
        if self.where:
            data["where"] = dict(self.where)
        if self.values:
            data["values"] = dict(self.values)
        return data


def exactly(
    n: int, effect: str, /, *, values: Mapping[str, Any] | None = None, **where: Any
) -> Count:
    """Exactly ``n`` effects called ``effect`` whose fields match ``where``.

    Args:
        n: The count.
        effect: The effect name.
        values: Values each of those effects must carry (an effect with another value
            fails the check: asked 499 cents, refunded 3997).
        **where: Only effects whose fields equal these values are counted.

    Example:
        >>> exactly(1, "payments.refund.create", order_id="order_1042", values={"amount": 499})
    """
    return Count("exactly", n, effect, dict(where), dict(values or {}))


def at_most(
    n: int, effect: str, /, *, values: Mapping[str, Any] | None = None, **where: Any
) -> Count:
    """At most ``n`` effects called ``effect`` whose fields match ``where`` (each carrying
    ``values``, when given)."""
    return Count("at_most", n, effect, dict(where), dict(values or {}))


def at_least(
    n: int, effect: str, /, *, values: Mapping[str, Any] | None = None, **where: Any
) -> Count:
    """At least ``n`` (≥ 1) effects called ``effect`` whose fields match ``where`` (each
    carrying ``values``, when given)."""
    return Count("at_least", n, effect, dict(where), dict(values or {}))


def never(effect: str, /, **where: Any) -> Count:
    """No effect called ``effect`` whose fields match ``where``."""
    return Count("never", 0, effect, dict(where))


@dataclass(frozen=True)
class Compensated:
    """Every forward effect of a saga has exactly the compensations it needs.

    A compensation is linked to its forward effect through the field ``on``: the
    compensation's ``fields[on]`` equals the forward effect's own ``fields[on]``, or its id when
    it has no such field (a cancellation that names booking ``fl_1``).

    Without ``unless``, every forward effect needs exactly one compensation (the saga failed
    and must be rolled back). With ``unless``, a forward effect needs one only when no
    ``unless`` effect shares its ``saga`` field (the later step never happened), and none when
    one does (the saga completed: undoing its first step would be wrong).

    Build it with :func:`compensated`.
    """

    effect: str
    by: str
    on: str
    unless: str | None = None
    saga: str | None = None
    where: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_effect_name(self.effect)
        _check_effect_name(self.by, "by")
        if not isinstance(self.on, str) or not self.on:
            raise ValueError(f"on must name the linking field, got {self.on!r}")
        if self.unless is not None:
            _check_effect_name(self.unless, "unless")
            if not self.saga:
                raise ValueError(
                    f"unless={self.unless!r} needs saga=<field> naming what ties it to "
                    f"{self.effect} (e.g. saga='trip_id')"
                )
        elif self.saga is not None:
            raise ValueError(f"saga={self.saga!r} only means something together with unless=")

    @property
    def subject(self) -> str:
        """``travel.flight.book compensated by travel.flight.cancel on booking_id``."""
        return f"{_where_label(self.effect, self.where)} compensated by {self.by} on {self.on}"

    @property
    def expected(self) -> str:
        """The expectation in words."""
        text = f"exactly 1 {self.by} per {self.effect}"
        if self.unless:
            text += f" without a {self.unless} on the same {self.saga}, none otherwise"
        return text

    def _link(self, effect: Effect) -> Any:
        return effect.fields.get(self.on, effect.id)

    def _required(self, ledger: Ledger, forward: Effect) -> int:
        if self.unless is None or self.saga is None:
            return 1
        if self.saga not in forward.fields:
            raise ValueError(
                f"{self.effect} {forward.id} has no field {self.saga!r} (fields: "
                f"{', '.join(sorted(forward.fields))}); compensated(saga=...) needs it"
            )
        value = forward.fields[self.saga]
        done = any(
            e.name == self.unless and e.fields.get(self.saga) == value for e in ledger.effects
        )
        return 0 if done else 1

    def check(self, ledger: Ledger) -> Verdict:
        """Count each forward effect's compensations."""
        forwards = matching(ledger, self.effect, self.where)
        compensations: dict[Any, list[Effect]] = {}
        for e in ledger.effects:
            if e.name == self.by and self.on in e.fields:
                compensations.setdefault(e.fields[self.on], []).append(e)
        problems: list[str] = []
        involved: list[Effect] = []
        for fwd in forwards:
            found = compensations.get(self._link(fwd), [])
            required = self._required(ledger, fwd)
            if len(found) != required:
                times = "once" if len(found) == 1 else f"{len(found)} times"
                why = ""
                if required == 0:
                    why = f" although {self.unless} committed on its {self.saga}"
                problems.append(f"{fwd.id} compensated {times}{why}")
                involved += [fwd, *found]
        if problems:
            observed = "; ".join(problems)
        elif forwards:
            observed = f"{len(forwards)} {self.effect}, each compensated as required"
        else:
            observed = f"no {self.effect}"
        if not problems:
            involved = [e for f in forwards for e in (f, *compensations.get(self._link(f), []))]
        involved.sort(key=lambda e: (e.attempt, e.id))
        return Verdict.from_effects(
            ledger,
            involved,
            ok=not problems,
            subject=self.subject,
            expected=self.expected,
            observed=observed,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form read by :func:`parse_assertion`."""
        data: dict[str, Any] = {
            "assert": "compensated",
            "effect": self.effect,
            "by": self.by,
            "on": self.on,
        }
        if self.unless is not None:
            data["unless"] = self.unless
            data["saga"] = self.saga
        if self.where:
            data["where"] = dict(self.where)
        return data


def compensated(
    effect: str,
    /,
    *,
    by: str,
    on: str,
    unless: str | None = None,
    saga: str | None = None,
    **where: Any,
) -> Compensated:
    """Each ``effect`` (matching ``where``) is compensated exactly once by a ``by`` effect.

    Args:
        effect: The forward effect (``travel.flight.book``).
        by: The compensating effect (``travel.flight.cancel``).
        on: The compensation's field that names the forward effect (``booking_id``): it is
            compared with the forward effect's field of the same name, or its id.
        unless: A later saga step (``travel.hotel.book``); when it committed on the same
            ``saga`` value, the forward effect must NOT be compensated.
        saga: The field tying ``unless`` to the forward effect (``trip_id``).
        **where: Only forward effects whose fields equal these values.

    Example:
        >>> compensated("travel.flight.book", by="travel.flight.cancel", on="booking_id")
    """
    return Compensated(effect, by, on, unless, saga, dict(where))


@dataclass(frozen=True)
class NoUnseenEffects:
    """Every committed effect (optionally: of one name, matching ``where``) was shown to the
    agent: its id appears in some tool result. Catches the seed's silent ``re_1``.

    Build it with :func:`no_unseen_effects`.
    """

    effect: str | None = None
    where: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.effect is not None:
            _check_effect_name(self.effect)
        elif self.where:
            raise ValueError("no_unseen_effects(**where) needs an effect name to filter on")

    @property
    def subject(self) -> str:
        """What was checked."""
        scope = "effects" if self.effect is None else _where_label(self.effect, self.where)
        return f"{scope} the agent never saw"

    def check(self, ledger: Ledger) -> Verdict:
        """Find effects whose id never appeared in an observation."""
        pool = ledger.effects if self.effect is None else matching(ledger, self.effect, self.where)
        unseen = [e for e in pool if not ledger.seen(e)]
        return Verdict.from_effects(
            ledger, unseen, ok=not unseen, subject=self.subject, expected="none"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form read by :func:`parse_assertion`."""
        data: dict[str, Any] = {"assert": "no_unseen_effects"}
        if self.effect is not None:
            data["effect"] = self.effect
        if self.where:
            data["where"] = dict(self.where)
        return data


def no_unseen_effects(effect: str | None = None, /, **where: Any) -> NoUnseenEffects:
    """No committed effect the agent was never told about.

    Args:
        effect: Only effects with this name (default: every effect).
        **where: Only effects whose fields equal these values (needs ``effect``).
    """
    return NoUnseenEffects(effect, dict(where))


_KEYS: dict[str, tuple[set[str], set[str]]] = {
    # kind: (required keys, optional keys) besides "assert"
    "exactly": ({"n", "effect"}, {"where", "values"}),
    "at_most": ({"n", "effect"}, {"where", "values"}),
    "at_least": ({"n", "effect"}, {"where", "values"}),
    "never": ({"effect"}, {"where"}),
    "compensated": ({"effect", "by", "on"}, {"unless", "saga", "where"}),
    "no_unseen_effects": (set(), {"effect", "where"}),
}


def parse_assertion(data: Mapping[str, Any]) -> Count | Compensated | NoUnseenEffects:
    """Build a built-in assertion from its JSON form, as a dataset carries it.

    Forms: ``{"assert": "exactly"|"at_most"|"at_least", "n": 1, "effect": ..., "where": {...},
    "values": {...}}``,
    ``{"assert": "never", "effect": ..., "where": {...}}``, ``{"assert": "compensated",
    "effect": ..., "by": ..., "on": ..., "unless": ..., "saga": ..., "where": {...}}``,
    ``{"assert": "no_unseen_effects", "effect": ..., "where": {...}}``; ``where`` and
    ``values`` are optional.

    Raises:
        ValueError: naming the bad value and what is accepted.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"an assertion must be a JSON object, got {data!r}")
    kind = data.get("assert")
    if kind not in _KEYS:
        raise ValueError(
            f"unknown assertion {kind!r} in {dict(data)!r}; 'assert' must be one of: "
            f"{', '.join(_KEYS)}"
        )
    required, optional = _KEYS[kind]
    keys = set(data) - {"assert"}
    if missing := required - keys:
        raise ValueError(f"{kind} assertion {dict(data)!r} lacks {', '.join(sorted(missing))}")
    if extra := keys - required - optional:
        raise ValueError(
            f"{kind} assertion {dict(data)!r} has unknown key(s) {', '.join(sorted(extra))}; "
            f"accepted: {', '.join(sorted(required | optional))}"
        )
    where = data.get("where", {})
    if not isinstance(where, Mapping):
        raise ValueError(f"'where' must be an object of field values, got {where!r}")
    where = dict(where)
    if kind == "compensated":
        return Compensated(
            data["effect"], data["by"], data["on"], data.get("unless"), data.get("saga"), where
        )
    if kind == "no_unseen_effects":
        return NoUnseenEffects(data.get("effect"), where)
    values = data.get("values", {})
    if not isinstance(values, Mapping):
        raise ValueError(f"'values' must be an object of field values, got {values!r}")
    return Count(kind, data.get("n", 0), data["effect"], where, dict(values))


def check_all(ledger: Ledger, *assertions: Assertion) -> list[Verdict]:
    """Check every assertion against ``ledger``; never raises on a failed verdict.

    Raises:
        TypeError: for an object without ``check(ledger)`` or a check that returns
            something other than a :class:`Verdict`.
    """
    verdicts = []
    for a in assertions:
        if not isinstance(a, Assertion):
            raise TypeError(
                f"{a!r} is not an assertion: expected an object with check(ledger) -> Verdict "
                "(e.g. exactly(1, 'payments.refund.create', order_id=...))"
            )
        v = a.check(ledger)
        if not isinstance(v, Verdict):
            raise TypeError(f"{a!r}.check() returned {v!r}; it must return a Verdict")
        verdicts.append(v)
    return verdicts


def assert_side_effects(ledger: Ledger, *assertions: Assertion) -> list[Verdict]:
    """Check every assertion; raise one AssertionError listing each failure.

    Each failed verdict is one line (``payments.refund.create where order_id='order_1042':
    expected exactly 1, observed 2 (re_1 at attempt 1, reply lost; re_2 at attempt 2)``)
    followed by the ledger lines of the attempts behind it.

    Returns:
        The verdicts, when every assertion holds.

    Raises:
        AssertionError: when any assertion fails.
        ValueError: when no assertion is given (a check of nothing always passes).
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's body
    if not assertions:
        raise ValueError("assert_side_effects needs at least one assertion")
    verdicts = check_all(ledger, *assertions)
    if not all(v.ok for v in verdicts):
        raise AssertionError(format_failures(verdicts, ledger))
    return verdicts


def parse_assertions(
    items: Iterable[Mapping[str, Any]],
) -> list[Count | Compensated | NoUnseenEffects]:
    """:func:`parse_assertion` over a list (e.g. a sample's ``metadata["assertions"]``)."""
    if isinstance(items, Mapping | str):
        raise ValueError(f"assertions must be a list of JSON objects, got {items!r}")
    return [parse_assertion(item) for item in items]
