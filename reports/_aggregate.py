"""Per-cell rates with Wilson 95% intervals (:mod:`.stats`), and the summary.json contract."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from ._frame import CELL, RETRY_SOURCES, with_agent
from ._metrics import AGENT_CRASHED, CATALOGUE, errored
from ._passk import no_dup_k
from ._storage import Location, as_location, write_text
from .stats import wilson_many

DUPLICATED_BY: tuple[str, ...] = ("framework", "model")
"""Retry sources whose duplicates each cell counts apart: ``<source>_duplication_rate`` (and
``_ci``) is the share of scored trials in which an attempt of that source committed an excess
effect. Side by side they answer "is it my model or my framework?"."""


def cells(trials: pd.DataFrame, by: tuple[str, ...] = CELL) -> pd.DataFrame:
    """Aggregate the trial frame per cell.

    Rates are over the trials that were scored; ``errors`` counts trials that errored (they are
    reported, never dropped silently). Columns: the cell keys, ``trials``, ``errors``, then every
    metric of the catalogue (``reports.CATALOGUE``) in its order, each rate followed by its
    interval ``<prefix>_ci`` as ``[lo, hi]``, then ``crashed_rate``/``crashed_ci`` (trials whose
    agent under test raised; they are scored), then ``tokens_mean``
    and ``no_dup_k`` (``{"1": ..., "k": ...}``: the chance all k trials of a sample avoid
    duplicating, see :mod:`._passk`). With the ledger's columns, also
    ``framework_duplication_rate``/``_ci`` and ``model_duplication_rate``/``_ci``
    (:data:`DUPLICATED_BY`), then ``retry_sources``: by retry source that sent any mutating
    attempt, ``{"attempts": ..., "excess": ...}`` summed over the cell's trials (excess
    effects over the scored ones).
    """
    trials = with_agent(trials)
    if trials.empty:
        return pd.DataFrame()
    keys = list(by)
    # One grouped pass for every column (the report aggregates dozens of groupings, so a loop
    # over groups with one interval call per metric was most of its time). Unscored trials
    # are masked out of the metric columns: rates and means are over the scored trials.
    scored = trials["completed"].notna()
    rate_columns = [m.column for m in CATALOGUE if m.ci is not None]
    mean_columns = [m.column for m in CATALOGUE if m.ci is None]
    if AGENT_CRASHED.column in trials:
        rate_columns.append(AGENT_CRASHED.column)
    caused = [s for s in DUPLICATED_BY if f"excess_{s}" in trials]
    for source in caused:
        excess = trials[f"excess_{source}"].astype(float)
        trials = trials.assign(
            **{f"_dup_{source}": (excess > 0).astype(float).where(excess.notna())}
        )
        rate_columns.append(f"_dup_{source}")
    metric_columns = list(dict.fromkeys(rate_columns + mean_columns))
    if missing := [c for c in metric_columns if c not in trials]:
        # A frame from before a metric existed (built by hand, or by older code): unmeasured.
        trials = trials.assign(**dict.fromkeys(missing, math.nan))
    masked = trials[metric_columns].astype(float).where(scored, math.nan)
    masked[keys] = trials[keys]
    masked["_errored"] = errored(trials).astype(int)
    masked["_tokens"] = trials["total_tokens"]
    grouped = masked.groupby(keys, sort=True, dropna=False)
    sums = grouped[[*metric_columns, "_errored"]].sum()
    # Per column: a trial scored before a metric existed (an older log) has no value for it,
    # and its rate is over the trials that have one, not a 0 it never measured.
    counts = grouped[metric_columns].count()
    means = grouped[[*mean_columns, "_tokens"]].mean()
    size = grouped.size()
    passk = no_dup_k(trials, by)
    index = [key if isinstance(key, tuple) else (key,) for key in size.index]
    out: dict[str, Any] = {name: [key[i] for key in index] for i, name in enumerate(keys)}
    out["trials"] = size.to_numpy()
    out["errors"] = sums["_errored"].to_numpy()

    def rate(column: str, ci: str, name: str) -> None:
        k = sums[column].to_numpy().round()
        n = counts[column].to_numpy()
        out[name] = np.where(n > 0, k / np.where(n > 0, n, 1), math.nan)
        out[ci] = wilson_many(k, n)

    for m in CATALOGUE:
        if m.ci is not None:
            rate(m.column, m.ci, m.name)
        else:
            # The mean of a cell with no value for the column is NaN already (pandas).
            out[m.name] = means[m.column].to_numpy()
    if AGENT_CRASHED.column in trials:
        # Agents under test: trials whose agent raised (scored, so counted over the scored
        # trials). Not in the catalogue, whose columns are the scorer's own metrics.
        rate(AGENT_CRASHED.column, str(AGENT_CRASHED.ci), AGENT_CRASHED.name)
    for source in caused:
        rate(f"_dup_{source}", f"{source}_duplication_ci", f"{source}_duplication_rate")
    out["tokens_mean"] = means["_tokens"].to_numpy(dtype=float)
    out["no_dup_k"] = [passk.get(key, {}) for key in index]
    if any(f"attempts_{s}" in trials for s in RETRY_SOURCES):
        out["retry_sources"] = _retry_sources(trials, keys, scored, index)
    return pd.DataFrame(out)


def _retry_sources(
    trials: pd.DataFrame, keys: list[str], scored: pd.Series, index: list[tuple[Any, ...]]
) -> list[dict[str, dict[str, int]]]:
    """Per cell, in ``index`` order: each retry source that sent a mutating attempt, with its
    attempts and the excess effects they committed."""
    sources = [s for s in RETRY_SOURCES if f"attempts_{s}" in trials and f"excess_{s}" in trials]
    frame = trials[keys].copy()
    for s in sources:
        frame[f"a_{s}"] = trials[f"attempts_{s}"].astype(float)
        frame[f"e_{s}"] = trials[f"excess_{s}"].astype(float).where(scored, math.nan)
    sums = frame.groupby(keys, sort=True, dropna=False).sum(min_count=0)
    # The grouping of cells(), so its rows come in the order of ``index``: read by position,
    # because a missing key (NaN) in a hand-built frame matches no label lookup.
    out = []
    for _key, (_, row) in zip(index, sums.iterrows(), strict=True):
        out.append(
            {
                s: {"attempts": int(row[f"a_{s}"]), "excess": int(row[f"e_{s}"])}
                for s in sources
                if row[f"a_{s}"] > 0 or row[f"e_{s}"] > 0
            }
        )
    return out


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
    """Write ``summary.json`` (the contract in docs/architecture.md; NaN rates become null).

    ``path`` may be an fsspec URI (``s3://bucket/run/summary.json``).
    """
    out = as_location(path)
    write_text(out, json.dumps(summary(table, **extra), indent=2) + "\n")
    return out
