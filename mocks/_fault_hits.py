"""Which of a trial's mutating attempts its fault hits: one count and one deferral per trial,
shared by the trial's mock services and by ``twice serve``'s proxy to a real upstream."""

from __future__ import annotations

from ._faults import Fault, NoFault
from ._ledger import Attempt


class FaultHits:
    """The fault of one trial, which of its mutating attempts it hits, and the hits it owes.

    The fault's :class:`Schedule` names matching mutating attempts by number, counted over
    every service of the trial (mock or upstream) in the order they arrive. A scheduled hit
    that cannot land passes to the next matching mutating attempt (it is *deferred*):

    * a fault after the work (``commits``: a reply lost after the work) cannot hit an attempt
      that did no work: a 4xx answer, a request refused for its key, an upstream that could
      not be reached;
    * no fault can hit a request that never reached its hooks (refused for its key first).

    A fault before the work whose hook ran keeps its attempt: nothing is done either way. So an
    agent whose first call is malformed still meets the fault on its next one. A schedule of
    ``every`` attempt hits each matching one before a deferred hit is looked at: its owed hits
    are never spent, and change nothing.

    Args:
        fault: The trial's fault (default: none).

    Attributes:
        fault: The trial's fault.
        counted: Matching mutating attempts counted so far.
        deferred: Hits owed to the next matching mutating attempts (a restored trial sets it
            from its log).
    """

    def __init__(self, fault: Fault | None = None) -> None:
        self.fault: Fault = fault or NoFault()
        self.counted = 0
        self.deferred = 0

    def count(self, attempt: Attempt) -> int:
        """Count ``attempt`` (once, when it is recorded) if the schedule counts it.

        Returns:
            The matching mutating attempts so far, ``attempt`` included: its ``nth``.
        """
        if self.fault.schedule.matches(attempt):
            self.counted += 1
        return self.counted

    def fault_for(self, attempt: Attempt, nth: int) -> Fault | None:
        """The fault that hits ``attempt``, the ``nth`` matching one, or None.

        It hits when the schedule names ``nth``, or else when a hit is owed (spending it).
        """
        if isinstance(self.fault, NoFault) or not self.fault.schedule.matches(attempt):
            return None
        if self.fault.schedule.hits(attempt, nth):
            return self.fault
        if self.deferred:
            self.deferred -= 1
            return self.fault
        return None

    def hit(self, attempt: Attempt) -> Fault | None:
        """Count a newly recorded ``attempt`` and return the fault that hits it, if any,
        marking the attempt with the fault's wire name."""
        fault = self.fault_for(attempt, self.count(attempt))
        if fault is not None:
            attempt.fault = fault.wire_name
        return fault

    def defer(self, attempt: Attempt, fault: Fault, *, before_hooks: bool = False) -> None:
        """``fault`` was to hit ``attempt``, which did no work: unmark the attempt, and owe
        the hit to the next matching mutating attempt when the fault could not land on this
        one (it ``commits``, or the request was refused ``before_hooks``: for its key)."""
        attempt.fault = None
        if fault.commits or before_hooks:
            self.deferred += 1
