"""Idempotency classes: declared by every mutating tool, enforced by the ``declared`` protection."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import pytest
from inspect_ai.tool import Tool, ToolDef, ToolError
from twice.mocks import (
    UNKNOWN_OUTCOME,
    ErrorAfterCommit,
    ErrorBeforeCommit,
    Fault,
    LostReply,
    NoFault,
    PaymentsService,
    RateLimited,
    ResetAfterCommit,
    ServerErrorAfterCommit,
    Services,
    TravelService,
)
from twice.tasks import (
    IDEMPOTENCY_CLASSES,
    PROTECTIONS,
    Compensation,
    TrialContext,
    get_protection,
    make_tool,
    mutate,
)
from twice.tasks.travel_booking import travel_tools

ORDER = {"order_id": "o1", "customer": "Dana", "amount": 5000}
REFUNDS = "https://payments.twice.test/v1/refunds"


def _ctx(protection: str, fault: Fault | None = None) -> TrialContext:
    services = Services([PaymentsService(orders=[ORDER])], fault=fault or NoFault())
    return TrialContext(services, get_protection(protection))


async def _refund(ctx: TrialContext, order_id: str) -> str:
    result = await mutate(
        ctx,
        route="payments.refund.create",
        method="POST",
        url=REFUNDS,
        payload={"order_id": order_id, "amount": 100},
        identity={"order_id": order_id},
        noun="refund",
        api="payments API",
    )
    return str(result.body["id"])


def _tool(ctx: TrialContext, idempotency: Any, **kwargs: Any) -> Tool:
    async def issue_refund(order_id: str) -> str:
        """Refund one dollar on an order.

        Args:
            order_id: The order.
        """
        return await _refund(ctx, order_id)

    async def find_refunds(order_id: str) -> str:
        """List refunds.

        Args:
            order_id: The order.
        """
        return order_id

    make_tool(ctx, find_refunds)
    return make_tool(ctx, issue_refund, idempotency=idempotency, **kwargs)


def _call(tool: Tool, order_id: str = "o1") -> str:
    return str(asyncio.run(tool(order_id=order_id)))


def _attempts(ctx: TrialContext) -> list[tuple[str, str | None, bool]]:
    return [(a.source, a.key, a.replayed) for a in ctx.services.ledger.attempts]


# -- declaring ------------------------------------------------------------------------------


def test_idempotency_classes_are_the_four_of_the_design() -> None:
    assert IDEMPOTENCY_CLASSES == ("safe", "keyed", "compensable", "unsafe")


@pytest.mark.parametrize("idempotency", ["safe", "keyed", "unsafe"])
def test_make_tool_records_the_class_in_the_schema(idempotency: str) -> None:
    tool = _tool(_ctx("bare"), idempotency, verify_with="find_refunds")
    assert ToolDef(tool).options == {
        "twice": {"mutating": True, "idempotency": idempotency, "verify_with": "find_refunds"}
    }


def test_make_tool_rejects_an_unknown_class() -> None:
    with pytest.raises(ValueError, match=r"'maybe'.*safe, keyed, compensable, unsafe"):
        _tool(_ctx("bare"), "maybe")


def test_make_tool_rejects_a_compensable_tool_without_its_undo() -> None:
    with pytest.raises(ValueError, match="compensable but has no compensation"):
        _tool(_ctx("bare"), "compensable")


def test_make_tool_rejects_a_compensation_on_another_class() -> None:
    undo = Compensation("cancel", lambda body: {"id": body["id"]})
    with pytest.raises(ValueError, match="only 'compensable' tools"):
        _tool(_ctx("bare"), "keyed", compensation=undo)


def test_check_tools_rejects_a_compensation_tool_missing_from_the_toolset() -> None:
    ctx = _ctx("bare")
    _tool(ctx, "compensable", compensation=Compensation("cancel_refund", lambda b: {}))
    with pytest.raises(ValueError, match=r"'cancel_refund', which is not in the trial's toolset"):
        ctx.check_tools()


def test_check_tools_rejects_a_missing_verify_tool() -> None:
    ctx = _ctx("bare")
    _tool(ctx, "unsafe", verify_with="lookup_refunds")
    with pytest.raises(ValueError, match="'lookup_refunds'"):
        ctx.check_tools()


# -- the six existing protections are unchanged, declared is new -----------------------------


def test_existing_protections_keep_their_behaviour() -> None:
    got = {
        name: (p.transport_retries, p.key, p.lookup, p.by_class, p.action_log)
        for name, p in PROTECTIONS.items()
    }
    assert got == {
        "bare": (0, "none", False, False, False),
        "retry-nokey": (2, "none", False, False, False),
        "retry-randomkey": (2, "random", False, False, False),
        "retry-stepkey": (2, "step", False, False, False),
        "intent-key": (0, "intent", False, False, False),
        "lookup": (2, "none", True, False, False),
        "declared": (2, "intent", False, True, True),
    }


# -- unsafe ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [LostReply(), ResetAfterCommit(), ErrorAfterCommit()])
def test_declared_unsafe_never_retries_an_unknown_outcome(fault: Fault) -> None:
    ctx = _ctx("declared", fault)
    tool = _tool(ctx, "unsafe", verify_with="find_refunds")
    with pytest.raises(ToolError) as err:
        _call(tool)
    message = err.value.message
    assert UNKNOWN_OUTCOME in message
    assert "declared unsafe to retry" in message
    assert "verify with find_refunds" in message and "escalate" in message
    assert _attempts(ctx) == [("initial", None, False)]
    assert len(ctx.services.ledger.effects) == 1


def test_declared_unsafe_without_a_verify_tool_still_says_verify_or_escalate() -> None:
    ctx = _ctx("declared", LostReply())
    with pytest.raises(ToolError, match="verify with a lookup tool first, or escalate"):
        _call(_tool(ctx, "unsafe"))


def test_declared_unsafe_retries_a_definite_refusal() -> None:
    # 429 means "not done": retrying it cannot duplicate, so even unsafe calls retry it.
    ctx = _ctx("declared", RateLimited())
    assert _call(_tool(ctx, "unsafe")) == "re_1"
    assert [s for s, _, _ in _attempts(ctx)] == ["initial", "transport"]


def test_retry_nokey_retries_an_unsafe_tool_blindly() -> None:
    # The failing path: without 'declared', the class is only a label and the retry duplicates.
    ctx = _ctx("retry-nokey", LostReply())
    assert _call(_tool(ctx, "unsafe")) == "re_2"
    assert len(ctx.services.ledger.effects) == 2


# -- keyed -----------------------------------------------------------------------------------


def test_declared_keyed_carries_one_intent_key_across_transport_and_model_retries() -> None:
    ctx = _ctx("declared", LostReply())
    tool = _tool(ctx, "keyed")
    assert _call(tool) == "re_1"  # the transport retry is replayed by the service
    assert _call(tool) == "re_1"  # so is a model retry of the same intent
    attempts = _attempts(ctx)
    assert [s for s, _, _ in attempts] == ["initial", "transport", "model"]
    keys = {k for _, k, _ in attempts}
    assert len(keys) == 1 and None not in keys
    assert next(iter(keys)).startswith(ctx.run_id)  # made by the tool layer, not the model
    assert [r for _, _, r in attempts] == [False, True, True]
    assert len(ctx.services.ledger.effects) == 1


def test_declared_keyed_gives_different_intents_different_keys() -> None:
    orders = [ORDER, {**ORDER, "order_id": "o2"}]
    ctx = TrialContext(Services([PaymentsService(orders=orders)]), get_protection("declared"))
    tool = _tool(ctx, "keyed")
    assert (_call(tool, "o1"), _call(tool, "o2")) == ("re_1", "re_2")
    assert len({k for _, k, _ in _attempts(ctx)}) == 2


def test_bare_keyed_sends_no_key_and_a_model_retry_duplicates() -> None:
    # The failing path: a keyed declaration under 'bare' sends nothing; only 'declared' enforces.
    ctx = _ctx("bare", LostReply())
    tool = _tool(ctx, "keyed")
    with pytest.raises(ToolError):
        _call(tool)
    assert _call(tool) == "re_2"
    assert {k for _, k, _ in _attempts(ctx)} == {None}


# -- safe ------------------------------------------------------------------------------------


def test_declared_safe_retries_without_a_key() -> None:
    ctx = _ctx("declared", ErrorBeforeCommit())
    assert _call(_tool(ctx, "safe")) == "re_1"
    assert _attempts(ctx) == [("initial", None, False), ("transport", None, False)]


def test_declared_safe_is_the_authors_claim() -> None:
    # Declaring a non-idempotent call 'safe' is a lie the layer believes: it retries freely.
    ctx = _ctx("declared", LostReply())
    assert _call(_tool(ctx, "safe")) == "re_2"
    assert len(ctx.services.ledger.effects) == 2


# -- compensable -----------------------------------------------------------------------------


def _travel(protection: str, fault: Fault | None = None) -> tuple[TrialContext, dict[str, Tool]]:
    flight = {
        "flight_id": "TW1",
        "origin": "Lisbon",
        "destination": "Berlin",
        "date": "2026-03-14",
        "fare": 18900,
        "seats": 9,
    }
    services = Services([TravelService(flights=[flight], hotels=[])], fault=fault or NoFault())
    ctx = TrialContext(services, get_protection(protection))
    tools = {ToolDef(t).name: t for t in travel_tools(ctx)}
    ctx.check_tools()
    return ctx, tools


def test_declared_compensable_registers_its_undo() -> None:
    ctx, tools = _travel("declared")
    text = asyncio.run(tools["book_flight"](trip_id="t1", traveler="Ana", flight_id="TW1"))
    assert "To undo it: cancel_flight(booking_id='fb_1')" in str(text)
    [undo] = ctx.compensations
    assert (undo.forward_tool, undo.forward_id, undo.tool, undo.args) == (
        "book_flight",
        "fb_1",
        "cancel_flight",
        {"booking_id": "fb_1"},
    )
    assert ctx.undo_for("fb_1") is undo
    assert ctx.services.ledger.attempts[0].key is not None  # compensable calls are keyed too


def test_declared_compensable_unknown_outcome_names_the_undo() -> None:
    ctx, tools = _travel("declared", ServerErrorAfterCommit(status=503))
    # The service saved its 503: every transport retry with the same key replays it, so the
    # outcome is still unknown at the end.
    with pytest.raises(ToolError, match="undo it with cancel_flight"):
        asyncio.run(tools["book_flight"](trip_id="t1", traveler="Ana", flight_id="TW1"))
    assert len(ctx.services.ledger.effects) == 1
    assert ctx.compensations == []  # nothing the layer saw committed


def test_declared_compensable_retry_after_a_gateway_error_gets_the_saved_booking() -> None:
    ctx, tools = _travel("declared", ErrorAfterCommit())
    text = str(asyncio.run(tools["book_flight"](trip_id="t1", traveler="Ana", flight_id="TW1")))
    # The gateway's 502 was not saved: the keyed retry got the service's own saved reply.
    assert text.startswith("Attempt 1: the travel API answered HTTP 502")
    assert "got back the saved result of the earlier attempt" in text and "fb_1" in text
    assert "To undo it: cancel_flight(booking_id='fb_1')" in text
    assert len(ctx.services.ledger.effects) == 1 and ctx.services.ledger.attempts[1].replayed


def test_compensation_is_registered_once_per_effect() -> None:
    ctx, tools = _travel("declared")
    for _ in range(2):
        asyncio.run(tools["book_flight"](trip_id="t1", traveler="Ana", flight_id="TW1"))
    assert [u.forward_id for u in ctx.compensations] == ["fb_1"]


# -- every mutating tool declares a class ----------------------------------------------------


def test_declared_refuses_a_mutation_from_a_tool_without_a_class() -> None:
    ctx = _ctx("declared")
    with pytest.raises(RuntimeError, match=r"tool 'issue_refund' made a mutating call"):
        _call(_tool(ctx, None))
    assert ctx.services.ledger.attempts == []


def test_declared_refuses_a_mutation_outside_any_tool() -> None:
    ctx = _ctx("declared")
    with pytest.raises(RuntimeError, match="outside a tool made by make_tool"):
        asyncio.run(_refund(ctx, "o1"))


def test_other_protections_still_allow_an_undeclared_mutation() -> None:
    ctx = _ctx("bare")
    assert _call(_tool(ctx, None)) == "re_1"


def test_a_tool_error_carries_only_the_tools_own_frame() -> None:
    # inspect formats every failed tool call's traceback into its trace log; a lost reply's
    # ToolError carrying every frame of the send path would bloat that log on every call
    ctx = TrialContext(Services([PaymentsService()]), get_protection("bare"))

    async def deep(order_id: str) -> str:
        raise ToolError(f"The payments API timed out on {order_id}.")

    async def issue_refund(order_id: str) -> str:
        """Refund an order.

        Args:
            order_id: The order.
        """
        return await deep(order_id)

    tool = make_tool(ctx, issue_refund, idempotency="keyed")
    with pytest.raises(ToolError, match="timed out on o1") as caught:
        asyncio.run(tool(order_id="o1"))
    names = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert "deep" not in names and "issue_refund" not in names, names
    assert ctx.services.ledger.observations[-1] == "The payments API timed out on o1."


def test_lookup_without_a_lookup_function_is_an_error_not_a_blind_retry() -> None:
    # The failing path: a tool passing no lookup= that retried blind under 'lookup' would
    # measure retry-nokey (100% duplicated) under the label 'lookup'.
    ctx = _ctx("lookup", LostReply())
    with pytest.raises(RuntimeError, match=r"tool 'issue_refund' .* without a lookup.*lookup="):
        _call(_tool(ctx, "keyed"))
    assert ctx.services.ledger.effects == []
