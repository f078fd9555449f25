"""The inspect-ai scorer adapter: per-trial metrics from the ledger in the sample store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_ai.scorer import Score, Scorer, Target, mean, scorer
from inspect_ai.solver import TaskState
from inspect_ai.util import store

from mocks import LEDGER_STORE_KEY, Ledger

from ._metrics import Intent, trial_metrics

EndStateCheck = Callable[[Ledger, dict[str, Any]], str | None]
"""``(ledger, sample metadata) -> None`` when the end state is right, else the reason."""


@scorer(metrics={"*": [mean()]})
def side_effects(end_state: EndStateCheck | None = None) -> Scorer:
    """Score a trial from its ledger: every per-trial metric of DESIGN.md.

    The sample's ``metadata["intents"]`` lists what should happen (see :class:`Intent`); the
    ledger comes from the sample store, where the task's tools keep it up to date. The score's
    metadata keeps the verdict evidence (effect ids and the attempts behind them).

    Args:
        end_state: An optional end-state check for tasks where counts are not enough
            (a failed saga must be compensated).
    """

    async def score(state: TaskState, target: Target) -> Score:
        data = store().get(LEDGER_STORE_KEY)
        if data is None:
            raise RuntimeError(
                f"no ledger in the sample store under {LEDGER_STORE_KEY!r}: the task's setup "
                "did not run twice's trial setup"
            )
        ledger = Ledger.from_dict(data)
        intents = [Intent.from_dict(i) for i in state.metadata.get("intents", [])]
        problem = end_state(ledger, state.metadata) if end_state else None
        m = trial_metrics(ledger, intents, problem)
        return Score(
            value=m.values(),
            answer=state.output.completion[:500] if state.output else None,
            explanation=m.explanation(),
            metadata=m.evidence(),
        )

    return score
