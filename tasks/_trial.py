"""What every twice task shares: the per-trial setup solver and the task builder."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from inspect_ai import Task
from inspect_ai.dataset import Dataset, MemoryDataset
from inspect_ai.log import transcript
from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser
from inspect_ai.solver import Generate, Solver, TaskState, solver
from twice.assertions import EndStateCheck, side_effects
from twice.mocks import (
    Services,
    flush_ledger,
    forget_held_metadata,
    forget_stub_config,
    get_fault,
    keep_held_metadata,
    keep_ledger,
    keep_stub_config,
)

from ._context import TrialContexts
from ._conversation import compact, follow_up, has_mutating_result
from ._inspect_compat import store_events_suspended
from ._prompts import Prompt, is_builtin_prompt, load_prompt
from ._protections import get_protection
from ._sample_checks import ServicesFactory, ToolsFactory, check_mocks, check_samples
from ._toolkit import ActionLog, RunCrashed, TrialContext, bind_tools
from .agents import BUILTIN_AGENTS, REACT, AgentError, agent_solver, check_agent

MAX_RESTARTS = 3


class _PlanText(str):
    """A prompt's text that inspect's record of the solver's arguments (the ``plan`` in every
    log header, and inspect's ``logs.json``) shows by digest: a 10 MB prompt stays out of it."""

    digest: str

    def __new__(cls, prompt: Prompt) -> _PlanText:
        obj = super().__new__(cls, prompt.text)
        obj.digest = prompt.sha256
        return obj

    def _repr_params_(self) -> str:  # inspect's hook for logging a parameter
        return f"<prompt text: {len(self)} characters, sha256 {self.digest}>"


HELD_KEYS = ("plan", "state")
"""Sample metadata a twice task keeps out of its logged samples (:func:`hold_metadata`): the
stubs' gold plan and the services' starting state. Neither is shown to the model; the
dataset record holds both. The intents, which the verdict is about, stay."""


class HeldMetadata(Mapping[str | int, Mapping[str, Any]]):
    """By sample id, the metadata :func:`hold_metadata` took out of the samples.

    A mapping, not a dict, so that inspect logs the setup's parameter as a one-line summary.
    """

    def __init__(self, held: dict[str | int, Mapping[str, Any]]) -> None:
        self._held = held

    def __getitem__(self, sample_id: str | int) -> Mapping[str, Any]:
        return self._held[sample_id]

    def __iter__(self) -> Iterator[str | int]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def _repr_params_(self) -> str:  # inspect's hook for logging a solver parameter
        return f"<plans and starting states of {len(self)} samples>"


def hold_metadata(dataset: Dataset) -> tuple[Dataset, HeldMetadata | None]:
    """The dataset without :data:`HELD_KEYS` in its samples' metadata, and those by sample id.

    Inspect deep-copies a sample's metadata twice when the sample starts, logs it three
    times and walks it several more; the plan and the starting state were most of a twice
    trial's extra cost over a bare inspect trial (measured in docs/BENCHMARKS.md). The
    trial's setup gets them back (:func:`trial_setup`), and so do the scorer and end-state
    checks (:func:`twice.mocks.trial_metadata`).

    Samples are copied, never changed. A dataset with a sample without an id, or two samples
    with one id, is returned as it is (None for the held metadata).
    """
    samples = list(dataset)
    ids = [s.id for s in samples]
    if any(i is None for i in ids) or len(set(ids)) != len(ids):
        return dataset, None
    held: dict[str | int, Mapping[str, Any]] = {}
    lean = []
    for sample in samples:
        meta = dict(sample.metadata or {})
        held[sample.id] = {k: meta.pop(k) for k in HELD_KEYS if k in meta}  # type: ignore[index]
        lean.append(sample.model_copy(update={"metadata": meta}))
    out = MemoryDataset(
        lean, name=dataset.name, location=dataset.location, shuffled=dataset.shuffled
    )
    return out, HeldMetadata(held)


@dataclass(frozen=True)
class TaskParts:
    """What a twice task is made of, for code that runs its trials outside an eval.

    ``twice serve`` builds a trial from these: the sample's services and the tools bound to
    them (for MCP), and the end-state check its verdict needs.
    """

    name: str
    dataset: Dataset
    services: ServicesFactory
    tools: ToolsFactory
    end_state: EndStateCheck | None


TASK_PARTS: dict[str, TaskParts] = {}
"""The parts of every task built so far, by task name (filled by :func:`twice_task`)."""


@solver
def trial_setup(
    services: ServicesFactory,
    tools: ToolsFactory,
    fault: str,
    protection: str,
    prompt_name: str,
    prompt_text: str,
    action_log: bool | None = None,
    contexts: TrialContexts | None = None,
    held: HeldMetadata | None = None,
) -> Solver:
    """Start a trial: fresh services with the fault, tools under the protection, the prompt.

    Runs as the task's ``setup`` so every sample × epoch gets its own services and ledger.

    Args:
        services: Builds the trial's services from the sample's ``state``.
        tools: Builds the trial's tools from its context.
        fault: A fault name.
        protection: A protection name.
        prompt_name: The prompt's name (stubs read it).
        prompt_text: The system prompt.
        action_log: Keep a durable action log; None follows the protection.
        contexts: Where :func:`resumable_generate` finds the trial's context.
        held: The metadata :func:`hold_metadata` took out of the samples (None: all of it is
            in each sample's metadata).

    Raises:
        ValueError: for a tool that declares a compensation or verify tool not in the toolset.
    """
    fault_obj = get_fault(fault)
    protection_obj = get_protection(protection)
    keep_log = protection_obj.action_log if action_log is None else action_log

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        kept = held.get(state.sample_id) if held is not None else None
        if kept:
            keep_held_metadata(state, kept)
        metadata = {**state.metadata, **kept} if kept else state.metadata
        trial_services = Services(services(metadata.get("state", {})), fault=fault_obj)
        ctx = TrialContext(
            trial_services, protection_obj, action_log=ActionLog() if keep_log else None
        )
        state.tools = bind_tools(tools(ctx))
        ctx.check_tools()
        if contexts is not None:
            contexts[(state.sample_id, state.epoch)] = ctx
        state.messages.insert(0, ChatMessageSystem(content=prompt_text))
        stub_setup(state, prompt_name, metadata, prompt_text=prompt_text)
        keep_ledger(state, trial_services.ledger, ctx.sync)
        ledger_changes_once()
        return state

    return solve


def stub_setup(
    state: TaskState,
    prompt_name: str,
    metadata: Mapping[str, Any] | None = None,
    *,
    prompt_text: str | None = None,
) -> None:
    """Give a trial's stub models their script: the sample's gold plan (from ``metadata``,
    default the sample's), the prompt and the trial's seed (``"<sample id>:<epoch>:<prompt>"``,
    so reruns repeat).

    The stubs are told the prompt's name only when it is a built-in prompt's text: stub/noisy
    draws its retry rate from it, and a prompt file of the user's named ``cautious.md`` must not
    get the built-in ``cautious`` prompt's rate by its name alone. Without ``prompt_text``
    the name is taken as it is."""
    plan = (state.metadata if metadata is None else metadata).get("plan", [])
    builtin = prompt_text is None or is_builtin_prompt(prompt_name, prompt_text)
    shown = prompt_name if builtin else ""
    keep_stub_config(state, plan, shown, f"{state.sample_id}:{state.epoch}:{prompt_name}")


def ledger_changes_once() -> None:
    """Log the trial's store changes once, when the solvers end, not at every span.

    Inspect copies the whole store at the start and end of every span (each tool call, each
    solver) and logs the difference; enclosing spans log the same change again. A twice
    trial's store then held the stub's plan and the ledger, so this copying and the repeated
    changes were the largest part of twice's extra cost per trial over a bare inspect trial
    (measured in bench/, docs/BENCHMARKS.md). From here to the end of the sample, spans do not
    copy the store; the ``solvers`` span, opened before this, still logs the net change of
    the solvers once. The ledger itself reaches the store at the task's cleanup
    (:func:`~twice.mocks.keep_ledger`), after every span, so it is logged once, in the
    sample's final store.
    If a later inspect moves the switch, spans track as before.
    """
    if store_events_suspended is not None:  # the variable is per task
        store_events_suspended.set(True)


@solver
def resumable_generate(
    contexts: TrialContexts | None = None,
    max_restarts: int = MAX_RESTARTS,
    conversation: str | None = None,
    task: str = "",
) -> Solver:
    """The agent loop, with a checkpoint before every model turn.

    It runs the same loop as inspect's ``generate()`` (model turn, tool calls, until the model
    answers without calling a tool), one turn at a time. When a tool call ends the run
    (:class:`RunCrashed`, from the ``crash_after_commit`` fault), it restarts from the
    checkpoint: the conversation as it stood before the assistant turn that made the call,
    and the tool layer's step counter at that point. What the tool layer keeps durably (its
    action log, registered compensations) survives; the re-sent attempts carry the retry
    source ``resume``.

    A conversation fault changes the conversation between turns (``twice.tasks`` module
    ``_conversation``): ``ask_again`` adds the user's follow-up after the final answer and
    runs the loop once more; ``compaction`` compacts the conversation once the result of a
    mutating call is in it. Repeated calls then carry the retry source ``user`` or
    ``compaction``.

    Args:
        contexts: The task's live trial contexts (filled by :func:`trial_setup`).
        max_restarts: Restarts allowed per trial before the crash fails the sample.
        conversation: ``ask_again``, ``compaction``, both (``compaction+ask_again``) or None
            (the conversation is left alone).
        task: The task's name (the follow-up names its action).
    """

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        key = (state.sample_id, state.epoch)
        asked = compacted = False
        faults = (conversation or "").split("+")
        try:
            while True:
                mark = len(state.messages)
                ctx = contexts.get(key) if contexts is not None else None
                calls = ctx.calls if ctx is not None else 0
                try:
                    state = await generate(state, tool_calls="single")
                except RunCrashed as crash:
                    if crash.ctx.restarts >= max_restarts:
                        raise RuntimeError(
                            f"the run crashed {crash.ctx.restarts + 1} times; giving up after "
                            f"{max_restarts} restarts"
                        ) from crash
                    del state.messages[mark:]
                    crash.ctx.restart(calls)
                    transcript().info(
                        f"twice: run crashed after call {crash.call} ({crash.route}) committed; "
                        f"restarting from the checkpoint before it ({mark} messages, "
                        f"step counter {calls})"
                    )
                    continue
                if (
                    "compaction" in faults
                    and not compacted
                    and ctx is not None
                    and not state.completed
                    and has_mutating_result(ctx)
                ):
                    compacted = True
                    before = len(state.messages)
                    state.messages = await compact(state.messages)
                    ctx.repeat_source = "compaction"
                    transcript().info(
                        f"twice: compacted the conversation ({before} messages, tool results "
                        "removed) after the first mutating call's result came back"
                    )
                    continue
                last = state.messages[-1] if state.messages else None
                if state.completed or (
                    isinstance(last, ChatMessageAssistant) and not last.tool_calls
                ):
                    if "ask_again" in faults and not asked and not state.completed:
                        asked = True
                        text = follow_up(task, state.sample_id, state.epoch)
                        state.messages.append(ChatMessageUser(content=text))
                        if ctx is not None:
                            ctx.repeat_source = "user"
                        transcript().info(f"twice: the user asks again: {text!r}")
                        continue
                    return state
                if isinstance(last, ChatMessageAssistant):
                    # Tool calls were not resolved (should not happen with "single").
                    return state
        finally:
            if contexts is not None:
                contexts.pop(key, None)

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
    action_log: bool | None = None,
    agent: str = REACT,
    mocks: dict[str, str] | None = None,
) -> Task:
    """Build a twice task: the shape every task folder shares.

    Args:
        name: Task name (the folder name).
        dataset: Samples whose metadata carries ``state``, ``intents`` and ``plan``. The task
            keeps the plan and the state out of the samples it logs (:func:`hold_metadata`);
            the setup, the scorer and the end-state check still get them.
        services: Builds the trial's services from the sample's ``state``.
        tools: Builds the trial's tools from its context.
        fault: A fault name (``twice list``).
        protection: A protection name.
        prompt: A built-in prompt name or a prompt file path.
        end_state: Optional end-state check for the scorer.
        message_limit: Hard stop for agents that loop.
        action_log: Keep a durable action log (True/False); None follows the protection
            (only ``declared`` keeps one). Recorded as ``action_log`` in the task metadata.
        agent: The agent under test: ``react`` (twice's own loop and tool layer), a built-in
            framework agent, or ``path.py:function`` / ``module:function``.
        mocks: For an agent other than ``react``: production URL by service name; the agent's
            httpx requests there are served by the trial's services.

    Raises:
        ValueError: for an unknown fault, protection, prompt or agent, naming the accepted
            values; a combination an agent other than ``react`` cannot run
            (:class:`~twice.tasks.agents.AgentError`); or a sample whose ``state`` the
            services do not take (a misspelt key).
    """
    get_fault(fault)
    check_agent_cell(agent, name, fault, protection, mocks)
    data = dataset_digest(dataset)
    check_samples(name, dataset, services, tools, protection, data)
    check_mocks(dataset, services, mocks)
    protection_obj = get_protection(protection)
    if action_log is not None and not isinstance(action_log, bool):
        raise ValueError(f"action_log must be true or false, got {action_log!r}")
    p = load_prompt(prompt)
    TASK_PARTS[name] = TaskParts(name, dataset, services, tools, end_state)
    lean, held = hold_metadata(dataset)
    contexts: TrialContexts = {}
    loop = (
        resumable_generate(contexts, conversation=get_fault(fault).conversation, task=name)
        if agent == REACT
        else agent_solver(
            agent,
            contexts,
            name,
            p.text,
            mocks,
            _agent_follow_up(name, fault),
            compaction=get_fault(fault).changes("compaction"),
        )
    )
    return Task(
        name=name,
        dataset=lean,
        setup=trial_setup(
            services, tools, fault, protection, p.name, _PlanText(p), action_log, contexts, held
        ),
        solver=loop,
        scorer=side_effects(end_state),
        cleanup=_store_the_ledger,
        message_limit=message_limit,
        metadata={
            "twice": {
                "task": name,
                "fault": fault,
                "protection": protection,
                "action_log": protection_obj.action_log if action_log is None else action_log,
                "agent": agent,
                # Who makes the HTTP calls: twice's tool layer (the protection applies) or the
                # agent's own tools (called bare: the protection axis is always "bare").
                "tool_layer": "twice" if agent == REACT else "agent",
                "dataset": data,
                **prompt_metadata(p),
            }
        },
    )


def _agent_follow_up(task: str, fault: str) -> Callable[[str | int, int], str] | None:
    """The follow-up an agent under test is asked again with, under ``ask_again``."""
    if not get_fault(fault).changes("ask_again"):
        return None
    return lambda sample_id, epoch: follow_up(task, sample_id, epoch)


def dataset_digest(dataset: Dataset) -> str:
    """The first 12 hex digits of a sha256 over every sample, plans and states included: in a
    task of the user's own, part of its version, so editing its dataset makes the logs of the
    old samples stale instead of reused on resume."""
    digest = hashlib.sha256()
    for sample in dataset:
        record = sample.model_dump(mode="json", exclude_none=True)
        digest.update(json.dumps(record, sort_keys=True, default=str).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:12]


def twice_metadata(task: Task) -> dict[str, Any] | None:
    """The ``twice`` metadata of a task :func:`twice_task` built (its fault, protection, ...);
    None for a task built otherwise, which has no mock services, ledger or side-effect scorer."""
    meta = (task.metadata or {}).get("twice")
    return meta if isinstance(meta, dict) and "fault" in meta else None


async def _store_the_ledger(state: TaskState) -> None:
    """The task's cleanup: inspect runs it after scoring, and also when the trial failed
    before scoring, so the ledger reaches the log either way."""
    flush_ledger(state)
    forget_stub_config(state)
    forget_held_metadata(state)


def prompt_metadata(p: Prompt) -> dict[str, Any]:
    """What a twice eval's metadata (``metadata["twice"]``) says about its prompt.

    Its name and source, and a digest, the size and an excerpt of its text, not the text:
    every log header (and inspect's ``logs.json`` listing) carries this, so a 10 MB prompt is
    not copied into each. The report shows the excerpt; the digest tells prompts apart.
    """
    return {
        "prompt": p.name,
        "prompt_source": p.source,
        "prompt_sha256": p.sha256,
        "prompt_text": p.excerpt,
        "prompt_bytes": p.size,
    }


AGENT_FAULTS_REFUSED = ("crash_after_commit",)
"""Faults only twice's own loop can run: restarting a run from a checkpoint needs its loop."""


def check_agent_cell(
    agent: str, task: str, fault: str, protection: str, mocks: dict[str, str] | None = None
) -> None:
    """Check that ``agent`` can run a cell: what an agent other than ``react`` cannot do.

    An agent other than ``react`` calls the services with its own tools, so twice's tool layer
    (and the protection it applies) is not in the path: the only protection is ``bare``.

    Raises:
        AgentError: naming the bad value and what is accepted.
    """
    if agent == REACT:
        if mocks:
            raise AgentError(
                "--mock applies to an agent under test (--agent path.py:function ...), not to "
                f"twice's own loop {REACT!r}"
            )
        return
    check_agent(agent, task)
    if protection != "bare":
        raise AgentError(
            f"protection {protection!r} is twice's own tool layer, which only the {REACT!r} "
            f"agent uses; agent {agent!r} calls the services with its own tools, so its cells "
            "run with protection 'bare' (put it in a [[matrix]] block of its own)"
        )
    if fault in AGENT_FAULTS_REFUSED:
        raise AgentError(
            f"fault {fault!r} restarts the run from twice's checkpoints, which only the "
            f"{REACT!r} agent has; agent {agent!r} accepts the other faults"
        )
    builtin = BUILTIN_AGENTS.get(agent)
    if get_fault(fault).changes("ask_again") and builtin and not builtin.keeps_history:
        raise AgentError(
            f"fault {fault!r} asks the agent again in the same session, and the built-in agent "
            f"{agent!r} does not pass the session's earlier turns to its framework (a fresh run "
            "would be read as a second request); agents that do: "
            + ", ".join(n for n, b in BUILTIN_AGENTS.items() if b.keeps_history)
        )
