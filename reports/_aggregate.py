"""Per-cell rates with Wilson 95% intervals (statsmodels), and the summary.json contract."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from ._frame import CELL, with_agent
from ._metrics import CATALOGUE, crashed
from ._passk import no_dup_k
from ._storage import Location, as_location, write_text

ALPHA = 0.05


def wilson(successes: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` (NaNs when ``n == 0``).

    The interval always contains ``successes / n`` and lies in [0, 1], with exact ends:
    statsmodels computes the bounds in floating point, so 0 of 28 came back as
    ``[1.4e-17, 0.12]`` and 96 of 96 as ``[0.96, 0.9999999999999999]``, intervals that did
    not contain their own rate. The Wilson bound at k = 0 (k = n) is exactly 0 (1).
    """
    if n == 0:
        return (math.nan, math.nan)
    lo, hi = proportion_confint(successes, n, alpha=alpha, method="wilson")
    rate = successes / n
    lo = 0.0 if successes == 0 else min(max(float(lo), 0.0), rate)
    hi = 1.0 if successes == n else max(min(float(hi), 1.0), rate)
    return (lo, hi)


def cells(trials: pd.DataFrame, by: tuple[str, ...] = CELL) -> pd.DataFrame:
    """Aggregate the trial frame per cell.

    Rates are over the trials that were scored; ``errors`` counts trials that crashed (they are
    reported, never dropped silently). Columns: the cell keys, ``trials``, ``errors``, then every
    metric of the catalogue (``reports.CATALOGUE``) in its order, each rate followed by its
    interval ``<prefix>_ci`` as ``[lo, hi]``, then ``crashed_rate``/``crashed_ci`` (trials whose
    agent under test raised; they are scored), then ``tokens_mean``
    and ``no_dup_k`` (``{"1": ..., "k": ...}``: the chance all k trials of a sample are
    exactly-once, see :mod:`._passk`).
    """
    trials = with_agent(trials)
    rows: list[dict[str, Any]] = []
    passk = no_dup_k(trials, by)
    for key, group in trials.groupby(list(by), sort=True, dropna=False):
        keys = key if isinstance(key, tuple) else (key,)
        scored = group[group["completed"].notna()]
        n = len(scored)
        row: dict[str, Any] = dict(zip(by, keys, strict=True))
        row["trials"] = len(group)
        row["errors"] = int(crashed(group).sum())
        for m in CATALOGUE:
            if m.ci is not None:
                k = int(scored[m.column].sum())
                row[m.name] = k / n if n else math.nan
                row[m.ci] = list(wilson(k, n))
            else:
                row[m.name] = float(scored[m.column].mean()) if n else math.nan
        if "crashed" in scored:
            # Agents under test: trials whose agent raised (scored, so counted over the scored
            # trials). Not in the catalogue, whose columns are the scorer's own metrics.
            k = int(scored["crashed"].sum())
            row["crashed_rate"] = k / n if n else math.nan
            row["crashed_ci"] = list(wilson(k, n))
        row["tokens_mean"] = float(group["total_tokens"].mean())
        row["no_dup_k"] = passk.get(tuple(keys), {})
        rows.append(row)
    return pd.DataFrame(rows)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def summary(table: pd.DataFrame, **extra: Any) -> dict[str, Any]:
    """The ``summary.json`` document: ``{"cells": [...]}`` plus any ``extra`` keys."""
    records = [{k: _clean(v) for k, v in row.items()} for row in table.to_dict("records")]
    return {"cells": records, **extra}


def write_summary(table: pd.DataFrame, path: Location, **extra: Any) -> Location:
    """Write ``summary.json`` (DESIGN.md's contract; NaN rates become null).

    ``path`` may be an fsspec URI (``s3://bucket/run/summary.json``).
    """
    out = as_location(path)
    write_text(out, json.dumps(summary(table, **extra), indent=2) + "\n")
    return out
