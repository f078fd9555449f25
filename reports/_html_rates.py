"""The report's rate sections: the headline per model and its takeaway, the model × prompt
grids, the charts, the breakdowns by task, fault and protection, and where retries came
from.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ._aggregate import cells
from ._charts import PALETTE, interval_bar, rate_colour, scatter
from ._frame import RETRY_SOURCES
from ._html_run import ordered, rank
from ._html_text import as_number, is_nan
from ._metrics import metric
from .stats import wilson

GRID_METRICS: tuple[str, ...] = ("duplication_rate", "completion_rate", "safe_success_rate")
"""The catalogue metrics the model × prompt grid has a tab for, first tab first."""


SOURCE_NOTES: dict[str, str] = {
    "initial": "the first attempt of a tool call",
    "transport": "the tool layer's own retry loop",
    "model": "the model calling the tool again",
    "resume": "a restarted run re-executing a step",
    "framework": "an agent's framework or own code re-sending a tool call the model made once",
    "user": "the model repeating an action after the user asked again",
    "compaction": "the model repeating an action after its context was compacted",
    "unknown": "a client that did not say",
}


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``table`` as dicts (none for an empty frame)."""
    return table.to_dict("records") if len(table) else []


def rate_view(row: dict[str, Any], prefix: str, lower_is_better: bool) -> dict[str, Any]:
    """A rate of a cells row as the template draws it: value, interval, colour and bar."""
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
    for r in records(table):
        found.setdefault(str(r["model"]), {})[str(r["prompt"])] = r
    for model, mine in found.items():
        out[model]["rows"] = [
            {"prompt": p, "n": mine[p]["trials"], "safe": rate_view(mine[p], "safe_success", False)}
            for p in ordered(prompts, mine)
        ]
    return out


def headline(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model, best first: its pooled rates, worst cell and rates per prompt."""
    by_model = {r["model"]: r for r in records(cells(trials, by=("model",)))}
    per_cell = cells(trials)
    prompts = list(info["prompts"]) or ordered(None, trials["prompt"])
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
                "safe": rate_view(r, "safe_success", False),
                "dup": rate_view(r, "duplication", True),
                "comp": rate_view(r, "completion", False),
                "wrong": rate_view(r, "wrong", True),
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
    rows.sort(key=lambda r: (-as_number(r["safe"]["rate"]), as_number(r["dup"]["rate"])))
    return rows


def passk_shown(values: dict[str, float]) -> list[tuple[int, float]]:
    """The ``no_dup^k`` values the headline shows: k = 1, 2, 4, 8, ... and the largest k."""
    ks = sorted(int(k) for k in values)
    if not ks:
        return []
    shown = {k for k in ks if k & (k - 1) == 0} | {ks[-1]}
    return [(k, values[str(k)]) for k in ks if k in shown]


def takeaway(headline: list[dict[str, Any]]) -> dict[str, Any] | None:
    scored = [r for r in headline if not is_nan(r["safe"]["rate"])]
    if not scored:
        return None
    best = max(scored, key=lambda r: (as_number(r["safe"]["ci"][0]), -as_number(r["dup"]["ci"][1])))
    return {
        # A model with no safe success at all is nobody's "highest safe success".
        "best": best if as_number(best["safe"]["rate"]) > 0 else None,
        "duplicators": [r["model"] for r in scored if as_number(r["dup"]["rate"]) > 0],
        # An agent that crashed never had the chance to duplicate: "never duplicated" alone
        # would read as safe, so those are listed apart with how often they crashed.
        "clean": [
            r["model"] for r in scored if as_number(r["dup"]["rate"]) == 0 and not _crashed(r)
        ],
        "crashed": [
            {"model": r["model"], "rate": r["crashed"]}
            for r in scored
            if as_number(r["dup"]["rate"]) == 0 and _crashed(r)
        ],
        "cut_short": [],  # filled from the run's status: :func:`_qualify_takeaway`
    }


def _crashed(row: dict[str, Any]) -> bool:
    return as_number(row.get("crashed")) > 0


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


def grids(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Per grid metric, the model × prompt grid of each fault and protection."""
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
    by_cell = {tuple(str(r[k]) for k in keys): r for r in records(table)}
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
                prompts = ordered(info["prompts"], [p for _, _, own in here for p in own])
                notes = {model: note for model, note, _ in here}
                rows = []
                for model in ordered(info["models"], notes):
                    row_cells: list[dict[str, Any] | None] = []
                    for prompt in prompts:
                        r = by_cell.get((fault, protection, model, prompt))
                        if r is None:
                            row_cells.append(None)
                            continue
                        row_cells.append(
                            {**rate_view(r, prefix, lower), "n": r["trials"], "errors": r["errors"]}
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


def charts(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Per protection, the scatter of every (model, prompt) point."""
    out = []
    table = cells(trials, by=("protection", "model", "prompt"))  # every chart's points at once
    points: dict[str, list[dict[str, Any]]] = {}
    for r in records(table):
        points.setdefault(str(r["protection"]), []).append(r)
    for protection in info["protections"]:
        part = trials[trials["protection"] == protection]
        if part.empty:
            continue
        rows = points.get(protection, [])
        prompts = list(info["prompts"])
        rows.sort(key=lambda r: (rank(info["models"], r["model"]), rank(prompts, r["prompt"])))
        chart = scatter(rows, info["models"])
        faults = ordered(info["faults"], part["fault"])
        out.append({"protection": protection, "faults": faults, "chart": chart})
    return out


def breakdowns(trials: pd.DataFrame, info: dict[str, Any]) -> list[dict[str, Any]]:
    """The rates by task, by fault and by protection, each over all models and per model."""
    out = []
    for dim, order in (
        ("task", info["tasks"]),
        ("fault", info["faults"]),
        ("protection", info["protections"]),
    ):
        per_model = cells(trials, by=(dim, "model"))
        overall = {r[dim]: r for r in records(cells(trials, by=(dim,)))}
        groups = []
        for value in order:
            if value not in overall:
                continue
            mine = per_model[per_model[dim] == value]
            ranked = sorted(records(mine), key=lambda r: rank(info["models"], r["model"]))
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
        "dup": rate_view(r, "duplication", True),
        "comp": rate_view(r, "completion", False),
        "safe": rate_view(r, "safe_success", False),
        "wrong": rate_view(r, "wrong", True),
        "excess": r["excess_effects_mean"],
        "unseen": r["unseen_effects_mean"],
    }


def sources(trials: pd.DataFrame, info: dict[str, Any]) -> dict[str, Any] | None:
    """Where attempts and excess effects came from (retry sources), overall and per model."""
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
