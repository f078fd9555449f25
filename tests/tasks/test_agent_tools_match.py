"""The built-in framework agents' tools offer the model what twice's own tools offer.

The stub models' plans name tools and arguments, and a prompt comparison across agents is
only fair if every agent is shown the same tools: same names, descriptions and parameters.
The two tool sets are written separately (the agents' are plain httpx code, no tool layer),
so this is what keeps them from drifting apart.
"""

from __future__ import annotations

import httpx
import pytest
from inspect_ai.tool import ToolDef
from twice.mocks import Services, get_fault
from twice.tasks import task_parts
from twice.tasks._protections import get_protection
from twice.tasks._toolkit import TrialContext
from twice.tasks.agents._apis import API_TOOLS


def _schemas(tools: list[object]) -> dict[str, tuple[str, dict[str, object]]]:
    out = {}
    for t in tools:
        d = ToolDef(t)  # type: ignore[arg-type]
        out[d.name] = (d.description, d.parameters.model_dump())
    return out


@pytest.mark.parametrize("task", sorted(API_TOOLS))
def test_agent_tools_have_the_react_tools_names_descriptions_and_parameters(task: str) -> None:
    parts = task_parts(task)
    sample = next(iter(parts.dataset))
    state = (sample.metadata or {}).get("state", {})
    ctx = TrialContext(Services(parts.services(state), fault=get_fault("none")),
                       get_protection("bare"))  # fmt: skip
    react = _schemas(parts.tools(ctx))
    urls = {name: "http://127.0.0.1:9" for name in ctx.services.services}
    agent = _schemas(API_TOOLS[task](httpx.AsyncClient(), urls))
    assert agent == react


def test_implements_refuses_a_tool_whose_signature_differs_from_its_interface() -> None:
    from twice.tasks import _interfaces as api
    from twice.tasks._interfaces import implements

    async def issue_refund(order_id: str, amount: float) -> str:  # no `reason`
        return ""

    with pytest.raises(TypeError, match=r"issue_refund.*does not match its interface"):
        implements(api.issue_refund)(issue_refund)

    async def refund(order_id: str, amount: float, reason: str = "") -> str:  # another name
        return ""

    with pytest.raises(TypeError, match="does not match"):
        implements(api.issue_refund)(refund)

    async def issue_refund_ok(order_id: str, amount: float, reason: str = "") -> str:
        return ""

    issue_refund_ok.__name__ = "issue_refund"
    assert implements(api.issue_refund)(issue_refund_ok).__doc__ == api.issue_refund.__doc__
    # The check is remembered per code and signature, not per interface: a mismatch made
    # after a match (the next trial's closure) is still refused, every time.
    for _ in range(2):
        with pytest.raises(TypeError, match="does not match"):
            implements(api.issue_refund)(issue_refund)


def test_implements_checks_a_closure_made_per_trial_once() -> None:
    from twice.tasks import _interfaces as api
    from twice.tasks._interfaces import _MATCHED, implements

    def make(default: str) -> object:
        async def issue_refund(order_id: str, amount: float, reason: str = default) -> str:
            return ""

        return implements(api.issue_refund)(issue_refund)

    make("")
    before = len(_MATCHED)
    make("")  # the next trial's closure: same code, same signature
    assert len(_MATCHED) == before
    with pytest.raises(TypeError, match="does not match"):
        make("x")  # same code, another default: another signature
