"""``FaultHits``: which of a trial's mutating attempts its fault hits, and where a hit that
could not land goes. One table, each row a trial's attempts in order."""

from __future__ import annotations

import pytest
from twice.mocks import (
    Attempt,
    Fault,
    FaultHits,
    LostReply,
    NoFault,
    Schedule,
    TimeoutBeforeCommit,
)

REFUND = "payments.refund.create"


def lost(*attempts: int, route: str | None = None, every: bool = False) -> Fault:
    """``lost_reply`` on the given mutating attempts (the first when none are given)."""
    return LostReply(schedule=Schedule(attempts=attempts or (1,), route=route, every=every))


# What befalls each attempt: "ok" (a refund that does the work), "4xx" (a refund that did
# no work: refused after the fault's hooks ran), "key" (a refund refused for its key, before
# the hooks), "other" (a mutating attempt on another route), "read" (not mutating).
# What the fault does to it: "H" hits and lands, "d" hits and is passed on to the next,
# "s" hits and is spent there (nothing is done either way), "-" no hit.
TABLE = [
    ("the first mutating attempt", lost(), "ok ok", "H -"),
    ("a read is not counted", lost(), "read ok ok", "- H -"),
    ("after the work: a 4xx passes it on", lost(), "4xx ok ok", "d H -"),
    ("after the work: a refusal passes it on", lost(), "key ok ok", "d H -"),
    ("before the work: a 4xx spends it", TimeoutBeforeCommit(), "4xx ok", "s -"),
    ("before the work: a refusal passes it on", TimeoutBeforeCommit(), "key ok ok", "d H -"),
    ("two owed hits", lost(1, 2), "4xx key ok ok ok", "d d H H -"),
    ("an owed hit, then a scheduled one", lost(1, 2), "4xx ok ok", "d H H"),
    ("a later number", lost(3), "ok ok 4xx ok", "- - d H"),
    ("every attempt: owed hits change nothing", lost(every=True), "4xx key ok ok", "d d H H"),
    ("a route counts its own", lost(2, route=REFUND), "other ok other ok ok", "- - - H -"),
    ("an owed hit waits for its route", lost(route=REFUND), "4xx other read ok", "d - - H"),
    ("no fault", NoFault(), "ok 4xx ok", "- - -"),
]


def _attempt(n: int, step: str) -> Attempt:
    route = "payments.refund.list" if step == "read" else REFUND
    if step == "other":
        route = "email.message.create"
    return Attempt(n, route.split(".")[0], "POST", "/", route, step != "read", None, {})


@pytest.mark.parametrize(("why", "fault", "steps", "marks"), TABLE, ids=[r[0] for r in TABLE])
def test_fault_hits_the_scheduled_attempt_or_the_next_after_one_that_could_not_take_it(
    why: str, fault: Fault, steps: str, marks: str
) -> None:
    hits = FaultHits(fault)
    seen = []
    for n, step in enumerate(steps.split(), 1):
        attempt = _attempt(n, step)
        hit = hits.hit(attempt)
        assert (hit is not None) == (attempt.fault is not None)
        if hit is not None and step in ("4xx", "key"):
            owed = hits.deferred
            hits.defer(attempt, hit, before_hooks=step == "key")
            assert attempt.fault is None
            seen.append("d" if hits.deferred == owed + 1 else "s")
        else:
            seen.append("-" if hit is None else "H")
    assert " ".join(seen) == marks


def test_fault_hits_counts_the_matching_attempts_and_marks_the_wire_name() -> None:
    fault = LostReply(name="lost_reply+ask_again", conversation="ask_again")
    hits = FaultHits(fault)
    assert hits.fault is fault
    assert hits.count(_attempt(1, "read")) == 0
    first = _attempt(2, "ok")
    assert hits.hit(first) is fault and first.fault == "lost_reply"
    assert hits.counted == 1 and hits.fault_for(_attempt(3, "ok"), 2) is None
    assert isinstance(FaultHits().fault, NoFault)


def test_fault_hits_owes_a_restored_count() -> None:
    # A restarted trial sets what its log says it owed: the next matching attempt is hit.
    hits = FaultHits(LostReply(schedule=Schedule(attempts=(9,))))
    hits.deferred = 2
    assert hits.fault_for(_attempt(1, "read"), 0) is None and hits.deferred == 2
    assert hits.fault_for(_attempt(1, "ok"), 1) is not None and hits.deferred == 1
