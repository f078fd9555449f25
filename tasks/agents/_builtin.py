"""The built-in framework agents: small programs written the way each framework's docs write one.

Each is an ordinary agent function (``async def agent(request, ctx) -> str``, the interface a
user's own agent has too) built on the framework's idioms, with the task's tools from
``_apis`` wrapped in the framework's tool decorator and the model reached as ``ctx.model``
(``inspect``) through the OpenAI async client, which the agent bridge routes to the eval's
model. The tools call the services bare (no retries, no idempotency key): what happens after
a timeout is the framework's and the model's doing.

Framework imports are inside the functions: the packages are the optional ``agents`` extra.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx

from ._apis import ApiTool, api_tools
from ._context import AgentContext

MAX_TURNS = 15
"""Model turns an agent may take (openai-agents ``max_turns``; LangGraph's limit is derived)."""
TOOL_TIMEOUT = 10.0
"""Seconds a tool's HTTP request may take (faults raise their timeouts at once)."""


def _tools(ctx: AgentContext, client: httpx.AsyncClient) -> list[ApiTool]:
    return api_tools(ctx.task, client, ctx.urls)


async def openai_agents(request: str, ctx: AgentContext) -> str:
    """OpenAI Agents SDK: ``Agent`` + ``@function_tool`` + ``Runner.run``, default error handling.

    A tool that raises is reported to the model as the SDK's default text, "An error occurred
    while running the tool. Please try again." (the exception text is not shown).
    """
    from agents import Agent, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the trace exporter would try the network
    async with httpx.AsyncClient(timeout=TOOL_TIMEOUT) as client:
        agent = Agent(
            name="Support agent",
            instructions=ctx.instructions,
            model=ctx.model,
            tools=[function_tool(fn) for fn in _tools(ctx, client)],
        )
        # The session's earlier turns, as the SDK takes a conversation: input items.
        items: list[Any] = [{"role": r, "content": t} for r, t in ctx.history]
        items.append({"role": "user", "content": request})
        result = await Runner.run(agent, items if ctx.history else request, max_turns=MAX_TURNS)
        return str(result.final_output)


async def _langgraph(request: str, ctx: AgentContext, *, retry: bool) -> str:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import RetryPolicy

    async with httpx.AsyncClient(timeout=TOOL_TIMEOUT) as client:
        tools = [tool(fn, parse_docstring=True) for fn in _tools(ctx, client)]
        llm = ChatOpenAI(model=ctx.model, max_retries=0).bind_tools(tools)

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
        app = graph.compile()
        messages: list[BaseMessage] = [SystemMessage(ctx.instructions)]
        for role, text in ctx.history:  # the session's earlier turns
            messages.append(HumanMessage(text) if role == "user" else AIMessage(text))
        messages.append(HumanMessage(request))
        config: RunnableConfig = {"recursion_limit": 2 * MAX_TURNS}
        # MessagesState wants list[AnyMessage]; a list of the two message classes is one.
        result = await app.ainvoke({"messages": messages}, config)  # type: ignore[call-overload]
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


async def pydantic_ai(request: str, ctx: AgentContext) -> str:
    """pydantic-ai: ``Agent`` on ``OpenAIChatModel``, tools that raise ``ModelRetry`` on errors.

    The model is shown the tool's error text and asked to try again (pydantic-ai allows one
    such retry per tool by default; more ends the run).
    """
    from openai import AsyncOpenAI
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        UserPromptPart,
    )
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

    async with httpx.AsyncClient(timeout=TOOL_TIMEOUT) as client:
        model = OpenAIChatModel(ctx.model, provider=OpenAIProvider(openai_client=AsyncOpenAI()))
        agent = Agent(
            model,
            instructions=ctx.instructions,
            tools=[retry_on_http_errors(fn) for fn in _tools(ctx, client)],
        )
        history: list[ModelMessage] = [  # the session's earlier turns
            ModelRequest(parts=[UserPromptPart(text)])
            if role == "user"
            else ModelResponse(parts=[TextPart(text)])
            for role, text in ctx.history
        ]
        result = await agent.run(request, message_history=history or None)
        return str(result.output)
