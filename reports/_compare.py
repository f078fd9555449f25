"""Differences between two rates: prompt vs prompt per model, and a run vs its baseline.

Every difference carries Newcombe's hybrid score interval for the difference of two
independent proportions (statsmodels' ``confint_proportions_2indep(method="newcomb")``); the
arithmetic of both tests is :mod:`.stats`.
Two questions, two tests, each named wherever its verdict is shown:

- **Prompt vs prompt** (:func:`prompt_comparison`) asks "do these differ, either way?": the
  two-sided score test of equal proportions (``test_proportions_2indep(method="score")``).
- **This run vs a baseline run** (:func:`baseline_comparison`, the report's regression badge)
  asks "did this cell get worse (or better)?": :func:`baseline_test`, Fisher's exact test,
  one-sided in the direction of the observed change. ``twice gate --baseline`` calls the same
  function, so at the same alpha a cell the report flags as a regression is a cell the gate
  fails, and the reverse.

All of them behave at rates of 0 % and 100 %, which is where agents under a fault often sit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ._frame import CELL
from ._metrics import COMPARED, Metric, metric
from .stats import ALPHA, Difference, difference, fisher_tails


def verdict(name: str, d: Difference) -> str:
    """``better``, ``worse`` (significant either way) or ``same`` for a metric's difference."""
    if not d.significant or d.diff == 0:
        return "same"
    lower_is_better = metric(name).higher_is_worse
    return "better" if (d.diff < 0) == lower_is_better else "worse"


@dataclass(frozen=True)
class BaselineTest:
    """Whether ``k`` of ``n`` is worse (or better) than the baseline's ``k_ref`` of ``n_ref``.

    The test is Fisher's exact test, one-sided: ``p_worse`` is the p-value of "this run is
    worse", ``p_better`` of "this run is better". It conditions on the margins and computes the
    tail exactly, so its false-alarm rate stays at or below ``alpha`` at the small counts and
    extreme rates of a cell (where the normal approximation of a z or score test is poor).
    """

    metric: Metric
    p_worse: float
    p_better: float
    alpha: float

    @property
    def verdict(self) -> str:
        """``worse`` (p_worse < alpha), ``better`` (p_better < alpha) or ``same``."""
        if self.p_worse < self.alpha:
            return "worse"
        return "better" if self.p_better < self.alpha else "same"

    @property
    def p_value(self) -> float:
        """The p-value of the direction the verdict (or, when ``same``, the data) leans."""
        return min(self.p_worse, self.p_better)


TEST_NAME = "Fisher's exact test, one-sided"
"""How the baseline test is named wherever its verdict is shown."""


def baseline_test(
    name: str, k: int, n: int, k_ref: int, n_ref: int, alpha: float = ALPHA
) -> BaselineTest:
    """Test one metric of a cell against the baseline: the report's badge and the gate's check.

    Args:
        name: The metric (``duplication_rate`` or its column ``duplicated``).
        k: Trials where the metric's column is 1, in this run.
        n: Scored trials, in this run.
        k_ref: The same as ``k``, in the baseline.
        n_ref: The same as ``n``, in the baseline.
        alpha: Significance level.
    """
    m = metric(name)
    if n == 0 or n_ref == 0:
        return BaselineTest(m, math.nan, math.nan, alpha)
    p_higher, p_lower = fisher_tails(k, n, k_ref, n_ref)
    if m.higher_is_worse:
        return BaselineTest(m, p_higher, p_lower, alpha)
    return BaselineTest(m, p_lower, p_higher, alpha)


def _scored(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["completed"].notna()]


def _row(name: str, k: int, n: int, k_ref: int, n_ref: int) -> dict[str, Any]:
    m = metric(name)
    d = difference(k, n, k_ref, n_ref)
    return {
        "metric": m.column,
        "label": m.label,
        "n_ref": n_ref,
        "n": n,
        "rate_ref": d.rate_ref,
        "rate": d.rate,
        "diff": d.diff,
        "diff_ci": list(d.ci),
        "p_value": d.p_value,
        "significant": d.significant,
        "verdict": verdict(name, d),
    }


def _baseline_row(name: str, k: int, n: int, k_ref: int, n_ref: int) -> dict[str, Any]:
    t = baseline_test(name, k, n, k_ref, n_ref)
    return {
        **_row(name, k, n, k_ref, n_ref),
        "p_value": t.p_value,
        "significant": t.verdict != "same",
        "verdict": t.verdict,
        "test": TEST_NAME,
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
        ``p_value`` (two-sided score test), ``significant``, ``verdict`` (better/worse/same
        for the prompt), ``label``. Empty when fewer than two prompts ran.
    """
    prompts = list(dict.fromkeys(trials["prompt"]))
    rows: list[dict[str, Any]] = []
    if len(prompts) < 2:
        return pd.DataFrame(rows)
    ref = reference if reference in prompts else default_reference(prompts)
    cond = ["task", "fault", "protection"]
    # Only the columns compared: every selection below copies each column it keeps.
    columns = ["model", "prompt", *cond, *dict.fromkeys(metric(n).column for n in COMPARED)]
    scored = _scored(trials)[columns]
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
                for name in COMPARED:
                    column = metric(name).column
                    rows.append(
                        {
                            "model": model,
                            "prompt": prompt,
                            "reference": ref,
                            "fault": fault,
                            "conditions": n_cond,
                            **_row(
                                name, int(a[column].sum()), len(a), int(r[column].sum()), len(r)
                            ),
                        }
                    )
    return pd.DataFrame(rows)


FLAGS = ("regression", "mixed", "improvement", "same", "new", "gone")
"""``baseline_comparison`` flags, most urgent first."""


def baseline_comparison(trials: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Every cell of this run against the same cell of a baseline run.

    A cell is a ``regression`` when some compared metric got significantly worse (duplication
    up, completion or safe success down; :func:`baseline_test`, the gate's test), an
    ``improvement`` when some got significantly better and none worse, ``mixed`` when both,
    ``same`` otherwise; ``new``/``gone`` for cells only in this run / only in the baseline.
    ``prompt_changed`` is True when a prompt of the same name has a different text (sha256) in
    the two runs.

    Returns:
        A long frame: the cell columns, ``flag``, ``prompt_changed``, then per compared metric
        one row (``metric`` and the columns of :func:`prompt_comparison`, with ``p_value``,
        ``significant`` and ``verdict`` from :func:`baseline_test`, and ``test`` naming it);
        ``new``/``gone`` cells have one row with ``metric`` None.
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
        # Both sets hold a value: the cell has trials in both runs.
        changed = shas[0] != shas[1] and "" not in shas[0] | shas[1]
        metric_rows = [
            _baseline_row(name, int(a[c].sum()), len(a), int(r[c].sum()), len(r))
            for name, c in ((name, metric(name).column) for name in COMPARED)
        ]
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
