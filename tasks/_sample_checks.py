"""Checks a task's samples pass when the task is built, so a bad sample fails it, named,
instead of every trial quietly: services that build, intents on effects they make, a gold
plan that calls the trial's tools with arguments they take, ``--mock`` services that exist."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inspect_ai.dataset import Dataset
from inspect_ai.tool import Tool, ToolDef
from twice.mocks import Service, Services

from ._dataset import ASSERTIONS_IGNORED
from ._protections import get_protection
from ._toolkit import TrialContext
from .agents import parse_hosts

ServicesFactory = Callable[[dict[str, Any]], list[Service]]
"""Builds a trial's services from the sample's ``state`` (fresh objects every call)."""
ToolsFactory = Callable[[TrialContext], list[Tool]]
"""Builds a trial's tools bound to its context."""

_CHECKED: set[tuple[Any, ...]] = set()
"""Datasets :func:`check_samples` passed (with their factories): every cell of a suite builds
its task again, and a dataset that passed once passes again."""


def check_samples(
    name: str,
    dataset: Dataset,
    services: ServicesFactory,
    tools: ToolsFactory,
    protection: str,
    digest: str,
) -> None:
    """Check every sample against what its trial will have, once, so a bad sample fails the
    task when built, naming it, instead of every trial quietly.

    A sample's ``state`` must build its services (no misspelt key); each intent must name an
    effect those services make (an intent on a foreign effect counts nothing, so a control
    that duplicates every time would score 0%); each step of the gold plan must call a tool
    the trial has, with arguments it takes (a stub following a misspelt plan fails every
    turn, and stub/retry would never duplicate). ``digest`` is the dataset's digest: with
    the factories, it says whether it passed before.
    """
    key = (name, services, tools, protection, digest)
    if key in _CHECKED:
        return
    for sample in dataset:
        metadata = sample.metadata or {}
        if "assertions" in metadata:
            # Read only by the side_effect_assertions scorer; a twice task scores its
            # intents, so these would sit in the sample unchecked (a trial that broke them
            # counted as safe), whoever built the dataset (load_dataset or inspect's own).
            raise ValueError(f"task {name!r}, sample {sample.id!r}: {ASSERTIONS_IGNORED}")
        try:
            built = list(services(metadata.get("state", {})))
        except (TypeError, ValueError) as ex:
            raise ValueError(f"task {name!r}, sample {sample.id!r}: {ex}") from None
        made = {r.name for service in built for r in service.routes() if r.mutating}
        for intent in metadata.get("intents") or []:
            effect = intent.get("effect") if isinstance(intent, dict) else None
            if effect not in made:
                raise ValueError(
                    f"task {name!r}, sample {sample.id!r}: intent effect {effect!r} is not an "
                    f"effect its services make; they make: {', '.join(sorted(made)) or 'none'} "
                    "(an effect is named after the route that makes it, declared "
                    "Route(..., mutating=True))"
                )
        plan = metadata.get("plan") or []
        if plan:
            ctx = TrialContext(Services(built), get_protection(protection))
            problem = plan_problem(plan, _signatures(tools(ctx)))
            if problem:
                raise ValueError(f"task {name!r}, sample {sample.id!r}: {problem}")
    _CHECKED.add(key)


def check_mocks(dataset: Dataset, services: ServicesFactory, mocks: dict[str, str] | None) -> None:
    """Check ``--mock SERVICE=URL`` against every sample's services now (as each trial would,
    :func:`~twice.tasks.agents.parse_hosts`): a service the task does not have is a usage
    error when the task is built, not an error in every trial."""
    if not mocks:
        return
    for sample in dataset:
        built = Services(list(services((sample.metadata or {}).get("state", {}))))
        parse_hosts(mocks, {n: s.base_url for n, s in built.services.items()})


def _signatures(tools: list[Tool]) -> dict[str, tuple[set[str], set[str]]]:
    """Each tool's name: (the arguments it takes, the ones it requires)."""
    found = {}
    for t in tools:
        tdef = ToolDef(t)
        found[tdef.name] = (set(tdef.parameters.properties), set(tdef.parameters.required))
    return found


def plan_problem(plan: list[Any], tools: Mapping[str, tuple[set[str], set[str]]]) -> str | None:
    """What is wrong with a gold plan for these tools (name: (takes, requires)), or None.

    Checks every call a stub makes from it (``call``, ``verify``, ``compensate``) and the
    arguments ``drift`` overrides. Steps are numbered from 0, as the dataset's own errors do.
    """
    names = ", ".join(sorted(tools)) or "none"
    for i, step in enumerate(plan):
        if not isinstance(step, Mapping):
            continue  # the dataset's own validation names malformed steps
        for part in ("call", "verify", "compensate"):
            call = step.get(part)
            if not isinstance(call, Mapping):
                continue
            tool, args = str(call.get("tool")), call.get("args") or {}
            where = f"plan step {i} {part!r} calls {tool!r}"
            if tool not in tools:
                return f"{where}, which is not a tool of the task; its tools are: {names}"
            takes, requires = tools[tool]
            extra = sorted(set(args) - takes)
            if extra:
                return (
                    f"{where} with argument {extra[0]!r}, which it does not take; it takes: "
                    f"{', '.join(sorted(takes)) or 'nothing'}"
                )
            missing = sorted(requires - set(args))
            if missing:
                return f"{where} without its required argument {missing[0]!r}"
        call = step.get("call")
        drift = step.get("drift") or {}
        if isinstance(call, Mapping) and call.get("tool") in tools:
            takes = tools[call["tool"]][0]
            extra = sorted(set(drift) - takes)
            if extra:
                return (
                    f"plan step {i} 'drift' changes argument {extra[0]!r}, which "
                    f"{call['tool']!r} does not take; it takes: {', '.join(sorted(takes))}"
                )
    return None
