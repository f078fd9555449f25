"""How long a served trial holds a lost reply open: the bound ``twice serve --hang-seconds``,
``twice run --hang-seconds`` and a trial's ``hang_seconds`` set (shared by the server and
the suite, which must not import each other)."""

from __future__ import annotations

import json
import math
from typing import Any

MAX_HANG_SECONDS = 600.0
"""The longest a trial may hold a lost reply open."""
DEFAULT_HANG_SECONDS = 120.0
"""How long a lost reply is held open by default: longer than the read timeouts clients are
usually given (Stripe's SDK: 80 s), so the client's own timeout is what ends the wait."""


def check_hang_seconds(value: Any, name: str = "hang_seconds") -> float:
    """``value`` as a hold time in seconds.

    Raises:
        ValueError: naming the value (as JSON, as a client wrote it) and the accepted range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_HANG_SECONDS
    ):
        try:
            shown = json.dumps(value)
        except (TypeError, ValueError):
            shown = repr(value)
        raise ValueError(f"{name} {shown} must be a number in (0, {MAX_HANG_SECONDS:g}]")
    return float(value)
