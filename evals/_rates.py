"""Run a small twice eval from Python (e.g. inside a test) and get its per-cell rates.

For teams that gate in pytest rather than with ``twice gate``: the rates are the ones
``reports.cells`` computes and ``summary.json`` stores, so a test and the gate read the same
numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from twice.reports import CELL, Cell
from twice.tasks.agents import REACT

from .suite import Matrix, Suite


def _axis(value: str | Sequence[str], name: str) -> tuple[str, ...]:
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{name} must be a name or a non-empty list of names, got {value!r}")
    return values


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


@dataclass(frozen=True)
class CellRates:
    """The rates of one cell (model, prompt, task, fault, protection, and the agent).

    The named attributes are summary.json's keys (docs/architecture.md); ``row`` holds every column
    ``reports.cells`` produced (``cell["divergence_rate"]`` reads any of them). ``frame``
    holds the cell's trials (one row per trial, the columns of ``reports.trials_frame``).

    Its ``repr`` is the evidence a failing ``assert`` shows in pytest: the cell, its counts,
    and which trials duplicated, crashed or did not complete (sample id and epoch), so the
    trials to open in ``inspect view`` are named.
    """

    model: str
    prompt: str
    task: str
    fault: str
    protection: str
    trials: int
    errors: int
    completion_rate: float
    duplication_rate: float
    duplication_ci: tuple[float, float]
    exactly_once_rate: float
    safe_success_rate: float
    excess_effects_mean: float
    row: Mapping[str, Any]
    frame: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False, compare=False)
    agent: str = REACT
    """The agent under test (``react``: twice's own loop)."""
    wrong_rate: float = math.nan
    """Share of trials with an effect whose values differ from the ones asked for (NaN when
    no trial was scored)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any], trials: pd.DataFrame | None = None) -> CellRates:
        """Build from one row of ``reports.cells`` (and the trial frame it was computed from,
        of which the cell keeps its own rows)."""
        r = {k: _plain(v) for k, v in row.items()}
        mine = pd.DataFrame()
        if trials is not None and not trials.empty:
            axes = [a for a in CELL if a in r and a in trials.columns]
            hit = pd.Series(True, index=trials.index)
            for a in axes:
                hit &= trials[a] == r[a]
            mine = trials[hit].reset_index(drop=True)
        lo, hi = r.get("duplication_ci") or (math.nan, math.nan)
        return cls(
            model=r["model"],
            prompt=r["prompt"],
            task=r["task"],
            fault=r["fault"],
            protection=r["protection"],
            trials=int(r["trials"]),
            errors=int(r["errors"]),
            completion_rate=float(r["completion_rate"]),
            duplication_rate=float(r["duplication_rate"]),
            duplication_ci=(float(lo), float(hi)),
            exactly_once_rate=float(r["exactly_once_rate"]),
            safe_success_rate=float(r["safe_success_rate"]),
            excess_effects_mean=float(r["excess_effects_mean"]),
            row=r,
            frame=mine,
            agent=str(r.get("agent", REACT)),
            wrong_rate=_float(r.get("wrong_rate")),
        )

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    @property
    def cell(self) -> Cell:
        """The cell these rates are of."""
        return Cell.from_mapping({k: getattr(self, k) for k in CELL})

    def label(self) -> str:
        """``stub/retry / baseline / refund / lost_reply / bare`` (the agent after the model
        when it is not ``react``): :attr:`Cell.label`."""
        return self.cell.label

    def trials_where(self, column: str) -> list[str]:
        """The trials (``sample#epoch``) where a per-trial metric column is true
        (``duplicated``, ``completed``...), in sample order; empty without a trial frame.

        Raises:
            KeyError: for a column the trial frame does not have, listing its metric columns.
        """
        if self.frame.empty:
            return []
        if column not in self.frame.columns:
            from twice.reports import METRICS

            raise KeyError(f"no trial column {column!r}; the metrics are: {', '.join(METRICS)}")
        return _trials_of(self.frame[self.frame[column].fillna(0) > 0])

    def __repr__(self) -> str:
        """``CellRates(stub/retry / baseline / refund / lost_reply / bare: 4 trials, 0 errors;
        duplicated 4 = 100% [51%-100%]: refund-001#1, ...; completed 100%, ...)``."""
        lo, hi = self.duplication_ci
        if self.frame.empty:  # built from a row alone: the count from the rate
            scored = self.trials - self.errors
            rate = self.duplication_rate
            dup = round(rate * scored) if scored and rate == rate else 0  # NaN: none scored
            which = ""
        else:
            shown = self.trials_where("duplicated")
            dup, which = len(shown), _which(shown)
        parts = [
            f"{self.trials} trials, {self.errors} errors",
            f"duplicated {dup} = {_pct(self.duplication_rate)} [{_pct(lo)}-{_pct(hi)}]{which}",
            f"completed {_pct(self.completion_rate)}",
            f"exactly once {_pct(self.exactly_once_rate)}",
            f"safe success {_pct(self.safe_success_rate)}",
        ]
        if not self.frame.empty:
            errored = self.frame["error"].astype(bool)
            if errored.any():
                parts.append("errors in" + _which(_trials_of(self.frame[errored])))
            undone = self.frame[~errored & (self.frame["completed"].fillna(0) == 0)]
            if not undone.empty:
                parts.append("not completed" + _which(_trials_of(undone)))
            if "wrong" in self.frame:
                wrong = self.frame[~errored & (self.frame["wrong"].fillna(0) > 0)]
                if not wrong.empty:
                    parts.append("wrong values" + _which(_trials_of(wrong)))
        return f"CellRates({self.label()}: {'; '.join(parts)})"


SHOWN = 5
"""Trials a repr names per list before it says how many more there are."""


def _float(value: Any) -> float:
    """A rate from a cells row: NaN when absent or null (logs scored before the metric)."""
    return math.nan if value is None else float(value)


def _pct(rate: float) -> str:
    return "n/a" if rate != rate else f"{rate:.0%}"  # NaN: no scored trial


def _trials_of(trials: pd.DataFrame) -> list[str]:
    """``sample#epoch`` of each row, sorted."""
    pairs = sorted(zip(trials["sample"], trials["epoch"], strict=True))
    return [f"{sample}#{int(epoch)}" for sample, epoch in pairs]


def _which(trials: list[str]) -> str:
    if not trials:
        return ""
    more = len(trials) - SHOWN
    return ": " + ", ".join(trials[:SHOWN]) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class EvalRates:
    """Every cell of an eval run, with its rates.

    With one cell, :meth:`one` returns it; with several, :meth:`cell` picks one by its axes.
    """

    cells: tuple[CellRates, ...]
    table: pd.DataFrame
    """The ``reports.cells`` frame itself."""
    log_dir: Path

    def __repr__(self) -> str:
        """The log directory, then each cell's label and duplication rate."""
        cells = "; ".join(
            f"{c.label()}: duplicated {_pct(c.duplication_rate)} of {c.trials}" for c in self.cells
        )
        n = len(self.cells)
        return f"EvalRates({n} cell{'' if n == 1 else 's'}, logs in {self.log_dir}: {cells})"

    def __iter__(self) -> Iterator[CellRates]:
        return iter(self.cells)

    def __len__(self) -> int:
        return len(self.cells)

    def cell(self, **axes: str) -> CellRates:
        """The one cell whose axes equal ``axes`` (e.g. ``model="stub/retry"``).

        Raises:
            ValueError: for an unknown axis name.
            LookupError: when no cell or several cells match, listing the cells.
        """
        unknown = set(axes) - set(CELL)
        if unknown:
            raise ValueError(
                f"unknown axis {', '.join(sorted(unknown))}; expected: {', '.join(CELL)}"
            )
        found = [c for c in self.cells if all(getattr(c, k) == v for k, v in axes.items())]
        if len(found) != 1:
            cells = "\n  ".join(c.label() for c in self.cells)
            raise LookupError(f"{len(found)} cells match {axes!r}; the cells are:\n  {cells}")
        return found[0]

    def one(self) -> CellRates:
        """The only cell of a one-cell run."""
        return self.cell()


def eval_rates(
    *,
    task: str | Sequence[str],
    model: str | Sequence[str],
    fault: str | Sequence[str],
    protection: str | Sequence[str] = "bare",
    prompt: str | Sequence[str] = "baseline",
    log_dir: str | Path,
    epochs: int = 1,
    limit: int | None = None,
    model_args: dict[str, Any] | None = None,
    allow_errors: bool = False,
    agent: str | Sequence[str] = REACT,
    mocks: Mapping[str, str] | None = None,
) -> EvalRates:
    """Run twice on task × model × fault × protection × prompt and return the per-cell rates.

    Args:
        task: Task name(s) (``twice list``).
        model: Inspect model string(s), e.g. ``stub/verify`` or ``openai/gpt-5-mini``.
        fault: Fault name(s).
        protection: Protection name(s).
        prompt: Built-in prompt name(s) or prompt file path(s).
        log_dir: Where the logs and ``summary.json`` go.
        epochs: Epochs per sample.
        limit: Samples per task (first N); None runs them all.
        model_args: Model arguments (as ``-M``).
        allow_errors: Return the rates even when an eval errored or a trial crashed.
        agent: The agent(s) under test, as ``--agent``: ``react`` (twice's own loop), a
            built-in framework agent (``langgraph``...), or ``path.py:function``.
        mocks: As ``--mock``: production URL by service name, for an agent's own tools.

    Raises:
        ValueError: for an unknown task, fault, protection, prompt or model, naming the
            accepted values.
        RuntimeError: when an eval errored or a trial crashed (unless ``allow_errors``):
            crashed trials are never dropped silently.
    """
    from .run import run_suite

    suite = Suite(
        (
            Matrix(
                models=_axis(model, "model"),
                prompts=_axis(prompt, "prompt"),
                tasks=_axis(task, "task"),
                faults=_axis(fault, "fault"),
                protections=_axis(protection, "protection"),
                agents=_axis(agent, "agent"),
            ),
        ),
        epochs=epochs,
        limit=limit,
        source="eval_rates()",
        mocks=dict(mocks or {}),
    )
    suite.validate()
    result = run_suite(suite, Path(log_dir), model_args=model_args, display="none", report=False)
    if result.failed and not allow_errors:
        raise RuntimeError(
            "twice eval did not run cleanly (pass allow_errors=True to get the rates anyway):\n  "
            + "\n  ".join(result.failed)
        )
    cells = tuple(CellRates.from_row(row, result.trials) for row in result.table.to_dict("records"))
    return EvalRates(cells=cells, table=result.table, log_dir=Path(log_dir))
