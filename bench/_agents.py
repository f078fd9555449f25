"""What a built-in framework agent costs per trial, over twice's own loop (``react``).

Every agent of the registry of built-in agents (``BUILTIN_AGENTS``) whose framework is
installed is measured; the others are named as skipped. Both run the refund task under fault
``none`` with ``stub/retry`` (one tool call, then an answer: the same turns for every agent),
interleaved in this process. The figure is CPU per trial of the framework agent over react's:
the framework, the agent bridge's translation of each model call to and from the OpenAI wire
format, and the per-trial host routing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import Paired, paired
from _trials import _runner, scratch_dir
from inspect_ai.model import get_model
from twice.evals.run import gc_for_trials
from twice.tasks import refund
from twice.tasks.agents import BUILTIN_AGENTS, AgentError, check_agent


def installed_agents() -> tuple[list[str], dict[str, str]]:
    """The built-in agents whose frameworks are installed, and why each other one is not."""
    runnable: list[str] = []
    skipped: dict[str, str] = {}
    for name in BUILTIN_AGENTS:
        try:
            check_agent(name, "refund")
        except AgentError as ex:
            skipped[name] = str(ex)
        else:
            runnable.append(name)
    return runnable, skipped


def agent_overhead(
    work: Path, epochs: int, reps: int, limit: int | None, agents: list[str]
) -> tuple[dict[str, float], dict[str, Paired]]:
    """CPU per trial of each of ``agents`` over react's (ratio per agent) and the raw pairs."""
    model = get_model("stub/retry")
    extra: dict[str, Any] = {"limit": limit} if limit else {}
    ratios: dict[str, float] = {}
    pairs: dict[str, Paired] = {}
    with scratch_dir(work, "agents") as logs, gc_for_trials():
        react = _runner(lambda: refund(fault="none"), model, epochs, logs, **extra)
        for name in agents:
            subject = _runner(
                lambda name=name: refund(fault="none", agent=name),  # type: ignore[misc]
                model,
                epochs,
                logs,
                **extra,
            )
            pairs[name] = paired(react, subject, reps)
            ratios[name] = pairs[name].ratio()
    return ratios, pairs
