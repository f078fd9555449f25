"""The tool layer writes the "what happened" sentence; services come from a sample's state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.tool import Tool, ToolDef, ToolError
from twice.mocks import (
    ErrorAfterCommit,
    Fault,
    LostReply,
    NoFault,
    PaymentsService,
    RateLimited,
    ResetAfterCommit,
    Services,
    TicketsService,
    services_from_state,
)
from twice.tasks import ActionLog, TrialContext, get_protection, twice_task
from twice.tasks.refund.refund import _services, refund_tools

ORDER = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}


def _refund_tool(protection: str, fault: Fault | None = None) -> tuple[TrialContext, Tool]:
    services = Services(_services({"orders": [ORDER]}), fault=fault or NoFault())
    p = get_protection(protection)
    ctx = TrialContext(services, p, action_log=ActionLog() if p.action_log else None)
    tools = {ToolDef(t).name: t for t in refund_tools(ctx)}
    return ctx, tools["issue_refund"]


def _refund(tool: Tool) -> str:
    return str(asyncio.run(tool(order_id="order_1042", amount=4.99)))


def test_first_attempt_result_says_what_it_did() -> None:
    _, tool = _refund_tool("bare")
    assert _refund(tool).startswith("Created refund re_1 of $4.99 on order order_1042")


def test_lookup_after_a_gateway_error_says_502_not_timed_out() -> None:
    # refund, error_after_commit, lookup: a 502 is an answer, and the agent must not be told
    # the first attempt timed out.
    _, tool = _refund_tool("lookup", ErrorAfterCommit())
    text = _refund(tool)
    assert "timed out" not in text
    assert text.startswith("Attempt 1: the payments API answered HTTP 502 (Bad gateway")
    assert "A lookup then found it already made, so it was not sent again: refund re_1" in text


def test_lookup_after_a_lost_reply_says_it_timed_out() -> None:
    _, tool = _refund_tool("lookup", LostReply())
    assert _refund(tool).startswith("Attempt 1: timed out waiting for the payments API. A lookup")


def test_a_result_from_the_action_log_does_not_claim_it_was_created() -> None:
    ctx, tool = _refund_tool("declared")
    _refund(tool)
    again = _refund(tool)
    assert not again.startswith("Created")
    # No restart happened: the model repeated the call (it said "before the run restarted").
    assert again.startswith("Already done earlier in this run (from the action log; nothing")
    assert "refund re_1" in again
    assert len([a for a in ctx.services.ledger.attempts if a.mutating]) == 1  # nothing sent


@pytest.mark.parametrize(("amount", "said"), [(0.004, "less than one cent"), (-1.0, "positive")])
def test_a_refund_amount_of_no_cents_says_why(amount: float, said: str) -> None:
    # 0.004 is positive: "amount must be positive, got 0.004" read as a contradiction.
    _, tool = _refund_tool("bare")
    with pytest.raises(ToolError, match=said):
        asyncio.run(tool(order_id="order_1042", amount=amount))


def test_a_keyed_replay_for_a_second_call_says_nothing_new_was_made() -> None:
    ctx, tool = _refund_tool("intent-key")
    _refund(tool)
    again = _refund(tool)
    assert again.startswith("Already done: the payments API returned the saved result")
    assert "nothing new was made: refund re_1" in again
    assert ctx.services.ledger.attempts[-1].replayed


def test_a_keyed_retry_after_a_lost_reply_says_it_got_the_saved_result() -> None:
    _, tool = _refund_tool("retry-stepkey", LostReply())
    text = _refund(tool)
    assert text.startswith("Attempt 1: timed out waiting for the payments API. Attempt 2")
    assert "got back the saved result of the earlier attempt, so it was made once: refund re_1" in (
        text
    )


def test_an_unkeyed_retry_warns_that_the_earlier_attempt_may_have_made_one() -> None:
    ctx, tool = _refund_tool("retry-nokey", LostReply())
    text = _refund(tool)
    assert text.startswith("Created refund re_2 of $4.99")
    assert "on attempt 2. Attempt 1: timed out waiting for the payments API" in text
    assert "another refund may have been made by it" in text
    assert [e.id for e in ctx.services.ledger.effects] == ["re_1", "re_2"]


def test_a_reset_after_the_commit_is_an_unknown_outcome_said_honestly() -> None:
    ctx, tool = _refund_tool("bare", ResetAfterCommit())
    with pytest.raises(ToolError) as err:
        _refund(tool)
    assert err.value.message == (
        "The connection to the payments API was closed before a reply after 1 attempt; the "
        "refund may or may not have been made. The outcome is unknown."
    )
    assert [e.id for e in ctx.services.ledger.effects] == ["re_1"]


@pytest.mark.parametrize(
    ("protection", "refunds", "said"),
    [
        # A connection closed after the request went out is no "never sent" connect error:
        # every retrying protection treats it as it treats a timeout.
        ("retry-nokey", ["re_1", "re_2"], "another refund may have been made by it"),
        ("retry-stepkey", ["re_1"], "got back the saved result of the earlier attempt"),
        ("lookup", ["re_1"], "A lookup then found it already made"),
    ],
)
def test_transport_retries_after_a_reset_act_as_after_a_lost_reply(
    protection: str, refunds: list[str], said: str
) -> None:
    ctx, tool = _refund_tool(protection, ResetAfterCommit())
    text = _refund(tool)
    assert "Attempt 1: the connection to the payments API was closed before a reply" in text
    assert said in text
    assert [e.id for e in ctx.services.ledger.effects] == refunds


def test_a_retry_after_a_429_says_nothing_was_made_by_it() -> None:
    _, tool = _refund_tool("retry-nokey", RateLimited())
    text = _refund(tool)
    assert text.startswith("Created refund re_1 of $4.99")
    assert "HTTP 429" in text and "no refund was made by it" in text


# -- the per-service handle --------------------------------------------------------------------


def test_api_handle_names_the_service_and_builds_urls() -> None:
    ctx = TrialContext(Services([TicketsService()]), get_protection("bare"))
    api = ctx.api("tickets")
    assert api.label == "helpdesk API"
    assert api.url("/v1/tickets") == "https://tickets.twice.test/v1/tickets"


def test_api_handle_for_an_unknown_service_names_the_trials_services() -> None:
    ctx = TrialContext(Services([PaymentsService()]), get_protection("bare"))
    with pytest.raises(
        ValueError, match=r"no service 'payment' in this trial; its services: payments"
    ):
        ctx.api("payment")


# -- services from a sample's state ----------------------------------------------------------


def test_services_from_state_passes_each_key_to_its_service() -> None:
    (payments,) = services_from_state({"orders": [ORDER]}, PaymentsService)
    assert isinstance(payments, PaymentsService) and list(payments.orders) == ["order_1042"]


def test_services_from_state_rejects_a_misspelt_key() -> None:
    with pytest.raises(
        ValueError, match=r"unknown state key\(s\) 'order' for PaymentsService; accepted: orders"
    ):
        services_from_state({"order": [ORDER]}, PaymentsService)


def test_services_from_state_refuses_a_key_two_services_take_every_time() -> None:
    class OtherPayments(PaymentsService):
        name = "other"

    services_from_state({"orders": [ORDER]}, PaymentsService)  # the good layout, cached
    for _ in range(2):  # a refusal is not cached away
        with pytest.raises(ValueError, match="state key 'orders' is taken by both"):
            services_from_state({"orders": [ORDER]}, PaymentsService, OtherPayments)
        with pytest.raises(ValueError, match="unknown state key"):
            services_from_state({"order": [ORDER]}, PaymentsService)


def test_twice_task_rejects_a_sample_whose_state_has_a_misspelt_key() -> None:
    dataset = MemoryDataset(
        [Sample(input="refund it", id="s1", metadata={"state": {"ordres": [ORDER]}})]
    )

    def tools(ctx: TrialContext) -> list[Any]:
        return []

    with pytest.raises(
        ValueError, match=r"task 'refund', sample 's1': unknown state key\(s\) 'ordres'"
    ):
        twice_task(
            name="refund",
            dataset=dataset,
            services=_services,
            tools=tools,
            fault="none",
            protection="bare",
            prompt="baseline",
        )


@pytest.mark.parametrize("effect", ["payments.refund", "email.message.send"])
def test_twice_task_rejects_an_intent_on_an_effect_its_services_do_not_make(effect: str) -> None:
    # Such an intent counted nothing: stub/retry under lost_reply, which refunds twice every
    # time, scored a duplication rate of 0 and a duplication-only gate passed it.
    intents = [{"effect": effect, "identity": {"order_id": "order_1042"}, "expected": 1}]
    dataset = MemoryDataset(
        [
            Sample(
                input="refund it",
                id="s1",
                metadata={"state": {"orders": [ORDER]}, "intents": intents},
            )
        ]
    )

    def tools(ctx: TrialContext) -> list[Any]:
        return []

    with pytest.raises(
        ValueError,
        match=rf"sample 's1': intent effect '{effect}' is not an effect its services make; "
        r"they make: payments\.refund\.create",
    ):
        twice_task(
            name="refund", dataset=dataset, services=_services, tools=tools, fault="none",
            protection="bare", prompt="baseline",
        )  # fmt: skip


GOOD_STEP = {
    "call": {"tool": "issue_refund", "args": {"order_id": "order_1042", "amount": 4.99}},
    "verify": {"tool": "find_refunds", "args": {"order_id": "order_1042"}},
    "found_pattern": "re_\\d+",
    "drift": {"amount": 4.98},
}


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        (
            {**GOOD_STEP, "call": {"tool": "issue_refnd", "args": {"order_id": "order_1042"}}},
            r"plan step 0 'call' calls 'issue_refnd', which is not a tool of the task; its "
            r"tools are: find_refunds, get_order, issue_refund",
        ),
        (
            {**GOOD_STEP, "call": {"tool": "issue_refund", "args": {"order_id": "order_1042",
                                                                     "amout": 4.99}}},
            r"plan step 0 'call' calls 'issue_refund' with argument 'amout', which it does not "
            r"take; it takes: amount, order_id, reason",
        ),
        (
            {**GOOD_STEP, "call": {"tool": "issue_refund", "args": {"order_id": "order_1042"}}},
            r"plan step 0 'call' calls 'issue_refund' without its required argument 'amount'",
        ),
        (
            {**GOOD_STEP, "verify": {"tool": "find_refund", "args": {"order_id": "order_1042"}}},
            r"plan step 0 'verify' calls 'find_refund', which is not a tool",
        ),
        (
            {**GOOD_STEP, "drift": {"amonut": 4.98}},
            r"plan step 0 'drift' changes argument 'amonut', which 'issue_refund' does not take",
        ),
    ],
)  # fmt: skip
def test_twice_task_rejects_a_plan_its_tools_cannot_follow(
    step: dict[str, Any], problem: str
) -> None:
    # A stub following such a plan got "tool not found" or an argument error every turn:
    # stub/retry under lost_reply never reached the refund, so it never duplicated, and the
    # control that proves the suite can see duplicates scored 0% without a word.
    intents = [{"effect": "payments.refund.create", "identity": {"order_id": "order_1042"}}]
    samples = [
        Sample(
            input="refund it",
            id=sid,
            metadata={"state": {"orders": [ORDER]}, "intents": intents, "plan": [plan_step]},
        )
        for sid, plan_step in (("good", GOOD_STEP), ("s2", step))
    ]
    with pytest.raises(ValueError, match=rf"task 'plan_check', sample 's2': {problem}"):
        twice_task(
            name="plan_check", dataset=MemoryDataset(samples), services=_services,
            tools=refund_tools, fault="none", protection="bare", prompt="baseline",
        )  # fmt: skip
    # The good sample alone builds (and a second build of the same dataset is not checked
    # again). Under its own name: a built task registers its parts by name (twice serve).
    for _ in range(2):
        twice_task(
            name="plan_check", dataset=MemoryDataset(samples[:1]), services=_services,
            tools=refund_tools, fault="none", protection="bare", prompt="baseline",
        )  # fmt: skip
