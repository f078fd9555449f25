"""What every twice task shares: the per-trial setup solver and the task builder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_ai import Task
from inspect_ai.dataset import Dataset
from inspect_ai.model import ChatMessageSystem
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver
from inspect_ai.tool import Tool
from inspect_ai.util import store

from assertions import EndStateCheck, side_effects
from mocks import STUB_STORE_KEY, Service, Services, get_fault

from ._prompts import load_prompt
from ._protections import get_protection
from ._toolkit import TrialContext

ServicesFactory = Callable[[dict[str, Any]], list[Service]]
"""Builds a trial's services from the sample's ``state`` (fresh objects every call)."""
ToolsFactory = Callable[[TrialContext], list[Tool]]
"""Builds a trial's tools bound to its context."""


@solver
def trial_setup(
    services: ServicesFactory,
    tools: ToolsFactory,
    fault: str,
    protection: str,
    prompt_name: str,
    prompt_text: str,
) -> Solver:
    """Start a trial: fresh services with the fault, tools under the protection, the prompt.

    Runs as the task's ``setup`` so every sample × epoch gets its own services and ledger.
    """
    fault_obj = get_fault(fault)
    protection_obj = get_protection(protection)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        trial_services = Services(services(state.metadata.get("state", {})), fault=fault_obj)
        ctx = TrialContext(trial_services, protection_obj)
        state.tools = tools(ctx)
        state.messages.insert(0, ChatMessageSystem(content=prompt_text))
        store().set(
            STUB_STORE_KEY,
            {
                "plan": state.metadata.get("plan", []),
                "prompt": prompt_name,
                "seed": f"{state.sample_id}:{state.epoch}:{prompt_name}",
            },
        )
        ctx.sync()
        return state

    return solve


def twice_task(
    *,
    name: str,
    dataset: Dataset,
    services: ServicesFactory,
    tools: ToolsFactory,
    fault: str,
    protection: str,
    prompt: str,
    end_state: EndStateCheck | None = None,
    message_limit: int = 30,
) -> Task:
    """Build a twice task: the shape every task folder shares.

    Args:
        name: Task name (the folder name).
        dataset: Samples whose metadata carries ``state``, ``intents`` and ``plan``.
        services: Builds the trial's services from the sample's ``state``.
        tools: Builds the trial's tools from its context.
        fault: A fault name (``twice list``).
        protection: A protection name.
        prompt: A built-in prompt name or a prompt file path.
        end_state: Optional end-state check for the scorer.
        message_limit: Hard stop for agents that loop.

    Raises:
        ValueError: for an unknown fault, protection or prompt, naming the accepted values.
    """
    get_fault(fault)
    get_protection(protection)
    p = load_prompt(prompt)
    return Task(
        name=name,
        dataset=dataset,
        setup=trial_setup(services, tools, fault, protection, p.name, p.text),
        solver=generate(),
        scorer=side_effects(end_state),
        message_limit=message_limit,
        metadata={
            "twice": {
                "task": name,
                "fault": fault,
                "protection": protection,
                "prompt": p.name,
                "prompt_source": p.source,
                "prompt_sha256": p.sha256,
                "prompt_text": p.text,
            }
        },
    )
