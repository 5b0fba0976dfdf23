"""The MCP face of the gateway: a low-level ``Server`` whose handlers serve the catalog and route calls.

``build_server(gateway)`` serves the pre-built catalog on ``tools/list`` and hands every ``tools/call`` to the
router; it remembers each client connection so a catalog change can be announced with
``notifications/tools/list_changed``. It is transport-agnostic: ``http.py`` mounts it on streamable HTTP, the CLI runs
it over stdio.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPError

from gateway.catalog import Catalog
from gateway.errors import BackendRpcError, ToolNotFound
from gateway.router import CallContext
from gateway.runtime import VERSION, Gateway

__all__ = ["build_server"]

log = structlog.get_logger("gateway.server")

INVALID_PARAMS = -32602
STARTUP_LIST_WAIT_S = 10.0
"""During startup, ``tools/list`` (and a call naming a tool not known yet) waits at most this long for backends still
connecting, so a client that connects at once sees the whole catalog instead of a partial one."""
NOTIFY_TIMEOUT_S = 2.0


class _GatewayServer(Server[Any]):
    """The SDK's low-level server, advertising ``listChanged`` for every list the gateway federates."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class _Connections:
    """Every live client connection, so catalog changes can be announced to each (weakly held)."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()

    async def track(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        connection = getattr(ctx.session, "_connection", None)  # the SDK keeps it private; mcp is pinned <3
        if connection is not None:
            self._live.add(connection)
        return await call_next(ctx)

    def __len__(self) -> int:
        return len(self._live)

    async def announce(self, catalog: Catalog) -> None:
        for connection in list(self._live):
            if not connection.initialized.is_set():
                continue
            with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                try:
                    await connection.send_tool_list_changed()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, OSError):
                    self._live.discard(connection)


def _call_context(ctx: ServerRequestContext[Any]) -> CallContext:
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    request = ctx.request
    session_id = None
    caller = None
    if request is not None and hasattr(request, "headers"):  # a Starlette request on HTTP, None on stdio
        session_id = request.headers.get("mcp-session-id")
        caller = request.scope.get("state", {}).get("caller")
    return CallContext(
        session_id=session_id,
        client_name=info.name if info is not None else None,
        client_version=info.version if info is not None else None,
        caller=caller,
    )


def build_server(gateway: Gateway) -> tuple[Server[Any], _Connections]:
    """The MCP server that fronts ``gateway``; pair it with a transport (HTTP app or stdio)."""
    connections = _Connections()
    startup_waited = anyio.Event()

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        if not startup_waited.is_set():
            await gateway.wait_settled(STARTUP_LIST_WAIT_S)
            startup_waited.set()
        return gateway.catalog.list_result  # pre-serialised once per catalog: no per-request model work

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        progress = None
        if ctx.meta and ctx.meta.get("progress_token") is not None:
            progress = ctx.session.report_progress  # relays on this request's own stream, against its own token

        if not startup_waited.is_set():
            # A call that races startup would find backends still connecting (an unknown tool, or a route that
            # degrades past a provider about to be ready): wait for every backend's first outcome, once.
            await gateway.wait_settled(STARTUP_LIST_WAIT_S)
            startup_waited.set()
        try:
            return await gateway.router.call(params.name, params.arguments, ctx=_call_context(ctx), progress=progress)
        except ToolNotFound as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from exc
        except BackendRpcError as exc:
            raise MCPError(exc.code, exc.message, exc.data) from exc

    def input_schema(name: str) -> Mapping[str, Any] | None:
        entry = gateway.catalog.get(name)
        return entry.tool.input_schema if entry is not None else None

    server = _GatewayServer(
        gateway.config.gateway.name,
        version=VERSION,
        instructions=gateway.config.gateway.instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )
    server.middleware.clear()  # the default OpenTelemetry middleware costs 5-15% per call; tracing is opt-in
    server.middleware.append(connections.track)
    gateway.on_catalog_change(connections.announce)
    return server, connections
