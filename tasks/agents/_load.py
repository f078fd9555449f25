"""Find an agent by name: ``react``, a built-in framework agent, or the user's own function."""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .._spec import load_function
from ._apis import API_TOOLS
from ._builtin import langgraph, langgraph_retry, openai_agents, pydantic_ai
from ._context import AgentError, AgentFunction
from ._more_builtin import (
    agno,
    agno_retries,
    autogen,
    autogen_reflect,
    google_adk,
    google_adk_reflect,
    smolagents,
    strands,
    strands_retry,
)

REACT = "react"
"""twice's own agent loop (inspect's generate loop plus twice's tool layer): the default."""

EXTRA = "agents"
"""The optional extra that installs the first built-in agents' framework packages."""

FRAMEWORKS_EXTRA = "frameworks"
"""The optional extra that installs the further built-in agents' framework packages."""

STRANDS_EXTRA = "strands"
"""The optional extra that installs Strands Agents (its own: it pins ``mcp<2.2``, and twice's
``serve`` extra needs ``mcp>=2.3``)."""

PLACEHOLDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
DUMMY_KEY = "twice-agent-bridge"
"""The API key set (only when none is set) so SDK clients can be built; the bridge never sends
it anywhere: requests for model ``inspect`` are answered in-process."""


@contextmanager
def placeholder_keys() -> Iterator[None]:
    """The placeholder keys, where none is set, while an agent's file is imported: a client
    built at import (the usual production layout) captures one. They are taken away after,
    so a real provider without its key still says so."""
    unset = [var for var in PLACEHOLDER_KEYS if var not in os.environ]
    for var in unset:
        os.environ[var] = DUMMY_KEY
    try:
        yield
    finally:
        for var in unset:
            if os.environ.get(var) == DUMMY_KEY:
                del os.environ[var]


@dataclass(frozen=True)
class BuiltinAgent:
    """A built-in framework agent."""

    name: str
    function: AgentFunction
    modules: tuple[str, ...]
    """Modules it imports (from its ``extra``)."""
    summary: str
    extra: str = "agents"
    """The optional extra that installs its framework."""
    keeps_history: bool = True
    """Whether it passes ``ctx.history`` (the session's earlier turns) to its framework, as the
    ``ask_again`` fault needs."""


BUILTIN_AGENTS: dict[str, BuiltinAgent] = {
    a.name: a
    for a in (
        BuiltinAgent(
            "openai-agents",
            openai_agents,
            ("agents",),
            "OpenAI Agents SDK: Agent + @function_tool + Runner.run, default error handling",
        ),
        BuiltinAgent(
            "langgraph",
            langgraph,
            ("langgraph", "langchain_openai"),
            "LangGraph: StateGraph + ToolNode(handle_tool_errors=True) + ChatOpenAI",
        ),
        BuiltinAgent(
            "langgraph-retry",
            langgraph_retry,
            ("langgraph", "langchain_openai"),
            "LangGraph with retry_policy=RetryPolicy() on the tool node",
        ),
        BuiltinAgent(
            "pydantic-ai",
            pydantic_ai,
            ("pydantic_ai",),
            "pydantic-ai: Agent whose tools raise ModelRetry on errors",
        ),
        BuiltinAgent(
            "autogen",
            autogen,
            ("autogen_agentchat", "autogen_ext.models.openai"),
            "AutoGen AgentChat: AssistantAgent, default reflect_on_tool_use=False",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "autogen-reflect",
            autogen_reflect,
            ("autogen_agentchat", "autogen_ext.models.openai"),
            "AutoGen AgentChat: AssistantAgent with reflect_on_tool_use=True",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "agno",
            agno,
            ("agno",),
            "Agno: Agent on OpenAIChat, run with arun(), default retries=0",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "agno-retries",
            agno_retries,
            ("agno",),
            "Agno: Agent(retries=2), which re-runs the whole run when it raises",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "google-adk",
            google_adk,
            ("google.adk", "openai"),
            "Google ADK: LlmAgent on OpenAILlm, default tool-error handling (the run aborts)",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "google-adk-reflect",
            google_adk_reflect,
            ("google.adk", "openai"),
            "Google ADK with ReflectAndRetryToolPlugin()",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "smolagents",
            smolagents,
            ("smolagents", "openai"),
            "smolagents: ToolCallingAgent on OpenAIServerModel (sync client, bridged) + @tool",
            FRAMEWORKS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "strands",
            strands,
            ("strands", "openai"),
            "Strands Agents: Agent on OpenAIModel(stream=False) + @tool, defaults",
            STRANDS_EXTRA,
            keeps_history=False,
        ),
        BuiltinAgent(
            "strands-retry",
            strands_retry,
            ("strands", "openai"),
            "Strands with a hook setting AfterToolCallEvent.retry on a tool call that raised",
            STRANDS_EXTRA,
            keeps_history=False,
        ),
    )
}
"""The built-in framework agents by name."""

AGENT_TASKS: tuple[str, ...] = tuple(API_TOOLS)
"""Tasks the built-in framework agents have tools for (a user's agent brings its own)."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def is_user_agent(name: str) -> bool:
    """True for ``path.py:function`` / ``module:function`` (anything but a known name)."""
    return name != REACT and name not in BUILTIN_AGENTS


def check_agent(name: str, task: str | None = None) -> None:
    """Check an agent name (and that it can run ``task``) without running anything.

    Raises:
        AgentError: naming the bad value and what is accepted, or the extra to install.
    """
    if name == REACT:
        return
    builtin = BUILTIN_AGENTS.get(name)
    if builtin is not None:
        for module in builtin.modules:
            if not _importable(module):
                raise AgentError(
                    f"agent {name!r} needs the package that provides {module!r}, from twice's "
                    f"optional extra {builtin.extra!r}: pip install 'twice[{builtin.extra}]'"
                )
        if task is not None and task not in API_TOOLS:
            raise AgentError(
                f"agent {name!r} has no tools for task {task!r}; the built-in framework agents "
                f"run: {', '.join(AGENT_TASKS)} (a user agent from path.py:function runs any task)"
            )
        return
    load_agent(name)


def load_agent(spec: str) -> AgentFunction:
    """The agent function named by ``spec``.

    Args:
        spec: A built-in agent name, ``path/to/agent.py:function`` or ``package.module:function``.

    Raises:
        AgentError: for an unknown name, a missing file or module, a missing function, or a
            function that is not ``async def f(request, ctx)``.
    """
    builtin = BUILTIN_AGENTS.get(spec)
    if builtin is not None:
        check_agent(spec)
        return builtin.function
    accepted = (
        f"expected {REACT!r}, one of {', '.join(BUILTIN_AGENTS)}, "
        "path/to/agent.py:function or package.module:function"
    )
    with placeholder_keys():
        fn = load_function(spec, "agent", AgentError, accepted)
    _check_signature(spec, fn)
    return fn  # type: ignore[no-any-return]


def _check_signature(spec: str, fn: Callable[..., object]) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise AgentError(
            f"agent {spec!r} must be an async function: async def agent(request: str, "
            "ctx: AgentContext) -> str"
        )
    try:
        inspect.signature(fn).bind("request", object())
    except TypeError:
        raise AgentError(
            f"agent {spec!r} must accept two arguments (request, ctx): async def "
            "agent(request: str, ctx: AgentContext) -> str"
        ) from None
