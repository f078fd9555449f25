"""Where each cell of a ``twice run --until-decided`` run stands: its state, how the gate's
rules judge it after a round, a resumed run's replay of the rounds its logs hold, and the
decisions printed at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from inspect_ai import Task

from ..gate import METHOD, GateConfig, RuleState, rule_state
from ..suite import Cell

NO_RULE = "no rule"
"""The verdict of a cell that no gate rule covers."""


NOT_FAILING = ("pass", NO_RULE)
"""Verdicts that fail nothing: the run's gate passes when every cell has one."""


@dataclass
class CellState:
    """Where one cell stands."""

    cell: Cell
    """The cell, its prompt by name (as its logs and summary.json name it)."""
    samples: int
    epochs: int = 0
    """Epochs planned so far (the task's epoch count in the next ``eval_set``)."""
    trials: int = 0
    scored: int = 0
    rounds: int = 0
    status: str = "running"
    """``pass``/``fail`` once settled, ``undecided`` at the cap, ``running`` before;
    ``no rule`` when no gate rule covers the cell (run one round, gated by nothing)."""
    stopped_round: int | None = None
    rules: dict[str, RuleState] = field(default_factory=dict)
    epochs_per_round: int = 1
    """``--batch`` rounded up to whole epochs of this cell's samples."""

    @property
    def label(self) -> str:
        """The cell's label (:attr:`Cell.label`)."""
        return self.cell.label

    def record(self) -> dict[str, Any]:
        """This cell in summary.json's ``run.sequential.cells``."""
        return {
            **self.cell.as_dict(),
            "trials": self.trials,
            "rounds": self.rounds,
            "round_trials": self.samples * self.epochs_per_round,
            "stopped_round": self.stopped_round,
            "verdict": self.status,
            # A rule not settled while its cell still runs has no verdict yet: its state
            # reads "fail" only until the bound is reached, and a reader took it for one.
            "rules": {
                name: s.status if s.settled or self.stopped_round is not None else "running"
                for name, s in self.rules.items()
            },
        }


def planned_cell(task: Task, model: str) -> Cell:
    """The cell a built task runs, its prompt by name, as its log will name it."""
    meta = (task.metadata or {}).get("twice", {})
    return Cell.from_mapping(
        {
            "model": model,
            "agent": meta.get("agent"),
            "prompt": meta.get("prompt", "?"),
            "task": meta.get("task") or task.name,
            "fault": meta.get("fault", "?"),
            "protection": meta.get("protection", "?"),
        }
    )


def samples_of(task: Task, limit: int | None) -> int:
    """The samples of ``task`` in one epoch under ``--limit``."""
    n = len(task.dataset)
    return min(n, limit) if limit else n


def judge(state: CellState, rows: pd.DataFrame, gate: GateConfig) -> bool:
    """Check every rule on the cell's trials; True when the cell's verdict is settled: one
    rule has failed for good (the cell fails whatever the others do), or all are settled."""
    scored = rows[rows["completed"].notna()]
    errors = len(rows) - len(scored)
    excluded = f"; {errors} errored trial(s) excluded" if errors else ""
    state.rules = {
        r.name: rule_state(r, scored, gate.confidence, excluded)
        for r in gate.rules
        if r.matches(state.cell.as_dict())
    }
    state.trials, state.scored = len(rows), len(scored)
    states = state.rules.values()
    return any(s.settled and s.status == "fail" for s in states) or all(s.settled for s in states)


def settle(state: CellState, round_: int) -> None:
    """Stop the cell at ``round_`` with its verdict: fail if a rule failed, pass if every
    rule passed, ``no rule`` if none covers it."""
    state.stopped_round = round_
    if not state.rules:  # nothing decided it: not a pass that summary.json could boast
        state.status = NO_RULE
    elif any(s.status == "fail" for s in state.rules.values()):
        state.status = "fail"
    else:
        state.status = "pass"


def epochs_held(rows: pd.DataFrame) -> int:
    """The highest epoch of a cell's trials in its logs (0: none)."""
    return int(rows["epoch"].max()) if len(rows) else 0


def replay(state: CellState, rows: pd.DataFrame, gate: GateConfig, max_trials: int) -> None:
    """Resume: re-judge the cell at each complete round already in its logs, as the first run
    did, so a resumed run stops where an uninterrupted one would have (never past
    ``max_trials``: rounds beyond it, from a run with a higher cap, are not looked at)."""
    done_epochs = epochs_held(rows)
    per_round = state.epochs_per_round
    within = max_trials // (state.samples * per_round) if state.samples else 0
    for r in range(1, min(done_epochs // per_round, within) + 1):
        upto = rows[rows["epoch"] <= r * per_round]
        if len(upto) < state.samples * r * per_round:
            break  # this round did not finish
        state.epochs, state.rounds = r * per_round, r
        if judge(state, upto, gate):
            settle(state, r)
            return


def cell_rows(frame: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    """The cell's trials in ``frame``."""
    if frame.empty:
        return frame
    mask = pd.Series(True, index=frame.index)
    for k, v in cell.as_dict().items():
        mask &= frame[k].astype(str) == v
    return frame[mask]


def format_decisions(states: list[CellState], max_trials: int) -> str:
    """Per cell: the verdict, the round it stopped at and the trials it used."""
    lines = []
    total = 0
    for st in states:
        total += st.trials
        when = f"after round {st.stopped_round}" if st.stopped_round else "not run"
        if st.stopped_round is None and st.trials:
            when = "the run stopped first"
        verdict = {
            "pass": "PASS (settled)",
            "fail": "FAIL (settled)",
            "undecided": f"UNDECIDED at the {max_trials}-trial cap (the gate fails it)",
            "running": "NOT SETTLED",
            NO_RULE: "NO RULE (1 round)",
        }[st.status]
        lines.append(f"{verdict:<20} {st.label}: {when}, {st.trials} trial(s)")
        for name, rs in st.rules.items():
            if rs.status == "fail" or st.status not in NOT_FAILING:
                lines.append(f"      {name!r}: {rs.message}")
    lines.append(f"{total} trial(s) in {len(states)} cell(s); {METHOD}")
    return "\n".join(lines)
