"""One supervised session to one downstream MCP server (stdio, streamable HTTP or SSE): ``McpBackend``.

``McpBackend.run`` is the only owner of the shared session: it opens the transport (transports.py) and the
``ClientSession`` in nested ``async with`` blocks inside its own task, opens the session in its era (eras.py:
``initialize`` or ``server/discover``), lists the tools, resources, resource templates and prompts (lists.py),
restores the log level and resource subscriptions the gateway's clients hold (held.py), marks itself ready, and
then waits until the connection ends (the process exits, the HTTP stream breaks, a ping fails, a stdio server stops
reading its stdin). It then marks itself failed with the reason in plain words and reconnects with exponential
backoff and jitter; only after a session that stayed up ``min_uptime_s`` does the backoff start again from the
first step, so a server that dies right after its handshake costs a few spawns per minute, not a tight loop. A
backend that never connects still calls ``task_status.started()`` after its first failure, so it never blocks
startup.

Faults stay with their cause. An answer over ``max_answer_bytes`` fails its call alone (``BackendAnswerTooLarge``).
Every call's failure that comes from losing the session carries that session's ``Life`` as its ``cause``, so the
circuit breaker counts a crash with eight calls in flight once. No foreign error leaves this package: calls go
through failures.py's ``map_call_errors``, connection failures through its ``classify_failure``.

While it runs, a downstream's list changes re-read that list (and the listeners rebuild the catalog), its log
messages and resource updates go to the ``on_notification`` hook, and its own requests to its client (sampling,
elicitation, roots) are relayed to the gateway's client whose call caused them (relay.py). A handshake-era
``tools/call`` on the shared session goes straight on it (fastpath.py) when the transport offers a direct lane. With
``session: per_client`` or per-caller credentials, requests go on sessions of their own (lanes.py). A stateless-era
request may be answered with an input-required result, raised as ``InputRequired`` (eras.py); a client's retry
reaches ``call_tool`` / ``request`` again with the round in its ``Upstream``.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
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
from gateway.backends.mcp.eras import (
    CALL_OR_INPUT,
    MODERN,
    PROMPT_OR_INPUT,
    READ_OR_INPUT,
    call_result,
    completed,
    open_session,
    probe,
    with_round,
)
from gateway.backends.mcp.failures import (
    FOREIGN,
    Life,
    ListTooLarge,
    ResponseRecorder,
    classify_failure,
    exit_detail,
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
    screen_lists,
)
from gateway.backends.mcp.pool import BackendPool, HttpPool, calls_for
from gateway.backends.mcp.relay import InFlight, attribute, back_channel, relay_request, serving
from gateway.backends.mcp.slots import SlotStatistics
from gateway.backends.mcp.stdio import StdioProcess
from gateway.backends.mcp.transports import open_transport
from gateway.backends.mcp.watch import WatchedReceiveStream
from gateway.calls import NO_UPSTREAM, ClientLink, Upstream
from gateway.config import HttpServer, ServerConfig, SseServer
from gateway.errors import BackendUnavailable
from gateway.version import VERSION

__all__ = ["MODERN", "HttpPool", "McpBackend", "NotificationHook"]

log = structlog.get_logger("gateway.backend")


class _ConnectFailed(Exception):
    """A connection attempt failed, or its session ended before ``min_uptime_s`` (the backoff goes on growing);
    ``reason`` is already in plain words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


NotificationHook = Callable[
    ["McpBackend", types.ServerNotification, Upstream | None, ClientLink | None], Awaitable[None]
]
"""Told of a downstream notification the gateway passes on (``notifications/message``, ``resources/updated``):
``(backend, notification, the client request it belongs to or None, the client whose own session it came on or
None)``."""


class McpBackend(BackendBase):
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
        self._tools: tuple[types.Tool, ...] = ()
        self._resources: tuple[types.Resource, ...] = ()
        self._templates: tuple[types.ResourceTemplate, ...] = ()
        self._prompts: tuple[types.Prompt, ...] = ()
        self._init: types.InitializeResult | None = None
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
        self._lanes = Lanes(
            name,
            config,
            self._credentials,
            connect=self._connect,
            handshake=functools.partial(open_session, protocol=config.protocol, backend=name),
            notify=functools.partial(on_notification, self) if on_notification is not None else None,
        )

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
        return self._config.protocol != MODERN  # the stateless era asks with an input-required result instead

    def tools(self) -> Sequence[types.Tool]:
        return self._tools

    def pool_statistics(self) -> SlotStatistics | None:
        """Its calls' connections (HTTP only): how many are busy, waiting, and the limits (pool.py)."""
        return self._http.slots.statistics() if self._http is not None else None

    def resources(self) -> Sequence[types.Resource]:
        return self._resources

    def resource_templates(self) -> Sequence[types.ResourceTemplate]:
        return self._templates

    def prompts(self) -> Sequence[types.Prompt]:
        return self._prompts

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
        if self._config.protocol != MODERN:
            lane = self._fast
            # Only on the shared session (stdio or streamable HTTP): a per-client server's and a per-caller-credentials
            # server's calls go on the caller's own session (_send), through the SDK.
            if lane is not None and lane.ready and not self._per_client and self._credentials is None:
                return await self._call_fast(lane, tool, arguments, meta, progress, upstream)
            request = types.CallToolRequest(params=params)
            return await self._send(request, types.CallToolResult, progress, upstream, per_client=self._per_client)  # type: ignore[no-any-return]
        request = types.CallToolRequest(params=with_round(params, upstream.round))
        result = await self._send(request, CALL_OR_INPUT, progress, upstream, per_client=False)
        return completed(result, backend=self._name, local=tool)  # type: ignore[no-any-return]

    async def _call_fast(
        self,
        lane: DirectLane,
        tool: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        progress: ProgressFn | None,
        upstream: Upstream,
    ) -> types.CallToolResult:
        """A handshake-era ``tools/call`` on the shared session, sent straight on it (fastpath.py; over stdio,
        stdio.py's ``StdioLane``): the same request, errors and back-channel as ``_send``, without the SDK session's
        round trip."""
        self._require_session()
        life, inflight, name = self._life, self._inflight, self._name
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta:
            params["_meta"] = meta

        async def answer(request: Any) -> Any:
            return await relay_request(request, inflight, name)

        with (
            serving(inflight, upstream),
            calls_for(_caller_of(upstream)),
            map_call_errors(name, self._config.timeout_s, life),
        ):
            raw = await lane.request(
                "tools/call",
                params,
                timeout_s=self._config.timeout_s,
                progress=progress,
                answer=answer,
                notify=self._on_message,
            )
        return call_result(raw, lane.version or "")

    async def request(
        self,
        request: Any,
        result_type: Any,
        *,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> Any:
        """Forward any client request (resources, prompts, completion, ...) to this backend.

        Raises:
            BackendError: the backend is not ready, or failed to answer (a JSON-RPC error is ``BackendRpcError``).
        """
        if self._config.protocol != MODERN or request.method not in ("prompts/get", "resources/read"):
            return await self._send(request, result_type, progress, upstream, per_client=False)
        request = request.model_copy(update={"params": with_round(request.params, upstream.round)})
        either = PROMPT_OR_INPUT if request.method == "prompts/get" else READ_OR_INPUT
        result = await self._send(request, either, progress, upstream, per_client=False)
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
    ) -> Any:
        life = self._life
        session = self._require_session()
        inflight = self._inflight
        if self._credentials is not None:
            own = await self._lanes.for_caller(upstream.caller.name, upstream.caller.token)
            session, inflight, life = own.session, own.inflight, own.life  # type: ignore[assignment]
        elif per_client:
            lane = await self._lanes.for_client(upstream)
            if lane is not None and lane.session is not None:
                session, inflight, life = lane.session, lane.inflight, lane.life
        with (
            serving(inflight, upstream),
            calls_for(_caller_of(upstream)),
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
        """``client`` says its roots changed: tell its own session, if it has one (the shared session's roots are
        whoever's call is in flight, so nothing there to tell)."""
        await self._lanes.roots_changed(client)

    # -- logging and subscriptions (held.py) -------------------------------------------------------------------

    async def set_log_level(self, level: types.LoggingLevel | None) -> None:
        """Ask the downstream to send log messages from ``level`` up (kept and re-applied after a reconnect).

        ``None`` forgets the level (the downstream keeps the last one it was given until it reconnects).
        """
        session = self._session if self._status.state is BackendState.READY else None
        await self._held.set_log_level(level, session, self.capabilities)

    async def subscribe_resource(self, uri: str) -> None:
        """Subscribe to updates of the downstream's ``uri`` (counted: the downstream is asked once).

        Raises:
            BackendError: the backend is not ready or refused the subscription.
        """
        await self._held.subscribe(uri)

    async def unsubscribe_resource(self, uri: str) -> None:
        """Drop one subscription to ``uri``; the downstream is told when the last one goes. Never raises."""
        await self._held.unsubscribe(uri, connected=self._session is not None)

    async def _send_empty(self, request: Any) -> object:
        return await self._send(request, types.EmptyResult, None, NO_UPSTREAM, per_client=False)

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
                async with self._connect(
                    life, recorder, stderr, inflight=self._inflight, message_handler=self._on_message, shared=True
                ) as session:
                    with anyio.fail_after(self._config.connect_timeout_s):
                        self._init = await open_session(session, protocol=self._config.protocol, backend=self._name)
                        if self._fast is not None:
                            self._fast.version = self._init.protocol_version
                        lists = await list_each(session, LIST_KINDS, self._init.capabilities, self._config)
                    ready_at = anyio.current_time()
                    await self._become_ready(session, lists)
                    on_first_outcome()
                    await self._serve(session, life)
            except anyio.get_cancelled_exc_class():
                self._session = None
                raise
            except Exception as exc:  # translated into a reason below; nothing foreign escapes
                failure = exc
            self._session = None
            self._tools = self._resources = self._templates = self._prompts = ()
            proc = self._proc
            exit_code = proc.returncode if proc is not None else None
            stderr_tail = proc.stderr_tail() if proc is not None else ""
            stray = proc.stray_tail() if proc is not None else ""
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
        """A session that was ready has ended: the backend fails with why; raises ``_ConnectFailed`` (reconnect
        with backoff) when it was up less than ``min_uptime_s``."""
        reason = life.reason or "the connection closed"
        reason = f"{reason}; {detail}" if detail else reason
        if uptime < self._config.min_uptime_s:
            reason += (
                f" (it was up for {uptime:.1f} s, less than min_uptime_s of {self._config.min_uptime_s:g} s: "
                "reconnecting with backoff)"
            )
            self._fail(reason)
            raise _ConnectFailed(reason) from failure
        self._fail(reason)

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
    ) -> AsyncIterator[ClientSession]:
        """A ``ClientSession`` to the server over a transport of its own, not yet opened, its receive stream watched
        (``life`` is marked lost when it ends) and its back-channel relayed for ``inflight`` (offering ``offered``,
        or all three). ``headers`` default to the gateway's own (the ``"*"`` entry's secrets of per-caller
        credentials, or the server's ``headers``). ``shared``: the backend's shared session, whose process and
        direct lane are the backend's while it is open."""
        if headers is None and self._credentials is not None:
            headers = self._credentials.gateway_headers()
        async with open_transport(
            self._config,
            http=self._http,
            headers=headers,
            recorder=recorder,
            stderr=stderr,
            on_failure=functools.partial(self._transport_failed, life),
            direct=shared,
        ) as transport:
            if shared:
                self._proc, self._fast = transport.process, transport.lane
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

    async def _become_ready(self, session: ClientSession, lists: dict[str, tuple[Any, ...]]) -> None:
        """The shared session is open and listed: serve from it."""
        self._session = session
        self._tools = lists["tools"]
        self._resources = lists["resources"]
        self._templates = lists["resource_templates"]
        self._prompts = lists["prompts"]
        if self._config.protocol != MODERN:  # that era has no log level or subscriptions to restore
            await self._held.restore(session, self.capabilities)
        self._set_status(
            BackendStatus(BackendState.READY, None, tool_count=len(self._tools), last_error=self._status.last_error)
        )

    async def _serve(self, session: ClientSession, life: Life) -> None:
        """Check the session's health (and in the stateless era, listen for list changes) until it is lost."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._ping_loop, session)
            if self._config.protocol == MODERN:
                tg.start_soon(self._listen, session)
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
                    await probe(session, protocol=self._config.protocol)
            except FOREIGN as exc:
                self._life.mark_lost(f"ping failed: {exc or type(exc).__name__}")
                return

    async def _listen(self, session: ClientSession) -> None:
        await hold_listen(session, self.capabilities, backend=self._name, config=self._config, relist=self._refresh)

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
        """Re-read the lists a ``list_changed`` names, then tell the listeners (the catalog is rebuilt).

        A change the downstream ``announced`` that leaves the lists as they were is passed on as it came: the
        rebuilt catalog would announce nothing, and a client of the downstream itself hears every announcement.
        """
        session = self._session
        if session is None:
            return
        try:
            with anyio.fail_after(self._config.connect_timeout_s):
                lists = await list_each(session, kinds, self.capabilities, self._config)
        except ListTooLarge as exc:  # the server has grown past its limits: failed, saying so (and reconnected)
            self._life.mark_lost(str(exc))
            return
        except FOREIGN as exc:
            log.warning("backend.relist_failed", backend=self._name, lists=list(kinds), error=str(exc))
            return
        if session is not self._session:
            return  # the session went away meanwhile; the next one lists afresh
        unchanged = all(lists[kind] == self._listed(kind) for kind in kinds)
        self._tools = lists.get("tools", self._tools)
        self._resources = lists.get("resources", self._resources)
        self._templates = lists.get("resource_templates", self._templates)
        self._prompts = lists.get("prompts", self._prompts)
        self._set_status(
            BackendStatus(
                BackendState.READY,
                None,
                since=self._status.since,
                tool_count=len(self._tools),
                last_error=self._status.last_error,
            )
        )
        if unchanged and announced is not None and self._on_notification is not None:
            await self._on_notification(self, announced, None, None)

    def _listed(self, kind: str) -> Sequence[Any]:
        lists: dict[str, Sequence[Any]] = {
            "tools": self._tools,
            "resources": self._resources,
            "resource_templates": self._templates,
            "prompts": self._prompts,
        }
        return lists[kind]

    def _transport_failed(self, life: Life, reason: str) -> None:
        """The transport gave up on a live session (a stdio server stopped reading its stdin): the backend is
        declared failed at once, before its process is stopped, so no new call is sent to it meanwhile."""
        life.mark_lost(reason)
        if life is self._life and self._session is not None:
            self._session = None
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        self._set_status(BackendStatus(BackendState.FAILED, reason, last_error=reason))


def _caller_of(upstream: Upstream) -> str | None:
    """Whose call a request carries, for the fair share of connections (pool.py); None: the gateway's own."""
    return None if upstream is NO_UPSTREAM else upstream.caller.name or ""
