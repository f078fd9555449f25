"""A trial's tools over MCP streamable HTTP (``/t/<id>/mcp``), with mcp 2.x's ``MCPServer``.

Each trial gets its own MCP server, made on first use: the task's own tools, bound to the
trial's tool-layer context, so an MCP client drives exactly what an eval's model drives (the
same protections, the same honest error texts). The session manager runs stateless: every
trial's state lives in the trial, keyed by the URL path, never in an MCP session.

mcp 2.x passes an exception's text to the client only for its own ``ToolError``; inspect's
``ToolError`` (a definite failure, or twice's "may or may not have been made" unknown outcome)
is re-raised as one, so the client reads the same sentence a model in an eval reads.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from inspect_ai.tool import Tool, ToolDef
from inspect_ai.tool import ToolError as InspectToolError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import Field
from twice.tasks import RunCrashed, ToolSpec

ASGIApp = Callable[..., Awaitable[None]]
_INTENT_KEYED = ("intent-key", "declared")
"""Protections under which a keyed tool sends the same key when the model repeats a call."""


def tool_annotations(spec: ToolSpec | None, protection: str) -> ToolAnnotations:
    """MCP hints from a tool's declared idempotency class (and the trial's protection).

    * read-only tools: ``readOnlyHint``, idempotent, not destructive;
    * ``safe``: idempotent (a repeat changes nothing), not destructive;
    * ``keyed``: destructive; idempotent only under a protection that derives the key from
      the intent (``intent-key``, ``declared``), since only then does a repeated call send
      the same key;
    * ``compensable`` and ``unsafe``: destructive, not idempotent (a repeat is a second
      booking, a second email).
    """
    cls = spec.idempotency if spec is not None else None
    if cls is None:
        return ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
    if cls == "safe":
        return ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
    idempotent = cls == "keyed" and protection in _INTENT_KEYED
    return ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=idempotent)


def _mcp_function(tool: Tool, after_call: Callable[[], None]) -> tuple[str, str, Any]:
    """An async function with the tool's name, documented signature and honest errors."""
    tdef = ToolDef(tool)
    sig = inspect.signature(tool, eval_str=True)
    params = []
    for p in sig.parameters.values():
        prop = tdef.parameters.properties.get(p.name)
        description = prop.description if prop else None
        # Built at run time from the tool's own signature, so pydantic (and the MCP schema)
        # carries each parameter's docstring text.
        described = Annotated[p.annotation, Field(description=description)]  # type: ignore[name-defined]
        params.append(p.replace(annotation=described))

    async def call(**kwargs: Any) -> str:
        try:
            return str(await tool(**kwargs))
        except InspectToolError as err:
            raise ToolError(err.message) from None
        except RunCrashed as crash:
            # The crash_after_commit fault: the work was committed and the client's run is
            # meant to die here; tell it so instead of a generic error.
            raise ToolError(str(crash)) from None
        finally:
            after_call()

    call.__signature__ = sig.replace(parameters=params, return_annotation=str)  # type: ignore[attr-defined]
    call.__name__ = tdef.name
    return tdef.name, tdef.description, call


class TrialMcp:
    """One trial's MCP endpoint: an ``MCPServer`` with the trial's tools and its session
    manager, running in a task of the server's event loop.

    Args:
        name: The server's name (``twice-refund``).
        tools: The trial's inspect tools.
        specs: Their declared idempotency classes, by tool name.
        protection: The trial's protection name (for the ``idempotentHint``).
        after_call: Called after every tool call (the server logs the tool layer's state).

    The twice server checks ``Host`` and ``Origin`` of every request, MCP's included, before
    it gets here (``_serve.check_origin``): the SDK's own check is off, so there is one.
    """

    def __init__(
        self,
        name: str,
        tools: list[Tool],
        specs: dict[str, ToolSpec],
        protection: str,
        after_call: Callable[[], None],
    ) -> None:
        self.server: MCPServer[Any] = MCPServer(name=name, log_level="WARNING")
        for tool in tools:
            tool_name, description, fn = _mcp_function(tool, after_call)
            self.server.add_tool(
                fn,
                name=tool_name,
                description=description,
                annotations=tool_annotations(specs.get(tool_name), protection),
                structured_output=False,
            )
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        # The Starlette app is not used: building it makes the session manager, which the
        # twice server calls directly for /t/<id>/mcp.
        self.server.streamable_http_app(
            json_response=True, stateless_http=True, transport_security=security
        )
        self.manager: StreamableHTTPSessionManager = self.server.session_manager
        self._started = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Run the session manager (once; later calls wait for it to be up)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        await self._started.wait()

    async def _run(self) -> None:
        async with self.manager.run():
            self._started.set()
            await self._stop.wait()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one HTTP request of the MCP streamable HTTP transport."""
        await self.start()
        await self.manager.handle_request(scope, receive, send)

    async def stop(self) -> None:
        """Stop the session manager."""
        self._stop.set()
        if self._task is not None:
            await self._task
