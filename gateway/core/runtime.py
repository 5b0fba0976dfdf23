"""``Gateway(config)``: owns the task group, every backend's lifetime, the current catalog and the router.

Entering the gateway starts one supervisor task per backend (``Backend.run``) and returns at once: a backend that
is slow or broken never delays startup or the others. ``wait_settled()`` waits, bounded, until every backend has
had its first outcome (ready, failed, or disabled: its tools are known, an adapter's probes may answer later) — the
first handshake and ``tools/list`` use it; ``gateway check`` waits for the probes too. Whenever a
backend's state or tools change, the catalog is rebuilt and swapped whole, and the change listeners (the server's
``list_changed`` broadcast) are told. ``reload(config)`` applies an edited federation backend by backend (the plan
comes from reload.py): each supervisor runs in its own cancel scope, so one backend can be drained and stopped
alone. Stopping is two steps: ``drain()`` lets the calls in progress finish for at most ``gateway.drain_s`` (less
after a second signal), then cancels the rest, each answered with an error that says the gateway is shutting down and
recorded as ``cancelled``; leaving ``running()`` then cancels every supervisor (each closes its own session and
kills its own processes inside its own task), kills whatever orphan the gateway adopted (backends/processes.py,
also swept every few seconds while it runs), and commits the ledger last.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import structlog
from anyio.streams.memory import MemoryObjectSendStream

from gateway.auth.connections import Connections
from gateway.auth.secrets import CallerSecrets
from gateway.backends import processes
from gateway.backends.base import Backend, BackendState, BackendStatus, DisabledBackend
from gateway.backends.cli.backend import CliBackend
from gateway.backends.cli.checks import PROBE_TIMEOUT_S
from gateway.backends.mcp.oauth_backend import OAuthBackend
from gateway.backends.mcp.session import HttpPool, McpBackend, NotificationHook
from gateway.backends.mcp.signin import SignIn
from gateway.calls import ClientLink, Upstream
from gateway.config import Federation, HttpServer
from gateway.core.answers import Answers
from gateway.core.breakers import Breakers, BreakerState
from gateway.core.catalog import Catalog
from gateway.core.connect import SignIns, client_document, connect_url, open_connections, uses_oauth
from gateway.core.costs import Cost, costs_from
from gateway.core.gate import ClientPolicy
from gateway.core.leaks import Leaks
from gateway.core.pins import Pending, Pin, pins_of
from gateway.core.reload import ReloadPlan, check_reload, plan_reload
from gateway.core.router import Router
from gateway.core.stopping import held_apart, shielded
from gateway.errors import AuditError
from gateway.ledger.engines import AuditLedger, open_ledger, open_reader
from gateway.ledger.pins import pin_record
from gateway.ledger.readers import Filters, ToolStats
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import CallTracer, open_tracing
from gateway.version import VERSION

__all__ = ["Gateway", "build_backends", "settle_budget"]

log = structlog.get_logger("gateway.runtime")

COSTS_WINDOW_S = 7 * 86400.0
STARTUP_SETTLE_S = 30.0
LIST_TTL_MS = 30_000
"""How long a 2026-07-28 client may reuse a list (its ``ttlMs``) while every backend is settled and serving."""
PINS_REFRESH_S = 5.0
"""How often the approved definitions are read again (``gateway pins approve`` writes them from another process)."""
STARTUP_WAIT_S = 10.0
"""During startup, a request that races it (the first handshake or discovery, a list, a call naming a tool not known
yet) waits at most this long for backends still connecting (``wait_started``), so a client that connects at once
sees the whole catalog instead of a partial one."""

CatalogListener = Callable[[Catalog], Awaitable[None]]
NotificationListener = Callable[
    [Backend, types.ServerNotification, Upstream | None, ClientLink | None], Awaitable[None]
]
"""Told of a downstream notification the gateway passes on (see backends/mcp/session.py ``NotificationHook``)."""


def _shows_costs(config: Federation) -> bool:
    """Whether some client can be in search exposure, whose results show each tool's measured cost band."""
    return config.exposure.mode != "all" or any(mode != "all" for mode in config.exposure.clients.values())


def settle_budget(config: Federation, *, probes: bool = False) -> float:
    """How long the first outcome of every backend can take: the slowest handshake, plus a margin; with ``probes``,
    also the slowest adapter's probes (its health probe, then each distinct variant probe, one after the other)."""
    timeouts = [server.connect_timeout_s for server in config.servers.values() if server.enabled]
    if probes:
        for adapter in config.adapters.values():
            variant_probes = {
                (v.probe.argv, v.probe.timeout_s)
                for t in adapter.tools.values()
                for v in t.variants.values()
                if v.probe
            }
            health = PROBE_TIMEOUT_S if adapter.probe is not None else 0.0
            timeouts.append(health + sum(timeout for _, timeout in variant_probes))
    return max(timeouts, default=0.0) + 5.0


class _Started(anyio.abc.TaskStatus[None]):
    def __init__(self, event: anyio.Event) -> None:
        self._event = event

    def started(self, value: None = None) -> None:
        self._event.set()


def build_backends(
    config: Federation,
    http: HttpPool | None = None,
    on_notification: NotificationHook | None = None,
    connections: Connections | None = None,
) -> dict[str, Backend]:
    """One backend object per declared server, adapter and wiki, in declaration order; an OAuth-protected server's
    tokens in ``connections`` (in memory when None)."""
    client_info = types.Implementation(name=config.gateway.name, version=VERSION)
    backends: dict[str, Backend] = {}
    path = config.gateway.auth.caller_secrets
    secrets = CallerSecrets(path) if path is not None else None  # ConfigError when it cannot be read or is open
    for name, server in config.servers.items():
        options: dict[str, Any] = {"http": http, "client_info": client_info, "on_notification": on_notification}
        if isinstance(server, HttpServer) and server.auth is not None:
            store = connections if connections is not None else Connections(None, [os.urandom(32)])
            signin = SignIn(name, server, store, connect_url(config))
            backends[name] = OAuthBackend(name, server, signin=signin, **options)
        else:
            backends[name] = McpBackend(name, server, secrets=secrets, **options)
    for name, adapter in config.adapters.items():
        backends[name] = CliBackend(name, adapter)
    if config.wiki is not None and not config.wiki.enabled:
        backends[config.wiki.name] = DisabledBackend(config.wiki.name, "wiki", config.wiki.disabled_reason)
    elif config.wiki is not None:
        from gateway.backends.wiki.backend import WikiBackend  # its index and ranking (numpy) only for a wiki

        wiki = config.wiki
        backends[wiki.name] = WikiBackend(
            wiki.name,
            Path(wiki.root),
            wiki.tools,
            read_all_max_bytes=wiki.read_all_max_bytes,
            default_max_bytes=wiki.default_max_bytes,
        )
    return backends


class Gateway:
    """The running federation. Use as ``async with Gateway(config).running() as gateway:``."""

    def __init__(self, config: Federation, *, audit: bool | None = None) -> None:
        self.config = config
        self._audit_enabled = config.gateway.audit.enabled if audit is None else audit
        self._backends: dict[str, Backend] = {}
        self._settled: dict[str, anyio.Event] = {}
        self._catalog = Catalog.empty()
        self._stale = False  # a backend changed since the catalog was built
        self._stale_event = anyio.Event()
        self._listeners: list[CatalogListener] = []
        self._notification_listeners: list[NotificationListener] = []
        self._changes: MemoryObjectSendStream[Catalog] | None = None
        self.ledger: AuditLedger | None = None
        self.sign_ins: SignIns | None = None
        """Callers' sign-ins to OAuth-protected servers and their connections (core/connect.py), while it runs."""
        self.clients = ClientPolicy(config.clients)
        self.answers = Answers(lambda: self.config)
        """Token budgets for answers, and the rest of cut answers kept for their callers (core/answers.py)."""
        self.metrics = GatewayMetrics(config.gateway.name, VERSION)
        self.tracer: CallTracer | None = None
        breaker = config.gateway.circuit_breaker
        self.router = Router(
            lambda: self.catalog,
            lambda: self._backends,
            None,  # the ledger and the tracer join when the gateway runs (use_instruments)
            self.clients,
            metrics=self.metrics,
            breakers=Breakers(breaker.failure_threshold, breaker.cooldown_s, breaker.max_cooldown_s),
            budget=lambda: self.config.gateway.call_budget,
            edge=lambda: self.config.gateway.edge,
            startup=self,
            answers=self.answers,
        )
        self.router.leaks = Leaks(lambda: self.config)
        self.started = False
        """True once the startup wait is over (``wait_started``): every backend had its first outcome, or the wait's
        bound passed."""
        self.started_at = 0.0
        self._costs: dict[str, Cost] = {}
        self._pins: dict[tuple[str, str], Pin] = {}
        self._pending_seen: set[tuple[str, str, str]] = set()  # (server, tool, digest) already in the ledger
        self._tg: anyio.abc.TaskGroup | None = None
        self._http: HttpPool | None = None
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._reload_lock = anyio.Lock()
        self.reload_error: str | None = None
        """Why the last edit of the file was refused (shown by /status); None once an edit applied."""
        self.loaded_at = time.time()
        self._uses_costs = "{cost:" in config.model_dump_json() or _shows_costs(config)

    # -- lifetime -------------------------------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Run the gateway. One exit stack owns what outlives the task group (tracing, the HTTP pool, the ledger,
        the change stream); leaving it cancels every supervisor first, then kills whatever orphan was adopted and
        closes the rest in reverse order, each step shielded from the cancellation that may be ending the gateway:
        the ledger commits its pending rows before the pool closes."""
        stack = AsyncExitStack()
        try:
            self.tracer = await stack.enter_async_context(
                open_tracing(
                    self.config.gateway.tracing,
                    service_name=self.config.gateway.name,
                    version=VERSION,
                    source=self.config.source,
                )
            )
            http = HttpPool()
            stack.push_async_callback(shielded, http.aclose)
            if self._audit_enabled:
                self.ledger = await stack.enter_async_context(held_apart(open_ledger(self.config.gateway.audit)))
            # every backend has stopped when this runs: no adopted process may stay
            stack.push_async_callback(shielded, functools.partial(processes.sweep, everything=True))
            send, receive = anyio.create_memory_object_stream[Catalog](16)
            self._changes = send
            stack.callback(self._close_changes, send)
            self.router.use_instruments(self.ledger, self.tracer)
            connections = open_connections(self.config)
            stack.callback(connections.close)
            document = client_document(connect_url(self.config), self.config.gateway.name)
            self.sign_ins = SignIns(lambda: self._backends, connections, document if uses_oauth(self.config) else None)
            await self.refresh_pins(rebuild=False)  # before any tool is listed: nothing unapproved is served
            async with anyio.create_task_group() as tg:
                self.started_at = anyio.current_time()
                self._tg, self._http = tg, http
                self._backends = build_backends(self.config, http, self._on_notification, connections)
                tg.start_soon(connections.watch)  # sign-ins and revocations made through other replicas
                for backend in self._backends.values():
                    self._start(backend)
                tg.start_soon(self._broadcast, receive)
                tg.start_soon(self._rebuild_when_stale)
                tg.start_soon(self._sweep_orphans)
                tg.start_soon(self._watch_pins)
                if self._uses_costs:
                    tg.start_soon(self._measure_costs)
                self._rebuild()
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await stack.aclose()

    def _close_changes(self, send: MemoryObjectSendStream[Catalog]) -> None:
        send.close()
        self._changes = None

    def _start(self, backend: Backend) -> None:
        """Run ``backend``'s supervisor in its own cancel scope (so a reload can stop it alone)."""
        assert self._tg is not None
        backend.subscribe(self._mark_stale)
        settled = self._settled[backend.name] = anyio.Event()
        scope = self._scopes[id(backend)] = anyio.CancelScope()
        self._tg.start_soon(self._supervise, backend, settled, scope, name=f"backend:{backend.name}")

    async def _supervise(self, backend: Backend, settled: anyio.Event, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                await backend.run(task_status=_Started(settled))
            except Exception:  # a bug in one backend must not take down the others
                log.exception("backend.crashed", backend=backend.name)
                settled.set()
        self._scopes.pop(id(backend), None)

    async def _stop(self, backend: Backend) -> None:
        """Drain ``backend`` (calls in progress finish, bounded by ``gateway.drain_s``), then stop it."""
        with anyio.move_on_after(self.config.gateway.drain_s) as drain:
            await self.router.drain.wait_idle(backend)
        if drain.cancelled_caught:
            log.warning("reload.drain_timeout", backend=backend.name, inflight=self.router.drain.inflight(backend))
        scope = self._scopes.pop(id(backend), None)
        if scope is not None:
            scope.cancel()

    async def drain(self, hurry: anyio.Event | None = None) -> None:
        """The first step of stopping: let the calls in progress finish, for at most ``gateway.drain_s`` (or until
        ``hurry`` is set: a second signal), then cancel the rest with an answer that says the gateway is shutting
        down (``Router.abort``: each gets its ``cancelled`` row, and its processes are killed, before it returns).
        Later calls are answered the same way at once."""
        limit = self.config.gateway.drain_s
        reason = f"the gateway is shutting down (the calls in progress had {limit:g} s to finish)"
        with anyio.move_on_after(limit):
            async with anyio.create_task_group() as waiting:

                async def calls_done() -> None:
                    await self.router.drain.wait_no_calls()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(calls_done)
                if hurry is not None:
                    await hurry.wait()
                    reason = "the gateway is shutting down (stopped at once by a second signal)"
                    waiting.cancel_scope.cancel()
        self.stop_calls(reason)

    def stop_calls(self, reason: str) -> None:
        """Cancel the calls in progress with an answer that gives ``reason`` (each leaves its ``cancelled`` row);
        later calls are answered the same way at once."""
        left = self.router.drain.calls_in_progress()
        if left:
            log.warning("gateway.calls_cancelled", calls=left, reason=reason)
        self.router.drain.abort(reason)

    async def reload(self, config: Federation) -> ReloadPlan:
        """Apply a new, validated federation without dropping a client session (see reload.py for the plan).

        New and changed backends start first; the catalog is then swapped whole (clients get ``list_changed``);
        removed and changed backends are drained and stopped last, so a call never finds its tool gone mid-way.

        Raises:
            ConfigError: the edit would remove every backend (``reload.check_reload``); nothing was changed.
        """
        async with self._reload_lock:
            check_reload(self.config, config)
            plan = plan_reload(self.config, config)
            for setting in plan.restart_needed:
                log.warning("reload.restart_needed", setting=setting, message="takes effect at the next start")
            store = self.sign_ins.store if self.sign_ins is not None else None
            fresh = build_backends(config, self._http, self._on_notification, store)
            old = self._backends
            backends = {name: (fresh[name] if name in plan.added + plan.changed else old[name]) for name in fresh}
            self.config = config
            await self.refresh_pins(rebuild=False)  # a server's pin mode may have changed
            self.loaded_at = time.time()
            self.clients = ClientPolicy(config.clients)
            self.router.use_clients(self.clients)
            self._uses_costs = self._uses_costs or "{cost:" in config.model_dump_json() or _shows_costs(config)
            for name in plan.added + plan.changed:
                self._start(backends[name])
            # The old generation keeps serving until the new one had its first outcome (ready or failed), so a
            # changed backend's tools never vanish from the catalog in between.
            with anyio.move_on_after(settle_budget(config)):
                for name in plan.added + plan.changed:
                    await self._settled[name].wait()
            self._backends = backends
            self._rebuild(cause="reload")
            log.info("reload.applied", **plan.summary())
            async with anyio.create_task_group() as stopping:
                for name in plan.removed + plan.changed:
                    stopping.start_soon(self._stop, old[name])
                    self.router.breakers.forget(name)
            for name in plan.removed:
                self._settled.pop(name, None)
            self._rebuild(cause="reload")
            return plan

    @property
    def pins(self) -> Mapping[tuple[str, str], Pin]:
        """The approved definitions as last read (``refresh_pins``), by (server, tool)."""
        return self._pins

    def _note_pending(self, catalog: Catalog) -> None:
        """Record in the ledger, once per definition, each server tool this catalog found new or changed since
        approval (a ``pins/pending`` row: ``refused`` when held back under ``enforce``)."""
        fresh = [p for p in catalog.pins_pending if (p.server, p.tool, p.digest) not in self._pending_seen]
        if not fresh or self.ledger is None or self._tg is None:
            return
        self._pending_seen.update((p.server, p.tool, p.digest) for p in fresh)
        self._tg.start_soon(self._record_pending, fresh)

    async def _record_pending(self, pending: Sequence[Pending]) -> None:
        now = time.time()
        for p in pending:
            status = "refused" if p.mode == "enforce" else "ok"
            preview = {"change": p.change, "pin": p.mode, "findings": str(p.findings)}
            row = pin_record("pins/pending", p.server, p.tool, p.digest, ts=now, caller=None, status=status, **preview)
            try:
                if self.ledger is not None:
                    await self.ledger.record(row)
            except AuditError as exc:
                log.warning("pins.unrecorded", tool=f"{p.server}/{p.tool}", error=str(exc))

    async def _watch_pins(self) -> None:
        """Read the approved definitions again every ``PINS_REFRESH_S``: an approval made by ``gateway pins approve``
        (or through another replica's ledger) is served without a restart."""
        while True:
            await anyio.sleep(PINS_REFRESH_S)
            await self.refresh_pins()

    async def refresh_pins(self, *, rebuild: bool = True) -> None:
        """Read the pins from the ledger (in a thread: it may be PostgreSQL); a change rebuilds the catalog. An
        unreadable ledger keeps the pins last read, and says why."""
        try:
            pins = await anyio.to_thread.run_sync(pins_of, self.config)
        except AuditError as exc:
            log.warning("pins.unreadable", error=str(exc))
            return
        if pins != self._pins:
            self._pins = pins
            if rebuild:
                self._rebuild(cause="pins")

    async def _measure_costs(self) -> None:
        """Refresh the figures behind ``{cost:TOOL}`` placeholders: at startup, then every ``costs_refresh_s``."""
        await self.wait_settled(STARTUP_SETTLE_S)
        while True:
            await self.refresh_costs()
            await anyio.sleep(self.config.gateway.costs_refresh_s)

    async def refresh_costs(self) -> None:
        """Measure costs now (the wiki's estimates, the ledger's medians); a band that moved rebuilds the catalog."""
        estimates: dict[str, int] = {}
        for backend in self._backends.values():
            if backend.status.state is BackendState.READY:
                estimates.update(backend.estimates())
        audit = self.config.gateway.audit
        target = audit.url or audit.path
        stats: list[ToolStats] = []
        # Also read by `gateway tools`, which opens no ledger.
        if audit.url is not None or await anyio.to_thread.run_sync(Path(audit.path).exists):
            try:
                stats = await anyio.to_thread.run_sync(
                    # Only answered calls: a refusal's or a timeout's size says nothing about what the tool costs.
                    open_reader(target).stats,
                    Filters(since=time.time() - COSTS_WINDOW_S, status="ok", kind="tools/call"),
                )
            except AuditError as exc:
                log.warning("costs.ledger_unreadable", error=str(exc))
        costs = costs_from(stats, estimates, self._costs)  # bands that hold: a list is not new at every refresh
        if costs != self._costs:
            self._costs = costs
            self._rebuild(cause="costs")

    async def _sweep_orphans(self) -> None:
        """Reap adopted orphans and end the escaped ones (processes.py), also between adapter calls."""
        while True:
            await anyio.sleep(processes.SWEEP_INTERVAL_S)
            await processes.sweep()

    async def _broadcast(self, receive: anyio.abc.ObjectReceiveStream[Catalog]) -> None:
        async with receive:
            async for catalog in receive:
                for listener in list(self._listeners):
                    await listener(catalog)

    # -- state ----------------------------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The current catalog, rebuilt first if a backend changed since (so a reader never sees a stale one)."""
        if self._stale:
            self._rebuild()
        return self._catalog

    @property
    def backends(self) -> Mapping[str, Backend]:
        return self._backends

    def statuses(self) -> list[tuple[str, str, BackendStatus]]:
        """Every backend's status; a READY backend whose circuit breaker is not closed shows as DEGRADED."""
        out = []
        for backend in self._backends.values():
            status = backend.status
            breaker = self.router.breakers.get(backend.name)
            if status.state is BackendState.READY and breaker is not None and breaker.state is not BreakerState.CLOSED:
                status = replace(status, state=BackendState.DEGRADED, reason=breaker.reason())
            out.append((backend.name, backend.kind, status))
        return out

    def on_catalog_change(self, listener: CatalogListener) -> None:
        self._listeners.append(listener)

    def on_backend_notification(self, listener: NotificationListener) -> None:
        """Be told of the downstream notifications the gateway passes on (log messages, resource updates)."""
        self._notification_listeners.append(listener)

    async def _on_notification(
        self,
        backend: Backend,
        notification: types.ServerNotification,
        upstream: Upstream | None,
        owner: ClientLink | None,
    ) -> None:
        for listener in list(self._notification_listeners):
            await listener(backend, notification, upstream, owner)

    def start_soon(self, fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        """Run ``fn`` in the gateway's own task group (it outlives the request that starts it; the gateway's stop
        cancels it). Used by the server for a bridged call whose downstream waits for a stateless client's input."""
        if self._tg is None:
            raise RuntimeError("the gateway is not running")
        self._tg.start_soon(fn, name=name)

    def list_ttl_ms(self, kind: str) -> int:
        """The ``ttlMs`` an answer of list ``kind`` (``tools``, ``resources``, ``resource_templates``, ``prompts``)
        carries: ``LIST_TTL_MS`` while every backend is settled and ready (or disabled), 0 ("ask again") while one is
        starting, reconnecting or failed, whose tools may come or go at any moment; never longer than a downstream
        gave its own list of that kind. Clients holding a listen stream hear of a change at once either way."""
        settled = (BackendState.READY, BackendState.DISABLED)
        if self.sessions_starting() or any(b.status.state not in settled for b in self._backends.values()):
            return 0
        hinted = (backend.list_ttl_ms(kind) for backend in self._backends.values())
        return min([LIST_TTL_MS, *(ttl for ttl in hinted if ttl is not None)])

    def sessions_starting(self) -> bool:
        """Whether a downstream MCP session has not had its first outcome yet: what it will offer (resources,
        prompts, completions, logging) is not known, so a handshake answered now offers all of them."""
        return any(
            backend.serves_requests and not self._settled[name].is_set()
            for name, backend in self._backends.items()
            if name in self._settled
        )

    async def wait_started(self) -> None:
        """The startup wait, once per gateway: until every backend had its first outcome, at most ``STARTUP_WAIT_S``.
        Every later caller returns at once."""
        if not self.started:
            await self.wait_settled(STARTUP_WAIT_S)
            self.started = True

    async def wait_settled(self, limit_s: float, *, checked: bool = False) -> bool:
        """Wait until every backend had its first outcome (and, when ``checked``, its whole first health check:
        an adapter's probes), at most ``limit_s`` seconds. True if all settled."""
        with anyio.move_on_after(limit_s):
            for event in self._settled.values():
                await event.wait()
            if checked:
                for backend in list(self._backends.values()):
                    await backend.wait_checked()
            return True
        return False

    def healthy(self) -> bool:
        return all(status.state in (BackendState.READY, BackendState.DISABLED) for _, _, status in self.statuses())

    def _mark_stale(self) -> None:
        """A backend's state or lists changed. Rebuilding is deferred to the next loop turn (or the next reader), so
        a burst of changes — fifty backends becoming ready at startup — costs one build, not fifty."""
        self._stale = True
        self._stale_event.set()

    async def _rebuild_when_stale(self) -> None:
        while True:
            await self._stale_event.wait()
            self._stale_event = anyio.Event()
            await anyio.lowlevel.checkpoint()  # let the rest of the burst arrive
            if self._stale:
                self._rebuild()  # announces the change to clients (list_changed) even if nobody reads the catalog

    def _rebuild(self, *, cause: str = "backends") -> None:
        """Build the catalog now; a change is logged (``catalog.changed``, saying what changed and why: at debug
        level when only a measured cost band in the descriptions moved)."""
        self._stale = False
        catalog = Catalog.build(self.config, self._backends, self._costs, self._pins)
        previous = self._catalog
        self._catalog = catalog
        self._note_pending(catalog)
        changes = catalog.changes(previous)
        if changes:  # tools, resources, templates, prompts or what the backends offer
            (log.debug if cause == "costs" else log.info)(
                "catalog.changed",
                tools=len(catalog),
                changed=sorted(changes),
                cause=cause,
                problems=list(catalog.problems) or None,
            )
            if self._changes is not None:
                try:
                    self._changes.send_nowait(catalog)
                except anyio.WouldBlock:
                    pass  # a burst of changes: the broadcast already queued will announce the newest catalog
