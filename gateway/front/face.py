"""The MCP face of the gateway: a low-level ``Server`` whose handlers serve the catalog and route every request.

``build_server(gateway)`` serves the pre-built catalog on ``tools/list`` and hands every ``tools/call`` to the
router; it federates the rest of the protocol the same way: ``resources/list``, ``resources/templates/list`` and
``prompts/list`` from the catalog's pre-serialised lists, ``resources/read``, ``prompts/get`` and
``completion/complete`` to the backend that owns the (possibly prefixed, see listings.py) name or URI,
``resources/subscribe`` / ``unsubscribe`` and ``logging/setLevel`` through ``Upstreams`` (per client), progress and
cancellation through the SDK on every forwarded request. Every request that reaches a backend goes through the router
(``Router.call``, ``Router.request``), which carries the error policy, the breakers, the ledger and the metrics; this
module only translates. The client's request travels in the call's context (``CallContext.upstream``), which the
router makes the ``UPSTREAM`` of the work it causes, so a downstream's sampling, elicitation and roots requests reach
the client whose call caused them (see backends/relay.py). The capabilities a client is offered at ``initialize``
(and a stateless client at ``server/discover``) are what the ready backends offer; a stateless (2026-07-28) client
hears of list changes on ``subscriptions/listen`` streams (``Upstreams.listen``), which is also why
``server/discover`` offers ``listChanged`` for every list. It is transport-agnostic: ``http.py`` mounts it on
streamable HTTP, the CLI runs it over stdio. A call's context names its session by ``session_digest`` only: session
ids never reach the log, the ledger or a span.

Multi-round-trip requests (MCP 2026-07-28, SEP-2322): when the backend serving a ``tools/call``, ``prompts/get`` or
``resources/read`` answers with an input-required result, the client gets its input requests as they are, with the
gateway's own ``requestState`` in place of the downstream's: a token sealed by gateway/continuation.py that says
which backend asked, its own name for the thing, for which caller, until when, and carries the downstream's state.
The client's retry is opened here and sent to that backend (``Router.resume`` for tools), with the client's input
responses and the downstream's state, whatever the catalog says now and whichever gateway process gets it; a token
that does not open (tampered, expired, another caller's, another request's, a backend the gateway no longer has) is
refused with the SDK's -32602 "Invalid or expired requestState". An input request for a capability the client did
not declare (elicitation, sampling, sampling with tools, roots) is answered with -32021
(``MISSING_REQUIRED_CLIENT_CAPABILITY``) and its ``requiredCapabilities``, as the SDK's own servers answer. A
handshake-era client cannot take an input-required result: the gateway asks it each input request on the call's own
stream and retries for it within that call (``_answer_here``), each round still a row of its own.

The other direction, bridged: a stateless client's ``tools/call`` that may reach a handshake-era downstream
(``may_ask_mid_call``) runs in a task of the gateway's own (``spawn_bridged``, a ``Bridge``), so that the downstream
that sends ``elicitation/create``, ``sampling/createMessage`` or ``roots/list`` mid-call can wait there: the client
is answered an input-required result carrying that request (key ``input``) and a sealed state naming a key of the
``pending`` table; its retry hands ``inputResponses.input`` to the waiting request and answers with what the call
says next (``bridged``). That waiting call lives in this process only, bounded by
``gateway.continuation.bridge_ttl_s`` and ``bridge_max_pending``; a retry that finds no such call here (expired,
another replica, a restart) or comes from another caller is refused with the same -32602. Each round that asked
leaves a row (``Router.note_round``), the call its own when it ends.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_dual_era_loop
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway.backends.base import Backend, ProgressFn
from gateway.backends.mcp.relay import Bridge, connection_of, forwarded_meta
from gateway.backends.mcp.session import ROUND, Round
from gateway.config import environ
from gateway.core.gate import ClientPolicy
from gateway.core.listings import Origin
from gateway.core.policies import ANONYMOUS, Identity, View
from gateway.core.router import CallContext, Unanswered
from gateway.core.runtime import VERSION, Gateway
from gateway.errors import (
    URI_CHARS,
    BackendRpcError,
    InputRequired,
    InvalidArguments,
    ToolNotFound,
    clip,
    quote,
)
from gateway.front.bridges import Bridges, may_ask, require_capabilities
from gateway.front.clients import Upstreams
from gateway.front.continuation import Continuation, Continuations, invalid_state, load_key, may_ask_mid_call
from gateway.front.exposure import Disclosure

__all__ = ["WITHHELD", "build_server", "session_digest"]

log = structlog.get_logger("gateway.server")

INVALID_PARAMS = -32602
WITHHELD = "gateway.withheld"
"""The key, in an HTTP request's scope state, of what edge.py found in a tools/call's arguments and did not pass on:
(argument path, reason). The router refuses the call with it, as invalid params, with its ledger row."""


class _GatewayServer(Server[Any]):
    """The SDK's low-level server, offering what the ready backends offer, with ``listChanged`` for every list."""

    def __init__(self, gateway: Gateway, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gateway = gateway

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(tools_changed=True, resources_changed=True, prompts_changed=True),
            experimental_capabilities,
            extensions,
        )

    async def run(
        self,
        read_stream: Any,
        write_stream: Any,
        initialization_options: InitializationOptions,
        raise_exceptions: bool = False,
    ) -> None:
        """Serve one connection (stdio). What is offered follows the ready backends, so it is worked out at the
        handshake (``create_initialization_options``), not fixed by ``initialization_options`` when the transport
        starts, before the backends have connected."""
        async with self.lifespan(self) as lifespan_context:
            await serve_dual_era_loop(
                self,
                read_stream,
                write_stream,
                lifespan_state=lifespan_context,
                init_options=None,
                raise_exceptions=raise_exceptions,
            )

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        offers = self._gateway.catalog.lists.offers
        resources = caps.resources
        if resources is not None:
            resources = resources.model_copy(update={"subscribe": bool(resources.subscribe) and offers.subscribe})
        return caps.model_copy(
            update={
                "resources": resources if offers.resources else None,
                "prompts": caps.prompts if offers.prompts else None,
                "completions": caps.completions if offers.completions else None,
                "logging": (caps.logging or types.LoggingCapability()) if offers.logging else None,
            }
        )


def session_digest(session_id: str | None) -> str | None:
    """What the log, the ledger and spans say instead of a session id: 12 hex digits of its SHA-256.

    A session id is a bearer credential for the session (whoever holds it can try to use it), so it is never
    written down; the digest still correlates one session's calls, and an operator who has the id can compute it.
    """
    return hashlib.sha256(session_id.encode()).hexdigest()[:12] if session_id else None


def _call_context(ctx: ServerRequestContext[Any], clients: ClientPolicy) -> CallContext:
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    request = ctx.request
    session_id = None
    caller = None
    headers = None
    withheld = None
    if request is not None and hasattr(request, "headers"):  # a Starlette request on HTTP, None on stdio
        headers = request.headers
        session_id = session_digest(headers.get("mcp-session-id"))
        state = request.scope.get("state", {})
        caller = state.get("caller")
        withheld = state.get(WITHHELD)
    name = info.name if info is not None else None
    version = info.version if info is not None else None
    return CallContext(
        session_id=session_id,
        client_name=name,
        client_version=version,
        caller=caller,
        declared=clients.declared(name, version, headers),
        upstream=ctx,  # the back-channel's and a traceparent's origin (the router passes it on)
        withheld=withheld,
    )


def _identity(ctx: ServerRequestContext[Any]) -> Identity:
    """Who sent the request (HTTP: what the guard found; stdio: nobody in particular)."""
    request = ctx.request
    if request is None or not hasattr(request, "scope"):
        return ANONYMOUS
    return Identity.of(request.scope.get("state"))


def build_server(gateway: Gateway) -> tuple[Server[Any], Upstreams]:
    """The MCP server that fronts ``gateway``; pair it with a transport (HTTP app or stdio)."""
    disclosure = Disclosure(lambda: gateway.config, lambda: gateway.catalog, lambda: gateway.backends)
    upstreams = Upstreams(
        gateway.catalog,
        lambda: gateway.backends,
        disclosure.tools_changed_for,
        searching=lambda ctx: searching(ctx),
        search_list_changed=disclosure.search_list_changed,
        current=lambda: gateway.catalog,
    )
    views = upstreams.views
    disclosure.use_views(views)

    def view(ctx: ServerRequestContext[Any]) -> View | None:
        """The caller's view of the catalog (auth/policies.py); None: no policies, it sees everything."""
        return views.view(gateway.catalog, _identity(ctx))

    def searching(ctx: ServerRequestContext[Any]) -> bool:
        """Whether the request's client is in search exposure, by its clientInfo: the initialize's in the handshake
        era, the request's own ``_meta`` in the stateless one (the SDK's ``Connection.from_envelope`` puts it in
        ``client_params`` either way)."""
        call_ctx = _call_context(ctx, gateway.clients)
        large = gateway.clients.is_large(call_ctx.declared)
        return disclosure.searching(call_ctx.client_name, call_ctx.client_version, large, connection_of(ctx))

    def listing(ctx: ServerRequestContext[Any]) -> Mapping[str, Any]:
        call_ctx = _call_context(ctx, gateway.clients)
        large = gateway.clients.is_large(call_ctx.declared)
        seen = view(ctx)
        if disclosure.searching(call_ctx.client_name, call_ctx.client_version, large, connection_of(ctx)):
            return disclosure.listing(gateway.catalog, large, seen)  # search exposure: search, call, the pins
        return seen.listing(large) if seen is not None else gateway.catalog.listing(large)

    # The startup wait (runtime.py ``wait_started``): a request that races startup (a list, a call naming a tool not
    # known yet, a route that would degrade past a provider about to be ready) waits, bounded, for every backend's
    # first outcome. A request the router dispatches waits in the router instead (``Router.wait_started``), which
    # writes its ledger row if it ends there.
    settled = gateway.wait_started

    validated = _ValidatedLists()
    continuations = _continuations(gateway)
    bridges = Bridges(gateway, continuations)

    async def asked(
        ctx: ServerRequestContext[Any],
        method: str,
        name: str,
        arguments: Mapping[str, Any] | None,
        caller: str | None,
        exc: InputRequired,
        again: Callable[[Origin, Round], Awaitable[Any]],
    ) -> Any:
        """The client's view of a backend's input-required answer: its requests as they are, our sealed state.

        A handshake-era client cannot take an input-required result: the gateway asks it each input request on the
        call's own stream instead (as the downstream's own requests are relayed) and retries with the answers
        (``again``), round after round, within this one request."""
        downstream = exc.result
        assert isinstance(downstream, types.InputRequiredResult)
        require_capabilities(ctx.session.client_capabilities, downstream.input_requests or {})
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await _answer_here(ctx, exc, lambda r: again(Origin(exc.backend, exc.tool), r))
        state = continuations.seal(
            method=method,
            name=name,
            arguments=arguments,
            backend=exc.backend,
            local=exc.tool,
            caller=caller,
            state=downstream.request_state,
        )
        return downstream.model_copy(update={"request_state": state})

    def reopen(
        method: str, name: str, arguments: Mapping[str, Any] | None, caller: str | None, token: object
    ) -> tuple[Continuation, Backend]:
        """A retry's state, verified, and the backend that asked (refused as the spec says when it is gone)."""
        found = continuations.open(token, method=method, name=name, arguments=arguments, caller=caller)
        backend = gateway.backends.get(found.backend)
        if backend is None or not backend.serves_requests:
            invalid_state(method, "the backend that asked is no longer configured")
        return found, backend

    async def bridge_round(
        ctx: ServerRequestContext[Any],
        method: str,
        name: str,
        arguments: Mapping[str, Any] | None,
        caller: str | None,
        params: types.GetPromptRequestParams | types.ReadResourceRequestParams,
    ) -> Any:
        """A stateless client's ``prompts/get`` or ``resources/read``, bridged when a handshake-era backend serves it
        (its first round) or when its state names a waiting request (a later one); None when it is not bridged.
        The bridged work is the request itself, served again by the same handler, inside the bridge."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or bridges.inside():
            return None
        if params.request_state is None:
            lists = gateway.catalog.lists
            origins = (lists.prompt(name),) if method == "prompts/get" else lists.resolve(name)
            if not may_ask(gateway.backends, [o.backend for o in origins if o is not None]):
                return None
            plain = params.model_copy(update={"input_responses": None})
            serve = get_prompt if method == "prompts/get" else read_resource

            async def work() -> Any:
                with _round(_ahead(params.input_responses)):
                    return await serve(ctx, plain)  # type: ignore[arg-type]

            bridge = bridges.start(ctx, caller, work)
        else:
            found = continuations.open(
                params.request_state, method=method, name=name, arguments=arguments, caller=caller
            )
            reopened = bridges.reopened(found, method, caller, params.input_responses)
            if reopened is None:
                return None
            bridge = reopened
        return await bridges.next(ctx, bridge, method=method, name=name, arguments=arguments, caller=caller)

    async def middleware(ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        try:
            return await serve(ctx, call_next)
        except (MCPError, ValidationError, anyio.get_cancelled_exc_class()):
            raise  # the SDK's own answers (a ValidationError of the params is its invalid params), and cancellation
        except Exception as exc:  # the per-request boundary: a fault while serving one request ends it alone
            log.exception("request.internal_error", method=ctx.method, error=type(exc).__name__)
            raise MCPError(
                types.INTERNAL_ERROR,
                f"The gateway failed while serving this {ctx.method} request ({type(exc).__name__}); "
                "the session and other requests are not affected.",
            ) from None

    async def serve(ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        # A client that connects while the backends are still connecting would be offered too little (no
        # resources, no prompts): the first handshake (or, stateless, the first `server/discover`, or a listen stream,
        # whose resource subscriptions need the backends that serve them) waits, bounded, for every backend's first
        # outcome.
        if ctx.method in ("initialize", "server/discover", "subscriptions/listen") and not gateway.started:
            await settled()
        if ctx.method == "tools/list" and gateway.started and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = connection_of(ctx)
            if connection is not None and connection.initialize_accepted:
                # The SDK would validate and re-dump the whole list on every request (87% of a 2,500-tool
                # tools/list); an answer validated once per catalog and protocol version is returned as is.
                answer = validated.answer(listing(ctx), ctx.protocol_version)

                async def cached(_: ServerRequestContext[Any]) -> HandlerResult:
                    return answer

                return await upstreams.track(ctx, cached)
        return await upstreams.track(ctx, call_next)

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await settled()
        # Pre-serialised once per catalog and policy (no per-request model work); large-context tools only for
        # large clients.
        return _enveloped(ctx, listing(ctx))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        progress = _progress(ctx)
        call_ctx = _call_context(ctx, gateway.clients)
        await gateway.router.wait_started("tools/call", params.name, arguments=params.arguments, ctx=call_ctx)
        seen = view(ctx)
        if seen is not None:
            call_ctx = dataclasses.replace(call_ctx, visible=seen.tools)

        async def resume(origin: Origin, retry: Round) -> types.CallToolResult:
            with _round(retry):
                return await gateway.router.resume(
                    params.name,
                    params.arguments,
                    backend_name=origin.backend,
                    tool=origin.local,
                    ctx=call_ctx,
                    progress=progress,
                )

        try:
            large = gateway.clients.is_large(call_ctx.declared)
            if disclosure.searching(call_ctx.client_name, call_ctx.client_version, large, connection_of(ctx)):
                if params.name == disclosure.exposure.search_tool:
                    visible = call_ctx.visible  # the caller's policy (None: every tool), less the gated ones if small
                    if not large:
                        visible = frozenset(visible if visible is not None else gateway.catalog.entries)
                        visible -= gateway.clients.gated
                    return await disclosure.search(params.arguments, visible)
                if params.name == disclosure.exposure.call_tool:  # routed and audited as the real tool's own call
                    name, arguments = disclosure.unwrap(params.arguments)
                    params = params.model_copy(update={"name": name, "arguments": arguments})
            try:
                if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    bridge: Bridge | None = None
                    if params.request_state is None:
                        if may_ask_mid_call(gateway.catalog, gateway.backends, params.name):

                            async def work() -> types.CallToolResult:
                                with _round(_ahead(params.input_responses)):
                                    return await gateway.router.call(
                                        params.name, params.arguments, ctx=call_ctx, progress=_quiet(progress)
                                    )

                            bridge = bridges.start(ctx, call_ctx.caller, work)
                    else:
                        found = continuations.open(
                            params.request_state,
                            method="tools/call",
                            name=params.name,
                            arguments=params.arguments,
                            caller=call_ctx.caller,
                        )
                        bridge = bridges.reopened(found, "tools/call", call_ctx.caller, params.input_responses)
                    if bridge is not None:

                        async def on_round(backend: str, method: str) -> None:
                            await gateway.router.note_round(
                                params.name, params.arguments, backend=backend, method=method, ctx=call_ctx
                            )

                        answer_now: types.CallToolResult | types.InputRequiredResult = await bridges.next(
                            ctx,
                            bridge,
                            method="tools/call",
                            name=params.name,
                            arguments=params.arguments,
                            caller=call_ctx.caller,
                            on_round=on_round,
                        )
                        return answer_now
                if params.request_state is None:
                    with _round(_ahead(params.input_responses)):
                        return await gateway.router.call(params.name, params.arguments, ctx=call_ctx, progress=progress)
                found, _ = reopen("tools/call", params.name, params.arguments, call_ctx.caller, params.request_state)
                return await resume(Origin(found.backend, found.local), Round(params.input_responses, found.state))
            except InputRequired as exc:
                answer: types.CallToolResult | types.InputRequiredResult = await asked(
                    ctx, "tools/call", params.name, params.arguments, call_ctx.caller, exc, resume
                )
                return answer
        except (ToolNotFound, InvalidArguments) as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from exc
        except BackendRpcError as exc:
            raise MCPError(exc.code, exc.message, exc.data) from exc

    def input_schema(name: str) -> Mapping[str, Any] | None:
        entry = gateway.catalog.get(name)
        return entry.tool.input_schema if entry is not None else disclosure.input_schema(name)

    # -- resources, prompts, completion: forwarded to the backend that owns the name ---------------------------------

    async def forward(
        ctx: ServerRequestContext[Any],
        method: str,
        name: str,
        origins: tuple[Origin, ...],
        build: Callable[[Origin], Any],
        result_type: Any,
        none_answered: MCPError | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> tuple[Origin, Any]:
        """Send the request through the router to the first of ``origins`` that answers. A lone backend's JSON-RPC
        error passes through as it is; when several were asked and all refused, ``none_answered`` is the answer
        (else the first error)."""
        progress = _progress(ctx)

        async def send(backend: Backend, origin: Origin) -> Any:
            return await backend.request(build(origin), result_type, progress=progress)

        try:
            return await gateway.router.request(
                method, name, origins, send, arguments=arguments, ctx=_call_context(ctx, gateway.clients)
            )
        except Unanswered as exc:
            raise _refusal(exc, none_answered) from exc.failures[0] if exc.failures else None

    def visible_origins(ctx: ServerRequestContext[Any], uri: str) -> tuple[Origin, ...]:
        """The backends that may serve ``uri`` to this caller (none: answered as a resource that does not exist)."""
        origins = gateway.catalog.lists.resolve(uri)
        seen = view(ctx)
        return seen.origins(uri, origins) if seen is not None else origins

    def visible_prompt(ctx: ServerRequestContext[Any], name: str) -> Origin | None:
        seen = view(ctx)
        if seen is not None and name not in seen.prompts:
            return None  # answered as an unknown prompt
        return gateway.catalog.lists.prompt(name)

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await settled()
        seen = view(ctx)
        return _enveloped(ctx, seen.resources_result if seen is not None else gateway.catalog.lists.resources_result)

    async def list_resource_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> Any:
        await settled()
        seen = view(ctx)
        return _enveloped(ctx, seen.templates_result if seen is not None else gateway.catalog.lists.templates_result)

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> Any:
        call_ctx = _call_context(ctx, gateway.clients)
        await gateway.router.wait_started("resources/read", params.uri, ctx=call_ctx)
        caller = call_ctx.caller
        meta = forwarded_meta(params.meta)

        async def resume(origin: Origin, retry: Round) -> Any:
            with _round(retry):
                return await read_from(ctx, params, (origin,), meta)

        bridged = await bridge_round(ctx, "resources/read", params.uri, None, caller, params)
        if bridged is not None:
            return bridged
        try:
            return await read_round(ctx, params, caller)
        except InputRequired as exc:
            return await asked(ctx, "resources/read", params.uri, None, caller, exc, resume)

    async def read_round(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams, caller: str | None
    ) -> Any:
        meta = forwarded_meta(params.meta)
        origins: tuple[Origin, ...]
        retry: Round | None
        if params.request_state is not None:  # a later round: to the backend that asked, whatever the lists say
            found, _ = reopen("resources/read", params.uri, None, caller, params.request_state)
            origins = (Origin(found.backend, found.local),)
            retry = Round(params.input_responses, found.state)
        else:
            origins = visible_origins(ctx, params.uri)
            retry = _ahead(params.input_responses)
        not_found = MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)})
        if not origins:
            raise not_found
        with _round(retry):
            try:
                return await read_from(ctx, params, origins, meta)
            except MCPError as exc:
                if exc.error.code in _NOT_FOUND_CODES and view(ctx) is not None:
                    raise not_found from None  # with policies, a downstream's own "not found" is told as a hidden one
                raise

    async def read_from(
        ctx: ServerRequestContext[Any],
        params: types.ReadResourceRequestParams,
        origins: tuple[Origin, ...],
        meta: Any,
    ) -> Any:

        def build(origin: Origin) -> types.ReadResourceRequest:
            update = {"uri": origin.local, "meta": meta, "input_responses": None, "request_state": None}
            return types.ReadResourceRequest(params=params.model_copy(update=update))

        # An unlisted URI may be asked of several backends; when none has it, the answer is SEP-2164's.
        not_found = MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)})
        origin, result = await forward(
            ctx, "resources/read", params.uri, origins, build, types.ReadResourceResult, not_found
        )
        if origin.local != params.uri:  # published under a prefix: the contents name the URI the client asked for
            for contents in result.contents:
                if contents.uri == origin.local:
                    contents.uri = params.uri
        return result

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        await gateway.router.wait_started("resources/subscribe", params.uri, ctx=_call_context(ctx, gateway.clients))

        async def send(backend: Backend, origin: Origin) -> None:
            await upstreams.subscribe(ctx, params.uri, origin, backend)

        origins = visible_origins(ctx, params.uri)
        try:
            await gateway.router.request(
                "resources/subscribe", params.uri, origins, send, ctx=_call_context(ctx, gateway.clients)
            )
        except Unanswered as exc:
            failure = exc.failures[-1] if exc.failures else None
            if isinstance(failure, BackendRpcError):
                raise MCPError(failure.code, failure.message, failure.data) from failure
            raise MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)}) from None
        return types.EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        origin = upstreams.forget(ctx, params.uri)
        if origin is not None:

            async def send(backend: Backend, origin: Origin) -> None:
                await backend.unsubscribe_resource(origin.local)

            try:
                await gateway.router.request(
                    "resources/unsubscribe", params.uri, (origin,), send, ctx=_call_context(ctx, gateway.clients)
                )
            except Unanswered:
                pass  # the backend is gone (or no session): nothing downstream holds the subscription any more
        return types.EmptyResult()

    async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await settled()
        seen = view(ctx)
        return _enveloped(ctx, seen.prompts_result if seen is not None else gateway.catalog.lists.prompts_result)

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> Any:
        call_ctx = _call_context(ctx, gateway.clients)
        await gateway.router.wait_started("prompts/get", params.name, arguments=params.arguments, ctx=call_ctx)
        caller = call_ctx.caller
        bridged = await bridge_round(ctx, "prompts/get", params.name, params.arguments, caller, params)
        if bridged is not None:
            return bridged
        origin: Origin | None
        retry: Round | None
        if params.request_state is not None:  # a later round: to the backend that asked, whatever the lists say
            found, _ = reopen("prompts/get", params.name, params.arguments, caller, params.request_state)
            origin = Origin(found.backend, found.local)
            retry = Round(params.input_responses, found.state)
        else:
            origin = visible_prompt(ctx, params.name)
            retry = _ahead(params.input_responses)
        if origin is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {quote(params.name)}")
        meta = forwarded_meta(params.meta)

        def build(origin: Origin) -> types.GetPromptRequest:
            update = {"name": origin.local, "meta": meta, "input_responses": None, "request_state": None}
            return types.GetPromptRequest(params=params.model_copy(update=update))

        async def send_to(origin: Origin, again: Round | None) -> Any:
            with _round(again):
                found = await forward(
                    ctx, "prompts/get", params.name, (origin,), build, types.GetPromptResult, None, params.arguments
                )
                return found[1]

        async def resume(origin: Origin, again: Round) -> Any:
            return await send_to(origin, again)

        try:
            return await send_to(origin, retry)
        except InputRequired as exc:
            return await asked(ctx, "prompts/get", params.name, params.arguments, caller, exc, resume)

    async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> Any:
        ref = params.ref
        name = ref.name if isinstance(ref, types.PromptReference) else ref.uri
        await gateway.router.wait_started("completion/complete", name, ctx=_call_context(ctx, gateway.clients))
        lists = gateway.catalog.lists
        origin: Origin | None
        if isinstance(ref, types.PromptReference):
            origin = visible_prompt(ctx, ref.name)
        else:
            origin = lists.template(ref.uri) or next(iter(lists.resolve(ref.uri)), None)
            seen = view(ctx)
            if origin is not None and seen is not None and not seen.origins(ref.uri, (origin,)):
                origin = None
        if origin is None:
            raise MCPError(types.INVALID_PARAMS, "No backend offers this prompt or resource.")
        meta = forwarded_meta(params.meta)

        def build(origin: Origin) -> types.CompleteRequest:
            local_ref = ref.model_copy(
                update={"name": origin.local} if isinstance(ref, types.PromptReference) else {"uri": origin.local}
            )
            return types.CompleteRequest(params=params.model_copy(update={"ref": local_ref, "meta": meta}))

        return (await forward(ctx, "completion/complete", name, (origin,), build, types.CompleteResult))[1]

    async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        await upstreams.set_level(ctx, params.level)
        return types.EmptyResult()

    server = _GatewayServer(
        gateway,
        gateway.config.gateway.name,
        version=VERSION,
        instructions=disclosure.instructions(gateway.config.gateway.instructions),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
        get_tool_input_schema=input_schema,
        on_subscriptions_listen=upstreams.listen,
    )
    # Registered directly: the constructor's `on_set_logging_level` warns (logging is deprecated as of 2026-07-28),
    # but every handshake-era client uses it.
    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)

    async def roots_changed(ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        connection = connection_of(ctx)
        for backend in gateway.backends.values():
            await backend.roots_changed(connection)

    # Registered directly for the same reason (roots are deprecated as of 2026-07-28).
    server.add_notification_handler("notifications/roots/list_changed", types.NotificationParams, roots_changed)
    server.middleware.clear()  # the default OpenTelemetry middleware costs 5-15% per call; tracing is opt-in
    server.middleware.append(middleware)
    gateway.on_catalog_change(upstreams.announce)
    gateway.on_backend_notification(upstreams.on_backend_notification)
    return server, upstreams


def _continuations(gateway: Gateway) -> Continuations:
    """The sealer of this gateway's ``requestState``, under a key replicas and restarts share (continuation.py)."""
    settings = gateway.config.gateway.continuation
    audit = gateway.config.gateway.audit
    ledger = audit.path if audit.enabled else None
    keys, source = load_key(settings.key_env, environ(settings.key_env), ledger, file=str(gateway.config.source or ""))
    if source == "this process only":
        log.warning(
            "request_state.ephemeral_key",
            note=f"{settings.key_env} is not set and the audit ledger is off: a multi-round-trip request whose client "
            "retries after a restart of this gateway, or at another replica, is refused",
        )
    else:
        log.info("request_state.key", source=source)
    return Continuations(keys, settings.ttl_s)


def _refusal(exc: Unanswered, none_answered: MCPError | None) -> MCPError:
    """What the client is answered when no backend answered its request (``Router.request``)."""
    failures = exc.failures
    if len(failures) > 1 and none_answered is not None:
        return none_answered
    failure = failures[0] if failures else None
    if isinstance(failure, BackendRpcError):
        return MCPError(failure.code, failure.message, failure.data)
    if failure is not None:
        return MCPError(types.INTERNAL_ERROR, str(failure))
    return MCPError(types.INVALID_PARAMS, "No backend serves this request.")


def _quiet(progress: ProgressFn | None) -> ProgressFn | None:
    """``progress`` for a bridged request, whose later rounds come on other requests: a relay to a request that has
    ended is dropped."""
    if progress is None:
        return None
    relayed = progress

    async def quiet(progress: float, total: float | None, message: str | None) -> None:
        try:
            await relayed(progress, total, message)
        except Exception:  # the request that asked for progress may have ended (a later round)
            pass

    return quiet


def _ahead(responses: Mapping[str, Any] | None) -> Round | None:
    """Input responses sent without a state (a client answering ahead, or a stateless server's own flow) go to the
    backend as they are: the server decides what they are worth (SEP-2322: re-ask, or ignore what it does not know)."""
    return Round(responses, None) if responses is not None else None


@contextmanager
def _round(retry: Round | None) -> Iterator[None]:
    """``retry`` in effect for the downstream requests made inside (backends/mcp.py ``ROUND``)."""
    if retry is None:
        yield
        return
    token = ROUND.set(retry)
    try:
        yield
    finally:
        ROUND.reset(token)


_NOT_FOUND_CODES = frozenset({INVALID_PARAMS, -32002})
"""A downstream's "no such resource" (-32002 is the code of the specification before SEP-2164)."""

MAX_ROUNDS = 10
"""The most rounds the gateway answers for a handshake-era client (the SDK client's own default cap)."""


async def _answer_here(
    ctx: ServerRequestContext[Any], exc: InputRequired, again: Callable[[Round], Awaitable[Any]]
) -> Any:
    """Drive a multi-round-trip request for a handshake-era client: each input request goes to it as a request of
    its own on this call's stream, one after the other; the answers go back to the backend with its state."""
    for _ in range(MAX_ROUNDS):
        downstream = exc.result
        assert isinstance(downstream, types.InputRequiredResult)
        requests = downstream.input_requests or {}
        require_capabilities(ctx.session.client_capabilities, requests)
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            try:
                responses[key] = await ctx.session.send_request(
                    request,
                    _input_result_type(request),
                    metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
                )
            except NoBackChannelError:
                raise MCPError(
                    types.INVALID_REQUEST,
                    f"The server behind this request needs input ({request.method}) and this call has no channel "
                    "back to the client to ask for it.",
                ) from None
        try:
            return await again(Round(responses, downstream.request_state))
        except InputRequired as more:
            exc = more
    raise MCPError(
        types.INTERNAL_ERROR, f"The server behind this request still asked for input after {MAX_ROUNDS} rounds."
    )


def _input_result_type(request: Any) -> Any:
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    if isinstance(request, types.ListRootsRequest):
        return types.ListRootsResult
    if isinstance(request, types.CreateMessageRequest) and request.params.tools:
        return types.CreateMessageResultWithTools
    return types.CreateMessageResult


class _ValidatedLists:
    """``tools/list`` answers validated against the protocol version once, reused until the catalog changes."""

    MAX = 64  # a catalog has two listings (large and small clients) per policy and protocol version in use

    def __init__(self) -> None:
        # (id of the listing, version) -> (the listing, kept alive so its id cannot be reused; the answer)
        self._answers: dict[tuple[int, str], tuple[Mapping[str, Any], dict[str, Any]]] = {}

    def answer(self, listing: Mapping[str, Any], version: str) -> dict[str, Any]:
        found = self._answers.get((id(listing), version))
        if found is not None:
            return found[1]
        if len(self._answers) >= self.MAX:
            self._answers.clear()  # older catalogs' answers: never asked for again
        answer = _methods.serialize_server_result("tools/list", version, dict(listing))
        self._answers[(id(listing), version)] = (listing, answer)
        return answer


_MODERN_LIST_ENVELOPE = {"ttlMs": 0, "cacheScope": "private", "resultType": "complete"}
"""What a 2026-07-28 list result must carry besides its items (SEP-2549 cache hints: "do not cache", the SDK's
defaults). Handshake-era answers are sent as pre-serialised, untouched."""


def _enveloped(ctx: ServerRequestContext[Any], listed: Mapping[str, Any]) -> Mapping[str, Any]:
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return {**listed, **_MODERN_LIST_ENVELOPE}
    return listed


def _progress(ctx: ServerRequestContext[Any]) -> ProgressFn | None:
    """Relay a forwarded request's progress on the client's own stream, against its own token, when it asked."""
    if ctx.meta and ctx.meta.get("progress_token") is not None:
        return ctx.session.report_progress
    return None
