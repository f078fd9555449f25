"""Per-trial values (``mocks/_live.TrialScoped``): one per running trial, gone with it."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from inspect_ai.util import Store
from twice.mocks._live import TrialScoped


def _state(uuid: str) -> SimpleNamespace:
    return SimpleNamespace(uuid=uuid, store=Store())


def test_each_trial_sees_only_its_own_value() -> None:
    scoped: TrialScoped[str] = TrialScoped()
    a, b = _state("a"), _state("b")
    scoped.keep(a, "plan a")
    scoped.keep(b, "plan b")
    assert scoped.get(a) == "plan a" and scoped.get(b) == "plan b"
    assert scoped.get(_state("c")) is None
    assert scoped.pop(a) == "plan a"
    assert scoped.get(a) is None and scoped.pop(a) is None
    assert scoped.get(b) == "plan b"


def test_a_value_goes_with_its_trials_store() -> None:
    # a trial that never reaches its cleanup must not leave its value behind
    scoped: TrialScoped[list[int]] = TrialScoped()
    state = _state("gone")
    scoped.keep(state, [1, 2, 3])
    assert len(scoped) == 1
    del state
    gc.collect()
    assert len(scoped) == 0
