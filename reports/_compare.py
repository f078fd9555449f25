"""Differences between two rates: prompt vs prompt per model, and a run vs its baseline.

The statistics are statsmodels': Newcombe's hybrid score interval for the difference of two
independent proportions (``confint_proportions_2indep(method="newcomb")``) and the score test
of equal proportions (``test_proportions_2indep(method="score")``). Both behave at rates of
0 % and 100 %, which is where agents under a fault often sit.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import confint_proportions_2indep, test_proportions_2indep

from ._aggregate import ALPHA
from ._frame import CELL

COMPARED: dict[str, str] = {
    "duplicated": "lower",
    "safe_success": "higher",
    "completed": "higher",
}
"""Per-trial metrics compared between prompts and against a baseline, and which way is better."""


@dataclass(frozen=True)
class Difference:
    """``rate - rate_ref`` with its interval and the p-value of "no difference"."""

    rate_ref: float
    rate: float
    diff: float
    ci: tuple[float, float]
    p_value: float

    @property
    def significant(self) -> bool:
        """Whether the score test rejects "no difference" at the 5 % level."""
        return not math.isnan(self.p_value) and self.p_value < ALPHA


def difference(k: int, n: int, k_ref: int, n_ref: int, alpha: float = ALPHA) -> Difference:
    """Compare ``k`` of ``n`` against ``k_ref`` of ``n_ref`` (two independent samples).

    Returns NaNs when either side has no trials. When both sides are all-0 or all-1 the
    score statistic is 0/0; the observed difference is then exactly 0 and the p-value is 1.
    """
    if n == 0 or n_ref == 0:
        nan = math.nan
        return Difference(
            k_ref / n_ref if n_ref else nan, k / n if n else nan, nan, (nan, nan), nan
        )
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # statsmodels also computes ratio and odds ratio, which divide by zero at 0 % / 100 %.
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = confint_proportions_2indep(
            k, n, k_ref, n_ref, method="newcomb", compare="diff", alpha=alpha
        )
        p = float(
            test_proportions_2indep(k, n, k_ref, n_ref, method="score", compare="diff").pvalue
        )
    if math.isnan(p) and k * n_ref == k_ref * n:
        p = 1.0
    return Difference(k_ref / n_ref, k / n, k / n - k_ref / n_ref, (float(lo), float(hi)), p)


def verdict(metric: str, d: Difference) -> str:
    """``better``, ``worse`` (significant either way) or ``same`` for a metric's difference."""
    if not d.significant or d.diff == 0:
        return "same"
    lower_is_better = COMPARED.get(metric, "higher") == "lower"
    return "better" if (d.diff < 0) == lower_is_better else "worse"


def _scored(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["completed"].notna()]


def _row(metric: str, k: int, n: int, k_ref: int, n_ref: int) -> dict[str, Any]:
    d = difference(k, n, k_ref, n_ref)
    return {
        "metric": metric,
        "n_ref": n_ref,
        "n": n,
        "rate_ref": d.rate_ref,
        "rate": d.rate,
        "diff": d.diff,
        "diff_ci": list(d.ci),
        "p_value": d.p_value,
        "significant": d.significant,
        "verdict": verdict(metric, d),
    }


def default_reference(prompts: list[str]) -> str:
    """The prompt others are compared with: ``baseline`` if present, else the first."""
    return "baseline" if "baseline" in prompts else prompts[0]


def prompt_comparison(
    trials: pd.DataFrame, reference: str | None = None, by_fault: bool = True
) -> pd.DataFrame:
    """Each prompt against a reference prompt, per model, over the conditions both ran.

    For every model and every prompt other than ``reference``, trials are pooled over the
    (task, fault, protection) conditions that the model ran with *both* prompts, so a prompt
    is never credited for conditions only it faced. With ``by_fault`` there is also one row
    per fault (``fault`` column; ``"all"`` for the pooled row).

    Returns:
        A long frame: ``model, prompt, reference, fault, conditions, metric, n_ref, n,
        rate_ref, rate, diff`` (``rate - rate_ref``), ``diff_ci`` ([lo, hi], Newcombe),
        ``p_value`` (score test), ``significant``, ``verdict`` (better/worse/same for the
        prompt). Empty when fewer than two prompts ran.
    """
    scored = _scored(trials)
    prompts = list(dict.fromkeys(trials["prompt"]))
    rows: list[dict[str, Any]] = []
    if len(prompts) < 2:
        return pd.DataFrame(rows)
    ref = reference if reference in prompts else default_reference(prompts)
    cond = ["task", "fault", "protection"]
    for model, mframe in scored.groupby("model", sort=True):
        ran = {
            p: set(map(tuple, g[cond].drop_duplicates().to_numpy()))
            for p, g in mframe.groupby("prompt")
        }
        for prompt in prompts:
            if prompt == ref or prompt not in ran or ref not in ran:
                continue
            shared = ran[prompt] & ran[ref]
            if not shared:
                continue
            keys = pd.Series(list(map(tuple, mframe[cond].to_numpy())), index=mframe.index)
            both = mframe[keys.isin(shared)]
            scopes: list[tuple[str, pd.DataFrame]] = [("all", both)]
            faults = list(dict.fromkeys(both["fault"]))
            if by_fault and len(faults) > 1:
                scopes += [(f, both[both["fault"] == f]) for f in faults]
            for fault, scope in scopes:
                a = scope[scope["prompt"] == prompt]
                r = scope[scope["prompt"] == ref]
                n_cond = len(scope[cond].drop_duplicates())
                for metric in COMPARED:
                    rows.append(
                        {
                            "model": model,
                            "prompt": prompt,
                            "reference": ref,
                            "fault": fault,
                            "conditions": n_cond,
                            **_row(
                                metric, int(a[metric].sum()), len(a), int(r[metric].sum()), len(r)
                            ),
                        }
                    )
    return pd.DataFrame(rows)


FLAGS = ("regression", "mixed", "improvement", "same", "new", "gone")
"""``baseline_comparison`` flags, most urgent first."""


def baseline_comparison(trials: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Every cell of this run against the same cell of a baseline run.

    A cell is a ``regression`` when some compared metric got significantly worse (duplication
    up, completion or safe success down), an ``improvement`` when some got significantly better
    and none worse, ``mixed`` when both, ``same`` otherwise; ``new``/``gone`` for cells only in
    this run / only in the baseline. ``prompt_changed`` is True when a prompt of the same name
    has a different text (sha256) in the two runs.

    Returns:
        A long frame: the cell columns, ``flag``, ``prompt_changed``, then per compared metric
        one row (``metric`` and the columns of :func:`prompt_comparison`); ``new``/``gone``
        cells have one row with ``metric`` None.
    """
    now, base = _scored(trials), _scored(baseline)
    now_groups = {k: g for k, g in now.groupby(list(CELL), sort=True)}
    base_groups = {k: g for k, g in base.groupby(list(CELL), sort=True)}
    # Cells whose trials all crashed still exist: they just have no scored trial.
    now_cells = set(map(tuple, trials[list(CELL)].drop_duplicates().to_numpy()))
    base_cells = set(map(tuple, baseline[list(CELL)].drop_duplicates().to_numpy()))
    rows: list[dict[str, Any]] = []
    for cell in sorted(now_cells | base_cells):
        keys = dict(zip(CELL, cell, strict=True))
        if cell not in base_cells or cell not in now_cells:
            flag = "new" if cell not in base_cells else "gone"
            rows.append({**keys, "flag": flag, "prompt_changed": False, "metric": None})
            continue
        a = now_groups.get(cell, now.iloc[0:0])
        r = base_groups.get(cell, base.iloc[0:0])
        shas = (
            set(trials.loc[_cell_mask(trials, cell), "prompt_sha256"]),
            set(baseline.loc[_cell_mask(baseline, cell), "prompt_sha256"]),
        )
        changed = bool(shas[0] and shas[1] and shas[0] != shas[1] and "" not in shas[0] | shas[1])
        metric_rows = [_row(m, int(a[m].sum()), len(a), int(r[m].sum()), len(r)) for m in COMPARED]
        verdicts = {row["verdict"] for row in metric_rows}
        if "worse" in verdicts:
            flag = "mixed" if "better" in verdicts else "regression"
        else:
            flag = "improvement" if "better" in verdicts else "same"
        rows += [{**keys, "flag": flag, "prompt_changed": changed, **row} for row in metric_rows]
    return pd.DataFrame(rows)


def _cell_mask(frame: pd.DataFrame, cell: tuple[Any, ...]) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for col, value in zip(CELL, cell, strict=True):
        mask &= frame[col] == value
    return mask
