"""The MCP face of the gateway (a low-level ``Server``) and its HTTP app: ``/mcp``, ``/healthz``, ``/status``.

The only module that imports Starlette. ``build_server(gateway)`` serves the pre-built catalog on ``tools/list`` and
hands every ``tools/call`` to the router; it remembers each client connection so a catalog change can be announced
with ``notifications/tools/list_changed``. ``build_app(gateway, ...)`` wraps the streamable HTTP endpoint in one pure
ASGI guard that checks Host/Origin (DNS-rebinding protection on loopback binds) and the bearer token — in constant
time, before any MCP work — and answers ``/healthz`` (no auth, no reasons) and ``/status`` (auth, full reasons).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.catalog import Catalog
from gateway.errors import BackendRpcError, ToolNotFound
from gateway.router import CallContext
from gateway.runtime import VERSION, Gateway

__all__ = ["Guard", "Tokens", "build_app", "build_server", "is_loopback"]

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
    if isinstance(request, Request):
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

        call_ctx = _call_context(ctx)
        try:
            try:
                return await gateway.router.call(params.name, params.arguments, ctx=call_ctx, progress=progress)
            except ToolNotFound:
                # A call that races startup may name a tool whose backend is still connecting: wait, then retry once.
                if startup_waited.is_set():
                    raise
                await gateway.wait_settled(STARTUP_LIST_WAIT_S)
                startup_waited.set()
                return await gateway.router.call(params.name, params.arguments, ctx=call_ctx, progress=progress)
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


# ----------------------------------------------------------------------------------------------- HTTP


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Tokens:
    """Accepted bearer tokens. ``GATEWAY_TOKENS="alice=tok1,bob=tok2"`` names callers; a bare token is named by
    its hash prefix. Tokens are compared in constant time and never logged or stored."""

    def __init__(self, spec: str | None) -> None:
        self._tokens: list[tuple[bytes, str]] = []
        for item in (spec or "").split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, token = item.partition("=")
            if not sep:
                name, token = "", item
            digest = hashlib.sha256(token.encode()).hexdigest()[:12]
            self._tokens.append((token.encode(), name or f"token-{digest}"))

    def __bool__(self) -> bool:
        return bool(self._tokens)

    @property
    def secrets(self) -> list[str]:
        return [token.decode() for token, _ in self._tokens]

    def identify(self, authorization: str | None) -> str | None:
        """The caller's name for a valid ``Authorization: Bearer`` header, else None."""
        if not authorization or not authorization[:7].lower() == "bearer ":
            return None
        offered = authorization[7:].strip().encode()
        found: str | None = None
        for token, name in self._tokens:  # compare against every token: timing reveals nothing
            if hmac.compare_digest(offered, token):
                found = name
        return found


class Guard:
    """Pure ASGI middleware: Host/Origin validation, then bearer auth for protected paths, before anything else."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens,
        loopback: bool,
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
        public_paths: Sequence[str] = ("/healthz",),
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.loopback = loopback
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.allowed_origins = {o.lower() for o in allowed_origins}
        self.public_paths = set(public_paths)

    def _host_ok(self, host: str) -> bool:
        host = host.lower()
        if host in self.allowed_hosts:
            return True
        if not self.loopback:
            return True  # behind a real name: the operator's proxy owns Host; auth is required anyway
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in ("127.0.0.1", "localhost", "[::1]")

    def _origin_ok(self, origin: str) -> bool:
        origin = origin.lower()
        if origin in self.allowed_origins:
            return True
        if not self.loopback:
            return not self.allowed_origins  # a list, when given, is exhaustive
        rest = origin.split("://", 1)[-1]
        name = rest.rsplit(":", 1)[0] if not rest.endswith("]") else rest
        return name in ("127.0.0.1", "localhost", "[::1]")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not self._host_ok(headers.get("host", "")):
            await _plain(send, 421, "Misdirected request: Host header not allowed.")
            return
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin):
            await _plain(send, 403, "Forbidden: Origin not allowed.")
            return
        if scope["path"] not in self.public_paths and self.tokens:
            caller = self.tokens.identify(headers.get("authorization"))
            if caller is None:
                await _plain(
                    send,
                    401,
                    "Unauthorized: a valid bearer token is required.",
                    [(b"www-authenticate", b'Bearer realm="mcp-gateway"')],
                )
                return
            scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)


async def _plain(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": text}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


def status_document(gateway: Gateway, *, connections: int | None = None) -> dict[str, Any]:
    catalog = gateway.catalog
    per_backend = catalog.by_backend()
    backends = []
    for name, kind, status in gateway.statuses():
        backends.append(
            {
                "name": name,
                "kind": kind,
                "state": str(status.state),
                "reason": status.reason,
                "declared": status.declared,
                "since": status.since,
                "last_error": status.last_error,
                "tools": per_backend.get(name, 0),
                "downstream_tools": status.tool_count,
            }
        )
    doc: dict[str, Any] = {
        "gateway": gateway.config.gateway.name,
        "version": VERSION,
        "status": "ok" if gateway.healthy() else "degraded",
        "catalog": {"tools": len(catalog), "problems": list(catalog.problems)},
        "backends": backends,
        "time": time.time(),
    }
    if connections is not None:
        doc["connections"] = connections
    return doc


def build_app(gateway: Gateway, *, host: str, tokens: Tokens, json_response: bool = False) -> ASGIApp:
    """The gateway's HTTP app. Run it inside ``gateway.running()`` (the caller owns the gateway's lifetime)."""
    server, connections = build_server(gateway)
    manager = StreamableHTTPSessionManager(
        app=server,
        json_response=json_response,
        # The Guard does Host/Origin checks for every path, so the SDK's own check is off (one policy, one place).
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    mcp_app = StreamableHTTPASGIApp(manager)

    async def healthz(request: Request) -> Response:
        states = {name: str(status.state) for name, _, status in gateway.statuses()}
        return JSONResponse({"status": "ok" if gateway.healthy() else "degraded", "backends": states})

    async def status(request: Request) -> Response:
        return JSONResponse(status_document(gateway, connections=len(connections)))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/status", status, methods=["GET"]),
            Route("/mcp", endpoint=mcp_app),
        ],
        lifespan=lifespan,
    )
    gateway_settings = gateway.config.gateway
    guarded = Guard(
        app,
        tokens=tokens,
        loopback=is_loopback(host),
        allowed_hosts=gateway_settings.allowed_hosts,
        allowed_origins=gateway_settings.allowed_origins,
    )
    return guarded
