"""A twice command agent on the Claude Agent SDK, written as its docs write an agent with custom
tools: ``@tool`` functions in an in-process SDK MCP server (``create_sdk_mcp_server``), offered
to Claude through ``ClaudeAgentOptions(mcp_servers=..., allowed_tools=...)`` and run with a
``ClaudeSDKClient``.

Runs in this folder's own venv (``make frameworks-install``). The SDK drives the Claude Code
CLI bundled in its wheel, which speaks the Anthropic Messages API only: it reaches the eval's
model at ``ANTHROPIC_BASE_URL`` (inspect's bridge answers ``/v1/messages`` with the eval's
model, whatever model name the CLI sends). A tool that raises becomes an MCP result with
``isError`` set and ``str(exception)`` as its text, which the model reads as an error
``tool_result`` (an empty text, an httpx ``ReadTimeout``'s, the CLI replaces with "Command
failed with no output"); nothing in the SDK or the CLI runs a tool again.

The model is offered the task's tools and nothing else: no built-in Claude Code tool (``tools
=[]``: no Bash, Read, Write, WebFetch ...), no settings, memory file or MCP server from the
machine (``setting_sources=[]``, ``strict_mcp_config``), and the CLI's home and config in a
folder of this run's own, with its telemetry, updater and other traffic beyond the model
endpoint switched off.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

# The CLI keeps its config, sessions and caches under $CLAUDE_CONFIG_DIR (default ~/.claude):
# a folder of this run's own, removed when it ends, so no trial reads what another (or the
# user) left, and nothing lands in the user's home.
_HOME = tempfile.TemporaryDirectory(prefix="twice-claude-")
OFFLINE = {
    "HOME": _HOME.name,
    "CLAUDE_CONFIG_DIR": str(Path(_HOME.name) / ".claude"),
    "TMPDIR": _HOME.name,
    # Telemetry, error reporting, the auto-updater, feature flags, surveys and every other
    # request that is not the agent's own model call: without them the CLI looks up
    # api.anthropic.com and makes a model call of its own (with no tools) besides the agent's.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_UPDATES": "1",
    "DISABLE_GROWTHBOOK": "1",
    "CLAUDE_CODE_DISABLE_FEATURE_FLAGS": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
    "CLAUDE_CODE_DISABLE_CLAUDE_MDS": "1",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
}
os.environ.update(OFFLINE)

from claude_agent_sdk import (  # noqa: E402
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    ResultMessage,
    TextBlock,
    create_sdk_mcp_server,
    tool,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from services import TRIAL, ApiTool, client, service_tools  # noqa: E402

SERVER = "twice"
"""The SDK MCP server's name: Claude sees each tool as ``mcp__twice__<tool>``."""

_ARG = re.compile(r"^\s{4,}(?P<name>\w+):\s*(?P<text>.+)$")


def _json_type(annotation: Any) -> dict[str, Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return {"type": "string", "enum": list(typing.get_args(annotation))}
    return {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}[annotation]}


def input_schema(fn: ApiTool) -> dict[str, Any]:
    """The JSON Schema of ``fn``'s arguments, each described by its docstring's ``Args:``."""
    described = {
        m["name"]: m["text"]
        for line in (fn.__doc__ or "").splitlines()
        if (m := _ARG.match(line)) is not None
    }
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        properties[name] = {**_json_type(hints[name]), "description": described.get(name, "")}
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def sdk_tool(fn: ApiTool) -> Any:
    """``fn`` as an SDK MCP tool: its name, its docstring's summary and its arguments."""
    summary = (fn.__doc__ or "").strip().split("\n\n")[0]

    async def call(args: dict[str, Any]) -> dict[str, Any]:
        # An exception is left to the SDK, which reports it to the model (isError).
        return {"content": [{"type": "text", "text": await fn(**args)}]}

    # The docs' @tool(name, description, schema), applied to each of the task's tools.
    return tool(fn.__name__, summary, input_schema(fn))(call)


async def main() -> None:
    if not os.environ.get("ANTHROPIC_BASE_URL"):
        # Without it the CLI would call Anthropic's API: only twice's endpoint is allowed.
        raise SystemExit(
            "ANTHROPIC_BASE_URL is not set: run this agent with twice run --agent-cmd, which "
            "sets it (and ANTHROPIC_API_KEY) to the eval's model endpoint"
        )
    async with client() as http:
        tools = [sdk_tool(fn) for fn in service_tools(http)]
        options = ClaudeAgentOptions(
            system_prompt=TRIAL["system"],
            mcp_servers={SERVER: create_sdk_mcp_server(name=SERVER, tools=tools)},
            allowed_tools=[f"mcp__{SERVER}__{t.name}" for t in tools],
            tools=[],
            setting_sources=[],
            strict_mcp_config=True,
            # The bridge serves any name with the eval's model; "inspect" is the name that
            # says so (the CLI warns that it does not know it, and assumes a large window).
            model=TRIAL["model"],
            cwd=_HOME.name,
        )
        async with ClaudeSDKClient(options=options) as claude:
            await claude.query(TRIAL["input"])
            async for message in claude.receive_response():
                if isinstance(message, AssistantMessage):
                    for block in message.content:
                        if isinstance(block, TextBlock):
                            print(block.text)
                elif isinstance(message, ResultMessage) and message.is_error:
                    raise SystemExit(f"claude ended with an error: {message.result}")


asyncio.run(main())
