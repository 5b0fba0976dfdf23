"""The SDK's low-level server as the gateway serves it, and the small translations every handler shares.

``GatewayServer`` offers what the ready backends offer, worked out at each handshake (not when the transport starts,
before the backends connected), with ``listChanged`` for every list. ``ValidatedLists`` keeps each ``tools/list``
answer validated once per catalog and protocol version. A 2026-07-28 list result carries SEP-2549's cache hints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_dual_era_loop
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.backends.base import ProgressFn
from gateway.core.listings import Offers
from gateway.core.router import Unanswered
from gateway.core.runtime import Gateway
from gateway.core.tasks import offered_extensions
from gateway.errors import BackendRpcError
from gateway.observe.logs import redactor

__all__ = ["GatewayServer", "ValidatedLists", "enveloped", "quiet", "refusal", "scrubbed"]


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
        """Serve one connection (stdio). What is offered follows the ready backends, so it is worked out at the
        handshake (``create_initialization_options``), not fixed by ``initialization_options`` when the transport
        starts."""
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
