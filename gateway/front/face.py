"""The MCP face of the gateway: one method per request kind, served by the SDK's low-level ``Server`` (``server``),
transport-free (front/http/ mounts it on streamable HTTP, front/stdio.py on stdin/stdout).

Lists come pre-serialised from the catalog, as the caller's policy and exposure show it; every request that reaches a
backend goes through the router, which carries the error policy, the breakers, the ledger and the metrics: this class
only translates. Each request becomes one ``CallContext`` (``context``): its caller (what the HTTP guard attributed it
to), its back-channel (front/channels.py), the ``_meta`` that travels on, its client and session digest. The era
bridge is front/eras.py's; list changes, log levels and subscriptions per client front/clients.py's; search exposure
front/exposure.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway.calls import BackChannel, CallContext, Caller, Origin, Round, Upstream
from gateway.core.policies import View
from gateway.core.runtime import Gateway
from gateway.errors import BackendRpcError, InputRequired, InvalidArguments, TaskCreated, ToolNotFound
from gateway.front.bridges import Bridge
from gateway.front.channels import Resumes, SessionChannel, client_log_level, connection_of, forwarded_meta
from gateway.front.clients import Clients
from gateway.front.continuation import may_ask_mid_call
from gateway.front.eras import Eras, ahead
from gateway.front.exposure import Disclosure
from gateway.front.named import Named
from gateway.front.outbox import Outboxes
from gateway.front.scope import caller_of, hold_of, request_caller, session_digest, withheld_of
from gateway.front.server import GatewayServer, ValidatedLists, enveloped, quiet, scrubbed
from gateway.front.tasks import Tasks
from gateway.version import VERSION

__all__ = ["Face"]

log = structlog.get_logger("gateway.server")

INVALID_PARAMS = -32602
_ROUTED = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete", "resources/subscribe"})
"""Requests whose downstream may talk to their client meanwhile: each gets an outbox (front/outbox.py)."""


class Face:
    """The gateway's MCP face (see the module docstring). ``resumes``: the HTTP event store's resumes (SEP-1699)."""

    def __init__(self, gateway: Gateway, *, resumes: Resumes | None = None) -> None:
        self.gateway = gateway
        self._resumes = resumes
        self.exposure = Disclosure(lambda: gateway.config, lambda: gateway.catalog, lambda: gateway.backends)
        self.clients = Clients(
            gateway.catalog,
            lambda: gateway.backends,
            self.exposure.tools_changed_for,
            searching=self.searching,
            search_list_changed=self.exposure.search_list_changed,
            current=lambda: gateway.catalog,
        )
        self.views = self.clients.views
        self.exposure.use_views(self.views)
        self.eras = Eras(gateway)
        self._validated = ValidatedLists()
        self.outboxes = Outboxes(lambda: gateway.config.gateway.edge, gateway.start_soon)
        self.tasks = Tasks(self)  # the tasks extension (front/tasks.py)
        gateway.on_catalog_change(self.clients.announce)
        gateway.on_backend_notification(self.clients.on_backend_notification)

    def server(self) -> Server[Any]:
        """The SDK's low-level server, its handlers this face's methods; pair it with a transport."""
        gateway, named = self.gateway, Named(self)
        server = GatewayServer(
            gateway,
            gateway.config.gateway.name,
            version=VERSION,
            instructions=self.exposure.instructions(gateway.config.gateway.instructions),
            on_list_tools=self.list_tools,
            on_call_tool=self.tasks.calls(self.call_tool),
            on_list_resources=named.list_resources,
            on_list_resource_templates=named.list_resource_templates,
            on_read_resource=named.read_resource,
            on_subscribe_resource=named.subscribe,
            on_unsubscribe_resource=named.unsubscribe,
            on_list_prompts=named.list_prompts,
            on_get_prompt=named.get_prompt,
            on_completion=named.complete,
            get_tool_input_schema=self.input_schema,
            on_subscriptions_listen=self.clients.listen,
        )
        # Registered directly: the constructor's handlers for these warn (deprecated as of 2026-07-28), but every
        # handshake-era client uses them.
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self.set_level)
        server.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self.roots_changed
        )
        self.tasks.register(server)
        server.middleware.clear()  # the default OpenTelemetry middleware costs 5-15% per call; tracing is opt-in
        server.middleware.append(self.middleware)
        return server

    # -- a request's context ---------------------------------------------------------------------------------------

    def channel(self, ctx: ServerRequestContext[Any]) -> BackChannel:
        return SessionChannel(ctx, self._resumes, self.outboxes.of(ctx))

    def context(
        self, ctx: ServerRequestContext[Any], *, channel: BackChannel | None = None, round: Round | None = None
    ) -> CallContext:
        """The request as the router needs it (``channel``: another than the request's own, e.g. a bridge)."""
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        request = ctx.request
        scope = getattr(request, "scope", None)  # a Starlette request on HTTP, None on stdio
        headers = getattr(request, "headers", None)
        name = info.name if info is not None else None
        version = info.version if info is not None else None
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        # The log level it wants: a stateless client says so per request; a handshake-era one gets every level until
        # its logging/setLevel (front/clients.py filters what each hears)
        asked = (ctx.meta or {}).get(types.LOG_LEVEL_META_KEY)
        level = (asked if isinstance(asked, str) else None) if modern else client_log_level(connection_of(ctx))
        upstream = Upstream(
            caller=caller_of(scope),
            channel=channel if channel is not None else self.channel(ctx),
            meta=forwarded_meta(ctx.meta),
            round=round,
            modern=modern,
            log_level=level if modern else (level or "debug"),
        )
        return CallContext(
            upstream=upstream,
            session_id=session_digest(headers.get("mcp-session-id")) if headers is not None else None,
            client_name=name,
            client_version=version,
            declared=self.gateway.clients.declared(name, version, headers),
            withheld=withheld_of(scope),
        )

    def caller(self, ctx: ServerRequestContext[Any]) -> Caller:
        return caller_of(getattr(ctx.request, "scope", None))

    def view(self, ctx: ServerRequestContext[Any]) -> View | None:
        """The caller's view of the catalog (core/policies.py); None: no policies, it sees everything."""
        return self.views.view(self.gateway.catalog, self.caller(ctx))

    def searching(self, ctx: ServerRequestContext[Any], call: CallContext | None = None) -> bool:
        """Whether the request's client is in search exposure, by its clientInfo (the initialize's in the handshake
        era, the request's own ``_meta`` in the stateless one) and its declared window."""
        call = call or self.context(ctx)
        large = self.gateway.clients.is_large(call.declared)
        return self.exposure.searching(
            call.client_name, call.client_version, large, connection_of(ctx), call.declared.tokens
        )

    def listing(self, ctx: ServerRequestContext[Any]) -> Mapping[str, Any]:
        self.clients.served(ctx, self.gateway.catalog)  # the connection holds this list now (front/clients.py)
        call = self.context(ctx)
        large = self.gateway.clients.is_large(call.declared)
        seen = self.view(ctx)
        if self.searching(ctx, call):
            return self.exposure.listing(self.gateway.catalog, large, seen)  # search exposure: search, call, pins
        listed = seen.listing(large) if seen is not None else self.gateway.catalog.listing(large)
        note = self.gateway.catalog.notes[0 if large else 1]
        return self.gateway.clients.listing(listed, note, call.declared)  # less the tools its window is below

    # -- every request ---------------------------------------------------------------------------------------------

    async def middleware(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        """The per-request boundary: a fault while serving one request ends it alone, an error answer leaves scrubbed
        of secrets (observe/logs.py); a ``tools/call`` holds its caller's concurrency place (``CallHold``) till done."""
        hold = hold_of(getattr(ctx.request, "scope", None)) if ctx.method == "tools/call" else None
        try:
            with hold.held() if hold is not None else contextlib.nullcontext():
                if ctx.method not in _ROUTED:
                    return await self._serve(ctx, call_next)
                return await self.outboxes.serve(ctx, self.caller(ctx).name, lambda: self._serve(ctx, call_next))
        except MCPError as exc:
            raise scrubbed(exc) from None
        except (ValidationError, anyio.get_cancelled_exc_class()):
            raise  # the SDK's own answers (a ValidationError of the params is its invalid params), and cancellation
        except Exception as exc:
            log.exception("request.internal_error", method=ctx.method, error=type(exc).__name__)
            raise MCPError(
                types.INTERNAL_ERROR,
                f"The gateway failed while serving this {ctx.method} request ({type(exc).__name__}); "
                "the session and other requests are not affected.",
            ) from None

    async def _serve(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        gateway = self.gateway
        # The handshake (`initialize`, a stateless `server/discover`) is answered at once, never held by a backend
        # still starting or an adapter's probe: it offers every capability a starting session may bring (server.py)
        # and the lists follow with list_changed. A listen stream waits, bounded, for every backend's first outcome;
        # a request the router dispatches waits in the router instead, which records it if it ends there.
        if ctx.method == "subscriptions/listen" and not gateway.started:
            await gateway.wait_started()
        if ctx.method == "tools/list" and gateway.started and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = connection_of(ctx)
            if connection is not None and connection.initialize_accepted:
                # The SDK would validate and re-dump the whole list on every request (87% of a 2,500-tool
                # tools/list); an answer validated once per catalog and protocol version is returned as is.
                answer = self._validated.answer(self.listing(ctx), ctx.protocol_version)

                async def cached(_: ServerRequestContext[Any]) -> HandlerResult:
                    return answer

                return await self.clients.track(ctx, cached)
        return await self.clients.track(ctx, call_next)

    # -- tools -----------------------------------------------------------------------------------------------------

    def envelope(self, ctx: ServerRequestContext[Any], listed: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
        self.clients.served(ctx, self.gateway.catalog)
        return enveloped(ctx, listed, self.gateway.list_ttl_ms(kind))  # the era's envelope and cache hints

    async def list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await self.gateway.wait_started()
        return self.envelope(ctx, self.listing(ctx), "tools")

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The schema the ``Mcp-Param-*`` check compares a stateless ``tools/call`` with: None for a hidden tool."""
        catalog = self.gateway.catalog
        entry = catalog.get(name)
        if entry is None:
            return self.exposure.input_schema(name)
        seen = self.views.view(catalog, request_caller())
        return entry.tool.input_schema if seen is None or name in seen.tools else None

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        gateway = self.gateway
        call = self.context(ctx)
        await gateway.router.wait_started("tools/call", params.name, arguments=params.arguments, ctx=call)
        seen = self.view(ctx)
        if seen is not None:
            call = dataclasses.replace(call, visible=seen.tools)
        try:
            if self.searching(ctx, call):
                visible = call.visible  # the caller's policy (None: every tool), less what its window is below
                hidden = gateway.clients.hidden(call.declared)
                if hidden:
                    visible = frozenset(visible if visible is not None else gateway.catalog.entries) - hidden
                team = seen.policy if seen is not None else None
                served = await self.exposure.intercept(params, visible, team, connection_of(ctx))
                if isinstance(served, types.CallToolResult):
                    return served
                params = served
            return await self._call(ctx, params, call)
        except (ToolNotFound, InvalidArguments) as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from exc
        except BackendRpcError as exc:
            raise MCPError(exc.code, exc.message, exc.data) from exc

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, call: CallContext
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A tools/call of a published tool: bridged, retried, or routed."""
        router, progress, caller = self.gateway.router, self.outboxes.progress(ctx), call.caller.name
        name, arguments = params.name, params.arguments

        async def resume(origin: Origin, retry: Round) -> types.CallToolResult:
            again = call.for_round(retry)
            return await router.resume(
                name, arguments, backend_name=origin.backend, tool=origin.local, ctx=again, progress=progress
            )

        try:
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                bridged = await self._bridged_call(ctx, params, call)
                if bridged is not None:
                    return bridged  # type: ignore[no-any-return]
            if params.request_state is None:
                first = call.for_round(ahead(params.input_responses))
                return await router.call(name, arguments, ctx=first, progress=progress)
            found = self.eras.reopen("tools/call", name, arguments, caller, params.request_state)
            return await resume(Origin(found.backend, found.local), Round(params.input_responses, found.state))
        except TaskCreated as created:
            created.published = name  # a task: answered as the gateway's own, named as published (front/tasks.py)
            raise
        except InputRequired as exc:
            answer: types.CallToolResult | types.InputRequiredResult = await self.eras.asked(
                ctx, "tools/call", name, arguments, caller, exc, resume
            )
            return answer

    async def _bridged_call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, call: CallContext
    ) -> Any:
        """A stateless client's tools/call, bridged when a handshake-era backend may ask for input mid-call (its
        first round) or when its state names a waiting call (a later one); None when it is not bridged."""
        gateway, caller = self.gateway, call.caller.name
        bridges = self.eras.bridges
        bridge: Bridge | None = None
        if params.request_state is None:
            if may_ask_mid_call(gateway.catalog, gateway.backends, params.name):
                retry, progress = ahead(params.input_responses), quiet(self.outboxes.progress(ctx))

                async def work(channel: Bridge) -> types.CallToolResult:
                    bridged = call.for_round(retry, channel)
                    return await gateway.router.call(params.name, params.arguments, ctx=bridged, progress=progress)

                bridge = bridges.start(call.upstream.channel or self.channel(ctx), caller, work)
        else:
            found = self.eras.opened("tools/call", params.name, params.arguments, caller, params.request_state)
            bridge = bridges.reopened(found, "tools/call", caller, params.input_responses)
        if bridge is None:
            return None

        async def on_round(backend: str, method: str) -> None:
            await gateway.router.note_round(params.name, params.arguments, backend=backend, method=method, ctx=call)

        return await bridges.next(
            ctx.session.client_capabilities,
            bridge,
            method="tools/call",
            name=params.name,
            arguments=params.arguments,
            caller=caller,
            on_round=on_round,
        )

    # -- logging and roots -----------------------------------------------------------------------------------------

    async def set_level(self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        await self.clients.set_level(ctx, params.level)
        return types.EmptyResult()

    async def roots_changed(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        client = self.channel(ctx).client
        if client is None:
            return
        for backend in self.gateway.backends.values():
            await backend.roots_changed(client)
