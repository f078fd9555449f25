"""Values that live exactly as long as one running trial (an inspect sample × epoch).

A trial's setup registers them; code that runs later in the same trial (a model provider, a
scorer) finds them by the trial's inspect ``TaskState``. They stay out of the sample store on
purpose: inspect copies the store at every span and logs each change (twice measured this as
the largest part of its own cost per trial), while these are read, never logged.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class TrialScoped(Generic[T]):
    """One value per running trial, keyed by its ``TaskState.uuid``."""

    def __init__(self) -> None:
        self._values: dict[str, T] = {}

    def keep(self, state: Any, value: T) -> None:
        """Register ``value`` for the trial of ``state``; it is forgotten by :meth:`pop`, or
        with the sample's store at the latest (a trial that never reaches its cleanup)."""
        self._values[state.uuid] = value
        weakref.finalize(state.store, self._values.pop, state.uuid, None)

    def get(self, state: Any) -> T | None:
        """The value registered for the trial of ``state``, if any."""
        return self._values.get(state.uuid)

    def pop(self, state: Any) -> T | None:
        """Forget the trial's value and return it (None when there was none)."""
        return self._values.pop(state.uuid, None)

    def __len__(self) -> int:
        return len(self._values)


_HELD: TrialScoped[Mapping[str, Any]] = TrialScoped()


def keep_held_metadata(state: Any, held: Mapping[str, Any]) -> None:
    """Register the sample metadata a task held back from the logged sample for one trial
    (``twice.tasks.hold_metadata``: the stubs' plan, the services' starting state), so that
    :func:`trial_metadata` gives scorers and end-state checks the whole of it."""
    _HELD.keep(state, held)


def forget_held_metadata(state: Any) -> None:
    """Drop a finished trial's held metadata (it goes with the sample at the latest)."""
    _HELD.pop(state)


def trial_metadata(state: Any) -> dict[str, Any]:
    """A running trial's whole sample metadata: what inspect logs, plus what was held back."""
    held = _HELD.get(state)
    metadata = dict(state.metadata or {})
    return {**metadata, **held} if held else metadata
