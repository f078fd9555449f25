"""Print the travel saga's reference results (stub controls) and the resume table.

    python -m tasks.travel_booking.reference [--limit N] [--log-dir DIR]

Each row is one cell run in-process with inspect's ``eval`` on the built-in dataset; counts
are per trial, read from each trial's ledger (never from the transcript). The README's tables
are this script's output; ``tests/tasks/test_travel_booking.py`` and
``tests/tasks/test_resume.py`` assert the same figures.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspect_ai import Task, eval
from inspect_ai.log import EvalLog
from twice.mocks import Ledger, ledger_of
from twice.tasks._protections import get_protection

from .travel_booking import FLIGHT_BOOK, FLIGHT_CANCEL, HOTEL_BOOK, travel_booking


@dataclass(frozen=True)
class RefCell:
    """One reference cell: a stub model on a task under a fault and a protection."""

    model: str
    fault: str
    protection: str = "bare"
    action_log: bool | None = None
    task: str = "travel_booking"


SAGA_CELLS: tuple[RefCell, ...] = tuple(
    RefCell(model, fault)
    for fault in ("none", "lost_reply", "timeout_before_commit")
    for model in ("stub/retry", "stub/no-retry", "stub/verify", "stub/parallel")
)
"""The saga table: every control under the control fault and the twin faults, ``bare``."""

PARALLEL_CELLS: tuple[RefCell, ...] = tuple(
    RefCell("stub/parallel", "none", protection)
    for protection in ("bare", "retry-nokey", "intent-key", "declared")
)
"""Parallel duplicates: one effect per intent with a key, two without."""

RESUME_CELLS: tuple[RefCell, ...] = (
    RefCell("stub/no-retry", "crash_after_commit", "bare", False),
    RefCell("stub/no-retry", "crash_after_commit", "bare", True),
    RefCell("stub/no-retry", "crash_after_commit", "retry-nokey"),
    RefCell("stub/no-retry", "crash_after_commit", "retry-randomkey"),
    RefCell("stub/no-retry", "crash_after_commit", "retry-stepkey"),
    RefCell("stub/no-retry", "crash_after_commit", "intent-key"),
    RefCell("stub/no-retry", "crash_after_commit", "lookup"),
    RefCell("stub/no-retry", "crash_after_commit", "declared", False),
    RefCell("stub/no-retry", "crash_after_commit", "declared", True),
    RefCell("stub/no-retry", "crash_after_commit", "bare", False, "refund"),
    RefCell("stub/no-retry", "crash_after_commit", "bare", True, "refund"),
    RefCell("stub/no-retry", "crash_after_commit", "declared", None, "refund"),
)
"""The resume table: a run that dies after its first commit, per protection, with and
without the durable action log."""


def _task(cell: RefCell) -> Task:
    if cell.task == "travel_booking":
        return travel_booking(
            fault=cell.fault, protection=cell.protection, action_log=cell.action_log
        )
    from twice.tasks import get_task

    return get_task(cell.task)(
        fault=cell.fault, protection=cell.protection, action_log=cell.action_log
    )


def run_cell(
    cell: RefCell,
    *,
    log_dir: str | Path,
    limit: int | None = None,
    sample_id: Sequence[str] | None = None,
) -> EvalLog:
    """Run one cell in-process and return its log (raises if the eval did not succeed)."""
    log = eval(
        _task(cell),
        model=cell.model,
        display="none",
        log_dir=str(log_dir),
        limit=limit,
        sample_id=list(sample_id) if sample_id is not None else None,
    )[0]
    if log.status != "success":
        raise RuntimeError(f"{cell} did not run: {log.status} {log.error}")
    return log


def _count(ledger: Ledger, name: str) -> int:
    return sum(e.name == name for e in ledger.effects)


FORWARD: dict[str, str] = {"travel_booking": FLIGHT_BOOK, "refund": "payments.refund.create"}
"""The effect a task's first mutating call makes (what ``crash_after_commit`` hits)."""


def summarize(cell: RefCell, log: EvalLog) -> dict[str, Any]:
    """Per-trial means of what the ledgers hold, and the scorer's rates, for one cell."""
    forward = FORWARD[cell.task]
    rows = []
    for sample in log.samples or []:
        ledger = ledger_of(sample)
        score = sample.scores["side_effects"] if sample.scores else None
        value = score.value if score is not None and isinstance(score.value, dict) else {}
        meta = score.metadata or {} if score is not None else {}
        rows.append(
            {
                "forward": _count(ledger, forward),
                "cancels": _count(ledger, FLIGHT_CANCEL),
                "hotels": _count(ledger, HOTEL_BOOK),
                "resume": sum(a.source == "resume" for a in ledger.attempts),
                "attempts": sum(a.mutating and a.route == forward for a in ledger.attempts),
                "completed": float(value.get("completed", 0.0)),
                "duplicated": float(value.get("duplicated", 0.0)),
                "safe": float(value.get("safe_success", 0.0)),
                "end_state": float(bool(meta.get("end_state"))),
                "error": bool(sample.error),
            }
        )
    n = len(rows)

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in rows) / n if n else float("nan")

    return {
        "cell": cell,
        "n": n,
        "errors": sum(r["error"] for r in rows),
        **{k: mean(k) for k in rows[0] if k != "error"},
    }


def _fmt(rows: list[dict[str, Any]], columns: list[tuple[str, str, Callable[[Any], str]]]) -> str:
    table = [[title for title, _, _ in columns]]
    for row in rows:
        table.append([fmt(row[key]) for _, key, fmt in columns])
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table
    )


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _num(x: float) -> str:
    return f"{x:.2f}"


def format_saga(rows: list[dict[str, Any]]) -> str:
    """The saga table as printed in the README."""
    for r in rows:
        r.update(model=r["cell"].model, fault=r["cell"].fault, protection=r["cell"].protection)
    return _fmt(
        rows,
        [
            ("model", "model", str),
            ("fault", "fault", str),
            ("protection", "protection", str),
            ("n", "n", str),
            ("flights/trial", "forward", _num),
            ("cancels/trial", "cancels", _num),
            ("hotels/trial", "hotels", _num),
            ("complete", "completed", _pct),
            ("dup", "duplicated", _pct),
            ("end-state bad", "end_state", _pct),
            ("safe", "safe", _pct),
        ],
    )


def format_resume(rows: list[dict[str, Any]]) -> str:
    """The resume table as printed in the README."""
    for r in rows:
        cell = r["cell"]
        keep = cell.action_log
        if keep is None:
            keep = get_protection(cell.protection).action_log
        r.update(task=cell.task, protection=cell.protection, log="on" if keep else "off")
    return _fmt(
        rows,
        [
            ("task", "task", str),
            ("protection", "protection", str),
            ("action log", "log", str),
            ("n", "n", str),
            ("effects/trial", "forward", _num),
            ("attempts/trial", "attempts", _num),
            ("resume attempts/trial", "resume", _num),
            ("dup", "duplicated", _pct),
            ("safe", "safe", _pct),
        ],
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run every reference cell and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="samples per cell (default all)")
    parser.add_argument("--log-dir", default=None, help="keep the logs here (default: temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = args.log_dir or tmp
        saga = [summarize(c, run_cell(c, log_dir=log_dir, limit=args.limit)) for c in SAGA_CELLS]
        par = [summarize(c, run_cell(c, log_dir=log_dir, limit=args.limit)) for c in PARALLEL_CELLS]
        resume = [
            summarize(c, run_cell(c, log_dir=log_dir, limit=args.limit)) for c in RESUME_CELLS
        ]
    print("travel_booking: the saga under the stub controls\n")
    print(format_saga(saga))
    print("\ntravel_booking: parallel duplicates (stub/parallel, fault none)\n")
    print(format_saga(par))
    print("\ntravel_booking: resume (the run dies right after its first commit)\n")
    print(format_resume(resume))


if __name__ == "__main__":
    main()
