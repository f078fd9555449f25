"""The ledger: every attempt a service received and every effect it committed.

The ledger is the ground truth of a trial. It is written by the services, never by the agent,
and it survives a lost reply: an attempt whose response never reached the client is recorded
with ``delivered=False``, exactly like a respx call whose side effect raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._live import TrialScoped

Outcome = Literal["ok", "fail", "unknown"]
"""What the client saw of an attempt (Jepsen's ok / fail / info)."""

RETRY_SOURCES: tuple[str, ...] = (
    "initial",
    "transport",
    "model",
    "resume",
    "framework",
    "user",
    "compaction",
    "unknown",
)
"""Who sent an attempt (``Attempt.source``): the first try, the tool layer's retry loop, the
model calling the tool again, a restarted run re-executing a step, (for an agent under test)
its framework or own code re-sending a tool call the model made once, the model repeating an
action after the user asked again (``user``) or after its context was compacted
(``compaction``). ``unknown`` when the client did not say and twice could not tell."""


@dataclass
class Attempt:
    """One HTTP request that reached a service, whether or not its reply was delivered."""

    n: int
    """1-based number of the attempt within the trial, over all services."""
    service: str
    method: str
    path: str
    route: str | None
    """The route's ``service.resource.verb`` name, or None for an unknown path."""
    mutating: bool
    key: str | None
    """The Idempotency-Key header, as sent (None when absent)."""
    params: dict[str, Any]
    source: str = "unknown"
    call: int | None = None
    """The tool layer's call number (one per tool invocation), when the client sent it."""
    status: int | None = None
    """HTTP status the service produced; None when it never produced one (timed out)."""
    delivered: bool = True
    outcome: Outcome = "ok"
    fault: str | None = None
    """Name of the fault that hit this attempt, if any."""
    replayed: bool = False
    """The response was replayed from the idempotency store: no new work was done."""
    effect_ids: list[str] = field(default_factory=list)
    backoff: float = 0.0
    """Virtual seconds the client waited before sending this attempt (never slept)."""
    at: float | None = None
    """Wall-clock time (Unix seconds) the service received it: orders it against the model's
    turns when twice attributes an agent under test's attempts."""
    asked: int | None = None
    """For an attributed attempt of an agent under test: how many tool calls the model had
    made that attempts of this request answered, up to this one (None: not attributed)."""
    reply: Any = None
    """The body a real service answered (JSON, or text), for an attempt ``twice serve
    --upstream`` forwarded to one; None for a mock service's attempt (its effects say what
    it did)."""


@dataclass
class Effect:
    """A state change a service committed: a refund row, a sent email."""

    id: str
    name: str
    """``service.resource.verb``, e.g. ``payments.refund.create``."""
    attempt: int
    """Number of the attempt that committed it."""
    fields: dict[str, Any]


def outcome_of(status: int | None, delivered: bool) -> Outcome:
    """Classify what a client can know from a response.

    A lost reply or any 5xx leaves the client not knowing whether the work was done (the
    service may have committed before failing); only a delivered 4xx is a definite failure.
    """
    if not delivered or status is None or status >= 500:
        return "unknown"
    if status >= 400:
        return "fail"
    return "ok"


@dataclass
class Ledger:
    """Attempts, effects and the texts the agent was shown, for one trial."""

    attempts: list[Attempt] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    """Every tool result (or tool error) text handed to the agent, in order."""
    known_effects: frozenset[str] | None = field(default=None, compare=False, repr=False)
    """The names of the trial's services' routes (an effect is named by the route that
    commits it), when the ledger is a live trial's: an assertion on another name is a typo
    that would pass vacuously. None (a ledger read back from a log, or built by hand): not
    checked."""

    def effects_named(self, name: str, **where: Any) -> list[Effect]:
        """Effects called ``name`` whose fields equal every ``where`` value."""
        return [
            e
            for e in self.effects
            if e.name == name and all(e.fields.get(k) == v for k, v in where.items())
        ]

    def attempt(self, n: int) -> Attempt:
        """The attempt numbered ``n`` (1-based).

        Raises:
            IndexError: when the ledger holds no attempt ``n`` (``n < 1`` included: a
                negative index would name another attempt).
        """
        if not 1 <= n <= len(self.attempts):
            raise IndexError(f"the ledger holds attempts 1 to {len(self.attempts)}, not {n}")
        return self.attempts[n - 1]

    def seen(self, effect: Effect) -> bool:
        """Whether the effect's id appeared in any text the agent was shown.

        Matched as a whole word, so ``re_1`` is not "seen" in a text that names ``re_10``.
        """
        pattern = re.compile(rf"(?<![\w]){re.escape(effect.id)}(?![\w])")
        return any(pattern.search(text) for text in self.observations)

    def unseen_effects(self) -> list[Effect]:
        """Effects the agent never learned about (the seed's silent ``re_1``)."""
        return [e for e in self.effects if not self.seen(e)]

    def faults_fired(self) -> list[Attempt]:
        """Attempts that a fault hit."""
        return [a for a in self.attempts if a.fault is not None]

    def describe_effect(self, effect: Effect) -> str:
        """One evidence line: ``re_1 at attempt 1 (initial), reply lost`` (``re_1 at attempt
        1`` alone when the ledger does not hold that attempt, as a hand-built one may not)."""
        n = effect.attempt
        return describe_effect(effect, self.attempt(n) if 1 <= n <= len(self.attempts) else None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy, as stored in the inspect sample store."""
        return {
            "attempts": [asdict(a) for a in self.attempts],
            "effects": [asdict(e) for e in self.effects],
            "observations": list(self.observations),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ledger:
        """Rebuild a ledger from :meth:`to_dict` output (e.g. read back from a log)."""
        return cls(
            attempts=[Attempt(**a) for a in data.get("attempts", [])],
            effects=[Effect(**e) for e in data.get("effects", [])],
            observations=list(data.get("observations", [])),
        )


LEDGER_STORE_KEY = "twice:ledger"
"""Key of the ledger (``Ledger.to_dict()``) in an inspect sample's store."""


_LIVE: TrialScoped[tuple[Ledger, Callable[[], None]]] = TrialScoped()
"""Each running trial's live ledger and what copies it into its store."""


def keep_ledger(state: Any, ledger: Ledger, flush: Callable[[], None]) -> None:
    """Register a running trial's live ledger, and how to copy it into the sample store.

    The store gets the ledger once, when the trial is over (:func:`flush_ledger`, from the
    task's cleanup), not after every call: each copy made while the trial ran was logged
    twice more (in the solver's state event and the enclosing spans' store events) on top
    of the final store. Meanwhile twice's scorers read the live ledger (:func:`live_ledger`).

    Args:
        state: The trial's inspect ``TaskState`` (its ``uuid`` names the trial).
        ledger: The trial's ledger, which its services keep current.
        flush: Copies the ledger into the store.
    """
    _LIVE.keep(state, (ledger, flush))


def live_ledger(state: Any) -> Ledger | None:
    """The running trial's live ledger, if its setup registered one (:func:`keep_ledger`)."""
    kept = _LIVE.get(state)
    return kept[0] if kept is not None else None


def flush_ledger(state: Any) -> None:
    """Copy a trial's ledger into the sample store and forget the registration.

    twice tasks call it at cleanup, which inspect runs after scoring, and also when the
    trial failed before it: a trial that dies keeps its ledger. Does nothing for a trial
    that registered nothing.
    """
    kept = _LIVE.pop(state)
    if kept is not None:
        kept[1]()


def ledger_of(sample: Any) -> Ledger:
    """The ledger twice's tools kept in one inspect sample's store (an ``EvalSample``).

    Raises:
        LookupError: when the sample's store holds no ledger (not a twice task's sample).
    """
    data = (getattr(sample, "store", None) or {}).get(LEDGER_STORE_KEY)
    if data is None:
        raise LookupError(
            f"sample {getattr(sample, 'id', '?')!r} has no ledger under {LEDGER_STORE_KEY!r} in "
            "its store: it was not run by a twice task"
        )
    return Ledger.from_dict(data)


def ledgers(log: Any) -> list[Ledger]:
    """The ledgers of every sample of a full inspect log (an ``EvalLog`` read with samples),
    in sample order."""
    return [ledger_of(s) for s in getattr(log, "samples", None) or []]


def describe_effect(effect: Effect, attempt: Attempt | None, *, brief: bool = False) -> str:
    """One evidence line for ``effect``, committed by ``attempt``.

    In full, ``re_1 at attempt 1 (initial), reply lost``: who sent the attempt and what its
    client saw. ``brief`` (an assertion's message) leaves out the sender, and what the client
    saw when it was the reply as sent: ``re_1 at attempt 1, reply lost; re_2 at attempt 2``.
    """
    line = f"{effect.id} at attempt {effect.attempt}"
    if attempt is None:  # a ledger without it (hand-built): nothing more is known
        return line
    if attempt.fault == "crash_after_commit":
        seen = "run crashed before the agent saw the reply"
    elif not attempt.delivered:
        seen = "reply lost"
    elif attempt.outcome != "ok":
        seen = f"client saw HTTP {attempt.status}"
    else:
        seen = "reply delivered"
    if brief:
        return line if seen == "reply delivered" else f"{line}, {seen}"
    # "(unknown)" read as if the outcome were unknown: it is who sent the attempt.
    sender = "sender unknown" if attempt.source == "unknown" else attempt.source
    if attempt.source == "framework" and attempt.asked is not None:
        sender = f"framework: the model asked {_times(attempt.asked)}"
    return f"{line} ({sender}), {seen}"


def _times(n: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(n, f"{n} times")
