"""``no_dup^k``: the chance that all k trials of one sample avoid duplicating an action.

τ-bench's pass^k (Yao et al., "τ-bench", 2024, §3), applied to duplicates instead of task
success: an agent that avoids duplicating 90% of the time does so on all of 4 retries of the
same request only ~66% of the time, and that is what a user who sends the same request every
day meets. Per sample with ``n`` scored trials of which ``c`` were not ``duplicated``,
``C(c, k) / C(n, k)`` is the unbiased estimator of ``p^k`` (drawing k of the n trials
without replacement; :func:`.stats.pass_hat_k`); the cell's value is its mean over the samples
with ``n ≥ k``.

A trial that did nothing, or did the wrong thing once, did not duplicate: it counts as a
success here (``no_dup_1`` is one minus the duplication rate), and against ``completed`` and
``exactly_once``, not here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ._frame import CELL, with_agent
from .stats import pass_hat_k

COLUMN = "duplicated"


def no_dup_k(
    trials: pd.DataFrame, by: tuple[str, ...] = CELL
) -> dict[tuple[Any, ...], dict[str, float]]:
    """``no_dup^k`` per group of ``by``, for k from 1 to the most trials any sample has.

    Args:
        trials: The trial frame; only scored trials count.
        by: The grouping (a cell by default). Samples are told apart by every cell key and
            the sample id, so pooled groups (e.g. by model) average over each cell's samples.

    Returns:
        Group key (a tuple of ``by`` values) → ``{"1": ..., "2": ..., ...}``.
    """
    trials = with_agent(trials)
    keys = list(dict.fromkeys([*by, *CELL, "sample"]))
    # only the columns used: the row selection copies every column it keeps
    scored = trials.loc[trials[COLUMN].notna(), [*keys, COLUMN]]
    if scored.empty:
        return {}
    avoided = scored.assign(**{COLUMN: 1.0 - scored[COLUMN]})  # c counts the clean trials
    per_sample = avoided.groupby(keys, sort=False, dropna=False)[COLUMN].agg(["size", "sum"])
    per_sample = per_sample.reset_index()
    out: dict[tuple[Any, ...], dict[str, float]] = {}
    for key, group in per_sample.groupby(list(by), sort=False, dropna=False):
        n = group["size"].to_numpy(dtype=np.float64)
        c = group["sum"].to_numpy(dtype=np.float64).round()
        values = pass_hat_k(n, c)
        out[key if isinstance(key, tuple) else (key,)] = values
    return out
