"""Per-cell rates with Wilson 95% intervals (statsmodels), and the summary.json contract."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from ._frame import CELL

RATES: dict[str, str] = {
    "completion_rate": "completed",
    "duplication_rate": "duplicated",
    "exactly_once_rate": "exactly_once",
    "safe_success_rate": "safe_success",
    "divergence_rate": "diverged",
    "crashed_rate": "crashed",
}
"""Cell rate name → per-trial metric it averages. Every rate gets a ``<name>_ci`` twin."""

ALPHA = 0.05


def wilson(successes: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` (NaNs when ``n == 0``)."""
    if n == 0:
        return (math.nan, math.nan)
    lo, hi = proportion_confint(successes, n, alpha=alpha, method="wilson")
    return (float(lo), float(hi))


def _ci_name(rate: str) -> str:
    return rate.removesuffix("_rate") + "_ci"


def cells(trials: pd.DataFrame, by: tuple[str, ...] = CELL) -> pd.DataFrame:
    """Aggregate the trial frame per cell.

    Rates are over the trials that were scored; ``errors`` counts trials that crashed (they are
    reported, never dropped silently; a ``crashed`` agent's trial is scored and counted in
    ``crashed_rate``). Columns: the cell keys, ``trials``, ``errors``, each rate
    of :data:`RATES` with ``<rate minus _rate>_ci`` as ``[lo, hi]``, ``excess_effects_mean``,
    ``unseen_effects_mean``, ``tokens_mean``.
    """
    rows: list[dict[str, Any]] = []
    for key, group in trials.groupby(list(by), sort=True, dropna=False):
        keys = key if isinstance(key, tuple) else (key,)
        scored = group[group["completed"].notna()]
        n = len(scored)
        row: dict[str, Any] = dict(zip(by, keys, strict=True))
        row["trials"] = len(group)
        row["errors"] = int(((group["error"] != "") | group["completed"].isna()).sum())
        for rate, metric in RATES.items():
            if metric not in scored:  # a frame from before the column existed
                continue
            k = int(scored[metric].sum())
            row[rate] = k / n if n else math.nan
            row[_ci_name(rate)] = list(wilson(k, n))
        row["excess_effects_mean"] = float(scored["excess_effects"].mean()) if n else math.nan
        row["unseen_effects_mean"] = float(scored["unseen_effects"].mean()) if n else math.nan
        row["tokens_mean"] = float(group["total_tokens"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def summary(table: pd.DataFrame, **extra: Any) -> dict[str, Any]:
    """The ``summary.json`` document: ``{"cells": [...]}`` plus any ``extra`` keys."""
    records = [{k: _clean(v) for k, v in row.items()} for row in table.to_dict("records")]
    return {"cells": records, **extra}


def write_summary(table: pd.DataFrame, path: str | Path, **extra: Any) -> Path:
    """Write ``summary.json`` (DESIGN.md's contract; NaN rates become null)."""
    out = Path(path)
    out.write_text(json.dumps(summary(table, **extra), indent=2) + "\n", encoding="utf-8")
    return out
