"""Chart geometry for the report's inline SVG.

The charts are drawn by small jinja macros (``templates/_svg.html.j2``) from the plain numbers
computed here. Python does the arithmetic (scales, overlap, colours) so the macros only place
shapes; every label they print goes through jinja's autoescaping like any other text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)
"""Colours for models, in order of appearance (colour-blind-safe enough for 10 models; the
markers are also numbered, so colour is never the only cue)."""


def _nan(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def rate_colour(rate: float | None, lower_is_better: bool) -> str:
    """Background for a rate: green when good, through yellow, to red when bad; grey for n/a.

    Light enough (lightness 78-88 %) that black text stays readable, also when printed.
    """
    if _nan(rate):
        return "#eeeeee"
    assert rate is not None
    bad = rate if lower_is_better else 1.0 - rate
    # sqrt: a 25 % duplication rate is already alarming, so the scale turns warm early.
    bad = math.sqrt(min(1.0, max(0.0, bad)))
    hue = round(120 * (1.0 - bad))
    light = round(88 - 10 * bad)
    return f"hsl({hue}, 70%, {light}%)"


@dataclass
class IntervalBar:
    """A rate with its interval on a 0-100 % track."""

    width: int
    x: float
    lo: float
    hi: float
    colour: str
    empty: bool = False


def interval_bar(
    rate: float | None,
    ci: list[float] | tuple[float, float],
    lower_is_better: bool,
    width: int = 120,
) -> IntervalBar:
    """Geometry of a small 0-100 % track with the interval as a bar and the rate as a dot."""
    pad = 4
    span = width - 2 * pad
    if _nan(rate) or _nan(ci[0]) or _nan(ci[1]):
        return IntervalBar(width, pad, pad, pad, "#999999", empty=True)
    assert rate is not None
    bad = rate if lower_is_better else 1 - rate
    colour = "#b2182b" if bad >= 0.5 else "#d6604d" if bad > 0.1 else "#1a9850"
    return IntervalBar(
        width,
        round(pad + rate * span, 1),
        round(pad + ci[0] * span, 1),
        round(pad + ci[1] * span, 1),
        colour,
    )


@dataclass
class ScatterPoint:
    """One model/prompt in the "useful and safe" chart."""

    model: str
    prompt: str
    colour: str
    duplication: float
    duplication_ci: list[float]
    completion: float
    completion_ci: list[float]
    trials: int
    x: float
    y: float
    x_ci: tuple[float, float]
    y_ci: tuple[float, float]
    spot: str = ""
    """Letter of the marker it is drawn under (points that coincide share one)."""


@dataclass
class Marker:
    """A drawn marker: one letter for one or more points that land on the same spot."""

    cx: float
    cy: float
    letter: str
    colour: str
    count: int = 1


@dataclass
class Scatter:
    """A completion-vs-duplication chart: axes, whiskers, markers, legend rows."""

    width: int
    height: int
    left: int
    top: int
    plot_w: int
    plot_h: int
    ticks: list[dict[str, Any]]
    points: list[ScatterPoint] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    safe_zone: dict[str, float] = field(default_factory=dict)


def _letter(i: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return letters[i] if i < len(letters) else f"{letters[i // 26 - 1]}{letters[i % 26]}"


def scatter(rows: list[dict[str, Any]], models: list[str]) -> Scatter:
    """Lay out completion (y) against duplication (x) for ``rows`` of per-(model, prompt) rates.

    Each row needs ``model, prompt, trials, completion_rate, completion_ci, duplication_rate,
    duplication_ci``. Points closer than a marker's width share one lettered marker; the
    legend (``points``, sorted by letter) keeps one line per point. The axes run slightly
    past 0 and 100 % so markers at the extremes stay inside the frame.
    """
    width, height, left, top, right, bottom = 360, 270, 52, 12, 12, 46
    pw, ph = width - left - right, height - top - bottom
    inset = 10  # px between the frame and the 0 % / 100 % lines

    def sx(v: float) -> float:
        return round(left + inset + v * (pw - 2 * inset), 1)

    def sy(v: float) -> float:
        return round(top + inset + (1 - v) * (ph - 2 * inset), 1)

    chart = Scatter(
        width=width,
        height=height,
        left=left,
        top=top,
        plot_w=pw,
        plot_h=ph,
        ticks=[
            {"v": f"{round(t * 100)}%", "x": sx(t), "y": sy(t)} for t in (0, 0.25, 0.5, 0.75, 1.0)
        ],
        safe_zone={
            "x": left,
            "y": top,
            "w": round(sx(0.1) - left, 1),
            "h": round(sy(0.9) - top, 1),
        },
    )
    for row in rows:
        dup, comp = row["duplication_rate"], row["completion_rate"]
        if _nan(dup) or _nan(comp):
            continue
        colour = (
            PALETTE[models.index(row["model"]) % len(PALETTE)]
            if row["model"] in models
            else "#333333"
        )
        dci, cci = row["duplication_ci"], row["completion_ci"]
        point = ScatterPoint(
            model=row["model"],
            prompt=row["prompt"],
            colour=colour,
            duplication=dup,
            duplication_ci=dci,
            completion=comp,
            completion_ci=cci,
            trials=int(row["trials"]),
            x=sx(dup),
            y=sy(comp),
            x_ci=(sx(dci[0]), sx(dci[1])),
            y_ci=(sy(cci[0]), sy(cci[1])),
        )
        for marker in chart.markers:
            if abs(marker.cx - point.x) < 14 and abs(marker.cy - point.y) < 14:
                marker.count += 1
                if marker.colour != point.colour:
                    marker.colour = "#444444"  # several models on one spot: neutral colour
                point.spot = marker.letter
                break
        else:
            letter = _letter(len(chart.markers))
            chart.markers.append(Marker(point.x, point.y, letter, point.colour))
            point.spot = letter
        chart.points.append(point)
    order = {m.letter: i for i, m in enumerate(chart.markers)}
    chart.points.sort(key=lambda p: order[p.spot])
    return chart


@dataclass
class Timeline:
    """One trial's attempts (what the client saw) above the effects they committed."""

    width: int
    height: int
    lane_agent: int
    lane_server: int
    attempts: list[dict[str, Any]]
    effects: list[dict[str, Any]]
    hidden: int
    """Attempts left out of the drawing (they are all in the table below it)."""


MAX_TIMELINE_ATTEMPTS = 16


def timeline(attempts: list[dict[str, Any]], effects: list[dict[str, Any]]) -> Timeline:
    """Geometry of a trial's timeline.

    Args:
        attempts: Ledger attempts (``n, source, key, outcome, delivered, mutating, fault,
            replayed, effect_ids``) in order.
        effects: Effects annotated with ``excess`` and ``seen`` (bools).
    """
    shown = attempts[:MAX_TIMELINE_ATTEMPTS]
    step, x0 = 104, 132
    width = max(420, x0 + step * len(shown) + 24)
    lane_agent, lane_server = 66, 152
    by_id = {e["id"]: e for e in effects}
    out_attempts: list[dict[str, Any]] = []
    out_effects: list[dict[str, Any]] = []
    for i, a in enumerate(shown):
        x = x0 + i * step
        key = a.get("key")
        out_attempts.append(
            {
                "x": x,
                "n": a.get("n"),
                "source": a.get("source", "unknown"),
                "method": a.get("method", ""),
                "outcome": a.get("outcome", "unknown"),
                "mutating": bool(a.get("mutating")),
                "key": "no key" if not key else f"key …{str(key)[-6:]}",
                "fault": a.get("fault"),
                "lost": not a.get("delivered", True),
                "replayed": bool(a.get("replayed")),
                "status": a.get("status"),
            }
        )
        ids = [i for i in a.get("effect_ids", []) if i in by_id]
        for j, effect_id in enumerate(ids):
            e = by_id[effect_id]
            out_effects.append(
                {
                    "x": x + (j - (len(ids) - 1) / 2) * 40,
                    "ax": x,
                    "id": e["id"],
                    "excess": bool(e.get("excess")),
                    "seen": e.get("seen")
                    is not False,  # unknown (an old log) is not drawn as unseen
                    "lost": not a.get("delivered", True),
                }
            )
    return Timeline(
        width, 200, lane_agent, lane_server, out_attempts, out_effects, len(attempts) - len(shown)
    )
