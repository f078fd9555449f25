"""The built-in framework agents: small programs written the way each framework's docs write one.

Each is an ordinary agent function (``async def agent(request, ctx) -> str``, the interface a
user's own agent has too) built on the framework's idioms, with the task's tools from
``_apis`` wrapped in the framework's tool decorator and the model reached as ``ctx.model``
(``inspect``) through the OpenAI async client, which the agent bridge routes to the eval's
model. The tools call the services bare (no retries, no idempotency key): what happens after
a timeout is the framework's and the model's doing.

Framework imports are inside the functions: the packages are the optional ``agents`` extra.

What a framework lets an application build once (its tool objects, a compiled graph, an
agent) is built once per process and task, as an application would, not once per trial:
building the tools' schemas from their signatures costs more than a trial of twice's own
loop. Those tools send with the running trial's client (:func:`trial_client`), so each trial
still has a client of its own.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import httpx

from ._apis import ApiTool, api_tools
from ._context import AgentContext

if TYPE_CHECKING:
    from openai import AsyncOpenAI

MAX_TURNS = 15
"""Model turns an agent may take (openai-agents ``max_turns``; LangGraph's limit is derived)."""
TOOL_TIMEOUT = 10.0
"""Seconds a tool's HTTP request may take (faults raise their timeouts at once)."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # httpx builds a fresh one for every client: loading the CA bundle is 20-40 ms of CPU,
    # more than a whole trial of twice's own loop. One context serves every client.
    return httpx.create_ssl_context()


def tool_client() -> httpx.AsyncClient:
    """A new ``httpx`` client for a built-in agent's tools, one per trial.

    It is an ordinary client with the tools' timeout; only its TLS context (the CA bundle,
    which httpx would load again for every client) is made once per process and shared.
    """
    return httpx.AsyncClient(timeout=TOOL_TIMEOUT, verify=_tls_context())


_CLIENT: ContextVar[httpx.AsyncClient] = ContextVar("twice_builtin_tool_client")


def trial_client() -> httpx.AsyncClient:
    """The running trial's tool client (for tools made once with :func:`shared_tools`).

    Raises:
        LookupError: outside :func:`with_trial_client`.
    """
    return _CLIENT.get()


@asynccontextmanager
async def with_trial_client() -> AsyncIterator[httpx.AsyncClient]:
    """A new :func:`tool_client` for this trial, which shared tools send with in the block
    (the framework's tasks and the threads it starts copy the context it is set in)."""
    async with tool_client() as client:
        token = _CLIENT.set(client)
        try:
            yield client
        finally:
            _CLIENT.reset(token)


def urls_key(urls: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``urls`` as a cache key."""
    return tuple(sorted(urls.items()))


def shared_tools(task: str, urls: tuple[tuple[str, str], ...]) -> list[ApiTool]:
    """The task's tools, sending with the running trial's client: for tools a framework
    wraps once per process (a cached builder keyed by ``task`` and :func:`urls_key`)."""
    return api_tools(task, trial_client, dict(urls))


@functools.cache
def _openai_client() -> AsyncOpenAI:
    # The bridge answers its requests in-process, whichever client sends them: one client
    # per process, as an application keeps one, instead of a CA bundle loaded per trial.
    from openai import AsyncOpenAI

    return AsyncOpenAI()


@functools.lru_cache(maxsize=64)
def _openai_agents_tools(task: str, urls: tuple[tuple[str, str], ...]) -> list[Any]:
    from agents import function_tool

    return [function_tool(fn) for fn in shared_tools(task, urls)]


async def openai_agents(request: str, ctx: AgentContext) -> str:
    """OpenAI Agents SDK: ``Agent`` + ``@function_tool`` + ``Runner.run``, default error handling.

    A tool that raises is reported to the model as the SDK's default text, "An error occurred
    while running the tool. Please try again." (the exception text is not shown).
    """
    from agents import Agent, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # the trace exporter would try the network
    async with with_trial_client():
        agent = Agent(
            name="Support agent",
            instructions=ctx.instructions,
            model=ctx.model,
            tools=list(_openai_agents_tools(ctx.task, urls_key(ctx.urls))),
        )
        # The session's earlier turns, as the SDK takes a conversation: input items.
        items: list[Any] = [{"role": r, "content": t} for r, t in ctx.history]
        items.append({"role": "user", "content": request})
        result = await Runner.run(agent, items if ctx.history else request, max_turns=MAX_TURNS)
        return str(result.final_output)


@functools.lru_cache(maxsize=64)
def _langgraph_app(task: str, urls: tuple[tuple[str, str], ...], model: str, *, retry: bool) -> Any:
    """The compiled graph (a compiled LangGraph graph is stateless and reusable)."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import RetryPolicy

    tools = [tool(fn, parse_docstring=True) for fn in shared_tools(task, urls)]
    llm = ChatOpenAI(model=model, max_retries=0).bind_tools(tools)

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    if retry:
        # The node retries on the exceptions LangGraph's default_retry_on accepts
        # (httpx timeouts and 5xx included), so tool errors must reach it.
        graph.add_node("tools", ToolNode(tools), retry_policy=RetryPolicy())
    else:
        graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


async def _langgraph(request: str, ctx: AgentContext, *, retry: bool) -> str:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.runnables import RunnableConfig

    async with with_trial_client():
        app = _langgraph_app(ctx.task, urls_key(ctx.urls), ctx.model, retry=retry)
        messages: list[BaseMessage] = [SystemMessage(ctx.instructions)]
        for role, text in ctx.history:  # the session's earlier turns
            messages.append(HumanMessage(text) if role == "user" else AIMessage(text))
        messages.append(HumanMessage(request))
        config: RunnableConfig = {"recursion_limit": 2 * MAX_TURNS}
        result = await app.ainvoke({"messages": messages}, config)
        return str(result["messages"][-1].content)


async def langgraph(request: str, ctx: AgentContext) -> str:
    """LangGraph: ``StateGraph`` + ``ToolNode(tools, handle_tool_errors=True)`` + ``ChatOpenAI``.

    A tool that raises is reported to the model as ``Error: ReadTimeout(...)`` with
    "Please fix your mistakes."
    """
    return await _langgraph(request, ctx, retry=False)


async def langgraph_retry(request: str, ctx: AgentContext) -> str:
    """LangGraph with ``retry_policy=RetryPolicy()`` on the tool node.

    The framework re-runs the tool node on a timeout (LangGraph's ``default_retry_on``), up to
    3 attempts, before the model sees anything: the model only sees the last attempt's result.
    Tool errors are not turned into messages here (``ToolNode(tools)``), because a handled error
    never reaches the retry policy.
    """
    return await _langgraph(request, ctx, retry=True)


@functools.lru_cache(maxsize=64)
def _pydantic_ai_agent(
    task: str, urls: tuple[tuple[str, str], ...], model: str, instructions: str
) -> Any:
    """The agent (pydantic-ai agents are made once and run many times, like a web app)."""
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def retry_on_http_errors(fn: ApiTool) -> ApiTool:
        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> str:
            try:
                return await fn(*args, **kwargs)
            except httpx.HTTPError as ex:
                raise ModelRetry(f"{fn.__name__} failed: {type(ex).__name__}: {ex}") from ex

        return call

    chat = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=_openai_client()))
    return Agent(
        chat,
        instructions=instructions,
        tools=[retry_on_http_errors(fn) for fn in shared_tools(task, urls)],
    )


async def pydantic_ai(request: str, ctx: AgentContext) -> str:
    """pydantic-ai: ``Agent`` on ``OpenAIChatModel``, tools that raise ``ModelRetry`` on errors.

    The model is shown the tool's error text and asked to try again (pydantic-ai allows one
    such retry per tool by default; more ends the run).
    """
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        UserPromptPart,
    )

    async with with_trial_client():
        agent = _pydantic_ai_agent(ctx.task, urls_key(ctx.urls), ctx.model, ctx.instructions)
        history: list[ModelMessage] = [  # the session's earlier turns
            ModelRequest(parts=[UserPromptPart(text)])
            if role == "user"
            else ModelResponse(parts=[TextPart(text)])
            for role, text in ctx.history
        ]
        result = await agent.run(request, message_history=history or None)
        return str(result.output)
