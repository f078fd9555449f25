"""More built-in framework agents: AutoGen AgentChat, Agno, Google ADK, smolagents and Strands,
each with its defaults and with the retry or tool-error setting its framework documents.

Written as ``_builtin``'s are: the framework's own idioms, the task's tools from ``_apis``
handed over the way the framework's docs hand over plain functions, and the model reached as
``ctx.model`` (``inspect``) through a client the agent bridge answers. Each docstring states
what the framework does with a tool that raised, with the line of its source that does it
(in the version the ``frameworks`` extra was tested with).

They run one request each, with no session: ``ask_again`` (which needs the session's earlier
turns) is refused for them (``BuiltinAgent.keeps_history``).

Framework imports are inside the functions: the packages are the optional ``frameworks`` extra
(Strands: the ``strands`` extra, whose mcp pin conflicts with ``serve``'s).

As in ``_builtin``, what a framework lets an application build once is built once per process
and task (cached builders over :func:`shared_tools`): the framework's tool objects and the
model clients that keep nothing of a run, each of which would otherwise load the CA bundle
again. The tools send with the running trial's client (:func:`with_trial_client`). What keeps
a conversation or a run's state (AutoGen's ``AssistantAgent``, Agno's ``Agent``, ADK's runner
and session, smolagents' agent) is still made per trial.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
import warnings
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from ._apis import ApiTool
from ._builtin import MAX_TURNS, _openai_client, shared_tools, urls_key, with_trial_client
from ._context import AgentContext

T = TypeVar("T")

Urls = tuple[tuple[str, str], ...]


# -- AutoGen AgentChat ------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _autogen_tools(task: str, urls: Urls) -> list[Any]:
    """The tools as ``FunctionTool``s (``AssistantAgent`` would wrap plain functions again,
    schema and all, for every agent); a ``FunctionTool`` keeps nothing of a call."""
    from autogen_core.tools import FunctionTool

    return [FunctionTool(fn, description=fn.__doc__ or "") for fn in shared_tools(task, urls)]


@functools.lru_cache(maxsize=8)
def _autogen_model_client(model: str) -> Any:
    """The model client, one per process: it keeps no conversation (``AssistantAgent`` holds
    the model context), only running token totals nobody reads here, and it is never closed
    by a run, as an application keeps one client for all its agents."""
    from autogen_core.models import ModelFamily, ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    # A model name OpenAI does not know needs its capabilities stated (autogen's docs).
    info = ModelInfo(
        vision=False,
        function_calling=True,
        json_output=False,
        family=ModelFamily.UNKNOWN,
        structured_output=False,
    )
    return OpenAIChatCompletionClient(model=model, model_info=info, max_retries=0)


async def _autogen(request: str, ctx: AgentContext, *, reflect: bool) -> str:
    from autogen_agentchat.agents import AssistantAgent

    # autogen warns when a reply names another model than the request; through the bridge
    # it always does (``inspect`` is answered by the eval's model).
    warnings.filterwarnings("ignore", "Resolved model mismatch", UserWarning)
    async with with_trial_client():
        # Per trial: the agent keeps the conversation (its model context) between runs.
        agent = AssistantAgent(
            name="support_agent",
            model_client=_autogen_model_client(ctx.model),
            tools=list(_autogen_tools(ctx.task, urls_key(ctx.urls))),
            system_message=ctx.instructions,
            reflect_on_tool_use=reflect,
            # With reflection the model answers after each tool result; allowing more
            # iterations lets it call a tool again, as the other agents' loops do.
            max_tool_iterations=MAX_TURNS if reflect else 1,
        )
        result = await agent.run(task=request)
        last = result.messages[-1]
        return str(getattr(last, "content", last))


async def autogen(request: str, ctx: AgentContext) -> str:
    """AutoGen AgentChat: ``AssistantAgent`` with plain async tools, default settings.

    A tool that raises becomes a tool result with ``is_error=True`` and ``str(exception)``
    (``autogen_core/tools/_static_workbench.py:121-123``); with the defaults
    ``reflect_on_tool_use=False`` and ``max_tool_iterations=1``
    (``autogen_agentchat/agents/_assistant_agent.py:738-739``) the run ends with that result
    as its answer: the model never sees the error, so it cannot retry (nor verify).
    """
    return await _autogen(request, ctx, reflect=False)


async def autogen_reflect(request: str, ctx: AgentContext) -> str:
    """AutoGen AgentChat with ``reflect_on_tool_use=True``: the model reads each tool result.

    The tool error reaches the model as ``str(exception)`` (``_static_workbench.py:121-123``)
    and the model decides what to do; AutoGen retries no tool call by itself.
    """
    return await _autogen(request, ctx, reflect=True)


# -- Agno -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _agno_tools(task: str, urls: Urls) -> list[Any]:
    """The tools as Agno ``Function``s; each run takes its own copy of each
    (``Function._per_run_copy``), so the derived schemas are shared, not the run's state."""
    from agno.tools.function import Function

    return [Function.from_callable(fn) for fn in shared_tools(task, urls)]


@functools.lru_cache(maxsize=8)
def _agno_model(model: str) -> Any:
    """The model, one per process: an ``OpenAIChat`` holds its settings and its OpenAI clients
    (made on first use and kept), nothing of a run."""
    from agno.models.openai import OpenAIChat
    from agno.utils.log import agent_logger

    # Agno logs every tool call that raised, with its traceback, to stdout (log_exception
    # ignores its own set_log_tracebacks, and every run sets the level back to INFO): under a
    # fault that is every trial, mixed into twice's own output. The failure is in the
    # trial's transcript and ledger already.
    agent_logger.disabled = True
    return OpenAIChat(id=model, max_retries=0)


async def _agno(request: str, ctx: AgentContext, *, retries: int) -> str:
    from agno.agent import Agent

    async with with_trial_client():
        # Per trial: an Agent keeps the state of its runs (its session, the tools and tool
        # instructions it resolved for the run), which concurrent trials must not share.
        agent = Agent(
            model=_agno_model(ctx.model),
            instructions=ctx.instructions,
            tools=list(_agno_tools(ctx.task, urls_key(ctx.urls))),
            retries=retries,
            delay_between_retries=0,
            telemetry=False,  # it would report the run to agno's servers
        )
        # arun(): Agent.run() uses the synchronous OpenAI client, which the bridge does not
        # answer.
        result = await agent.arun(request)
        return str(result.content)


async def agno(request: str, ctx: AgentContext) -> str:
    """Agno: ``Agent`` on ``OpenAIChat`` with plain async tools, run with ``arun()``.

    A tool that raises becomes a failed function result whose text, ``str(exception)``, is
    sent to the model as the tool message (``agno/tools/function.py:3001-3005``,
    ``agno/models/base.py:2192-2198``); Agno retries no tool call by itself.
    """
    return await _agno(request, ctx, retries=0)


async def agno_retries(request: str, ctx: AgentContext) -> str:
    """Agno with ``Agent(retries=2)``: the whole run is re-run when it raises.

    ``retries`` re-runs the entire run on an exception (``arun``: ``agno/agent/_run.py:1571``,
    ``:1898-1909``), but a tool's exception never reaches it: it is caught and shown to the
    model first (``agno/tools/function.py:3001-3005``). A lost tool reply is handled as by
    ``agno``.
    """
    return await _agno(request, ctx, retries=2)


# -- Google ADK -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _adk_agent(task: str, urls: Urls, model: str, instructions: str) -> Any:
    """The agent, one per process and task: an ``LlmAgent`` is configuration (its state lives
    in the runner's session), and its tools are ``FunctionTool``s made here once (ADK would
    wrap plain functions again at every model request). Its ``OpenAILlm`` makes its OpenAI
    client once (a cached property) and keeps it."""
    from google.adk.agents import LlmAgent
    from google.adk.integrations.openai import OpenAILlm
    from google.adk.tools.function_tool import FunctionTool

    return LlmAgent(
        name="support_agent",
        model=OpenAILlm(model=model),
        instruction=instructions,
        tools=[FunctionTool(fn) for fn in shared_tools(task, urls)],
    )


async def _adk(request: str, ctx: AgentContext, *, reflect: bool) -> str:
    from google.adk.plugins import BasePlugin
    from google.adk.plugins.reflect_retry_tool_plugin import ReflectAndRetryToolPlugin
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    async with with_trial_client():
        agent = _adk_agent(ctx.task, urls_key(ctx.urls), ctx.model, ctx.instructions)
        # Per trial: the runner holds the session service (the conversation) and the plugin
        # its failure counts.
        plugins: list[BasePlugin] = [ReflectAndRetryToolPlugin()] if reflect else []
        runner = InMemoryRunner(agent=agent, app_name="twice", plugins=plugins)
        session = await runner.session_service.create_session(app_name="twice", user_id="user")
        message = types.Content(role="user", parts=[types.Part(text=request)])
        answer = ""
        try:
            async for event in runner.run_async(
                user_id="user", session_id=session.id, new_message=message
            ):
                if event.is_final_response() and event.content and event.content.parts:
                    answer = "".join(p.text or "" for p in event.content.parts)
        finally:
            await runner.close()
        return answer


async def google_adk(request: str, ctx: AgentContext) -> str:
    """Google ADK: ``LlmAgent`` on ``OpenAILlm`` with plain async tools, ``InMemoryRunner``.

    A tool that raises is offered to ``on_tool_error_callback`` (of the agent or a plugin);
    with none set, the exception is re-raised and the whole run aborts
    (``google/adk/flows/llm_flows/tools/_caller.py:582-595``): the model never sees it.
    """
    return await _adk(request, ctx, reflect=False)


async def google_adk_reflect(request: str, ctx: AgentContext) -> str:
    """Google ADK with ``ReflectAndRetryToolPlugin()``, its documented tool-error plugin.

    The plugin's ``on_tool_error_callback`` turns a tool's exception into a result for the
    model, ``{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN", "error_type": ...}``
    with guidance ("Do not repeat the exact same call"), and counts failures up to
    ``max_retries=3`` (``google/adk/plugins/reflect_retry_tool_plugin.py:197-218``, ``:311``):
    whether to call the tool again is the model's decision; ADK re-sends nothing by itself.
    """
    return await _adk(request, ctx, reflect=True)


# -- smolagents -------------------------------------------------------------------------------


_TRIAL_LOOP: ContextVar[asyncio.AbstractEventLoop] = ContextVar("twice_smolagents_trial_loop")


def _on_loop(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` on the trial's event loop from the agent's worker thread, and wait.

    The loop is read at call time from the context, which ``asyncio.to_thread`` copied from
    the trial's: what calls this (the tools, the model's client) is made once per process
    and serves every trial, each on its own loop. The coroutine runs in the thread's context
    (``call_soon_threadsafe`` copies it): the bridge and the trial's services serve it as
    they serve the agent's own awaits."""

    async def run() -> T:
        return await awaitable

    return asyncio.run_coroutine_threadsafe(run(), _TRIAL_LOOP.get()).result()


@functools.cache
def _bridged_openai() -> Any:
    """A synchronous ``openai.OpenAI`` class whose requests the agent bridge answers.

    The bridge answers the *async* client only; a framework that calls the sync client (as
    smolagents' ``OpenAIServerModel`` does) would reach the network. Each request of this
    client is sent by the process's ``AsyncOpenAI`` on the trial's event loop instead, where
    the bridge (and twice's guard: no streaming, model ``inspect`` only) sees it like any
    other."""
    import openai

    class BridgedOpenAI(openai.OpenAI):
        def request(  # type: ignore[override]
            self, cast_to: Any, options: Any, *, stream: bool = False, stream_cls: Any = None
        ) -> Any:
            return _on_loop(_openai_client().request(cast_to, options, stream=stream))

    return BridgedOpenAI


def _sync_tool(fn: ApiTool) -> Callable[..., str]:
    """``fn`` as the synchronous function a smolagents ``@tool`` wraps (same name, signature
    and docstring; smolagents calls tools from its own synchronous loop)."""

    def call(*args: Any, **kwargs: Any) -> str:
        return _on_loop(fn(*args, **kwargs))

    # smolagents reads the tool's source (a plain ``def``, no decorator but its own) and its
    # type hints: this function's own source, and ``fn``'s name, docstring, signature and
    # resolved hints.
    functools.update_wrapper(call, fn)
    delattr(call, "__wrapped__")
    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    call.__annotations__ = typing.get_type_hints(fn)
    return call


@functools.lru_cache(maxsize=64)
def _smolagents_tools(task: str, urls: Urls) -> list[Any]:
    """The ``@tool`` objects (their schemas are read from the source and hints): a smolagents
    ``Tool`` keeps nothing of a call, and these find the trial's loop when called."""
    from smolagents import tool

    return [tool(_sync_tool(fn)) for fn in shared_tools(task, urls)]


@functools.lru_cache(maxsize=8)
def _smolagents_model(model: str) -> Any:
    """The model, one per process: an ``OpenAIServerModel`` holds its settings and its
    client (made in its constructor: a CA bundle each time), and keeps nothing of a run
    (the agent holds the memory). Its client finds the trial's loop per request."""
    from smolagents import OpenAIServerModel

    client_class = _bridged_openai()

    class BridgedModel(OpenAIServerModel):  # type: ignore[misc]
        def create_client(self) -> Any:
            return client_class(**self.client_kwargs)

    return BridgedModel(model_id=model)


@functools.cache
def _smolagents_prompts() -> Any:
    """``ToolCallingAgent``'s default prompt templates, which it would parse from their YAML
    file for every agent (more CPU than the rest of the agent); agents only read them."""
    import importlib.resources

    import yaml

    text = importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml")
    return yaml.safe_load(text.read_text())


@functools.cache
def _smolagents_agent_class() -> Any:
    """``ToolCallingAgent`` with its system prompt rendered once per process for each set of
    tools and instructions: smolagents compiles the prompt's Jinja template every time it
    reads it (twice a run), though the text depends only on these."""
    from smolagents import ToolCallingAgent

    prompts: dict[tuple[Any, ...], str] = {}

    class Agent(ToolCallingAgent):  # type: ignore[misc]
        def initialize_system_prompt(self) -> str:
            key = (
                self.prompt_templates["system_prompt"],
                self.instructions,
                tuple(t.to_tool_calling_prompt() for t in self.tools.values()),
                tuple(self.managed_agents),
            )
            if key not in prompts:
                prompts[key] = super().initialize_system_prompt()
            return prompts[key]

    return Agent


async def _smolagents(request: str, ctx: AgentContext) -> str:
    from smolagents import LogLevel

    # Per trial: the agent keeps the run's memory (its steps).
    agent = _smolagents_agent_class()(
        tools=list(_smolagents_tools(ctx.task, urls_key(ctx.urls))),
        model=_smolagents_model(ctx.model),
        prompt_templates=_smolagents_prompts(),
        instructions=ctx.instructions,
        max_steps=MAX_TURNS,
        verbosity_level=LogLevel.OFF,  # it prints every step, and errors, to the console
    )
    async with with_trial_client():
        token = _TRIAL_LOOP.set(asyncio.get_running_loop())
        try:
            # smolagents runs synchronously: in a worker thread, which carries the trial.
            result = await asyncio.to_thread(agent.run, request)
        finally:
            _TRIAL_LOOP.reset(token)
        return str(result)


async def smolagents(request: str, ctx: AgentContext) -> str:
    """smolagents: ``ToolCallingAgent`` on ``OpenAIServerModel`` with ``@tool`` functions.

    A tool that raises is wrapped in ``AgentToolExecutionError("Error executing tool
    'issue_refund' with arguments {...}: ReadTimeout: ...\\nPlease try again or use another
    tool")`` (``smolagents/agents.py:1479-1502``) and kept as the step's error
    (``agents.py:597-599``), which the model reads next turn with "Now let's retry: take care
    not to repeat previous errors!" (``smolagents/memory.py:138-148``). The step's tool call
    itself is not kept (``memory_step.tool_calls`` is set only after the tools ran,
    ``agents.py:1436``): the model sees the error, not that it had called the tool.
    smolagents retries no tool call by itself.

    ``OpenAIServerModel`` uses the synchronous OpenAI client, which the agent bridge does not
    answer: its ``create_client`` returns a client whose requests an async client sends on
    the trial's event loop (:func:`_bridged_openai`); the agent runs in a worker thread.
    """
    return await _smolagents(request, ctx)


# -- Strands ----------------------------------------------------------------------------------

RETRY_ATTEMPTS = 3
"""Attempts in all of a tool call that raised, under the Strands retry hook (as LangGraph's
``RetryPolicy``'s ``max_attempts``)."""


@functools.lru_cache(maxsize=64)
def _strands_tools(task: str, urls: Urls) -> list[Any]:
    """The ``@tool`` objects (their specs built from the signatures and docstrings): a
    decorated tool keeps nothing of a call, and the agents' registries only read them."""
    from strands import tool

    return [tool(fn) for fn in shared_tools(task, urls)]


@functools.lru_cache(maxsize=8)
def _strands_model(model: str) -> Any:
    """The model, one per process. With ``client_args`` an ``OpenAIModel`` makes an
    ``AsyncOpenAI`` (a CA bundle) for every request, so that no connection outlives its
    event loop; the bridge answers these requests in-process, with no connection, so one
    injected client serves every trial. The model itself holds only its settings."""
    from strands.models.openai import OpenAIModel

    # stream=False: the agent bridge refuses a streamed request (the default).
    return OpenAIModel(
        client=_openai_client().with_options(max_retries=0), model_id=model, stream=False
    )


async def _strands(request: str, ctx: AgentContext, *, retry: bool) -> str:
    from strands import Agent
    from strands.hooks import AfterToolCallEvent, HookProvider, HookRegistry

    class RetryToolErrors(HookProvider):  # type: ignore[misc]
        """Strands' documented retry hook: a tool call that raised is run again."""

        def __init__(self) -> None:
            self.attempts: dict[str, int] = {}

        def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
            registry.add_callback(AfterToolCallEvent, self.after_tool)

        def after_tool(self, event: AfterToolCallEvent) -> None:
            if event.exception is None:
                return
            use = str(event.tool_use["toolUseId"])
            self.attempts[use] = self.attempts.get(use, 1) + 1
            event.retry = self.attempts[use] <= RETRY_ATTEMPTS

    async with with_trial_client():
        # Per trial: the agent keeps the conversation, the hook its attempt counts.
        agent = Agent(
            model=_strands_model(ctx.model),
            system_prompt=ctx.instructions,
            tools=list(_strands_tools(ctx.task, urls_key(ctx.urls))),
            hooks=[RetryToolErrors()] if retry else [],
            callback_handler=None,  # the default prints the model's text to stdout
        )
        result = await agent.invoke_async(request)
        return str(result).strip()


async def strands(request: str, ctx: AgentContext) -> str:
    """Strands Agents: ``Agent`` on ``OpenAIModel(stream=False)`` with ``@tool`` functions.

    A tool that raises becomes a tool result with status ``error`` and the text
    ``Error: ReadTimeout - timed out waiting for the response``
    (``strands/tools/decorator.py:673-685``), which the model reads; Strands retries no tool
    call by itself. ``stream=False`` because the model's default, ``stream=True``
    (``strands/models/openai.py:514``), is refused by the agent bridge.
    """
    return await _strands(request, ctx, retry=False)


async def strands_retry(request: str, ctx: AgentContext) -> str:
    """Strands with a hook that sets ``AfterToolCallEvent.retry`` on a tool call that raised.

    ``retry`` is Strands' documented way to retry a tool (``strands/hooks/events.py:262-301``):
    the executor discards the result and runs **the same tool use, same arguments** again
    (``strands/tools/executors/_executor.py:371-372``, ``:410-411``), before the model sees
    anything; here up to :data:`RETRY_ATTEMPTS` attempts in all. The model only sees the last
    attempt's result.
    """
    return await _strands(request, ctx, retry=True)
