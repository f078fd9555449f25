"""How the suite's own pytest processes run their tests (``tests/conftest.py``)."""

from __future__ import annotations

import gc
import sys

from twice.evals.run import GC_THRESHOLDS


def test_a_test_runs_above_the_frame_with_room() -> None:
    # Without it, a call repeated over the edge of a 16 KiB chunk of CPython's frame stack
    # maps and unmaps memory each time (millions of times in a `make test`).
    frame = sys._getframe()
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        if frame.f_code.co_name == "with_room":
            assert frame.f_code.co_nlocals >= 15_000
            return
        frame = frame.f_back
    raise AssertionError(f"no with_room frame under the test: {names}")


def test_the_session_collects_at_twices_own_thresholds() -> None:
    assert gc.get_threshold() == GC_THRESHOLDS
