"""The SDK's low-level server as the gateway serves it, and the small translations every handler shares.

``GatewayServer`` offers what the ready backends offer, worked out at each handshake (not when the transport starts,
before the backends connected), with ``listChanged`` for every list. ``ValidatedLists`` keeps each ``tools/list``
answer validated once per catalog and protocol version. A 2026-07-28 list result carries SEP-2549's cache hints.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskStatus
from mcp.server import Server
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_connection, serve_dual_era_loop
from mcp.shared.dispatcher import DispatchContext, OnNotify, OnNotifyIntercept, OnRequest
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage
from mcp.shared.transport_context import TransportContext
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.backends.base import ProgressFn
from gateway.core.listings import Offers
from gateway.core.router import Unanswered
from gateway.core.runtime import Gateway
from gateway.core.tasks import offered_extensions
from gateway.errors import BackendRpcError
from gateway.front.streams import ReadEnd
from gateway.observe.logs import redactor

__all__ = [
    "GatewayServer",
    "HandshakeDispatcher",
    "ValidatedLists",
    "carries_envelope",
    "enveloped",
    "opening_request",
    "quiet",
    "refusal",
    "scrubbed",
    "serve_handshake",
]


class GatewayServer(Server[Any]):
    """The SDK's low-level server, offering what the ready backends offer, with ``listChanged`` for every list."""

    def __init__(self, gateway: Gateway, *args: Any, **kwargs: Any) -> None:
        self._gateway = gateway
        self._instructions: str | None = None
        super().__init__(*args, **kwargs)

    @property
    def instructions(self) -> str | None:
        """The instructions, and with ``router_note_in: once`` the router note after them (as the small tools/list
        carries it: no tool a small client cannot see is named)."""
        note = self._gateway.catalog.notes[1] if self._gateway.config.gateway.router_note_in == "once" else ""
        if not note:
            return self._instructions
        return f"{self._instructions.rstrip()}\n\n{note}" if self._instructions else note

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._instructions = value

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
        """Serve one connection (stdio) in the era its first request opens. What is offered follows the ready
        backends, so it is worked out at the handshake (``create_initialization_options``), not fixed by
        ``initialization_options`` when the transport starts.

        A handshake-era connection (the first request an ``initialize``, or none) is served by ``serve_handshake``,
        its messages read straight from ``read_stream``; a 2026-07-28 one by the SDK's dual-era loop, which relays
        every message through a task of its own to the loop it chose (the handshake-era ones save that hop)."""
        async with self.lifespan(self) as lifespan_context:
            opening, replayed = await opening_request(read_stream)
            if opening is not None and opening.method != "initialize" and carries_envelope(opening.params):
                await serve_dual_era_loop(
                    self,
                    replayed,
                    write_stream,
                    lifespan_state=lifespan_context,
                    init_options=None,
                    raise_exceptions=raise_exceptions,
                )
                return
            await serve_handshake(
                self, replayed, write_stream, lifespan_state=lifespan_context, raise_exceptions=raise_exceptions
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
        # A session still starting may bring any capability: the handshake is not held for it (nor for a probe),
        # so it is offered all of them; their lists fill in with list_changed once the backend is ready.
        offers = STILL_STARTING if self._gateway.sessions_starting() else self._gateway.catalog.lists.offers
        resources = caps.resources
        if resources is not None:
            resources = resources.model_copy(update={"subscribe": bool(resources.subscribe) and offers.subscribe})
        extensions = offered_extensions(self._gateway.backends.values())  # a downstream's, e.g. tasks (SEP-2663)
        return caps.model_copy(
            update={
                "extensions": {**extensions, **(caps.extensions or {})} or None,
                "resources": resources if offers.resources or self._gateway.answers.on else None,
                "prompts": caps.prompts if offers.prompts else None,
                "completions": caps.completions if offers.completions else None,
                "logging": (caps.logging or types.LoggingCapability()) if offers.logging else None,
            }
        )


LEAD_FRAMES = 8
"""Frames a client sends before its first request that are kept for the session (a bare ``initialized``, say);
further ones are dropped, as the SDK's era loop drops them."""


class Replayed(ReadEnd[SessionMessage | Exception]):
    """A read stream with the frames already read from it in front, then the stream itself (no task between)."""

    def __init__(self, lead: list[SessionMessage | Exception], stream: Any) -> None:
        self._lead = collections.deque(lead)
        self._stream = stream

    async def receive(self) -> SessionMessage | Exception:
        if self._lead:
            return self._lead.popleft()
        item: SessionMessage | Exception = await self._stream.receive()
        return item

    async def aclose(self) -> None:
        self._lead.clear()
        await self._stream.aclose()


async def opening_request(read_stream: Any) -> tuple[types.JSONRPCRequest | None, Replayed]:
    """The client's first request (None: the stream ended first) and the stream again, from its first frame."""
    lead: list[SessionMessage | Exception] = []
    try:
        async for item in read_stream:
            if isinstance(item, SessionMessage) and isinstance(item.message, types.JSONRPCRequest):
                lead.append(item)
                return item.message, Replayed(lead, read_stream)
            if len(lead) < LEAD_FRAMES:
                lead.append(item)
    except anyio.ClosedResourceError:
        pass  # closed under us: as at its end
    return None, Replayed(lead, read_stream)


def carries_envelope(params: Mapping[str, Any] | None) -> bool:
    """Whether a request carries the 2026-07-28 envelope (its protocol version in ``_meta``)."""
    meta = (params or {}).get("_meta")
    return isinstance(meta, Mapping) and types.PROTOCOL_VERSION_META_KEY in meta


class HandshakeDispatcher(JSONRPCDispatcher[TransportContext]):
    """The SDK's dispatcher for a handshake-era connection that refuses a request carrying the 2026-07-28 envelope
    (such a request opens a connection of its own), as the SDK's era loop refuses it."""

    async def run(
        self,
        on_request: OnRequest,
        on_notify: OnNotify,
        on_notify_intercept: OnNotifyIntercept | None = None,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async def handshake_era(
            dctx: DispatchContext[TransportContext], method: str, params: Mapping[str, Any] | None
        ) -> dict[str, Any]:
            if method != "initialize" and carries_envelope(params):
                raise MCPError(
                    types.INVALID_REQUEST,
                    "this connection serves the handshake protocol era; requests carrying the 2026-07-28 envelope "
                    "are not accepted on it",
                )
            return await on_request(dctx, method, params)

        await super().run(handshake_era, on_notify, on_notify_intercept, task_status=task_status)


async def serve_handshake(
    server: Server[Any], read_stream: Any, write_stream: Any, *, lifespan_state: Any, raise_exceptions: bool = False
) -> None:
    """Serve a handshake-era connection until its read stream ends: the SDK's dispatcher (``initialize`` handled
    before the next message is read) and runner, as each HTTP session is served."""
    dispatcher = HandshakeDispatcher(
        read_stream,
        write_stream,
        raise_handler_exceptions=raise_exceptions,
        inline_methods=frozenset({"initialize"}),  # a client that pipelines its next request sees it initialized
    )
    connection = Connection.for_loop(dispatcher)
    await serve_connection(server, dispatcher, connection=connection, lifespan_state=lifespan_state)


STILL_STARTING = Offers(resources=True, subscribe=True, prompts=True, completions=True, logging=True)
"""What the gateway offers while a downstream session has not had its first outcome: everything it may bring."""


class ValidatedLists:
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


def enveloped(ctx: ServerRequestContext[Any], listed: Mapping[str, Any], ttl_ms: int) -> Mapping[str, Any]:
    """A list answer as the request's era wants it: a 2026-07-28 one carries SEP-2549's cache hints, ``ttl_ms``
    (``Gateway.list_ttl_ms``) and ``cacheScope: private`` (a list is answered to a signed-in caller, often filtered
    for it: no shared cache may hand it to another); handshake-era answers go as pre-serialised, untouched."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return {**listed, "ttlMs": ttl_ms, "cacheScope": "private", "resultType": "complete"}
    return listed


def quiet(progress: ProgressFn | None) -> ProgressFn | None:
    """``progress`` for a bridged request, whose later rounds come on other requests: a relay to a request that has
    ended is dropped."""
    if progress is None:
        return None
    relayed = progress

    async def quieted(progress: float, total: float | None, message: str | None) -> None:
        try:
            await relayed(progress, total, message)
        except Exception:  # the request that asked for progress may have ended (a later round)
            pass

    return quieted


def refusal(exc: Unanswered, none_answered: MCPError | None) -> MCPError:
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


def scrubbed(exc: MCPError) -> MCPError:
    """``exc`` with every registered secret scrubbed from its message and data (a backend's failure quoted in an
    error answer may hold one: observe/logs.py); ``exc`` itself when it held none."""
    error = exc.error
    message, data = redactor.scrub(error.message), redactor.scrub(error.data)
    if message == error.message and data == error.data:
        return exc
    return MCPError(error.code, message, data)
