"""How the report writes numbers and model text: rates, intervals, differences, p-values,
and Unicode's directional controls made visible.
"""

from __future__ import annotations

import math
import re
from typing import Any

import markupsafe

BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Unicode's directional formatting characters (overrides, embeddings, isolates, marks)."""


def show_bidi_controls(value: Any) -> Any:
    """Every value the template prints, with its directional formatting characters shown as
    ``[U+202E]`` instead of obeyed: escaping does not stop a right-to-left override in a
    model's text from reversing what follows it on the line, twice's own labels and
    numbers included. Markup (already escaped) stays Markup; the marker is plain text."""
    if isinstance(value, str) and BIDI_CONTROLS.search(value):
        shown = BIDI_CONTROLS.sub(lambda m: f"[U+{ord(m.group()):04X}]", value)
        return markupsafe.Markup(shown) if isinstance(value, markupsafe.Markup) else shown
    return value


def is_nan(x: Any) -> bool:
    """None or a float NaN: a value the report shows as ``n/a``."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def as_number(x: Any) -> float:
    """``x`` as a float for sorting, ``n/a`` below every rate."""
    return -1.0 if is_nan(x) else float(x)


def pct(x: Any, digits: int = 0) -> str:
    """``29%``; ``<1%`` / ``>99%`` near the ends so a nonzero rate never reads as 0 (or 1);
    ``n/a``. With ``digits``, that many decimals (``22.5%``)."""
    if is_nan(x):
        return "n/a"
    v = 100 * float(x)
    step = 10.0**-digits
    if 0 < v < step:
        return f"<{step:g}%"
    if 100 - step < v < 100:
        return f">{100 - step:g}%"
    return f"{v:.{digits}f}%"


def pct_pair(pair: tuple[Any, Any]) -> tuple[str, str]:
    """Two rates shown side by side (``before → after``), with as many decimals (up to 2) as
    it takes for different rates to read differently: 22.5% and 21.5% both read "22%" beside
    a "-1 pts" difference."""
    a, b = pair
    for digits in (0, 1, 2):
        shown = pct(a, digits), pct(b, digits)
        if shown[0] != shown[1] or is_nan(a) or is_nan(b) or float(a) == float(b):
            break
    return shown


def _bound(x: float) -> str:
    v = 100 * x
    # Bounds near 0 % and 100 % get a decimal: "0%" beside a nonzero bound would read as none.
    return f"{v:.1f}" if (0.05 <= v < 1 or 99 < v <= 99.95) else f"{v:.0f}"


def ci_text(v: Any) -> str:
    """``[15–49%]`` for a 95 % interval (a decimal near 0 and 100 %); empty for n/a."""
    if v is None or len(v) != 2 or is_nan(v[0]) or is_nan(v[1]):
        return ""
    return f"[{_bound(v[0])}–{_bound(v[1])}%]"


def pts(x: Any) -> str:
    """A difference of rates in percentage points, signed: ``+31 pts``."""
    if is_nan(x):
        return "n/a"
    v = 100 * float(x)
    return "±0 pts" if round(v) == 0 else f"{v:+.0f} pts"


def pts_ci(v: Any) -> str:
    """``[+13, +47]`` (percentage points)."""
    if v is None or len(v) != 2 or is_nan(v[0]) or is_nan(v[1]):
        return ""
    return f"[{100 * v[0]:+.0f}, {100 * v[1]:+.0f}]"


def p_text(p: Any) -> str:
    """``p=0.31``, ``p<0.001``."""
    if is_nan(p):
        return "p n/a"
    return "p<0.001" if p < 0.001 else f"p={p:.3f}" if p < 0.01 else f"p={p:.2f}"
