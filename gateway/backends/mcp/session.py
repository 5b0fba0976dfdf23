"""One supervised session to one downstream MCP server (stdio, streamable HTTP or SSE): ``McpBackend``.

``McpBackend.run`` is the only owner of the shared session: in its own task it opens the transport (transports.py) and
the ``ClientSession`` in its era, learning which eras the downstream speaks (eras.py; the session of a dual-era
downstream's other era: twin.py), lists what it offers (lists.py), restores what clients hold (held.py), marks itself
ready and waits until the connection ends (process exit, broken stream, failed ping, stdin no longer read). It then
fails with the reason in plain words and reconnects with exponential backoff and jitter, restarted only after a session
that stayed up ``min_uptime_s``. A backend that never connects still reports ``task_status.started()`` after its first
failure, so it never blocks startup. An answer over ``max_answer_bytes`` fails its call alone. Every call's failure
that comes from losing the session carries that session's ``Life`` as its ``cause``, so the circuit breaker counts a
crash with eight calls in flight once. No foreign error leaves this package (failures.py).

While it runs, a downstream's list changes re-read that list, its log messages and resource updates go to the
``on_notification`` hook, and its own requests to its client (sampling, elicitation, roots) are relayed to the
gateway's client whose call caused them (relay.py). A handshake-era ``tools/call`` on the shared session goes straight
on it (direct.py) when the transport offers a direct lane; with ``session: per_client`` or per-caller credentials,
requests go on sessions of their own (lanes.py). A stateless-era request may be answered with an input-required
result, raised as ``InputRequired`` (eras.py); the client's retry comes back with the round in its ``Upstream``.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import IO, Any

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskStatus
from mcp.client.session import ClientSession, MessageHandlerFnT
from tenacity import wait_exponential_jitter

from gateway.auth.credentials import CallerCredentials, SessionCredentials
from gateway.auth.secrets import CallerSecrets
from gateway.backends.backoff import spread, supervise
from gateway.backends.base import BackendBase, BackendState, BackendStatus, ProgressFn
from gateway.backends.mcp.direct import call_direct, caller_of
from gateway.backends.mcp.eras import (
    CALL_OR_INPUT,
    HANDSHAKE,
    MODERN,
    PROMPT_OR_INPUT,
    READ_OR_INPUT,
    HandshakeRefused,
    Opened,
    completed,
    open_session,
    probe,
    with_round,
)
from gateway.backends.mcp.failures import (
    FOREIGN,
    Life,
    ResponseRecorder,
    classify_failure,
    exit_detail,
    leaf_of,
    lost_reason,
    map_call_errors,
    over_limits,
)
from gateway.backends.mcp.fastpath import DirectLane
from gateway.backends.mcp.held import Held
from gateway.backends.mcp.lanes import Lanes
from gateway.backends.mcp.lists import (
    LIST_KINDS,
    OVER_LIMIT_RETRY_S,
    changed_lists,
    hold_listen,
    list_each,
    relist,
    screen_lists,
)
from gateway.backends.mcp.pool import BackendPool, HttpPool, calls_for
from gateway.backends.mcp.relay import InFlight, attribute, back_channel, serving
from gateway.backends.mcp.slots import SlotStatistics
from gateway.backends.mcp.stdio import StdioProcess
from gateway.backends.mcp.transports import open_transport
from gateway.backends.mcp.twin import Listed, Twin
from gateway.backends.mcp.watch import WatchedReceiveStream
from gateway.calls import NO_UPSTREAM, ClientLink, Upstream
from gateway.config import HttpServer, ServerConfig, SseServer
from gateway.errors import BackendUnavailable
from gateway.version import VERSION

__all__ = ["MODERN", "HttpPool", "McpBackend", "NotificationHook"]

log = structlog.get_logger("gateway.backend")


class _ConnectFailed(Exception):
    """A connection attempt failed, or its session ended before ``min_uptime_s`` (the backoff goes on growing)."""


NotificationHook = Callable[
    ["McpBackend", types.ServerNotification, Upstream | None, ClientLink | None], Awaitable[None]
]
"""Told of a downstream notification the gateway passes on (``notifications/message``, ``resources/updated``):
``(backend, notification, the client request it belongs to or None, the client whose own session it came on or
None)``."""


class McpBackend(Listed, BackendBase):
    """A downstream MCP server behind one long-lived, supervised client session."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        *,
        http: HttpPool | None = None,
        client_info: types.Implementation | None = None,
        on_notification: NotificationHook | None = None,
        secrets: CallerSecrets | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        super().__init__(
            name,
            config.transport,
            BackendStatus(BackendState.DISABLED, config.disabled_reason or "disabled in federation.yaml", declared=True)
            if not config.enabled
            else BackendStatus(BackendState.STARTING, "connecting"),
        )
        self._config = config
        self._http: BackendPool | None = None
        if isinstance(config, HttpServer | SseServer):  # connections of its own (pool.py)
            self._http = http.for_backend(name, config) if http is not None else BackendPool(name, config)
        self._client_info = client_info or types.Implementation(name="mcp-gateway", version=VERSION)
        self._on_notification = on_notification
        self._session: ClientSession | None = None
        self._lists: dict[str, tuple[Any, ...]] = dict.fromkeys(LIST_KINDS, ())  # what it offers, by kind
        self._init: types.InitializeResult | None = None
        # The shared session's era, the eras answered in at the last connect, the era a one-era connection tries
        # next, and the session of the other era beside a dual-era downstream's shared one (twin.py).
        self._era = MODERN if config.protocol == MODERN else HANDSHAKE
        self._eras: tuple[str, ...] = ()
        self._learnt: str | None = None
        self._twin = Twin(name, config)
        self._life = Life()
        self._probe_now: anyio.Event = anyio.Event()
        self._proc: StdioProcess | None = None
        # The calls in flight on the shared session: what a downstream's request is matched to when nothing links
        # it to its call (stdio, SSE, or streamable HTTP's standalone stream; see relay.py).
        self._inflight = InFlight()
        self._per_client = config.session == "per_client"
        self._held = Held(name, config.connect_timeout_s, self._send_empty)
        self._fast: DirectLane | None = None  # the shared session's direct lane (stdio, streamable HTTP)
        self.connects = 0
        # ${caller.secret:NAME} in the headers, or token_exchange: each caller gets a session of its own, with its
        # own credentials (auth/credentials.py).
        self._credentials = credentials or CallerCredentials.for_server(config, secrets)  # or OAuth's (signin.py)
        self._lanes = lanes = Lanes(
            name,
            config,
            self._credentials,
            connect=self._connect,
            handshake=self._open_lane,
            notify=functools.partial(on_notification, self) if on_notification is not None else None,
        )
        self._open_handshake = functools.partial(lanes.for_handshake, self._inflight, self._on_message)

    # -- the Backend protocol (name, kind, status, ladder, subscribe: BackendBase) ---------------------------------

    @property
    def config(self) -> ServerConfig:
        return self._config

    @property
    def serves_requests(self) -> bool:
        return True

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What the downstream offered at its last handshake (None before it connected)."""
        return self._init.capabilities if self._init is not None else None

    @property
    def session(self) -> ClientSession | None:
        return self._session

    @property
    def asks_mid_call(self) -> bool:
        """May a stateless client's request be asked mid-request (so bridged)? Not where it is served in its era."""
        return self._era != MODERN and (self._twin.session is None or self._credentials is not None)

    async def _route(self, upstream: Upstream, method: str, params: Any) -> tuple[str, ClientSession | None]:
        """The era ``upstream``'s request is sent in (the client's own where the downstream speaks it), and the
        session it goes on: the twin's (twin.py), or None for the shared session (or the caller's own)."""
        bridged = self._credentials is not None and self._era != MODERN  # its callers' sessions are handshake ones
        on = await self._twin.route(method, params, MODERN if upstream.modern and not bridged else HANDSHAKE)
        return (self._twin.era or self._era, on) if on is not None else (self._era, None)

    def pool_statistics(self) -> SlotStatistics | None:
        """Its calls' connections (HTTP only): how many are busy, waiting, and the limits (pool.py)."""
        return self._http.slots.statistics() if self._http is not None else None

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> types.CallToolResult:
        meta = dict(upstream.meta) if upstream.meta else None
        params = types.CallToolRequestParams(name=tool, arguments=arguments, _meta=meta)  # type: ignore[arg-type]
        era, on = await self._route(upstream, "tools/call", params)
        if era != MODERN:
            twin = on is not None  # the handshake twin's session (twin.py), else the shared one
            lane = self._twin.fast if twin else self._fast
            # Only on the shared session or twin (stdio or streamable HTTP): a per-client server's and a
            # per-caller-credentials server's calls go on the caller's own session (_send), through the SDK.
            if lane is not None and lane.ready and not self._per_client and self._credentials is None:
                self._require_session()
                return await call_direct(
                    lane,
                    tool,
                    arguments,
                    meta,
                    progress=progress,
                    upstream=upstream,
                    backend=self._name,
                    life=self._twin.life if twin else self._life,
                    inflight=self._inflight,
                    timeout_s=self._config.timeout_s,
                    notify=self._on_message,
                )
            request, per_client = types.CallToolRequest(params=params), self._per_client
            return await self._send(request, types.CallToolResult, progress, upstream, per_client=per_client, on=on)  # type: ignore[no-any-return]
        request = types.CallToolRequest(params=with_round(params, upstream.round))
        result = await self._send(request, CALL_OR_INPUT, progress, upstream, per_client=False, on=on)
        return completed(result, backend=self._name, local=tool)  # type: ignore[no-any-return]

    async def request(
        self,
        request: Any,
        result_type: Any,
        *,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> Any:
        """Forward any client request (resources, prompts, completion, a task's, ...) to this backend. Raises
        ``BackendError``: it is not ready, or failed to answer (a JSON-RPC error is ``BackendRpcError``)."""
        era, on = await self._route(upstream, request.method, request.params)
        if era != MODERN or request.method not in ("prompts/get", "resources/read"):
            return await self._send(request, result_type, progress, upstream, per_client=False, on=on)
        request = request.model_copy(update={"params": with_round(request.params, upstream.round)})
        either = PROMPT_OR_INPUT if request.method == "prompts/get" else READ_OR_INPUT
        result = await self._send(request, either, progress, upstream, per_client=False, on=on)
        local = request.params.name if request.method == "prompts/get" else request.params.uri
        return completed(result, backend=self._name, local=local)

    async def _send(
        self,
        request: Any,
        result_type: Any,
        progress: ProgressFn | None,
        upstream: Upstream,
        *,
        per_client: bool,
        on: ClientSession | None = None,
    ) -> Any:
        """Send ``request`` on the shared session, the caller's or client's own, or ``on`` (the twin's). With
        per-caller credentials every request goes on the caller's own session, which serves whatever state the shared
        one is in (it may be opening again after the caller it listed as was signed out)."""
        life, inflight = self._life, self._inflight
        if on is not None:
            self._require_session()
            session = on
        elif self._credentials is not None:
            own = await self._lanes.for_caller(upstream.caller.name, upstream.caller.token)
            session, inflight, life = own.session, own.inflight, own.life  # type: ignore[assignment]
        else:
            session = self._require_session()
            lane = await self._lanes.for_client(upstream) if per_client else None
            if lane is not None and lane.session is not None:
                session, inflight, life = lane.session, lane.inflight, lane.life
        with (
            serving(inflight, upstream),
            calls_for(caller_of(upstream)),
            map_call_errors(self._name, self._config.timeout_s, life),
        ):
            return await session.send_request(
                request,
                result_type,
                request_read_timeout_seconds=self._config.timeout_s,
                progress_callback=progress,
            )

    def _require_session(self) -> ClientSession:
        session = self._session
        if session is None or self._status.state is not BackendState.READY:
            reason = self._status.reason or f"not ready ({self._status.state})"
            raise BackendUnavailable(self._name, reason, cause=self._life)
        return session

    async def roots_changed(self, client: ClientLink) -> None:
        """``client`` says its roots changed: tell its own session, if it has one (the shared one has no roots)."""
        await self._lanes.roots_changed(client)

    # -- logging and subscriptions (held.py) -------------------------------------------------------------------

    async def set_log_level(self, level: types.LoggingLevel | None) -> None:
        """Ask the downstream to send log messages from ``level`` up (kept and re-applied after a reconnect);
        ``None`` forgets the level (the downstream keeps the last one it was given until it reconnects). A stateless
        session is not asked: each request says its level (eras.py ``_forward_capabilities``)."""
        session = self._session if self._status.state is BackendState.READY and self._era != MODERN else None
        twin = self._twin.handshake  # a dual-era server's handshake session, where 2025 clients' level goes, if open
        await self._held.set_log_level(level, twin or session, self._twin.capabilities if twin else self.capabilities)

    async def subscribe_resource(self, uri: str) -> None:
        """Subscribe to updates of the downstream's ``uri`` (counted: asked once). Raises ``BackendError``."""
        twin = await self._twin.handshake_open()  # a dual-era server's subscriptions are its handshake session's
        self._held.listening = self._era == MODERN and twin is None
        await self._held.subscribe(uri)

    async def unsubscribe_resource(self, uri: str) -> None:
        """Drop one subscription to ``uri``; the downstream is told when the last one goes. Never raises."""
        await self._held.unsubscribe(uri, connected=self._session is not None)

    async def _twin_changed(self) -> None:
        """The handshake twin opened (the level its clients keep goes on it) or was refused: list it afresh."""
        if (twin := self._twin.handshake) is not None:
            await self._held.restore_log_level(twin, self._twin.capabilities)
        await self._refresh(LIST_KINDS)

    async def _send_empty(self, request: Any) -> object:  # on a dual-era server's handshake session, if open
        return await self._send(
            request, types.EmptyResult, None, NO_UPSTREAM, per_client=False, on=self._twin.handshake
        )

    # -- supervision ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a session to the downstream alive until cancelled. See the module docstring."""
        if not self._config.enabled:
            self._set_status(self._status)
            task_status.started()
            await anyio.sleep_forever()

        async with self._lanes.running():
            await supervise(
                self._session_lifetime,
                retry=_ConnectFailed,
                wait=wait_exponential_jitter(multiplier=0.5, max=30.0, jitter=0.5),
                task_status=task_status,
            )

    async def _session_lifetime(self, on_first_outcome: Callable[[], None]) -> None:
        """One connection, and at once another in the 2026-07-28 era when a one-era server refused the handshake."""
        try:
            await self._connect_once(on_first_outcome)
        except HandshakeRefused as refused:
            self._learnt = MODERN
            log.info("backend.era_learnt", backend=self._name, reason=f"{refused}: connecting in the {MODERN} era")
            await self._connect_once(on_first_outcome)

    async def _connect_once(self, on_first_outcome: Callable[[], None]) -> None:
        """One connection: open, initialize, serve until lost. Raises _ConnectFailed when it could not connect, or
        when the session it made ended before ``min_uptime_s``."""
        self.connects += 1
        recorder = ResponseRecorder()
        self._life = life = Life()
        self._proc = None
        ready_at: float | None = None
        failure: Exception | None = None
        with tempfile.TemporaryFile() as stderr:
            try:
                async with (
                    self._connect(
                        life, recorder, stderr, inflight=self._inflight, message_handler=self._on_message, shared=True
                    ) as session,
                    AsyncExitStack() as lanes,
                ):
                    with anyio.fail_after(self._config.connect_timeout_s):
                        opened = await self._open(session)
                    if opened.era == HANDSHAKE and opened.discovered is not None:  # both eras: a lane for 2026's
                        lane = self._connect(
                            life, recorder, stderr, inflight=self._inflight, message_handler=self._on_message
                        )
                        await self._twin.open_stateless(lanes, lane, opened.discovered)
                    elif opened.deferred and opened.discovered is not None:  # a handshake twin, if ever needed
                        self._twin.defer(opened.discovered, self._open_handshake, self._twin_changed)
                    with anyio.fail_after(self._config.connect_timeout_s):
                        lists = await list_each(session, LIST_KINDS, opened.init.capabilities, self._config)
                        lists = await self._twin.merged(lists, self._life)
                    ready_at = anyio.current_time()
                    await self._become_ready(session, lists)
                    on_first_outcome()
                    await self._serve(session, life)
            except anyio.get_cancelled_exc_class():
                self._session = None
                self._twin.close()
                raise
            except Exception as exc:  # translated into a reason below; nothing foreign escapes
                failure = exc
            self._session = None
            self._twin.close()
            self._lists = dict.fromkeys(LIST_KINDS, ())
            proc = self._proc
            exit_code = proc.returncode if proc is not None else None
            stderr_tail = proc.stderr_tail() if proc is not None else ""
            stray = proc.stray_tail() if proc is not None else ""
        if (refused := leaf_of(failure, HandshakeRefused)) is not None:
            raise refused  # the era is learnt: connect again at once (_session_lifetime)
        if ready_at is None:
            reason = classify_failure(
                failure or RuntimeError("the session ended during the handshake"),
                config=self._config,
                stderr_tail=stderr_tail,
                exit_code=exit_code,
                http=recorder,
                stray=stray,
            )
            self._fail(reason)
            if over_limits(failure):  # asking again soon would cost every caller the same again
                on_first_outcome()
                await anyio.sleep(OVER_LIMIT_RETRY_S)
            raise _ConnectFailed(reason) from failure
        detail = exit_detail(exit_code, stderr_tail) if proc is not None else ""
        if failure is not None and not detail:
            detail = classify_failure(failure, config=self._config, http=recorder)
        self._lost(life, detail, uptime=anyio.current_time() - ready_at, failure=failure)

    def _lost(self, life: Life, detail: str, *, uptime: float, failure: Exception | None) -> None:
        """A ready session ended: fail with why; ``_ConnectFailed`` (backoff) when up less than ``min_uptime_s``."""
        reason, soon = lost_reason(life, detail, uptime, self._config.min_uptime_s)
        self._fail(reason)
        if soon:
            raise _ConnectFailed(reason) from failure

    async def _open(self, session: ClientSession) -> Opened:
        """Open the shared session in its era (learnt, unless ``protocol:`` names one; eras.py)."""
        config, both, probe_s = self._config, isinstance(self._config, HttpServer), self._config.connect_timeout_s / 3
        protocol = config.protocol if config.protocol != "auto" else (self._learnt or "auto")
        opened = await open_session(
            session, protocol=protocol, backend=self._name, both=both, probe_s=probe_s, lazy=self._lazy
        )
        self._init, self._era, self._eras = opened.init, opened.era, opened.eras
        if self._fast is not None:
            self._fast.version = opened.init.protocol_version
        return opened

    @property
    def _lazy(self) -> bool:
        """Is the handshake session opened only when needed? Not where callers have sessions of their own (opened
        in the shared session's era, learnt at connect)."""
        return self._credentials is None and not self._per_client

    async def _open_lane(self, session: ClientSession) -> types.InitializeResult:
        """A caller's or client's own session, opened in the shared session's era."""
        return (await open_session(session, protocol=self._era, backend=self._name)).init

    @asynccontextmanager
    async def _connect(
        self,
        life: Life,
        recorder: ResponseRecorder,
        stderr: IO[bytes],
        *,
        inflight: InFlight,
        offered: types.ClientCapabilities | None = None,
        headers: Mapping[str, str] | None = None,
        message_handler: MessageHandlerFnT | None = None,
        shared: bool = False,
        twin: bool = False,
    ) -> AsyncIterator[ClientSession]:
        """A ``ClientSession`` over a transport of its own, not yet opened, its receive stream watched (``life`` is
        marked lost when it ends), its back-channel relayed for ``inflight`` (offering ``offered``, or all three).
        ``headers``: the gateway's own by default. ``shared``: the shared session (its process and direct lane);
        ``twin``: the handshake twin (its direct lane)."""
        if headers is None and self._credentials is not None:
            headers = self._credentials.gateway_headers()
        async with open_transport(
            self._config,
            http=self._http,
            headers=headers,
            recorder=recorder,
            stderr=stderr,
            on_failure=functools.partial(self._transport_failed, life),
            direct=shared or twin,
        ) as transport:
            if shared:
                self._proc, self._fast = transport.process, transport.lane
            if twin:
                self._twin.fast = transport.lane
            try:
                lost = functools.partial(life.mark_lost, "the connection closed")
                watched = WatchedReceiveStream(transport.read, lost, screen_lists(self._config))
                async with ClientSession(
                    watched,
                    transport.write,
                    client_info=self._client_info,
                    message_handler=message_handler,
                    **back_channel(inflight, offered, self._name),
                ) as session:
                    yield session
            finally:
                if shared:
                    self._fast = None
                if twin:
                    self._twin.fast = None

    async def _become_ready(self, session: ClientSession, lists: dict[str, tuple[Any, ...]]) -> None:
        """The shared session is open and listed: serve from it."""
        self._session = session
        self._lists = dict(lists)
        await self._held.restore(session, self.capabilities, listening=self._era == MODERN)  # held.py
        self._ready()

    async def _serve(self, session: ClientSession, life: Life) -> None:
        """Check the session's health (and on a stateless session or lane, listen for list changes: that era
        announces them nowhere else) until it is lost."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._ping_loop, session)
            listened = session if self._era == MODERN else self._twin.session  # a stateless session or twin
            if listened is not None:
                tg.start_soon(self._listen, listened)
            await life.lost.wait()
            tg.cancel_scope.cancel()

    async def _ping_loop(self, session: ClientSession) -> None:
        """Ping every ``ping_interval_s``, or at once when the transport reports an error (e.g. its stream broke)."""
        while True:
            # Jittered, so the pings of many backends (and of many gateways) do not fall in step.
            with anyio.move_on_after(spread(self._config.ping_interval_s)):
                await self._probe_now.wait()
            self._probe_now = anyio.Event()
            try:
                with anyio.fail_after(self._config.connect_timeout_s):
                    await probe(session, protocol=self._era)
            except FOREIGN as exc:
                self._life.mark_lost(f"ping failed: {exc or type(exc).__name__}")
                return

    async def _listen(self, session: ClientSession) -> None:
        caps = found.capabilities if (found := session.discover_result) is not None else self.capabilities
        await hold_listen(session, caps, self._held, backend=self._name, config=self._config, relist=self._refresh)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.debug("backend.transport_error", backend=self._name, error=str(message) or type(message).__name__)
            self._probe_now.set()  # is the session still alive? ping now rather than at the next interval
            return
        kinds = changed_lists(message)
        if kinds:
            await self._refresh(kinds, message)
        elif isinstance(message, types.LoggingMessageNotification | types.ResourceUpdatedNotification):
            if self._on_notification is not None:
                upstream = (
                    attribute(self._inflight)[0] if isinstance(message, types.LoggingMessageNotification) else None
                )
                await self._on_notification(self, message, upstream, None)

    async def _refresh(self, kinds: Sequence[str], announced: types.ServerNotification | None = None) -> None:
        """Re-read the lists a ``list_changed`` names, then tell the listeners (the catalog is rebuilt). A change
        the downstream ``announced`` that leaves the lists as they were is passed on as it came: the
        rebuilt catalog would announce nothing, and a client of the downstream itself hears every announcement."""
        session = self._session
        if session is None:
            return
        lists = await relist(session, kinds, self.capabilities, self._config, backend=self._name, life=self._life)
        if lists is not None:
            lists = await self._twin.merged(lists, self._life)
        if lists is None or session is not self._session:
            return  # not listed, or the session went away meanwhile (the next one lists afresh)
        unchanged = all(lists[kind] == self._lists[kind] for kind in kinds)
        self._lists.update(lists)
        self._ready(since=self._status.since)
        if unchanged and announced is not None and self._on_notification is not None:
            await self._on_notification(self, announced, None, None)

    def _transport_failed(self, life: Life, reason: str) -> None:
        """The transport gave up on a live session (a stdio server stopped reading its stdin): the backend is
        declared failed at once, before its process is stopped, so no new call is sent to it meanwhile."""
        life.mark_lost(reason)
        if life is self._life and self._session is not None:
            self._session = None
            self._fail(reason)

    def _ready(self, since: float | None = None) -> None:
        self._twin.learn(self._lists["tools"])  # the lane sends the Mcp-Param-* headers of the tools listed (SEP-2243)
        last = self._status.last_error
        eras = self._twin.eras(self._eras)
        ready = BackendStatus(
            BackendState.READY, None, tool_count=len(self._lists["tools"]), last_error=last, eras=eras
        )
        self._set_status(ready if since is None else replace(ready, since=since))

    def _fail(self, reason: str) -> None:
        self._set_status(BackendStatus(BackendState.FAILED, reason, last_error=reason, eras=self._eras))
