"""The gateway's clients, and what it owes each of them besides answers: list changes, log messages, resource updates.

``Clients`` holds every live client connection (weakly: a connection that goes away is forgotten) and:
  * announces a new catalog as ``notifications/{tools,resources,prompts}/list_changed``, one per list that changed:
    to every handshake-era (2025-xx) connection that holds such a list from an earlier catalog (``served``), and as an
    event on ``bus``, which serves the stateless era's
    ``subscriptions/listen`` streams (the SDK's ``ListenHandler`` acknowledges, tags each frame with the stream's
    subscription id and delivers only the kinds that stream asked for). A listen stream's ``resourceSubscriptions``
    subscribe the downstream that serves each URI (``resources/subscribe``) while the stream lasts, and its
    ``notifications/resources/updated`` reach that stream as they reach the handshake era's subscribers;
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
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from gateway.backends.base import Backend
from gateway.calls import ANONYMOUS, Caller, ClientLink, Origin, Upstream
from gateway.core.catalog import Catalog
from gateway.core.policies import Views, lists_changed
from gateway.errors import BackendError
from gateway.front.channels import LOG_LEVELS, admits, client_log_level, connection_of, set_client_log_level
from gateway.front.scope import caller_of

__all__ = ["Clients"]

_NOTIFICATIONS = {
    "tools": "notifications/tools/list_changed",
    "resources": "notifications/resources/list_changed",
    "prompts": "notifications/prompts/list_changed",
}
_EVENTS: dict[str, Callable[[], ServerEvent]] = {
    "tools": ToolsListChanged,
    "resources": ResourcesListChanged,
    "prompts": PromptsListChanged,
}
_KINDS = ("tools", "resources", "prompts")
_LISTS = {
    "tools/list": "tools",
    "resources/list": "resources",
    "resources/templates/list": "resources",
    "prompts/list": "prompts",
}
"""Which kind of list each list request serves (``Clients.served``)."""


def _caller(ctx: ServerRequestContext[Any]) -> Caller:
    return caller_of(getattr(ctx.request, "scope", None))


log = structlog.get_logger("gateway.upstreams")

NOTIFY_TIMEOUT_S = 2.0
"""Bound on telling one client of a change (a stuck client must not hold up the others)."""
_SUBSCRIPTIONS_KEY = "mcp-gateway/subscriptions"


class Clients:
    """Every live client connection and the notifications it is owed (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        backends: Any,
        tools_changed: Any = None,
        *,
        searching: Callable[[ServerRequestContext[Any]], bool] | None = None,
        search_list_changed: Callable[[Caller, Catalog, Catalog], bool] | None = None,
        current: Callable[[], Catalog] | None = None,
    ) -> None:
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        # (connection, identity, previous, catalog) -> whether that connection's tools/list changed, or None when it
        # lists the catalog's own list (a search-exposure connection lists another: front/exposure.py)
        self._tools_changed = tools_changed
        # The same for the stateless era, whose listen streams are no connection that ever listed: whether a request's
        # client is in search exposure (its clientInfo rides in the request's _meta), and whether a search-exposure
        # list of a caller changed between two catalogs.
        self._searching = searching
        self._search_list_changed = search_list_changed
        self._announced = catalog
        self._current = current  # () -> the gateway's current catalog (resolving a listen's resources)
        self._backends = backends  # () -> Mapping[str, Backend]
        self._downstream_level: types.LoggingLevel | None = None
        self.views = Views()
        """Each caller's view of the catalog (core/policies.py), shared with the server."""
        self._identities: weakref.WeakKeyDictionary[Any, Caller] = weakref.WeakKeyDictionary()
        self._held: weakref.WeakKeyDictionary[Any, dict[str, Catalog]] = weakref.WeakKeyDictionary()
        """Per connection, the catalog each kind of list it was last served came from (``served``)."""
        self._buses: dict[tuple[str | None, bool], tuple[Caller, InMemorySubscriptionBus, ListenHandler]] = {}
        """List changes for the 2026-07-28 era's ``subscriptions/listen`` streams, one bus per caller and exposure
        (a change reaches only the callers whose view it changed; a search-exposure stream hears of ``tools`` only
        when its own list, the search and call tools and the pins, changed)."""
        self._listened: dict[tuple[str, str], list[tuple[InMemorySubscriptionBus, str]]] = {}
        """(backend, its URI) -> (the caller's bus, the URI) a listen stream subscribed it under, once per stream."""

    async def listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """Serves one ``subscriptions/listen`` stream (see the module docstring), on its caller's bus.

        Each resource it names is subscribed downstream (``resources/subscribe``, counted with the handshake era's
        subscribers) for as long as the stream lasts; one no backend takes is left out of the acknowledgement.
        """
        identity = _caller(ctx)
        key = (identity.name, self._searching is not None and self._searching(ctx))
        found = self._buses.get(key)
        if found is None or found[0] != identity:
            bus = found[1] if found is not None else InMemorySubscriptionBus()
            found = self._buses[key] = (identity, bus, found[2] if found else ListenHandler(bus))
        bus, handler = found[1], found[2]
        held: list[tuple[str, Origin]] = []
        try:
            for uri in dict.fromkeys(params.notifications.resource_subscriptions or ()):
                origin = await self._subscribe_any(uri, identity)
                if origin is not None:
                    held.append((uri, origin))
                    self._listened.setdefault((origin.backend, origin.local), []).append((bus, uri))
            honoured = params.notifications.model_copy(update={"resource_subscriptions": [u for u, _ in held] or None})
            return await handler(ctx, params.model_copy(update={"notifications": honoured}))
        finally:
            with anyio.CancelScope(shield=True):  # the stream ended (or its client went): so do its subscriptions
                for uri, origin in held:
                    published = self._listened.get((origin.backend, origin.local), [])
                    published.remove((bus, uri))
                    if not published:
                        self._listened.pop((origin.backend, origin.local), None)
                    await self._release(origin)

    async def _subscribe_any(self, uri: str, identity: Caller) -> Origin | None:
        """Subscribe the first backend that serves ``uri`` (in the caller's view) and takes the subscription; None
        when none does."""
        backends = self._backends()
        # The gateway's current catalog, not the last one announced: the announcement follows a change
        # asynchronously, and a stream opened just after startup would miss a backend that is already ready.
        catalog = self._current() if self._current is not None else self._announced
        origins = catalog.lists.resolve(uri)
        view = self.views.view(catalog, identity)
        for origin in view.origins(uri, origins) if view is not None else origins:
            backend = backends.get(origin.backend)
            if backend is not None and backend.serves_requests:
                try:
                    await backend.subscribe_resource(origin.local)
                    return origin
                except BackendError as exc:
                    log.info("upstream.listen_subscribe_failed", backend=origin.backend, error=str(exc))
        return None

    def __len__(self) -> int:
        return len(self._live)

    async def track(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        """Middleware: remember the connection (the request itself travels in its ``CallContext``)."""
        connection = connection_of(ctx)
        if connection is not None:
            self._live.add(connection)
            if connection not in self._identities:
                self._identities[connection] = _caller(ctx)  # a session belongs to one caller (front/http/sessions.py)
        return await call_next(ctx)

    # -- list changes ---------------------------------------------------------------------------------------------

    def served(self, ctx: ServerRequestContext[Any], catalog: Catalog) -> None:
        """A list request of ``ctx``'s connection was answered from ``catalog``. A connection is told a kind of list
        changed only once it holds one, and not of the catalog it holds: a client that never listed has nothing
        stale, and a notification after its last answer, as it closes, broke real clients (mcp 1.x over stdio)."""
        connection, kind = connection_of(ctx), _LISTS.get(ctx.method)
        if connection is not None and kind is not None:
            self._held.setdefault(connection, {})[kind] = catalog

    async def announce(self, catalog: Catalog) -> None:
        """Tell each client of the lists that changed as it sees them: with policies, or tools that only some
        callers' own sessions list (``caller_lists``), only the callers whose view changed hear of it
        (core/policies.py)."""
        previous, self._announced = self._announced, catalog
        views = self.views
        per_caller = catalog.policies or previous.policies or catalog.caller_lists or previous.caller_lists
        everyone = None if per_caller else lists_changed(previous, catalog, ANONYMOUS, views)
        told: set[str] = set()
        for (_, searching), (identity, bus, _) in list(self._buses.items()):
            kinds = everyone if everyone is not None else lists_changed(previous, catalog, identity, views)
            if searching and self._search_list_changed is not None:
                changed = self._search_list_changed(identity, previous, catalog)
                kinds = (kinds - {"tools"}) | ({"tools"} if changed else frozenset())
            if kinds:
                told.add(identity.name or "anonymous")
            for kind in _KINDS:
                if kind in kinds:
                    await bus.publish(_EVENTS[kind]())  # in-process fan-out: never blocks on a slow stream
        for connection in list(self._live):
            if not connection.initialized.is_set():
                continue
            identity = self._identities.get(connection, ANONYMOUS)
            kinds = everyone if everyone is not None else lists_changed(previous, catalog, identity, views)
            kinds = self._with_search(kinds, connection, identity, previous, catalog)
            held = self._held.get(connection, {})
            kinds = frozenset(kind for kind in kinds if kind in held and held[kind] is not catalog)
            if kinds:
                told.add(identity.name or "anonymous")
            for method in (_NOTIFICATIONS[kind] for kind in _KINDS if kind in kinds):
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    try:
                        await connection.notify(method, None)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, OSError):
                        self._live.discard(connection)
        if told:
            log.info("lists.announced", callers=sorted(told))

    async def _tell_unchanged(self, kind: str) -> None:
        """A downstream announced a change of ``kind`` that left its list as it was: pass it on as it came (a client
        of the downstream itself hears every announcement). With policies no caller's view changed, so none is told.
        """
        if self._announced.policies:
            return
        for _, bus, _ in list(self._buses.values()):
            await bus.publish(_EVENTS[kind]())
        for connection in list(self._live):
            if connection.initialized.is_set() and kind in self._held.get(connection, {}):
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    try:
                        await connection.notify(_NOTIFICATIONS[kind], None)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, OSError):
                        self._live.discard(connection)

    def _with_search(
        self, kinds: frozenset[str], connection: Any, identity: Caller, previous: Catalog, catalog: Catalog
    ) -> frozenset[str]:
        """``kinds`` with ``tools`` as a search-exposure connection sees it (its own list: front/exposure.py)."""
        found = self._tools_changed(connection, identity, previous, catalog) if self._tools_changed else None
        if found is None:
            return kinds
        return (kinds - {"tools"}) | ({"tools"} if found else frozenset())

    # -- logging --------------------------------------------------------------------------------------------------

    async def set_level(self, ctx: ServerRequestContext[Any], level: types.LoggingLevel) -> None:
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
        self, notification: types.LoggingMessageNotification, upstream: Upstream | None, owner: ClientLink | None
    ) -> None:
        if upstream is not None and upstream.channel is not None:
            await upstream.channel.log(notification)  # the call it belongs to, on the call's own stream
            return
        # Not part of a call: the one client whose own session it came on, else the clients that asked for logs.
        if owner is not None:
            with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                await owner.log(notification)
            return
        level = notification.params.level
        params = notification.params.model_dump(by_alias=True, mode="json", exclude_none=True)
        for connection in [c for c in list(self._live) if client_log_level(c) is not None]:
            if admits(client_log_level(connection), level):
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    await connection.notify("notifications/message", params)

    # -- resource subscriptions -----------------------------------------------------------------------------------

    async def subscribe(self, ctx: ServerRequestContext[Any], uri: str, origin: Origin, backend: Backend) -> None:
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

    def forget(self, ctx: ServerRequestContext[Any], uri: str) -> Origin | None:
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
        for bus, published in dict.fromkeys(self._listened.get((backend, uri), ())):
            await bus.publish(ResourceUpdated(uri=published))  # to the listen streams that asked for it
        for connection in list(self._live):
            state = getattr(connection, "state", None)
            subscriptions = state.get(_SUBSCRIPTIONS_KEY) if isinstance(state, dict) else None
            for published, origin in list((subscriptions or {}).items()):
                if origin.backend == backend and origin.local == uri:
                    with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                        await connection.send_resource_updated(published)

    # -- from the backends ----------------------------------------------------------------------------------------

    async def on_backend_notification(
        self,
        backend: Backend,
        notification: types.ServerNotification,
        upstream: Upstream | None,
        owner: ClientLink | None,
    ) -> None:
        try:
            if isinstance(notification, types.LoggingMessageNotification):
                await self._deliver_log(notification, upstream, owner)
            elif isinstance(notification, types.ResourceUpdatedNotification):
                await self._deliver_update(backend.name, notification.params.uri)
            elif isinstance(notification, types.ToolListChangedNotification):
                await self._tell_unchanged("tools")  # announced, and the re-read list is as it was
            elif isinstance(notification, types.PromptListChangedNotification):
                await self._tell_unchanged("prompts")
            elif isinstance(notification, types.ResourceListChangedNotification):
                await self._tell_unchanged("resources")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, BackendError, OSError) as exc:
            log.debug("upstream.notify_failed", backend=backend.name, error=str(exc) or type(exc).__name__)
