"""The report's comparisons: prompt against prompt per model, and this run against a
baseline run, cell by cell.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ._compare import FLAGS, baseline_comparison, default_reference, prompt_comparison
from ._frame import CELL, local_path
from ._html_rates import records
from ._html_run import ordered
from ._metrics import COMPARED, metric
from ._storage import parent_of


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


def prompt_section(trials: pd.DataFrame, info: dict[str, Any]) -> dict[str, Any] | None:
    """Each prompt against the reference prompt per model (None with fewer than two prompts)."""
    prompts = ordered(info["prompts"], trials["prompt"])
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
            metrics = {r["metric"]: r for r in records(group)}
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


def baseline_section(trials: pd.DataFrame, baseline: pd.DataFrame) -> dict[str, Any]:
    """Every cell against the same cell of the baseline run, flagged cells first."""
    table = baseline_comparison(trials, baseline)
    rows: list[dict[str, Any]] = []
    if len(table):
        for cell, group in table.groupby(list(CELL), sort=False):
            recs = records(group)
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
