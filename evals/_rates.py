"""Run a small twice eval from Python (e.g. inside a test) and get its per-cell rates.

For teams that gate in pytest rather than with ``twice gate``: the rates are the ones
``reports.cells`` computes and ``summary.json`` stores, so a test and the gate read the same
numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ._suite import Matrix, Suite

_AXES = ("model", "prompt", "task", "fault", "protection")


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
    """The rates of one cell (model, prompt, task, fault, protection).

    The named attributes are DESIGN.md's summary.json keys; ``row`` holds every column
    ``reports.cells`` produced (``cell["divergence_rate"]`` reads any of them).
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

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CellRates:
        """Build from one row of ``reports.cells``."""
        r = {k: _plain(v) for k, v in row.items()}
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
        )

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    def label(self) -> str:
        """``stub/retry / baseline / refund / lost_reply / bare``."""
        return " / ".join(str(getattr(self, a)) for a in _AXES)


@dataclass(frozen=True)
class EvalRates:
    """Every cell of an eval run, with its rates.

    With one cell, :meth:`one` returns it; with several, :meth:`cell` picks one by its axes.
    """

    cells: tuple[CellRates, ...]
    table: pd.DataFrame
    """The ``reports.cells`` frame itself."""
    log_dir: Path

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
        unknown = set(axes) - set(_AXES)
        if unknown:
            raise ValueError(
                f"unknown axis {', '.join(sorted(unknown))}; expected: {', '.join(_AXES)}"
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

    Raises:
        ValueError: for an unknown task, fault, protection, prompt or model, naming the
            accepted values.
        RuntimeError: when an eval errored or a trial crashed (unless ``allow_errors``):
            crashed trials are never dropped silently.
    """
    from ._run import run_suite  # imports inspect's eval machinery: only when running

    suite = Suite(
        (
            Matrix(
                models=_axis(model, "model"),
                prompts=_axis(prompt, "prompt"),
                tasks=_axis(task, "task"),
                faults=_axis(fault, "fault"),
                protections=_axis(protection, "protection"),
            ),
        ),
        epochs=epochs,
        limit=limit,
        source="eval_rates()",
    )
    suite.validate()
    result = run_suite(suite, Path(log_dir), model_args=model_args, display="none", report=False)
    if result.failed and not allow_errors:
        raise RuntimeError(
            "twice eval did not run cleanly (pass allow_errors=True to get the rates anyway):\n  "
            + "\n  ".join(result.failed)
        )
    cells = tuple(CellRates.from_row(row) for row in result.table.to_dict("records"))
    return EvalRates(cells=cells, table=result.table, log_dir=Path(log_dir))
