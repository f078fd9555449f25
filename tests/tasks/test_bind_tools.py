"""``bind_tools``: what inspect holds for a trial is one stand-in per tool shape, calling the
tools of the trial running in the current context."""

from __future__ import annotations

import asyncio
import contextvars
import traceback

import pytest
from inspect_ai.model._call_tools import get_tools_info
from inspect_ai.tool import ToolError
from inspect_ai.tool._tool_description import tool_description
from twice.mocks import Services, get_fault
from twice.tasks._protections import get_protection
from twice.tasks._toolkit import TrialContext, bind_tools
from twice.tasks.refund.refund import _services, refund_tools


def _trial(*orders: str, fault: str = "none") -> TrialContext:
    state = {"orders": [{"order_id": o, "customer": "C", "amount": 500} for o in orders]}
    services = Services(_services(state), fault=get_fault(fault))
    return TrialContext(services, get_protection("bare"))


def test_stand_ins_offer_the_model_exactly_the_trial_tools_schemas() -> None:
    made = refund_tools(_trial())
    stand_ins = bind_tools(made)
    assert get_tools_info(stand_ins) == get_tools_info(made)  # names, docs, params, options
    issue = get_tools_info(stand_ins)[0]
    assert issue.options == {"twice": {"mutating": True, "idempotency": "keyed"}}


def test_every_trial_gets_the_same_stand_in_objects_without_a_per_object_schema() -> None:
    # A per-object schema (ToolDef.as_tool's description) makes inspect rebuild and deep-copy
    # the parameters on every turn; a stable stand-in is parsed once.
    first = bind_tools(refund_tools(_trial()))
    second = bind_tools(refund_tools(_trial()))
    assert [id(t) for t in first] == [id(t) for t in second]
    assert all(tool_description(t).parameters is None for t in first)


def test_a_stand_in_calls_the_tool_of_the_trial_in_its_own_context() -> None:
    async def one_trial(order: str) -> tuple[str, int]:
        ctx = _trial(order)  # this trial's payments service knows only its own order
        tools = {t.__name__: t for t in bind_tools(refund_tools(ctx))}
        await asyncio.sleep(0)  # interleave the two trials
        text = await tools["issue_refund"](order_id=order, amount=1.0)
        return str(text), len(ctx.services.ledger.effects)

    async def both() -> list[tuple[str, int]]:
        return list(await asyncio.gather(one_trial("order_1"), one_trial("order_2")))

    (text_1, effects_1), (text_2, effects_2) = asyncio.run(both())
    assert "order_1" in text_1 and "order_2" in text_2
    assert effects_1 == effects_2 == 1  # each trial's ledger holds only its own refund


def test_a_stand_in_called_outside_a_bound_trial_says_so() -> None:
    stand_in = bind_tools(refund_tools(_trial()))[1]  # find_refunds
    fresh = contextvars.Context()  # no trial bound here
    with pytest.raises(RuntimeError, match="outside the trial that bound it"):
        fresh.run(asyncio.run, stand_in(order_id="order_1"))


def test_a_tool_error_leaves_a_stand_in_with_the_stand_ins_frame_alone() -> None:
    # inspect formats the traceback of every failed tool call (its trace log); each frame
    # costs ~25 µs, the fault path's whole extra cost is a few hundred (docs/BENCHMARKS.md).
    ctx = _trial("order_1", fault="lost_reply")
    issue = bind_tools(refund_tools(ctx))[0]

    async def model_turn() -> None:
        await issue(order_id="order_1", amount=1.0)

    with pytest.raises(ToolError, match="outcome is unknown") as caught:
        asyncio.run(model_turn())
    names = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert names[-1] == "call", names  # the stand-in raised it, as the last frame
    assert "execute" not in names, names
    assert len(ctx.services.ledger.effects) == 1  # the refund was made, the reply lost
