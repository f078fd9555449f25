"""The durable action log: the tool layer's own record of dispatched calls.

The tool layer may keep an :class:`ActionLog` (dispatched calls, their keys and results,
outside the model's context). When the ``crash_after_commit`` fault kills the run after a
commit, ``resumable_generate`` restarts it from the conversation as it stood before the call;
attempts the restarted run re-sends carry the retry source ``resume``, and the action log is
what lets the tool layer skip them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

ACTION_LOG_STORE_KEY = "twice:action_log"
"""Store key of the durable action log (``ActionLog.to_list()``), when the trial keeps one."""
COMPENSATIONS_STORE_KEY = "twice:compensations"
"""Store key of the undos registered by ``compensable`` calls (a list of ``Undo``)."""


@dataclass
class ActionRecord:
    """One dispatched mutating call in the action log."""

    intent: str
    route: str
    call: int
    key: str | None
    payload: dict[str, Any]
    state: Literal["dispatched", "done", "failed"] = "dispatched"
    """``dispatched``: sent, outcome unknown so far; ``done``: a 2xx (or a lookup) came back;
    ``failed``: a definite 4xx."""
    body: dict[str, Any] | None = None


class ActionLog:
    """The orchestrator's durable record of dispatched calls, outside the model's context.

    Written before a mutating request is sent and updated when its reply arrives, it survives a
    restarted run (it lives in the trial context and the sample store, not in the messages).
    """

    def __init__(self) -> None:
        self.records: list[ActionRecord] = []

    def latest(self, intent: str) -> ActionRecord | None:
        """The most recent record of an intent, or None."""
        for record in reversed(self.records):
            if record.intent == intent:
                return record
        return None

    def begin(
        self, *, intent: str, route: str, call: int, key: str | None, payload: dict[str, Any]
    ) -> ActionRecord:
        """Record a call about to be dispatched."""
        record = ActionRecord(intent, route, call, key, dict(payload))
        self.records.append(record)
        return record

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-ready records, as stored in the sample store."""
        return [asdict(r) for r in self.records]
