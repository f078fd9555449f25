"""The HTML report: one self-contained, autoescaped page built from the trial frame.

:func:`report_data` turns frames into plain data (lists, dicts, strings, numbers); the jinja
template only lays it out. Nothing model-controlled is marked safe anywhere: prompts, tool
arguments, tool outputs, ids and error messages all go through jinja's autoescaping, and the
page carries a Content-Security-Policy that allows no script and no network at all.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
import markupsafe
import pandas as pd

from ._aggregate import cells, wilson
from ._charts import PALETTE, interval_bar, rate_colour, scatter
from ._compare import FLAGS, baseline_comparison, default_reference, prompt_comparison
from ._drill import WORST_N, clip, drill_down
from ._frame import CELL, PARSE_COLUMNS, PARSE_SHAPES, RETRY_SOURCES, local_path, with_agent
from ._logs import read_header
from ._metrics import COMPARED, errored, metric
from ._storage import Location, as_location, parent_of, write_text

TEMPLATE = "report.html.j2"

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


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader(__package__ or "twice.reports", "templates"),
    autoescape=True,  # model-controlled text (prompts, tool args, outputs, errors) is untrusted
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=show_bidi_controls,
)

GRID_METRICS: tuple[str, ...] = ("duplication_rate", "completion_rate", "safe_success_rate")
"""The catalogue metrics the model × prompt grid has a tab for, first tab first."""

SOURCE_NOTES: dict[str, str] = {
    "initial": "the first attempt of a tool call",
    "transport": "the tool layer's own retry loop",
    "model": "the model calling the tool again",
    "resume": "a restarted run re-executing a step",
    "unknown": "a client that did not say",
}


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x: Any, digits: int = 0) -> str:
    """``29%``; ``<1%`` / ``>99%`` near the ends so a nonzero rate never reads as 0 (or 1);
    ``n/a``. With ``digits``, that many decimals (``22.5%``)."""
    if _nan(x):
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
        if shown[0] != shown[1] or _nan(a) or _nan(b) or float(a) == float(b):
            break
    return shown


def _bound(x: float) -> str:
    v = 100 * x
    # Bounds near 0 % and 100 % get a decimal: "0%" beside a nonzero bound would read as none.
    return f"{v:.1f}" if (0.05 <= v < 1 or 99 < v <= 99.95) else f"{v:.0f}"


def ci_text(v: Any) -> str:
    """``[15–49%]`` for a 95 % interval (a decimal near 0 and 100 %); empty for n/a."""
    if v is None or len(v) != 2 or _nan(v[0]) or _nan(v[1]):
        return ""
    return f"[{_bound(v[0])}–{_bound(v[1])}%]"


def pts(x: Any) -> str:
    """A difference of rates in percentage points, signed: ``+31 pts``."""
    if _nan(x):
        return "n/a"
    v = 100 * float(x)
    return "±0 pts" if round(v) == 0 else f"{v:+.0f} pts"


def pts_ci(v: Any) -> str:
    """``[+13, +47]`` (percentage points)."""
    if v is None or len(v) != 2 or _nan(v[0]) or _nan(v[1]):
        return ""
    return f"[{100 * v[0]:+.0f}, {100 * v[1]:+.0f}]"


def p_text(p: Any) -> str:
    """``p=0.31``, ``p<0.001``."""
    if _nan(p):
        return "p n/a"
    return "p<0.001" if p < 0.001 else f"p={p:.3f}" if p < 0.01 else f"p={p:.2f}"


_ENV.filters.update(pct=pct, pct_pair=pct_pair, ci=ci_text, pts=pts, pts_ci=pts_ci, p=p_text)
_ENV.tests["nan"] = _nan


def _ordered(preferred: Iterable[str] | None, present: Iterable[str]) -> list[str]:
    present = list(dict.fromkeys(str(v) for v in present))
    first = [v for v in (preferred or []) if v in present]
    return first + [v for v in present if v not in first]


def _rank(order: list[str], value: str) -> int:
    return order.index(value) if value in order else len(order)


def _headers(trials: pd.DataFrame) -> list[Any]:
    # One header per prompt (for its text) plus the first and last log (dates, versions):
    # bounded however many logs the run has.
    picks: dict[str, None] = {}
    logs = trials["log"].astype(str)
    for _, group in trials.assign(_log=logs).groupby("prompt", sort=False):
        picks[group["_log"].iloc[0]] = None
    if len(logs):
        picks[logs.min()] = None
        picks[logs.max()] = None
    out = []
    for log in picks:
        try:
            out.append(read_header(local_path(log)))
        except Exception:  # a missing log only costs the "what was run" details
            continue
    return out


def _span(headers: list[Any]) -> str:
    """``first start – last finish`` of the logs' evals (minutes; UTC offsets as written)."""
    started = min(str(h.eval.created) for h in headers)
    ends = [str(h.stats.completed_at) for h in headers if h.stats and h.stats.completed_at]
    first, last = _minute(started), _minute(max(ends)) if ends else ""
    return first if not last or last == first else f"{first} – {last}"


def _minute(stamp: str) -> str:
    try:
        return dt.datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M %Z").strip()
    except ValueError:
        return stamp


def run_info(trials: pd.DataFrame, run: dict[str, Any] | None) -> dict[str, Any]:
    """What was run: ``run`` (from ``twice run``) completed from the logs themselves."""
    run = dict(run or {})
    headers = _headers(trials) if len(trials) else []
    prompts: dict[str, dict[str, Any]] = {}
    for h in headers:
        meta = ((h.eval.metadata or {}).get("twice") or {}) if h.eval.metadata else {}
        name = meta.get("prompt")
        if name and name not in prompts:
            prompts[name] = {
                "source": meta.get("prompt_source", ""),
                "sha256": meta.get("prompt_sha256", ""),
                "text": meta.get("prompt_text", ""),
            }
    prompts.update(run.get("prompts") or {})
    for name, sha in trials.drop_duplicates("prompt")[["prompt", "prompt_sha256"]].itertuples(
        index=False
    ):
        prompts.setdefault(name, {"source": "", "sha256": sha, "text": ""})
    order = [*(run.get("prompts") or {}), *prompts]  # the run's order, then the logs'
    versions = dict(run.get("versions") or {})
    # When the trials ran, from the logs: a resumed run that reused every cell writes a new
    # run["created"], but its trials are as old as their logs.
    created = run.get("created") or ""
    if headers:
        versions = {**{k: v for k, v in (headers[0].eval.packages or {}).items()}, **versions}
        created = _span(headers)
    info = {
        "models": _ordered(run.get("models"), trials["model"]),
        "prompts": {
            name: {
                "source": p.get("source", ""),
                "sha256": p.get("sha256", ""),
                "text": clip(p.get("text", ""), 20_000),
            }
            for name, p in ((n, prompts[n]) for n in _ordered(order, trials["prompt"]))
            if name in prompts
        },
        "tasks": _ordered(run.get("tasks"), trials["task"]),
        "faults": _ordered(run.get("faults"), trials["fault"]),
        "protections": _ordered(run.get("protections"), trials["protection"]),
        "epochs": run.get("epochs") or (int(trials["epoch"].max()) if len(trials) else 0),
        "versions": versions,
        "created": created,
        "suite": run.get("suite", ""),
        "sequential": run.get("sequential") if isinstance(run.get("sequential"), dict) else None,
        "log_dirs": sorted({parent_of(local_path(str(p))) for p in trials["log"].unique()}),
    }
    return info


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    return table.to_dict("records") if len(table) else []


def _rate(row: dict[str, Any], prefix: str, lower_is_better: bool) -> dict[str, Any]:
    rate = row.get(f"{prefix}_rate")
    ci = row.get(f"{prefix}_ci") or [math.nan, math.nan]
    return {
        "rate": rate,
        "ci": ci,
        "colour": rate_colour(rate, lower_is_better),
        "bar": interval_bar(rate, ci, lower_is_better),
    }


def _matched_prompts(mine: pd.DataFrame) -> tuple[pd.DataFrame | None, int, str]:
    """One model's trials over the conditions all its prompts ran: the matched trials (None
    when there are none), how many conditions, and a note when nothing could be matched."""
    cond = ["task", "fault", "protection"]
    ran = {
        p: set(map(tuple, g[cond].drop_duplicates().to_numpy())) for p, g in mine.groupby("prompt")
    }
    if len(ran) < 2:
        return None, 0, "ran one prompt only"
    shared = set.intersection(*ran.values())
    if not shared:
        return None, 0, "its prompts share no condition"
    keys = pd.Series(list(map(tuple, mine[cond].to_numpy())), index=mine.index)
    return mine[keys.isin(shared)], len(shared), ""


def _by_prompt(trials: pd.DataFrame, models: list[str], prompts: list[str]) -> dict[str, Any]:
    """Per model, its safe success per prompt over the conditions all its prompts ran
    (None for every model when fewer than two prompts ran)."""
    if len(prompts) < 2:
        return dict.fromkeys(models)
    out: dict[str, Any] = {}
    parts = []
    for model in models:
        matched, n, note = _matched_prompts(trials[trials["model"] == model])
        out[model] = {"rows": [], "conditions": n, "note": note}
        if matched is not None:
            parts.append(matched)
    # One aggregation for every model: the matched parts are disjoint (one model each).
    table = cells(pd.concat(parts), by=("model", "prompt")) if parts else pd.DataFrame()
    found: dict[str, dict[str, Any]] = {}
    for r in _records(table):
        found.setdefault(str(r["model"]), {})[str(r["prompt"])] = r
    for model, mine in found.items():
        out[model]["rows"] = [
            {"prompt": p, "n": mine[p]["trials"], "safe": _rate(mine[p], "safe_success", False)}
            for p in _ordered(prompts, mine)
        ]
    return out


def _headline(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    by_model = {r["model"]: r for r in _records(cells(trials, by=("model",)))}
    per_cell = cells(trials)
    prompts = list(info["prompts"]) or _ordered(None, trials["prompt"])
    present = [m for m in info["models"] if m in by_model]
    by_prompt = _by_prompt(trials[trials["model"].isin(present)], present, prompts)
    rows = []
    for model in info["models"]:
        r = by_model.get(model)
        if r is None:
            continue
        mine = per_cell[per_cell["model"] == model]
        worst = None
        if len(mine) and mine["duplication_rate"].max() > 0:
            w = mine.sort_values(["duplication_rate", "trials"], ascending=False).iloc[0]
            worst = {k: w[k] for k in ("prompt", "task", "fault", "protection")}
            worst["rate"], worst["ci"] = w["duplication_rate"], w["duplication_ci"]
        own = trials[trials["model"] == model]
        rows.append(
            {
                "model": model,
                "colour": PALETTE[info["models"].index(model) % len(PALETTE)],
                "trials": r["trials"],
                "errors": r["errors"],
                "safe": _rate(r, "safe_success", False),
                "dup": _rate(r, "duplication", True),
                "comp": _rate(r, "completion", False),
                "wrong": _rate(r, "wrong", True),
                "excess": r["excess_effects_mean"],
                "crashed": r.get("crashed_rate"),
                "passk": passk_shown(r.get("no_dup_k") or {}),
                "worst": worst,
                # What the row pools: the headline rates are over all of these at once.
                "pooled": {
                    axis: int(own[axis].nunique())
                    for axis in ("prompt", "task", "fault", "protection")
                },
                "by_prompt": by_prompt[model],
            }
        )
    # Best first: the page is read top-down, so the table answers "which one" on its own.
    rows.sort(key=lambda r: (-_num(r["safe"]["rate"]), _num(r["dup"]["rate"])))
    return rows


def passk_shown(values: dict[str, float]) -> list[tuple[int, float]]:
    """The ``no_dup^k`` values the headline shows: k = 1, 2, 4, 8, ... and the largest k."""
    ks = sorted(int(k) for k in values)
    if not ks:
        return []
    shown = {k for k in ks if k & (k - 1) == 0} | {ks[-1]}
    return [(k, values[str(k)]) for k in ks if k in shown]


def _num(x: Any) -> float:
    return -1.0 if _nan(x) else float(x)


def _takeaway(headline: list[dict[str, Any]]) -> dict[str, Any] | None:
    scored = [r for r in headline if not _nan(r["safe"]["rate"])]
    if not scored:
        return None
    best = max(scored, key=lambda r: (_num(r["safe"]["ci"][0]), -_num(r["dup"]["ci"][1])))
    return {
        # A model with no safe success at all is nobody's "highest safe success".
        "best": best if _num(best["safe"]["rate"]) > 0 else None,
        "duplicators": [r["model"] for r in scored if _num(r["dup"]["rate"]) > 0],
        # An agent that crashed never had the chance to duplicate: "never duplicated" alone
        # would read as safe, so those are listed apart with how often they crashed.
        "clean": [r["model"] for r in scored if _num(r["dup"]["rate"]) == 0 and not _crashed(r)],
        "crashed": [
            {"model": r["model"], "rate": r["crashed"]}
            for r in scored
            if _num(r["dup"]["rate"]) == 0 and _crashed(r)
        ],
        "cut_short": [],  # filled from the run's status: :func:`_qualify_takeaway`
    }


def _crashed(row: dict[str, Any]) -> bool:
    return _num(row.get("crashed")) > 0


def _matched(part: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One model's trials under one fault and protection, cut to the tasks every prompt ran.

    The grid compares prompts along a row, so a prompt must not be credited (or blamed) for
    tasks only it faced: ``stub/retry`` under ``baseline`` over five tasks beside ``cautious``
    over refund alone read as a prompt effect. Returns the matched trials and a note saying
    what was left out ("" when nothing was).
    """
    tasks = {p: set(g["task"]) for p, g in part.groupby("prompt", sort=False)}
    if len(tasks) < 2:
        return part, ""
    shared = set.intersection(*tasks.values())
    if not shared:
        return part, "prompts ran different tasks: not comparable along this row"
    if all(t == shared for t in tasks.values()):
        return part, ""
    left = sorted(set.union(*tasks.values()) - shared)
    return (
        part[part["task"].isin(shared)],
        f"matched on {', '.join(sorted(shared))}; left out {', '.join(left)} "
        "(run by only some prompts)",
    )


def _grids(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    facets_data: dict[tuple[str, str], list[tuple[str, str, list[str]]]] = {}
    parts = []
    for (fault, protection, model), part in trials.groupby(
        ["fault", "protection", "model"], sort=False
    ):
        matched, note = _matched(part)
        parts.append(matched)
        prompts = list(dict.fromkeys(str(p) for p in matched["prompt"]))
        facets_data.setdefault((str(fault), str(protection)), []).append(
            (str(model), note, prompts)
        )
    # Every row of every grid in one aggregation: the matched parts are disjoint, so grouping
    # their union by (fault, protection, model, prompt) gives each part's per-prompt cells.
    keys = ("fault", "protection", "model", "prompt")
    table = cells(pd.concat(parts), by=keys) if parts else pd.DataFrame()
    by_cell = {tuple(str(r[k]) for k in keys): r for r in _records(table)}
    out = []
    for m in map(metric, GRID_METRICS):
        prefix, lower = m.prefix, m.higher_is_worse
        faults = []
        for fault in info["faults"]:
            facets = []
            for protection in info["protections"]:
                here = facets_data.get((fault, protection))
                if not here:
                    continue
                prompts = _ordered(info["prompts"], [p for _, _, own in here for p in own])
                notes = {model: note for model, note, _ in here}
                rows = []
                for model in _ordered(info["models"], notes):
                    row_cells: list[dict[str, Any] | None] = []
                    for prompt in prompts:
                        r = by_cell.get((fault, protection, model, prompt))
                        if r is None:
                            row_cells.append(None)
                            continue
                        row_cells.append(
                            {**_rate(r, prefix, lower), "n": r["trials"], "errors": r["errors"]}
                        )
                    rows.append({"model": model, "cells": row_cells, "note": notes[model]})
                facets.append({"protection": protection, "prompts": prompts, "rows": rows})
            if facets:
                faults.append({"fault": fault, "facets": facets})
        out.append(
            {
                "id": m.prefix,
                "title": m.label.capitalize(),
                "what": m.what,
                "lower_is_better": lower,
                "faults": faults,
            }
        )
    return out


def _charts(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    table = cells(trials, by=("protection", "model", "prompt"))  # every chart's points at once
    points: dict[str, list[dict[str, Any]]] = {}
    for r in _records(table):
        points.setdefault(str(r["protection"]), []).append(r)
    for protection in info["protections"]:
        part = trials[trials["protection"] == protection]
        if part.empty:
            continue
        rows = points.get(protection, [])
        prompts = list(info["prompts"])
        rows.sort(key=lambda r: (_rank(info["models"], r["model"]), _rank(prompts, r["prompt"])))
        chart = scatter(rows, info["models"])
        faults = _ordered(info["faults"], part["fault"])
        out.append({"protection": protection, "faults": faults, "chart": chart})
    return out


def callout(highlights: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The significant differences the prompt section's callout lists: every pooled one
    (``fault == "all"``), then each per-fault one its pooled row does not already say (the
    same metric, the same direction). A pair's pooled "duplication better" once hid its
    "safe success worse" under one fault."""
    said = {
        (h["model"], h["prompt"], h["metric"], h["verdict"])
        for h in highlights
        if h["fault"] == "all"
    }
    return [
        h
        for h in highlights
        if h["fault"] == "all" or (h["model"], h["prompt"], h["metric"], h["verdict"]) not in said
    ]


def _prompt_section(trials: pd.DataFrame, info: dict[str, Any]) -> dict[str, Any] | None:
    prompts = _ordered(info["prompts"], trials["prompt"])
    if len(prompts) < 2:
        return None
    reference = default_reference(prompts)
    table = prompt_comparison(trials, reference=reference)
    rows: list[dict[str, Any]] = []
    hidden = 0
    highlights: list[dict[str, Any]] = []
    if len(table):
        for (model, prompt, fault), group in table.groupby(
            ["model", "prompt", "fault"], sort=False
        ):
            metrics = {r["metric"]: r for r in _records(group)}
            first = next(iter(metrics.values()))
            if fault != "all" and all(m["diff"] == 0 for m in metrics.values()):
                hidden += (
                    1  # a per-fault row where nothing moved says nothing the pooled row doesn't
                )
                continue
            for m in metrics.values():
                if m["verdict"] != "same":
                    highlights.append(
                        {
                            "model": model,
                            "prompt": prompt,
                            "fault": fault,
                            **m,
                        }
                    )
            rows.append(
                {
                    "model": model,
                    "prompt": prompt,
                    "fault": fault,
                    "pooled": fault == "all",
                    "conditions": first["conditions"],
                    "n_ref": first["n_ref"],
                    "n": first["n"],
                    "metrics": [
                        metrics[c] for c in (metric(n).column for n in COMPARED) if c in metrics
                    ],
                }
            )
    significant = int(table["significant"].sum()) if len(table) else 0
    highlights = callout(highlights)
    return {
        "reference": reference,
        "rows": rows,
        "hidden": hidden,
        "highlights": highlights[:12],
        "comparisons": len(table),
        "significant": significant,
    }


def _baseline_section(trials: pd.DataFrame, baseline: pd.DataFrame) -> dict[str, Any]:
    table = baseline_comparison(trials, baseline)
    rows: list[dict[str, Any]] = []
    if len(table):
        for cell, group in table.groupby(list(CELL), sort=False):
            recs = _records(group)
            first = recs[0]
            rows.append(
                {
                    **dict(zip(CELL, cell, strict=True)),
                    "flag": first["flag"],
                    "prompt_changed": bool(first["prompt_changed"]),
                    # a new or gone cell's one row has no metric (NaN here, which is truthy);
                    # its NaN counts made the column float: "56.0 / 56.0" trials
                    "metrics": [
                        {**r, "n": int(r["n"]), "n_ref": int(r["n_ref"])}
                        for r in recs
                        if isinstance(r.get("metric"), str)
                    ],
                }
            )
    rows.sort(key=lambda r: FLAGS.index(r["flag"]))
    counts = {flag: sum(1 for r in rows if r["flag"] == flag) for flag in FLAGS}
    return {
        "rows": [r for r in rows if r["flag"] != "same"],
        "same": [r for r in rows if r["flag"] == "same"],
        "counts": counts,
        "trials": len(baseline),
        "log_dirs": sorted({parent_of(local_path(str(p))) for p in baseline["log"].unique()})
        if len(baseline)
        else [],
    }


def _breakdowns(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for dim, order in (
        ("task", info["tasks"]),
        ("fault", info["faults"]),
        ("protection", info["protections"]),
    ):
        per_model = cells(trials, by=(dim, "model"))
        overall = {r[dim]: r for r in _records(cells(trials, by=(dim,)))}
        groups = []
        for value in order:
            if value not in overall:
                continue
            mine = per_model[per_model[dim] == value]
            ranked = sorted(_records(mine), key=lambda r: _rank(info["models"], r["model"]))
            rows = [_breakdown_row(r, r["model"]) for r in ranked]
            groups.append(
                {"value": value, "all": _breakdown_row(overall[value], "all models"), "rows": rows}
            )
        out.append({"dim": dim, "groups": groups})
    return out


def _breakdown_row(r: dict[str, Any], label: str) -> dict[str, Any]:
    return {
        "label": label,
        "trials": r["trials"],
        "errors": r["errors"],
        "dup": _rate(r, "duplication", True),
        "comp": _rate(r, "completion", False),
        "safe": _rate(r, "safe_success", False),
        "wrong": _rate(r, "wrong", True),
        "excess": r["excess_effects_mean"],
        "unseen": r["unseen_effects_mean"],
    }


def _sources(trials: pd.DataFrame, info: dict[str, Any]) -> dict[str, Any] | None:
    if f"attempts_{RETRY_SOURCES[0]}" not in trials.columns:
        return None
    groups = []
    scopes = [("all models", trials)] + [(m, trials[trials["model"] == m]) for m in info["models"]]
    for label, part in scopes:
        scored = part[part["completed"].notna() & part[f"excess_{RETRY_SOURCES[0]}"].notna()]
        total_excess = sum(float(scored[f"excess_{s}"].sum()) for s in RETRY_SOURCES)
        rows = []
        for source in RETRY_SOURCES:
            attempts = float(part[f"attempts_{source}"].sum())
            excess = float(scored[f"excess_{source}"].sum())
            if attempts == 0 and excess == 0:
                continue
            dup_trials = int((scored[f"excess_{source}"] > 0).sum())
            n = len(scored)
            rate = dup_trials / n if n else math.nan
            ci = list(wilson(dup_trials, n))
            rows.append(
                {
                    "source": source,
                    "note": SOURCE_NOTES.get(source, ""),
                    "attempts": int(attempts),
                    "per_trial": attempts / len(part) if len(part) else math.nan,
                    "trials_with": int((part[f"attempts_{source}"] > 0).sum()),
                    "excess": int(excess),
                    "share": excess / total_excess if total_excess else math.nan,
                    "dup": {
                        "rate": rate,
                        "ci": ci,
                        "colour": rate_colour(rate, True),
                        "bar": interval_bar(rate, ci, True),
                    },
                    "dup_trials": dup_trials,
                    "scored": n,
                }
            )
        if rows:
            groups.append({"label": label, "trials": len(part), "rows": rows})
    return {"groups": groups, "notes": SOURCE_NOTES}


def _errors(trials: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for cell, group in trials[errored(trials)].groupby(list(CELL), sort=True):
        messages = group["error"].replace("", "(not scored)").value_counts().head(3)
        out.append(
            {
                **dict(zip(CELL, cell, strict=True)),
                "count": len(group),
                "messages": [{"text": clip(m, 400), "count": int(c)} for m, c in messages.items()],
            }
        )
    return out


def _agent_crashes(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Cells where the agent under test raised: scored results, listed with what it raised."""
    if "crashed" not in trials:
        return []
    crashed = trials[trials["crashed"] == 1]
    totals = trials.groupby(list(CELL), sort=False).size()
    out = []
    for cell, group in crashed.groupby(list(CELL), sort=True):
        messages = group["agent_error"].replace("", "(no message)").value_counts().head(3)
        out.append(
            {
                **dict(zip(CELL, cell, strict=True)),
                "count": len(group),
                "trials": int(totals[cell]),
                "messages": [{"text": clip(m, 400), "count": int(c)} for m, c in messages.items()],
            }
        )
    return out


def agents_as_models(trials: pd.DataFrame) -> pd.DataFrame:
    """Name each agent under test with its model (``stub/retry · langgraph``), so every
    per-model view of the report (grids, charts, prompt comparisons) treats an agent like a
    model. Trials of twice's own loop (``react``) keep the plain model name."""
    trials = with_agent(trials)
    if not (trials["agent"] != "react").any():
        return trials
    label = trials["model"].where(
        trials["agent"] == "react", trials["model"] + " · " + trials["agent"]
    )
    return trials.assign(model=label)


def _parsing(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Per model, how twice's local model server read its replies (tool-call shapes)."""
    if not set(PARSE_COLUMNS) <= set(trials.columns):
        return []
    out = []
    for model, group in trials.groupby("model", sort=False):
        counted = group[list(PARSE_COLUMNS)].dropna(how="all")
        if counted.empty:
            continue
        sums = {s: int(counted[f"parse_{s}"].sum()) for s in PARSE_SHAPES}
        out.append({"model": model, "trials": len(counted), "replies": sum(sums.values()), **sums})
    return out


def report_data(
    trials: pd.DataFrame,
    run: dict[str, Any] | None = None,
    baseline: pd.DataFrame | None = None,
    worst: int = WORST_N,
) -> dict[str, Any]:
    """Plain data for the template (no pandas objects cross into jinja).

    Args:
        trials: The trial frame (:func:`reports.trials_frame`).
        run: What was run (``evals``' run metadata); missing parts are read from the logs.
        baseline: Another run's trial frame to compare against, cell by cell.
        worst: How many of the worst trials to drill into (each is read back from its log).
    """
    agent_crashes = _agent_crashes(trials) if len(trials) and "agent" in trials else []
    trials = agents_as_models(trials)
    if baseline is not None:
        baseline = agents_as_models(baseline)
    info = run_info(trials, run)
    n_scored = int(trials["completed"].notna().sum()) if len(trials) else 0
    data: dict[str, Any] = {
        "run": info,
        "n_trials": len(trials),
        "n_scored": n_scored,
        "n_cells": len(trials[list(CELL)].drop_duplicates()) if len(trials) else 0,
        "headline": _headline(trials, info) if len(trials) else [],
        "takeaway": None,
        "grids": _grids(trials, info) if len(trials) else [],
        "charts": _charts(trials, info) if len(trials) else [],
        "prompts": _prompt_section(trials, info) if len(trials) else None,
        "baseline": _baseline_section(trials, baseline) if baseline is not None else None,
        "breakdowns": _breakdowns(trials, info) if len(trials) else [],
        "sources": _sources(trials, info) if len(trials) else None,
        "errors": _errors(trials) if len(trials) else [],
        "agent_crashes": agent_crashes,
        "parsing": _parsing(trials) if len(trials) else [],
        "worst_n": worst,
        "drill": drill_down(trials, worst) if len(trials) else [],
        "palette": PALETTE,
    }
    data["takeaway"] = _takeaway(data["headline"])
    # The headline table is already wide: its wrong-values column shows only when some model
    # committed wrong values (as twice run's table does); the breakdowns always show it.
    measured = [m["wrong"]["rate"] for m in data["headline"] if not _nan(m["wrong"]["rate"])]
    data["headline_wrong"] = any(rate > 0 for rate in measured)
    data["headline_no_wrong"] = bool(measured) and not data["headline_wrong"]
    return data


def prepare_report() -> None:
    """Do now what this process's first report would otherwise start with: import the
    statistics libraries its comparisons use (``_compare``: 0.8 s) and compile its template.

    ``twice run --workers`` calls it on the core the first worker to end leaves idle, so the
    merged report, written after the last worker ends, is that much shorter.
    """
    import scipy.stats  # noqa: F401
    import statsmodels.stats.proportion  # noqa: F401

    _ENV.get_template(TEMPLATE)


def partial_note(status: Mapping[str, Any] | None) -> str | None:
    """What the report says first when it covers part of a run, from ``summary.json``'s
    ``status``/``interrupted``/``missing``/``missing_logs``/``errored`` (None: the run is
    complete)."""
    if not status:
        return None
    cells, logs = len(status.get("missing") or []), len(status.get("missing_logs") or [])
    errored = status.get("errored") if isinstance(status.get("errored"), int) else 0
    if status.get("status") == "running":
        why = "The run is still going"
    elif status.get("interrupted"):
        why = f"The run was interrupted ({status['interrupted']})"
    elif cells or logs or errored or status.get("complete") is False:
        why = "The run is incomplete"
    else:
        return None
    if cells:
        left = f": {cells} planned cell(s) have no finished log"
    elif logs:
        left = f": {logs} planned log(s) are missing"
    elif errored:
        left = f": {errored} trial(s) errored and are left out of the rates"
    else:
        left = ""
    note = (
        f"{why}{left}. These rates cover only the trials that finished; rerun the same "
        "twice run command to finish it."
    )
    cut = [c for c in status.get("cut_short") or [] if isinstance(c, Mapping)]
    if cut:
        n = sum(int(c.get("trials") or 0) for c in cut)
        dup = sum(int(c.get("duplicated") or 0) for c in cut)
        note += (
            f" {n} trial(s) were cut short and are not in them; {dup} of those had already "
            "duplicated an action. A trial that retries runs longer, so an interrupt cuts it "
            "short first: these rates understate duplication."
        )
    return note


def cut_short_duplicators(status: Mapping[str, Any] | None) -> dict[str, int]:
    """Per model as the headline names it, the trials an interrupt cut short whose ledger
    already held a duplicate (``summary.json``'s ``cut_short``)."""
    cut = [c for c in (status or {}).get("cut_short") or [] if isinstance(c, Mapping)]
    if not cut:
        return {}
    frame = agents_as_models(pd.DataFrame(cut))
    frame = frame[pd.to_numeric(frame["duplicated"], errors="coerce").fillna(0) > 0]
    return {
        str(m): int(n) for m, n in frame.groupby("model", sort=False)["duplicated"].sum().items()
    }


def _qualify_takeaway(takeaway: dict[str, Any] | None, status: Mapping[str, Any] | None) -> None:
    """A model whose cut-short trials had duplicated is not "never duplicated", whatever its
    finished trials say: it moves to a line of its own."""
    late = cut_short_duplicators(status)
    if takeaway is None or not late:
        return
    takeaway["clean"] = [m for m in takeaway["clean"] if m not in late]
    takeaway["crashed"] = [c for c in takeaway["crashed"] if c["model"] not in late]
    takeaway["cut_short"] = [{"model": m, "trials": n} for m, n in late.items()]


def render_report(
    trials: pd.DataFrame,
    run: dict[str, Any] | None = None,
    baseline: pd.DataFrame | None = None,
    status: Mapping[str, Any] | None = None,
) -> str:
    """The report as an HTML string (``status``: see :func:`write_report`)."""
    data = report_data(trials, run, baseline)
    _qualify_takeaway(data["takeaway"], status)
    return _ENV.get_template(TEMPLATE).render(**data, partial=partial_note(status))


def write_report(
    trials: pd.DataFrame,
    path: Location,
    run: dict[str, Any] | None = None,
    baseline: pd.DataFrame | None = None,
    status: Mapping[str, Any] | None = None,
) -> Location:
    """Write the report to ``path`` and return it.

    Args:
        trials: The trial frame of the run (:func:`reports.trials_frame`).
        path: Where to write the HTML file (one self-contained file); may be an fsspec URI.
        run: What was run (models, prompts with texts, axes, versions, date), as ``evals``
            records it; anything missing is read from the logs.
        baseline: The trial frame of an earlier run: cells are compared and regressions and
            improvements flagged.
        status: The run's state as ``summary.json`` records it (``complete``, ``status``,
            ``interrupted``, ``missing``, ``missing_logs``, ``errored``, ``cut_short``): a
            report of part of a run says so above everything else.
    """
    out = as_location(path)
    write_text(out, render_report(trials, run, baseline, status))
    return out
