"""Who sent each attempt of an agent under test: the rule of ``attribute_attempts``."""

from __future__ import annotations

import json
from typing import Any

from inspect_ai.event import ModelEvent
from inspect_ai.model import GenerateConfig, ModelOutput
from inspect_ai.tool import ToolInfo
from twice.assertions import Intent, trial_metrics
from twice.mocks import Attempt, Effect, Ledger
from twice.tasks.agents import ModelToolCall, attribute_attempts, model_tool_calls

REFUND = "payments.refund.create"
LIST = "payments.refund.list"
IDENTITY = {REFUND: ["order_id"]}
ASK = {"order_id": "order_1042", "amount": 4.99, "reason": "cracked"}
SENT = {"order_id": "order_1042", "amount": 499, "reason": "cracked"}


def _call(at: float, name: str = "issue_refund", turn: int = 0, **args: Any) -> ModelToolCall:
    return ModelToolCall(name, args or ASK, at, turn)


def _post(n: int, at: float | None, params: dict[str, Any] | None = None, **kw: Any) -> Attempt:
    return Attempt(
        n=n,
        service="payments",
        method="POST",
        path="/v1/refunds",
        route=REFUND,
        mutating=True,
        key=None,
        params=params or SENT,
        at=at,
        **kw,
    )


def _get(n: int, at: float) -> Attempt:
    return Attempt(
        n=n,
        service="payments",
        method="GET",
        path="/v1/refunds",
        route=LIST,
        mutating=False,
        key=None,
        params={"order_id": "order_1042"},
        at=at,
    )


def _sources(ledger: Ledger) -> list[str]:
    return [a.source for a in ledger.attempts]


def test_attribution_a_repeat_the_model_did_not_ask_for_is_the_frameworks() -> None:
    # A retry policy re-sends the refund before the model sees anything.
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 10.5)])
    assert attribute_attempts(ledger, [_call(9.0)], IDENTITY) == 2
    assert _sources(ledger) == ["initial", "framework"]
    assert [a.asked for a in ledger.attempts] == [1, 1]


def test_attribution_a_repeat_the_model_asked_for_again_is_the_models() -> None:
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 12.0)])
    attribute_attempts(ledger, [_call(9.0), _call(11.0, turn=1)], IDENTITY)
    assert _sources(ledger) == ["initial", "model"]
    assert [a.asked for a in ledger.attempts] == [1, 2]


def test_attribution_two_identical_calls_in_one_turn_are_both_the_models() -> None:
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 10.1)])
    attribute_attempts(ledger, [_call(9.0), _call(9.0)], IDENTITY)
    assert _sources(ledger) == ["initial", "model"]


def test_attribution_a_model_retry_with_another_amount_is_the_same_request() -> None:
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 12.0, {**SENT, "amount": 599})])
    drift = {**ASK, "amount": 5.99}
    attribute_attempts(ledger, [_call(9.0), _call(11.0, turn=1, **drift)], IDENTITY)
    assert _sources(ledger) == ["initial", "model"]


def test_attribution_a_call_made_after_the_attempt_does_not_explain_it() -> None:
    # The framework re-sent at 10.5; the model's second call came only at 11.
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 10.5), _post(3, 12.0)])
    attribute_attempts(ledger, [_call(9.0), _call(11.0, turn=1)], IDENTITY)
    assert _sources(ledger) == ["initial", "framework", "model"]


def test_attribution_a_lookup_binds_to_the_lookup_tool_not_the_create() -> None:
    # One turn asks for both; then the model only looks, yet the refund is sent again.
    calls = [
        _call(9.0, "issue_refund"),
        _call(9.0, "find_refunds", order_id="order_1042"),
        _call(11.0, "find_refunds", turn=1, order_id="order_1042"),
    ]
    ledger = Ledger(attempts=[_get(1, 10.0), _post(2, 10.1), _get(3, 11.5), _post(4, 11.6)])
    attribute_attempts(ledger, calls, IDENTITY)
    assert _sources(ledger) == ["initial", "initial", "model", "framework"]


def test_attribution_arguments_named_otherwise_match_the_latest_turn() -> None:
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 10.5)])
    attribute_attempts(ledger, [_call(9.0, orderId="order_1042", dollars=4.99)], IDENTITY)
    assert _sources(ledger) == ["initial", "framework"]


def test_attribution_without_a_model_turn_leaves_every_attempt_unknown() -> None:
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 10.5)])
    assert attribute_attempts(ledger, [], IDENTITY) == 0
    assert _sources(ledger) == ["unknown", "unknown"]
    assert [a.asked for a in ledger.attempts] == [None, None]


def test_attribution_leaves_named_sources_and_untimed_attempts_alone() -> None:
    ledger = Ledger(
        attempts=[
            _post(1, 10.0, source="initial"),
            _post(2, 10.5, source="transport"),
            _post(3, None),
        ]
    )
    assert attribute_attempts(ledger, [_call(9.0)], IDENTITY) == 0
    assert _sources(ledger) == ["initial", "transport", "unknown"]


def test_attribution_a_request_no_tool_call_explains_stays_unknown() -> None:
    other = {**SENT, "order_id": "order_9"}
    ledger = Ledger(attempts=[_post(1, 10.0), _post(2, 10.1, other)])
    attribute_attempts(ledger, [_call(9.0)], IDENTITY)
    assert _sources(ledger) == ["initial", "unknown"]


def test_attribution_shows_in_the_verdict_and_the_effects_facts() -> None:
    ledger = Ledger(
        attempts=[_post(1, 10.0, delivered=False, outcome="unknown"), _post(2, 10.5)],
        effects=[
            Effect("re_1", REFUND, 1, SENT),
            Effect("re_2", REFUND, 2, SENT),
        ],
    )
    attribute_attempts(ledger, [_call(9.0)], IDENTITY)
    metrics = trial_metrics(
        ledger, [Intent(REFUND, {"order_id": "order_1042"}, values={"amount": 499})]
    )
    assert "re_1 at attempt 1 (initial), reply lost" in metrics.explanation()
    assert "re_2 at attempt 2 (framework: the model asked once), reply delivered" in (
        metrics.explanation()
    )
    assert [(f.source, f.excess) for f in metrics.effects] == [
        ("initial", False),
        ("framework", True),
    ]


def _event(completion: str, *, tools: list[ToolInfo] | None = None) -> ModelEvent:
    return ModelEvent(
        model="stub/no-retry",
        input=[],
        tools=tools or [],
        tool_choice="auto",
        config=GenerateConfig(),
        output=ModelOutput.from_content("stub/no-retry", completion),
    )


def test_model_tool_calls_reads_the_action_of_a_react_text_turn() -> None:
    # A model offered no tools names its call in ReAct text: without reading it, a framework's
    # re-send of that call could not be told from one nobody asked for.
    said = f"Thought: refund it.\nAction: issue_refund\nAction Input: {json.dumps(ASK)}"
    calls = model_tool_calls([_event(said), _event("Thought: done\nFinal Answer: refunded")])
    assert [(c.name, dict(c.arguments), c.turn) for c in calls] == [("issue_refund", ASK, 0)]
    ledger = Ledger(attempts=[_post(1, calls[0].at + 1), _post(2, calls[0].at + 2)])
    attribute_attempts(ledger, calls, IDENTITY)
    assert _sources(ledger) == ["initial", "framework"]


def test_model_tool_calls_takes_react_text_only_from_a_turn_offered_no_tools() -> None:
    said = f"Action: issue_refund\nAction Input: {json.dumps(ASK)}"
    offered = [ToolInfo(name="issue_refund", description="refund")]
    assert model_tool_calls([_event(said, tools=offered)]) == []
