"""The gateway's clients, and what it owes each of them besides answers: list changes, log messages, resource updates.

``Upstreams`` holds every live client connection (weakly: a connection that goes away is forgotten) and:
  * announces a new catalog as ``notifications/{tools,resources,prompts}/list_changed``, one per list that changed:
    to every handshake-era (2025-xx) connection, and as an event on ``bus``, which serves the stateless era's
    ``subscriptions/listen`` streams (the SDK's ``ListenHandler`` acknowledges, tags each frame with the stream's
    subscription id and delivers only the kinds that stream asked for). A listen stream's ``resourceSubscriptions``
    are not honoured (the ack leaves them out, as the spec lets a server do): resource updates reach the handshake
    era's subscribers, whose ``resources/subscribe`` subscribes the downstream;
  * keeps each client's ``logging/setLevel`` choice on its own connection, so a client's level changes what *that*
    client is sent and nothing else: a downstream's log message that belongs to a call goes to that call's client
    (on the call's own stream) when its level admits it; one that belongs to no call goes to the clients that asked
    for log messages with ``logging/setLevel``. The downstreams are asked for the most verbose level any live client
    chose, so every client receives what it asked for; the gateway's own log level is never touched;
  * keeps each client's resource subscriptions: the downstream is subscribed once however many clients subscribe
    (``McpBackend`` counts), ``notifications/resources/updated`` goes to exactly the subscribers under the URI they
    subscribed with, and a client's subscriptions end with its connection.
"""

from __future__ import annotations

import weakref
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server.connection import allowed_log_levels
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ServerEvent, ToolsListChanged

from gateway.backends.base import Backend
from gateway.backends.relay import (
    LOG_LEVELS,
    Upstream,
    admits,
    client_log_level,
    connection_of,
    set_client_log_level,
)
from gateway.catalog import Catalog
from gateway.errors import BackendError
from gateway.listings import Origin

__all__ = ["Upstreams"]

log = structlog.get_logger("gateway.upstreams")

NOTIFY_TIMEOUT_S = 2.0
"""Bound on telling one client of a change (a stuck client must not hold up the others)."""
_SUBSCRIPTIONS_KEY = "mcp-gateway/subscriptions"


class Upstreams:
    """Every live client connection and the notifications it is owed (see the module docstring)."""

    def __init__(self, catalog: Catalog, backends: Any) -> None:
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        self._announced = catalog
        self._backends = backends  # () -> Mapping[str, Backend]
        self._downstream_level: types.LoggingLevel | None = None
        self.bus = InMemorySubscriptionBus()
        """List changes for the 2026-07-28 era's ``subscriptions/listen`` streams."""
        self._listen = ListenHandler(self.bus)

    async def listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """Serves one ``subscriptions/listen`` stream: list changes only (see the module docstring)."""
        lists_only = params.notifications.model_copy(update={"resource_subscriptions": None})
        return await self._listen(ctx, params.model_copy(update={"notifications": lists_only}))

    def __len__(self) -> int:
        return len(self._live)

    async def track(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        """Middleware: remember the connection (the request itself travels in its ``CallContext``)."""
        connection = connection_of(ctx)
        if connection is not None:
            self._live.add(connection)
        return await call_next(ctx)

    # -- list changes ---------------------------------------------------------------------------------------------

    async def announce(self, catalog: Catalog) -> None:
        previous, self._announced = self._announced, catalog
        changed = catalog.changes(previous)
        sends: list[str] = []
        events: list[ServerEvent] = []
        lists: tuple[tuple[str, ServerEvent], ...] = (
            ("tools", ToolsListChanged()),
            ("resources", ResourcesListChanged()),
            ("prompts", PromptsListChanged()),
        )
        for kind, change in lists:
            if kind in changed:
                sends.append(f"notifications/{kind}/list_changed")
                events.append(change)
        for event in events:
            await self.bus.publish(event)  # in-process fan-out: never blocks on a slow stream
        for connection in list(self._live):
            if not connection.initialized.is_set():
                continue
            for method in sends:
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    try:
                        await connection.notify(method, None)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, OSError):
                        self._live.discard(connection)

    # -- logging --------------------------------------------------------------------------------------------------

    async def set_level(self, ctx: Upstream, level: types.LoggingLevel) -> None:
        """A client's ``logging/setLevel``: remembered on its connection; the downstreams follow the most verbose."""
        connection = connection_of(ctx)
        if connection is None:
            return
        first = client_log_level(connection) is None
        set_client_log_level(connection, level)
        if first:  # its departure may lower the verbosity needed
            connection.exit_stack.push_async_callback(self._retune, connection)
        await self._retune()

    async def _retune(self, leaving: Any = None) -> None:
        levels = [client_log_level(c) for c in list(self._live) if c is not leaving]
        wanted = min((LOG_LEVELS.index(lv) for lv in levels if lv is not None), default=None)
        level = LOG_LEVELS[wanted] if wanted is not None else None
        if level is None or level == self._downstream_level:
            return
        self._downstream_level = level
        async with anyio.create_task_group() as tg:
            for backend in self._backends().values():
                if backend.serves_requests:
                    tg.start_soon(backend.set_log_level, level)

    async def _deliver_log(
        self, notification: types.LoggingMessageNotification, upstream: Upstream | None, owner: Any
    ) -> None:
        level = notification.params.level
        if upstream is not None:
            connection = connection_of(upstream)
            if admits(client_log_level(connection), level) and level in allowed_log_levels(
                upstream.protocol_version, upstream.meta
            ):
                await upstream.session.send_notification(notification, related_request_id=upstream.request_id)
            return
        # Not part of a call: the one client whose own session it came on, else the clients that asked for logs.
        targets = [owner] if owner is not None else [c for c in list(self._live) if client_log_level(c) is not None]
        params = notification.params.model_dump(by_alias=True, mode="json", exclude_none=True)
        for connection in targets:
            if admits(client_log_level(connection), level):
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    await connection.notify("notifications/message", params)

    # -- resource subscriptions -----------------------------------------------------------------------------------

    async def subscribe(self, ctx: Upstream, uri: str, origin: Origin, backend: Backend) -> None:
        """Subscribe ``ctx``'s client to ``uri`` (served by ``origin``).

        Raises:
            BackendError: the backend refused or could not be reached.
        """
        connection = connection_of(ctx)
        subscriptions = self._subscriptions(connection)
        if uri in subscriptions:
            return
        await backend.subscribe_resource(origin.local)
        subscriptions[uri] = origin

    def forget(self, ctx: Upstream, uri: str) -> Origin | None:
        """End ``ctx``'s client's subscription to ``uri``: the origin whose backend must be told (the caller tells
        it, ``Backend.unsubscribe_resource``), or None when the client held none."""
        return self._subscriptions(connection_of(ctx)).pop(uri, None)

    def _subscriptions(self, connection: Any) -> dict[str, Origin]:
        state = getattr(connection, "state", None)
        if not isinstance(state, dict):
            return {}
        subscriptions: dict[str, Origin] | None = state.get(_SUBSCRIPTIONS_KEY)
        if subscriptions is None:
            subscriptions = state[_SUBSCRIPTIONS_KEY] = {}
            connection.exit_stack.push_async_callback(self._release_all, subscriptions)
        return subscriptions

    async def _release_all(self, subscriptions: dict[str, Origin]) -> None:
        for origin in list(subscriptions.values()):
            await self._release(origin)
        subscriptions.clear()

    async def _release(self, origin: Origin) -> None:
        backend = self._backends().get(origin.backend)
        if backend is not None:
            await backend.unsubscribe_resource(origin.local)

    async def _deliver_update(self, backend: str, uri: str) -> None:
        for connection in list(self._live):
            state = getattr(connection, "state", None)
            subscriptions = state.get(_SUBSCRIPTIONS_KEY) if isinstance(state, dict) else None
            for published, origin in list((subscriptions or {}).items()):
                if origin.backend == backend and origin.local == uri:
                    with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                        await connection.send_resource_updated(published)

    # -- from the backends ----------------------------------------------------------------------------------------

    async def on_backend_notification(
        self, backend: Backend, notification: types.ServerNotification, upstream: Upstream | None, owner: Any
    ) -> None:
        try:
            if isinstance(notification, types.LoggingMessageNotification):
                await self._deliver_log(notification, upstream, owner)
            elif isinstance(notification, types.ResourceUpdatedNotification):
                await self._deliver_update(backend.name, notification.params.uri)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, BackendError, OSError) as exc:
            log.debug("upstream.notify_failed", backend=backend.name, error=str(exc) or type(exc).__name__)
