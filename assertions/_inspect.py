"""The inspect-ai scorer adapters: per-trial metrics, and side-effect assertions, from the
ledger in the sample store."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from inspect_ai.scorer import (
    Metric,
    SampleScore,
    Score,
    Scorer,
    Target,
    mean,
    metric,
    scorer,
)
from inspect_ai.solver import TaskState
from inspect_ai.util import store
from twice.mocks import LEDGER_STORE_KEY, Ledger, live_ledger, trial_metadata

from ._checks import Assertion, check_all, parse_assertions
from ._metrics import METRICS, Intent, TrialMetrics, trial_metrics
from ._verdict import format_failures

EndStateCheck = Callable[[Ledger, dict[str, Any]], str | None]
"""``(ledger, sample metadata) -> None`` when the end state is right, else the reason."""


def score_trial(
    ledger: Ledger, metadata: dict[str, Any], end_state: EndStateCheck | None = None
) -> TrialMetrics:
    """Every per-trial metric of one trial, from its ledger and its sample's metadata.

    The one place a trial is judged: the inspect scorer below and ``twice serve``'s verdict
    endpoint both call it.

    Args:
        ledger: The trial's ledger.
        metadata: The sample's metadata; ``metadata["intents"]`` lists what should happen.
        end_state: The task's end-state check, if it has one.
    """
    intents = [Intent.from_dict(i) for i in metadata.get("intents", [])]
    problem = end_state(ledger, metadata) if end_state else None
    return trial_metrics(ledger, intents, problem)


def _store_ledger(state: TaskState) -> Ledger:
    live = live_ledger(state)  # a twice trial's: it reaches the store at cleanup
    if live is not None:
        return live
    data = store().get(LEDGER_STORE_KEY)
    if data is None:
        raise RuntimeError(
            f"no ledger in the sample store under {LEDGER_STORE_KEY!r}: the task's setup "
            "did not run twice's trial setup"
        )
    return Ledger.from_dict(data)


@metric
def rates() -> Metric:
    """The mean of every per-trial metric (:data:`METRICS`) over the scored trials.

    One pass over the scores. inspect's ``{"*": [mean()]}`` gives the same means, but it
    deep-copies every sample's whole score (the evidence in its metadata too) once per key
    before averaging: for a twice score that was most of the eval's results step, about
    1% of a stub trial's CPU. A key whose value is NaN in a trial leaves that trial out of
    that key's mean, as inspect does.
    """

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        sums = dict.fromkeys(METRICS, 0.0)
        counts = dict.fromkeys(METRICS, 0)
        for sample_score in scores:
            value = sample_score.score.value
            if not isinstance(value, dict):
                continue
            for key in METRICS:
                x = value.get(key)
                if isinstance(x, int | float) and not math.isnan(x):
                    sums[key] += float(x)
                    counts[key] += 1
        return {k: sums[k] / counts[k] if counts[k] else math.nan for k in METRICS}

    return compute


@scorer(metrics=[rates()])
def side_effects(end_state: EndStateCheck | None = None) -> Scorer:
    """Score a trial from its ledger: every per-trial metric the README defines.

    The sample's ``metadata["intents"]`` lists what should happen (see :class:`Intent`); the
    end-state check gets the whole metadata, with what a twice task held back from the log
    (:func:`twice.mocks.trial_metadata`). The
    ledger is the trial's own (a twice trial's, live) or the sample store's. The score's
    metadata keeps the verdict evidence (effect ids and the attempts behind them).

    Args:
        end_state: An optional end-state check for tasks where counts are not enough
            (a failed saga must be compensated).
    """

    async def score(state: TaskState, target: Target) -> Score:
        m = score_trial(_store_ledger(state), trial_metadata(state), end_state)
        return Score(
            value=m.values(),
            answer=state.output.completion[:500] if state.output else None,
            explanation=m.explanation(),
            metadata=m.evidence(),
        )

    return score


@scorer(metrics=[mean()])
def side_effect_assertions(*assertions: Assertion, metadata_key: str = "assertions") -> Scorer:
    """Score a trial 1 when every side-effect assertion holds on its ledger, else 0.

    The assertions are the ones given here plus the ones the sample carries as data in
    ``metadata[metadata_key]`` (JSON forms, see :func:`parse_assertion`), so a dataset can say
    per sample what must happen. The explanation lists every failed verdict with its ledger
    lines; the score metadata keeps every verdict (``{"verdicts": [...]}``).

    Args:
        *assertions: Assertions applied to every sample.
        metadata_key: The sample metadata key holding per-sample assertions.

    Raises:
        ValueError: (at scoring) when a sample ends up with no assertion at all, or carries
            a malformed one: a check of nothing would always pass.
        TypeError: at once, for an argument that is not an assertion.
    """
    for a in assertions:
        if not isinstance(a, Assertion):
            raise TypeError(
                f"{a!r} is not an assertion: expected an object with check(ledger) -> Verdict"
            )

    async def score(state: TaskState, target: Target) -> Score:
        ledger = _store_ledger(state)
        from_data = parse_assertions(state.metadata.get(metadata_key, []))
        checks = [*assertions, *from_data]
        if not checks:
            raise ValueError(
                f"sample {state.sample_id!r} has no side-effect assertions: none were given to "
                f"side_effect_assertions() and its metadata has no {metadata_key!r} list"
            )
        verdicts = check_all(ledger, *checks)
        ok = all(v.ok for v in verdicts)
        return Score(
            value=1.0 if ok else 0.0,
            explanation=(
                f"all {len(verdicts)} side-effect assertion(s) hold"
                if ok
                else format_failures(verdicts, ledger)
            ),
            metadata={"verdicts": [v.to_dict() for v in verdicts]},
        )

    return score
