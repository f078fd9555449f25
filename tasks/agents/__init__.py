"""Agents under test: twice's own loop (``react``), framework agents, and the user's own.

An agent is ``async def agent(request: str, ctx: AgentContext) -> str``. It runs inside
inspect's in-process agent bridge: its OpenAI/Anthropic *async* client requests for model
``inspect`` (``ctx.model``) are answered by the eval's model, and its ``httpx`` requests to
``ctx.urls`` (or to production hosts declared with ``--mock SERVICE=URL``) are served by the
trial's mock services, so faults, keys and the ledger work as for twice's own loop.

Limits (each refused with an :class:`AgentLimitError`): synchronous model clients, streaming,
``previous_response_id``, a model name other than ``inspect``.
"""

from ._apis import API_TOOLS, api_tools
from ._attribute import (
    ModelToolCall,
    attribute_attempts,
    intent_identity,
    mark_source,
    model_tool_calls,
)
from ._context import BRIDGE_MODEL, AgentContext, AgentError, AgentFunction, AgentLimitError
from ._frameworks import (
    COMMANDS_DIR,
    FRAMEWORKS_DIR,
    Behaviour,
    FrameworkRow,
    FrameworkRowError,
    load_framework_row,
    load_frameworks,
)
from ._hosts import parse_hosts, serve_trial
from ._load import (
    AGENT_TASKS,
    BUILTIN_AGENTS,
    EXTRA,
    REACT,
    BuiltinAgent,
    check_agent,
    is_user_agent,
    load_agent,
)
from ._model_guard import check_model_request
from ._solver import AGENT_STORE_KEY, agent_solver, agent_time_limit, scrub_agent_trace
from ._trials import take_late_requests

__all__ = [
    "AGENT_STORE_KEY",
    "AGENT_TASKS",
    "API_TOOLS",
    "BRIDGE_MODEL",
    "BUILTIN_AGENTS",
    "COMMANDS_DIR",
    "EXTRA",
    "FRAMEWORKS_DIR",
    "REACT",
    "AgentContext",
    "AgentError",
    "AgentFunction",
    "AgentLimitError",
    "Behaviour",
    "BuiltinAgent",
    "FrameworkRow",
    "FrameworkRowError",
    "ModelToolCall",
    "agent_solver",
    "agent_time_limit",
    "api_tools",
    "attribute_attempts",
    "check_agent",
    "check_model_request",
    "intent_identity",
    "is_user_agent",
    "load_agent",
    "load_framework_row",
    "load_frameworks",
    "mark_source",
    "model_tool_calls",
    "parse_hosts",
    "scrub_agent_trace",
    "serve_trial",
    "take_late_requests",
]
