"""The inspect scorer adapter: assertions as arguments and as sample metadata."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from batch_eval import batch_eval
from inspect_ai import Task
from inspect_ai.dataset import Sample
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import store
from twice.assertions import at_least, exactly, side_effect_assertions
from twice.mocks import LEDGER_STORE_KEY, LostReply, PaymentsService, Services

REFUND = "payments.refund.create"
ORDER = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}


@solver
def naive_refund_solver() -> Solver:
    """Refund once, retry once without a key after the lost reply; keep the ledger in the store."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        services = Services([PaymentsService(orders=[ORDER])], fault=LostReply())
        async with services.client(base_url="https://payments.twice.test") as client:
            for _ in range(2):
                try:
                    await client.post("/v1/refunds", json={"order_id": "order_1042", "amount": 499})
                    break
                except httpx.TimeoutException:
                    continue
        store().set(LEDGER_STORE_KEY, services.ledger.to_dict())
        return state

    return solve


def _run(tmp_path: Path, samples: list[Sample], *args: object) -> list[object]:
    task = Task(
        dataset=samples,
        solver=naive_refund_solver(),
        scorer=side_effect_assertions(*args),  # type: ignore[arg-type]
    )
    log = batch_eval(task, model="mockllm/model", log_dir=str(tmp_path))[0]
    assert log.samples is not None
    return list(log.samples)


def test_side_effect_assertions_reads_sample_metadata_and_arguments(tmp_path: Path) -> None:
    samples = [
        Sample(
            id="says-two",
            input="refund",
            metadata={"assertions": [{"assert": "exactly", "n": 2, "effect": REFUND}]},
        ),
        Sample(
            id="says-one",
            input="refund",
            metadata={
                "assertions": [
                    {
                        "assert": "exactly",
                        "n": 1,
                        "effect": REFUND,
                        "where": {"order_id": "order_1042"},
                    }
                ]
            },
        ),
    ]
    by_id = {s.id: s for s in _run(tmp_path, samples, at_least(1, REFUND))}  # type: ignore[attr-defined]
    two = by_id["says-two"].scores["side_effect_assertions"]
    one = by_id["says-one"].scores["side_effect_assertions"]
    assert two.value == 1.0
    assert two.explanation == "all 2 side-effect assertion(s) hold"
    assert one.value == 0.0
    assert one.explanation.splitlines()[:2] == [
        "1 of 2 side-effect assertions failed:",
        "payments.refund.create where order_id='order_1042': expected exactly 1, observed 2 "
        "(re_1 at attempt 1, reply lost; re_2 at attempt 2)",
    ]
    assert [v["ok"] for v in one.metadata["verdicts"]] == [True, False]


def test_side_effect_assertions_sample_without_assertions_errors(tmp_path: Path) -> None:
    task = Task(
        dataset=[Sample(id="nothing", input="refund")],
        solver=naive_refund_solver(),
        scorer=side_effect_assertions(),
    )
    log = batch_eval(task, model="mockllm/model", log_dir=str(tmp_path))[0]
    assert log.status == "error"
    assert log.error is not None
    assert "sample 'nothing' has no side-effect assertions" in log.error.message


def test_side_effect_assertions_rejects_a_non_assertion_at_once() -> None:
    with pytest.raises(TypeError, match=r"'exactly 1' is not an assertion"):
        side_effect_assertions("exactly 1")  # type: ignore[arg-type]


def test_side_effect_assertions_reports_a_duplicate_from_an_argument(tmp_path: Path) -> None:
    samples = [Sample(id="s1", input="refund")]
    (sample,) = _run(tmp_path, samples, exactly(1, REFUND))
    score = sample.scores["side_effect_assertions"]  # type: ignore[attr-defined]
    assert score.value == 0.0
    assert "expected exactly 1, observed 2" in score.explanation


def test_side_effects_header_gives_every_rate_over_the_trials(tmp_path: Path) -> None:
    from twice.assertions import METRICS, side_effects

    intents = lambda n: {"intents": [{"effect": REFUND, "identity": {}, "expected": n}]}  # noqa: E731
    samples = [
        Sample(id="expects-two", input="refund", metadata=intents(2)),
        Sample(id="expects-one", input="refund", metadata=intents(1)),
    ]
    task = Task(dataset=samples, solver=naive_refund_solver(), scorer=side_effects())
    log = batch_eval(task, model="mockllm/model", log_dir=str(tmp_path))[0]
    assert log.status == "success" and log.samples and log.results
    (scores,) = log.results.scores
    header = {name: m.value for name, m in scores.metrics.items()}
    per_trial = [s.scores["side_effects"].value for s in log.samples]  # type: ignore[index]
    assert list(header) == list(METRICS)
    for name in METRICS:
        assert header[name] == pytest.approx(sum(v[name] for v in per_trial) / 2), name
    # Each trial refunds twice: a duplicate for the sample that expected one only.
    assert header["duplicated"] == 0.5 and header["exactly_once"] == 0.5


def test_rates_leaves_a_nan_out_of_that_key_only() -> None:
    from inspect_ai.scorer import SampleScore, Score
    from twice.assertions import METRICS
    from twice.assertions._inspect import rates

    def trial(**values: float) -> SampleScore:
        return SampleScore(score=Score(value={k: values.get(k, 0.0) for k in METRICS}))

    got = rates()([trial(duplicated=1.0), trial(duplicated=float("nan"), completed=1.0)])
    assert got["duplicated"] == 1.0  # the NaN trial is left out of this key
    assert got["completed"] == 0.5  # and counted for the others
    assert rates()([])["duplicated"] != rates()([])["duplicated"]  # NaN: no trials
