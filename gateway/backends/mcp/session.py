"""One supervised session to one downstream MCP server (stdio, streamable HTTP or SSE).

``McpBackend.run`` is the only owner of the session: it opens the transport and the ``ClientSession`` in nested
``async with`` blocks inside its own task, initializes with protocol negotiation, lists the tools, resources,
resource templates and prompts (every page), restores the log level and the resource subscriptions the gateway's
clients hold, marks itself ready, and then waits until the connection ends (the process exits, the HTTP stream
breaks, a ping fails, a stdio server stops reading its stdin). It then marks itself failed with the reason in plain
words and reconnects with exponential backoff and jitter (tenacity); only after a session that stayed up
``min_uptime_s`` does the backoff start again from the first step, so a server that dies right after its handshake
costs a few spawns per minute, not a tight loop. A backend that never connects still calls ``task_status.started()``
after its first failure, so it never blocks startup.

Faults stay with their cause. An answer over ``max_answer_bytes`` is replaced in the byte stream by an error answer
(backends/answers.py) and fails its call alone (``BackendAnswerTooLarge``). Every call's failure that comes from
losing the session carries that session's ``_Life`` as its ``cause``, so the circuit breaker counts a crash with
eight calls in flight once (health.py).

While it runs, a downstream's ``list_changed`` re-reads that list (and the listeners rebuild the catalog), its log
messages and resource updates go to the ``on_notification`` hook, and its own requests to its client (sampling,
elicitation, roots) are relayed to the gateway's client whose call caused them (backends/relay.py). With
``session: per_client``, each client that can answer such requests gets its own session, opened at its first call in
a task of its own and closed with the client's connection.

Foreign errors (``OSError``, ``httpx2``, ``anyio``, ``MCPError``) are translated into the gateway's ``BackendError``
tree by one table (backends/failures.py ``FOREIGN_ERRORS``; ``classify_failure`` for connection failures,
``map_call_errors`` for calls); nothing above ``backends/`` sees them. The HTTP connection pool is backends/pool.py,
the watch on a transport's receive stream backends/watch.py.

The era (``protocol``): by default the session is a handshake-era one (``initialize``). With ``protocol:
2026-07-28`` it is a stateless one (``server/discover``; its answer stands in for the handshake's, and a periodic
``server/discover`` for the ping, which that era has not; that era announces list changes only on a
``subscriptions/listen`` stream, so when the discover answer offers ``listChanged`` the session holds one open, fed
into the same re-listing as a handshake-era ``list_changed``, and reopens it with backoff when it breaks, without
failing the backend), and a ``tools/call``, ``prompts/get`` or
``resources/read`` may be answered with an input-required result (SEP-2322): it is raised as ``InputRequired``
(naming this backend and its own name for the tool, prompt or resource), for the server to hand the client with a
sealed ``requestState`` (gateway/continuation.py). A client's retry reaches ``call_tool`` / ``request`` again with
the client's input responses and the downstream's own state (``ROUND``, set by whoever routes the retry). Each
request declares, in its ``_meta`` envelope, the capabilities of the client whose request it serves (not the
gateway's own), so the server asks only for what that client can answer (SEP-2322).
"""

from __future__ import annotations

import contextvars
import functools
import math
import tempfile
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import anyio
import anyio.abc
import httpx2
import mcp_types as types
import structlog
from anyio.abc import TaskStatus
from mcp.client.session import ClientRequestContext, ClientSession, _later_revision_fields
from mcp.client.sse import sse_client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, listen
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from pydantic import TypeAdapter
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from gateway.auth.credentials import CallerCredentials, NoCredential
from gateway.auth.secrets import CallerSecrets
from gateway.backends.backoff import backoff, spread, supervise
from gateway.backends.base import BackendBase, BackendState, BackendStatus, ProgressFn
from gateway.backends.mcp.answers import ANSWER_TOO_LARGE, answer_too_large
from gateway.backends.mcp.failures import FOREIGN, ResponseRecorder, classify_failure, exit_detail, gateway_error
from gateway.backends.mcp.fastpath import DirectLane, HttpLane
from gateway.backends.mcp.pool import HttpPool
from gateway.backends.mcp.relay import SERVING, InFlight, attribute, relay_request
from gateway.backends.mcp.stdio import StdioProcess, open_stdio
from gateway.backends.mcp.watch import WatchedReceiveStream
from gateway.calls import NO_UPSTREAM, ClientLink, Round, Upstream
from gateway.config import HttpServer, ServerConfig, StdioServer
from gateway.errors import (
    BackendAnswerTooLarge,
    BackendError,
    BackendProtocolError,
    BackendRpcError,
    BackendTimeout,
    BackendUnavailable,
    InputRequired,
)

__all__ = ["MODERN", "HttpPool", "McpBackend"]

MODERN = "2026-07-28"
"""The stateless era's protocol version (``protocol:`` of a server)."""
MAX_CALLER_SESSIONS = 64
"""Per-caller sessions one server keeps open (``${caller.secret:...}`` headers); past it, a new caller's session
closes the least recently used idle one (that caller's next request opens it again)."""


log = structlog.get_logger("gateway.backend")

JSONRPC_REQUEST_TIMEOUT = -32001
JSONRPC_CONNECTION_CLOSED = -32000
SSE_EVENT_CAP = 1024 * 1024 - 1024
"""The SDK's legacy SSE client takes no event larger than 1 MiB (not configurable): over SSE the answer limit is at
most this, so an oversized answer is replaced before the SDK would end the session on it."""
SSE_EVENT_MARGIN = 64 * 1024
"""What the SDK's own SSE event limit allows beyond ``max_answer_bytes`` (a backstop behind backends/answers.py)."""


class _ConnectFailed(Exception):
    """A connection attempt failed, or its session ended before ``min_uptime_s`` (the backoff goes on growing);
    ``reason`` is already in plain words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class _ListenLost(Exception):
    """A ``subscriptions/listen`` stream ended before ``min_uptime_s`` (it is reopened with backoff)."""


LISTEN_BACKOFF_S = (0.5, 30.0)
"""A lost listen stream is reopened after 0.5 s, then twice as long each time it is lost again, at most 30 s."""


NotificationHook = Callable[
    ["McpBackend", types.ServerNotification, Upstream | None, ClientLink | None], Awaitable[None]
]
"""Told of a downstream notification the gateway passes on (``notifications/message``, ``resources/updated``):
``(backend, notification, the client request it belongs to or None, the client whose own session it came on or
None)``."""

LIST_KINDS = ("tools", "resources", "resource_templates", "prompts")

_BACK_CHANNEL_CAPABILITIES = types.ClientCapabilities(
    sampling=types.SamplingCapability(), elicitation=types.ElicitationCapability(), roots=types.RootsCapability()
)


@dataclass(eq=False)
class _Life:
    """One session's lifetime. ``lost`` is set once the session is gone, ``reason`` says first why; the object
    itself is the ``cause`` that the failures of the calls it took down share."""

    lost: anyio.Event = field(default_factory=anyio.Event)
    reason: str | None = None

    def mark_lost(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.lost.set()


@dataclass(eq=False)
class _Lane:
    """A downstream session of one upstream client (``session: per_client``), owned by its own task."""

    owner: Any  # the client (ClientLink) of a per-client session; the caller's name for a per-caller one
    inflight: InFlight
    ready: anyio.Event = field(default_factory=anyio.Event)
    life: _Life = field(default_factory=_Life)
    session: ClientSession | None = None
    failure: str | None = None

    @property
    def closed(self) -> anyio.Event:
        return self.life.lost


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
    ) -> None:
        super().__init__(
            name,
            config.transport,
            BackendStatus(BackendState.DISABLED, config.disabled_reason or "disabled in federation.yaml", declared=True)
            if not config.enabled
            else BackendStatus(BackendState.STARTING, "connecting"),
        )
        self._config = config
        self._http = http
        self._client_info = client_info or types.Implementation(name="mcp-gateway", version="0.1.0")
        self._on_notification = on_notification
        self._session: ClientSession | None = None
        self._tools: tuple[types.Tool, ...] = ()
        self._resources: tuple[types.Resource, ...] = ()
        self._templates: tuple[types.ResourceTemplate, ...] = ()
        self._prompts: tuple[types.Prompt, ...] = ()
        self._init: types.InitializeResult | None = None
        self._life = _Life()
        self._probe_now: anyio.Event = anyio.Event()
        self._proc: StdioProcess | None = None
        # The calls in flight on the shared session: what a downstream's request is matched to when nothing links
        # it to its call (stdio, SSE, or streamable HTTP's standalone stream; see relay.py).
        self._inflight = InFlight()
        self._per_client = config.session == "per_client"
        self._lanes: weakref.WeakKeyDictionary[Any, _Lane] = weakref.WeakKeyDictionary()
        self._lanes_tg: anyio.abc.TaskGroup | None = None
        self._log_level: types.LoggingLevel | None = None
        self._subscribed: dict[str, int] = {}
        self._fast: DirectLane | None = (
            None  # the shared session (stdio, streamable HTTP), for calls sent straight on it
        )
        self.connects = 0
        # ${caller.secret:NAME} in the headers, or token_exchange: each caller gets a session of its own, with its
        # own credentials (auth/credentials.py).
        self._credentials = CallerCredentials.for_server(config, secrets)
        self._callers: dict[str, _Lane] = {}

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
        request = types.CallToolRequest(params=_with_round(params, upstream.round))
        result = await self._send(request, _CALL_OR_INPUT, progress, upstream, per_client=False)
        if isinstance(result, types.InputRequiredResult):
            raise InputRequired(result, backend=self._name, tool=tool)
        return result  # type: ignore[no-any-return]

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

        with _serving(inflight, upstream), self.map_call_errors(life):
            raw = await lane.request(
                "tools/call",
                params,
                timeout_s=self._config.timeout_s,
                progress=progress,
                answer=answer,
                notify=self._on_message,
            )
        return _call_result(raw, lane.version or "")

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
        request = request.model_copy(update={"params": _with_round(request.params, upstream.round)})
        either = _PROMPT_OR_INPUT if request.method == "prompts/get" else _READ_OR_INPUT
        result = await self._send(request, either, progress, upstream, per_client=False)
        if isinstance(result, types.InputRequiredResult):
            local = request.params.name if request.method == "prompts/get" else request.params.uri
            raise InputRequired(result, backend=self._name, tool=local)
        return result

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
            own = await self._caller_lane(upstream.caller.name, upstream.caller.token)
            session, inflight, life = own.session, own.inflight, own.life  # type: ignore[assignment]
        elif per_client:
            lane = await self._lane_for(upstream)
            if lane is not None and lane.session is not None:
                session, inflight, life = lane.session, lane.inflight, lane.life
        with _serving(inflight, upstream), self.map_call_errors(life):
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

    @contextmanager
    def map_call_errors(self, life: _Life | None = None) -> Iterator[None]:
        """Translate a call's foreign errors into BackendError, naming this backend.

        ``life`` is the session the call went out on (the shared one by default): a failure that comes from losing
        it ends it (if it is not over already), says why it was lost, and carries it as its ``cause``.
        """
        life = life or self._life
        try:
            yield
        except MCPError as exc:
            code = exc.error.code
            too_large = answer_too_large(exc.error.data) if code == ANSWER_TOO_LARGE else None
            if too_large is not None:
                raise BackendAnswerTooLarge(self._name, *too_large) from exc
            if code == JSONRPC_REQUEST_TIMEOUT:
                timeout = f"timed out after {self._config.timeout_s:g} s"
                if life.lost.is_set():  # the session went away meanwhile (e.g. its stdin stopped taking messages)
                    raise BackendTimeout(self._name, f"{timeout}: {life.reason}", cause=life) from exc
                raise BackendTimeout(self._name, f"{timeout} (cancellation sent downstream)") from exc
            if code == JSONRPC_CONNECTION_CLOSED:
                known = life.reason
                life.mark_lost("the connection closed during a call")
                why = f": {known}" if known is not None and known != "the connection closed" else " (server crashed?)"
                raise BackendUnavailable(self._name, f"the connection closed during the call{why}", cause=life) from exc
            raise BackendRpcError(self._name, code, exc.error.message, exc.error.data) from exc
        except FOREIGN as exc:
            error = gateway_error(exc) or BackendUnavailable
            if issubclass(error, BackendProtocolError):  # an answer of the wrong shape: the session is fine
                raise error(self._name, str(exc)) from exc
            reason = f"transport error: {exc or type(exc).__name__}"
            life.mark_lost(reason)  # anything else lost the session the call went out on
            raise error(self._name, reason, cause=life) from exc

    # -- logging and subscriptions ----------------------------------------------------------------------------------

    async def set_log_level(self, level: types.LoggingLevel | None) -> None:
        """Ask the downstream to send log messages from ``level`` up (kept and re-applied after a reconnect).

        ``None`` forgets the level (the downstream keeps the last one it was given until it reconnects).
        """
        self._log_level = level
        session = self._session
        if level is None or session is None or self._status.state is not BackendState.READY:
            return
        await self._apply_log_level(session, level)

    async def _apply_log_level(self, session: ClientSession, level: types.LoggingLevel) -> None:
        caps = self.capabilities
        if caps is None or caps.logging is None:
            return
        request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))
        await self._send_or_log(session, request, "backend.set_log_level_failed", level=level)

    async def _send_or_log(self, session: ClientSession, request: Any, event: str, **fields: Any) -> None:
        """Send ``request`` (answered by an empty result) within the connect timeout; a failure is logged as a
        warning ``event`` with ``fields``, not raised."""
        try:
            with anyio.fail_after(self._config.connect_timeout_s):
                await session.send_request(request, types.EmptyResult)
        except FOREIGN as exc:
            log.warning(event, backend=self._name, **fields, error=str(exc))

    async def subscribe_resource(self, uri: str) -> None:
        """Subscribe to updates of the downstream's ``uri`` (counted: the downstream is asked once).

        Raises:
            BackendError: the backend is not ready or refused the subscription.
        """
        if self._subscribed.get(uri, 0) == 0:
            request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
            await self._send(request, types.EmptyResult, None, NO_UPSTREAM, per_client=False)
        self._subscribed[uri] = self._subscribed.get(uri, 0) + 1

    async def unsubscribe_resource(self, uri: str) -> None:
        """Drop one subscription to ``uri``; the downstream is told when the last one goes. Never raises."""
        count = self._subscribed.get(uri, 0)
        if count > 1:
            self._subscribed[uri] = count - 1
            return
        self._subscribed.pop(uri, None)
        if count == 0 or self._session is None:
            return
        request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
        try:
            with anyio.fail_after(self._config.connect_timeout_s):
                await self._send(request, types.EmptyResult, None, NO_UPSTREAM, per_client=False)
        except (BackendError, TimeoutError) as exc:
            log.info("backend.unsubscribe_failed", backend=self._name, uri=uri, error=str(exc))

    async def _restore(self, session: ClientSession) -> None:
        """After a (re)connect: the log level and the subscriptions the gateway's clients hold."""
        if self._log_level is not None:
            await self._apply_log_level(session, self._log_level)
        for uri in list(self._subscribed):
            request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
            await self._send_or_log(session, request, "backend.resubscribe_failed", uri=uri)

    # -- the back-channel -----------------------------------------------------------------------------------------

    def _back_channel(self, inflight: InFlight | None, offered: types.ClientCapabilities | None) -> dict[str, Any]:
        """The ClientSession callbacks that relay a downstream's requests to the upstream client (see relay.py).

        ``offered`` narrows what the downstream is told the gateway can answer (a per-client session mirrors its
        client); None offers all three.
        """
        name = self._name

        async def sampling(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> Any:
            return await relay_request(types.CreateMessageRequest(params=params), inflight, name)

        async def elicitation(context: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
            return await relay_request(types.ElicitRequest(params=params), inflight, name)

        async def roots(context: ClientRequestContext) -> Any:
            return await relay_request(types.ListRootsRequest(), inflight, name)

        caps = offered or _BACK_CHANNEL_CAPABILITIES
        callbacks: dict[str, Any] = {}
        if caps.sampling is not None:
            callbacks["sampling_callback"] = sampling
            callbacks["sampling_capabilities"] = caps.sampling
        if caps.elicitation is not None:
            callbacks["elicitation_callback"] = elicitation
        if caps.roots is not None:
            callbacks["list_roots_callback"] = roots
        return callbacks

    async def _lane_for(self, upstream: Upstream) -> _Lane | None:
        """The client's own downstream session, opened on its first call; None for a client that cannot answer a
        downstream's requests (it shares the one session) or when its session could not be opened."""
        client = upstream.channel.client if upstream.channel is not None else None
        if client is None or not _takes_back_channel(client.capabilities):
            return None
        lane = self._lanes.get(client)
        if lane is None:
            if self._lanes_tg is None:
                return None
            lane = _Lane(client, InFlight(owner=client))
            self._lanes[client] = lane
            client.on_close(lane.closed.set)
            # A fresh context: the lane's task must not see this request as the one it serves (see relay.SERVING).
            contextvars.Context().run(self._lanes_tg.start_soon, self._lane_lifetime, lane)
        with anyio.move_on_after(self._config.connect_timeout_s):
            await lane.ready.wait()
        if lane.session is None:
            log.warning("backend.client_session_failed", backend=self._name, reason=lane.failure or "timed out")
            return None
        return lane

    async def _lane_lifetime(self, lane: _Lane) -> None:
        """Own one client's downstream session until the client's connection closes or the session ends."""
        recorder = ResponseRecorder()
        caps = lane.owner.capabilities or types.ClientCapabilities()
        offered = types.ClientCapabilities(sampling=caps.sampling, elicitation=caps.elicitation, roots=caps.roots)
        try:
            with tempfile.TemporaryFile() as stderr:
                async with self._transport(recorder, stderr, lane.life, primary=False) as (read, write):
                    watched = WatchedReceiveStream(read, lambda: lane.life.mark_lost("the connection closed"))
                    async with ClientSession(
                        watched,
                        write,
                        client_info=self._client_info,
                        message_handler=functools.partial(self._on_lane_message, lane),
                        **self._back_channel(lane.inflight, offered),
                    ) as session:
                        with anyio.fail_after(self._config.connect_timeout_s):
                            await session.initialize()
                        lane.session = session
                        lane.ready.set()
                        log.info("backend.client_session", backend=self._name, state="open")
                        await lane.closed.wait()
        except Exception as exc:  # reported in plain words; the client's calls fall back to the shared session
            lane.failure = classify_failure(exc, config=self._config, http=recorder)
        finally:
            lane.session = None
            lane.ready.set()
            if self._lanes.get(lane.owner) is lane:
                del self._lanes[lane.owner]
            log.info("backend.client_session", backend=self._name, state="closed", reason=lane.failure)

    async def _caller_lane(self, caller: str | None, subject_token: str | None = None) -> _Lane:
        """The caller's own session to this server (its headers carry the caller's credentials), opened on its
        first request and kept while it stays up (and its credentials hold).

        Raises:
            BackendUnavailable: the caller has no such secret, or its session could not be opened.
        """
        key = caller or ""
        lane = self._callers.pop(key, None)
        if lane is not None and not lane.closed.is_set():
            self._callers[key] = lane  # the most recently used last
        else:
            if self._lanes_tg is None:
                raise BackendUnavailable(self._name, "not running")
            idle = [k for k, other in self._callers.items() if not len(other.inflight)]
            if len(self._callers) >= MAX_CALLER_SESSIONS and idle:
                self._callers[idle[0]].life.mark_lost("closed: the least recently used of too many caller sessions")
            lane = self._callers[key] = _Lane(key, InFlight())
            contextvars.Context().run(self._lanes_tg.start_soon, self._caller_lifetime, lane, subject_token)
        with anyio.move_on_after(self._config.connect_timeout_s):
            await lane.ready.wait()
        if lane.session is None:
            raise BackendUnavailable(
                self._name, f"no session for caller {caller or 'anonymous'}: {lane.failure or 'timed out opening it'}"
            )
        return lane

    async def _caller_lifetime(self, lane: _Lane, subject_token: str | None) -> None:
        """Own one caller's session to this server until it ends, its exchanged token expires, or the backend
        stops."""
        recorder = ResponseRecorder()
        try:
            assert self._credentials is not None
            headers, lifetime = await self._credentials.for_caller(lane.owner or None, subject_token)
            with tempfile.TemporaryFile() as stderr:
                async with self._transport(recorder, stderr, lane.life, primary=False, headers=headers) as streams:
                    watched = WatchedReceiveStream(streams[0], lambda: lane.life.mark_lost("the connection closed"))
                    async with ClientSession(
                        watched, streams[1], client_info=self._client_info, **self._back_channel(lane.inflight, None)
                    ) as session:
                        with anyio.fail_after(self._config.connect_timeout_s):
                            await self._open(session)
                        lane.session = session
                        lane.ready.set()
                        log.info("backend.caller_session", backend=self._name, caller=lane.owner, state="open")
                        with anyio.move_on_after(lifetime if lifetime is not None else math.inf):
                            await lane.closed.wait()
                        lane.life.mark_lost("the exchanged token expired")  # the next request exchanges anew
        except NoCredential as exc:
            lane.failure = str(exc)
        except Exception as exc:  # reported in plain words (never with a header value) to the caller's request
            lane.failure = classify_failure(exc, config=self._config, http=recorder)
        finally:
            lane.session = None
            lane.life.mark_lost(lane.failure or "closed")
            lane.ready.set()
            if self._callers.get(lane.owner) is lane:
                del self._callers[lane.owner]
            log.info("backend.caller_session", backend=self._name, caller=lane.owner, state="closed")

    async def roots_changed(self, client: ClientLink) -> None:
        """``client`` says its roots changed: tell its own session, if it has one (the shared session's roots are
        whoever's call is in flight, so nothing there to tell)."""
        lane = self._lanes.get(client)
        if lane is None or lane.session is None:
            return
        try:
            await lane.session.send_notification(types.RootsListChangedNotification())
        except FOREIGN as exc:
            log.debug("backend.roots_changed_failed", backend=self._name, error=str(exc) or type(exc).__name__)

    async def _on_lane_message(self, lane: _Lane, message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification) and self._on_notification is not None:
            upstream, _ = attribute(lane.inflight)
            await self._on_notification(self, message, upstream, lane.owner)

    # -- supervision ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a session to the downstream alive until cancelled. See the module docstring."""
        if not self._config.enabled:
            self._set_status(self._status)
            task_status.started()
            await anyio.sleep_forever()

        async with anyio.create_task_group() as lanes:
            self._lanes_tg = lanes
            try:
                await supervise(
                    self._session_lifetime,
                    retry=_ConnectFailed,
                    wait=wait_exponential_jitter(multiplier=0.5, max=30.0, jitter=0.5),
                    task_status=task_status,
                )
            finally:
                self._lanes_tg = None

    async def _session_lifetime(self, on_first_outcome: Callable[[], None]) -> None:
        """One connection: open, initialize, serve until lost. Raises _ConnectFailed when it could not connect, or
        when the session it made ended before ``min_uptime_s``."""
        self.connects += 1
        recorder = ResponseRecorder()
        self._life = life = _Life()
        self._proc = None
        connected = False
        ready_at = 0.0
        failure: Exception | None = None
        with tempfile.TemporaryFile() as stderr:
            try:
                async with self._transport(recorder, stderr, life) as (read, write):
                    watched = WatchedReceiveStream(read, lambda: life.mark_lost("the connection closed"))
                    async with ClientSession(
                        watched,
                        write,
                        client_info=self._client_info,
                        message_handler=self._on_message,
                        **self._back_channel(self._inflight, None),
                    ) as session:
                        with anyio.fail_after(self._config.connect_timeout_s):
                            self._init = await self._open(session)
                            if self._fast is not None:
                                self._fast.version = self._init.protocol_version
                            lists = {kind: await self._list(session, kind) for kind in LIST_KINDS}
                        connected, ready_at = True, anyio.current_time()
                        self._session = session
                        self._tools = lists["tools"]
                        self._resources = lists["resources"]
                        self._templates = lists["resource_templates"]
                        self._prompts = lists["prompts"]
                        if self._config.protocol != MODERN:  # that era has no log level or subscriptions to restore
                            await self._restore(session)
                        self._set_status(
                            BackendStatus(
                                BackendState.READY,
                                None,
                                tool_count=len(self._tools),
                                last_error=self._status.last_error,
                            )
                        )
                        on_first_outcome()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._ping_loop, session)
                            if self._config.protocol == MODERN:
                                tg.start_soon(self._listen_loop, session)
                            await life.lost.wait()
                            tg.cancel_scope.cancel()
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
        if connected:
            detail = exit_detail(exit_code, stderr_tail) if proc is not None else ""
            if failure is not None and not detail:
                detail = classify_failure(failure, config=self._config, http=recorder)
            reason = life.reason or "the connection closed"
            reason = f"{reason}; {detail}" if detail else reason
            uptime = anyio.current_time() - ready_at
            if uptime < self._config.min_uptime_s:
                reason += (
                    f" (it was up for {uptime:.1f} s, less than min_uptime_s of {self._config.min_uptime_s:g} s: "
                    "reconnecting with backoff)"
                )
                self._fail(reason)
                raise _ConnectFailed(reason) from failure
            self._fail(reason)
            return
        reason = classify_failure(
            failure or RuntimeError("the session ended during the handshake"),
            config=self._config,
            stderr_tail=stderr_tail,
            exit_code=exit_code,
            http=recorder,
        )
        self._fail(reason)
        raise _ConnectFailed(reason) from failure

    @asynccontextmanager
    async def _transport(
        self,
        recorder: ResponseRecorder,
        stderr: IO[bytes],
        life: _Life,
        *,
        primary: bool = True,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[Any]:
        config = self._config
        if isinstance(config, StdioServer):
            env = get_default_environment() | dict(config.env)
            async with open_stdio(
                config.command,
                list(config.args),
                env=env,
                cwd=config.cwd,
                stderr=stderr,
                max_line_bytes=config.max_answer_bytes,
                write_timeout_s=config.timeout_s,
                on_failure=functools.partial(self._transport_failed, life),
            ) as (read, write, proc):
                if not primary:
                    yield read, write
                    return
                self._proc, self._fast = proc, proc.lane
                try:
                    yield read, write
                finally:
                    self._fast = None
            return
        http = self._http or HttpPool()
        if headers is None:
            headers = dict(config.headers)
            if self._credentials is not None:  # the gateway's own session: the "*" entry's secrets, if any
                headers = self._credentials.gateway_headers()
        if isinstance(config, HttpServer):
            # A response stream may stay open as long as the longest call: never cut it before the call's timeout.
            limit = config.max_answer_bytes
            read_s = max(300.0, config.timeout_s + 30)
            client = http.client(
                headers,
                config.connect_timeout_s,
                recorder,
                read_s,
                max_answer_bytes=limit,
                json_lines=config.protocol == MODERN,  # the stateless era's servers stream JSON lines too
            )
            lane = HttpLane(client, config.url, max_event_size=limit + SSE_EVENT_MARGIN) if primary else None
            if lane is not None:
                client.event_hooks["response"].append(lane.see)
            async with (
                streamable_http_client(
                    config.url, http_client=client, max_sse_event_size=limit + SSE_EVENT_MARGIN
                ) as streams,
                anyio.create_task_group() as closer,
            ):
                if lane is not None:
                    lane.closer = closer
                self._fast = lane
                try:
                    yield streams
                finally:
                    self._fast = None
                    closer.cancel_scope.cancel()
            return

        sent = headers

        def factory(
            headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None, auth: Any = None
        ) -> httpx2.AsyncClient:
            merged = {**sent, **(headers or {})}
            limit = min(config.max_answer_bytes, SSE_EVENT_CAP)
            client = http.client(merged, config.connect_timeout_s, recorder, max_answer_bytes=limit)
            if timeout is not None:
                client.timeout = timeout
            return client

        async with sse_client(
            config.url,
            headers=dict(sent),
            timeout=config.connect_timeout_s,
            httpx_client_factory=factory,
        ) as streams:
            yield streams

    async def _open(self, session: ClientSession) -> types.InitializeResult:
        """The handshake, or in the stateless era ``server/discover``, whose answer is told as a handshake's."""
        if self._config.protocol != MODERN:
            return await session.initialize()
        _complete_by_default(session)
        found = await session.discover()
        _forward_capabilities(session)
        info = session.server_info or types.Implementation(name=self._name, version="")
        return types.InitializeResult(
            protocol_version=session.protocol_version or MODERN,
            capabilities=found.capabilities,
            server_info=info,
            instructions=found.instructions,
        )

    async def _list(self, session: ClientSession, kind: str) -> tuple[Any, ...]:
        """Every page of one of the downstream's lists (empty when it does not offer that capability)."""
        caps = self._init.capabilities if self._init is not None else None
        offered = {
            "tools": caps is None or caps.tools is not None,
            "resources": caps is not None and caps.resources is not None,
            "resource_templates": caps is not None and caps.resources is not None,
            "prompts": caps is not None and caps.prompts is not None,
        }[kind]
        if not offered:
            return ()
        items: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            if kind == "tools":
                tools = await session.list_tools(params=params)
                items.extend(tools.tools)
                cursor = tools.next_cursor
            elif kind == "resources":
                resources = await session.send_request(
                    types.ListResourcesRequest(params=params), types.ListResourcesResult
                )
                items.extend(resources.resources)
                cursor = resources.next_cursor
            elif kind == "resource_templates":
                try:
                    templates = await session.send_request(
                        types.ListResourceTemplatesRequest(params=params), types.ListResourceTemplatesResult
                    )
                except MCPError as exc:
                    if exc.error.code != types.METHOD_NOT_FOUND:
                        raise
                    # Resources without templates: an SDK server lacking the handler answers "Method not found"
                    # (over stateless HTTP, with a 404) though it declared ``resources``; it has no templates.
                    return tuple(items)
                items.extend(templates.resource_templates)
                cursor = templates.next_cursor
            else:
                prompts = await session.send_request(types.ListPromptsRequest(params=params), types.ListPromptsResult)
                items.extend(prompts.prompts)
                cursor = prompts.next_cursor
            if not cursor or cursor in seen:  # a server that hands out the same cursor again would loop forever
                return tuple(items)
            seen.add(cursor)

    async def _ping_loop(self, session: ClientSession) -> None:
        """Ping every ``ping_interval_s``, or at once when the transport reports an error (e.g. its stream broke)."""
        while True:
            # Jittered, so the pings of many backends (and of many gateways) do not fall in step.
            with anyio.move_on_after(spread(self._config.ping_interval_s)):
                await self._probe_now.wait()
            self._probe_now = anyio.Event()
            try:
                with anyio.fail_after(self._config.connect_timeout_s):
                    if self._config.protocol == MODERN:
                        await session.send_discover(session.protocol_version or MODERN)
                    else:
                        await session.send_ping()
            except FOREIGN as exc:
                self._mark_lost(f"ping failed: {exc or type(exc).__name__}")
                return

    async def _listen_loop(self, session: ClientSession) -> None:
        """Hold one ``subscriptions/listen`` stream to a stateless-era downstream, for the list changes its discover
        answer says it announces (that era has no other way to hear them). Each event the stream carries also reaches
        ``_on_message`` (the SDK tees listen frames to the message handler), which re-lists as for a handshake-era
        ``list_changed``. A stream that breaks or is refused is reopened with backoff (``LISTEN_BACKOFF_S``), which
        starts again from its first step after a stream that stayed up ``min_uptime_s``; the backend's health stays
        its discover check. The spec replays nothing, so every acknowledged stream re-lists what it watches first."""
        caps = self._init.capabilities if self._init is not None else None
        tools = caps is not None and caps.tools is not None and bool(caps.tools.list_changed)
        prompts = caps is not None and caps.prompts is not None and bool(caps.prompts.list_changed)
        resources = caps is not None and caps.resources is not None and bool(caps.resources.list_changed)
        kinds = [*(("tools",) if tools else ()), *(("prompts",) if prompts else ())]
        kinds += ["resources", "resource_templates"] if resources else []
        if not kinds:
            return

        def lost(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            wait = round(state.upcoming_sleep, 1)
            log.info("backend.listen_lost", backend=self._name, error=str(error), retry_in_s=wait)

        while True:  # one backoff per run of short-lived streams
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(_ListenLost),
                wait=backoff(*LISTEN_BACKOFF_S),
                sleep=anyio.sleep,
                before_sleep=lost,
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._listen_once(session, kinds, tools=tools, prompts=prompts, resources=resources)
            except ListenNotSupportedError as exc:
                log.warning("backend.listen_unavailable", backend=self._name, error=str(exc))
                return

    async def _listen_once(
        self, session: ClientSession, kinds: list[str], *, tools: bool, prompts: bool, resources: bool
    ) -> None:
        """One ``subscriptions/listen`` stream, until it ends. Returns when it stayed up ``min_uptime_s`` (it is
        reopened at once); raises ``_ListenLost`` when it ended sooner, or was refused, or never acknowledged."""
        opened_at = anyio.current_time()
        error = "the server closed it"
        with anyio.CancelScope() as ack_scope:
            ack_scope.deadline = opened_at + self._config.connect_timeout_s  # bounds the wait for the ack only
            try:
                async with listen(
                    session,
                    tools_list_changed=tools,
                    prompts_list_changed=prompts,
                    resources_list_changed=resources,
                ) as subscription:
                    ack_scope.deadline = float("inf")
                    log.debug("backend.listen_open", backend=self._name, lists=kinds)
                    await self._refresh(kinds)
                    async for _event in subscription:  # drains the backlog; _on_message has re-listed
                        pass
            except ListenNotSupportedError:
                raise  # a RuntimeError, but not a lost stream: the loop stops
            except FOREIGN as exc:
                error = str(exc) or type(exc).__name__
        if ack_scope.cancelled_caught:
            error = f"no acknowledgment within connect_timeout_s of {self._config.connect_timeout_s:g} s"
        if anyio.current_time() - opened_at < self._config.min_uptime_s:
            raise _ListenLost(error)
        log.info("backend.listen_lost", backend=self._name, error=error, retry_in_s=0)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.debug("backend.transport_error", backend=self._name, error=str(message) or type(message).__name__)
            self._probe_now.set()  # is the session still alive? ping now rather than at the next interval
            return
        if isinstance(message, types.ToolListChangedNotification):
            await self._refresh(("tools",), message)
        elif isinstance(message, types.ResourceListChangedNotification):
            await self._refresh(("resources", "resource_templates"), message)
        elif isinstance(message, types.PromptListChangedNotification):
            await self._refresh(("prompts",), message)
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
                lists = {kind: await self._list(session, kind) for kind in kinds}
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

    def _mark_lost(self, reason: str) -> None:
        self._life.mark_lost(reason)

    def _transport_failed(self, life: _Life, reason: str) -> None:
        """The transport gave up on a live session (a stdio server stopped reading its stdin): the backend is
        declared failed at once, before its process is stopped, so no new call is sent to it meanwhile."""
        life.mark_lost(reason)
        if life is self._life and self._session is not None:
            self._session = None
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        self._set_status(BackendStatus(BackendState.FAILED, reason, last_error=reason))


def _call_result(raw: dict[str, Any], version: str) -> types.CallToolResult:
    """A ``tools/call`` answer read off the wire, checked as the SDK's session checks it (``send_request``)."""
    try:
        _methods.validate_server_result("tools/call", version, raw)
    except KeyError:
        pass
    foreign = _later_revision_fields("tools/call", version)
    if not foreign.isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return types.CallToolResult.model_validate(raw, by_name=False)


@contextmanager
def _serving(inflight: InFlight, upstream: Upstream) -> Iterator[None]:
    """While a request is sent for ``upstream``'s client: counted in flight on the session, and the one the SDK
    callbacks it causes are attributed to (relay.py). A request no client's channel stands behind is neither."""
    if upstream.channel is None:
        yield
        return
    key = inflight.enter(upstream)
    token = SERVING.set(upstream)
    try:
        yield
    finally:
        SERVING.reset(token)
        inflight.leave(key)


def _takes_back_channel(caps: types.ClientCapabilities | None) -> bool:
    return caps is not None and (caps.sampling is not None or caps.elicitation is not None or caps.roots is not None)


_CALL_OR_INPUT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    types.CallToolResult | types.InputRequiredResult
)
_PROMPT_OR_INPUT: TypeAdapter[types.GetPromptResult | types.InputRequiredResult] = TypeAdapter(
    types.GetPromptResult | types.InputRequiredResult
)
_READ_OR_INPUT: TypeAdapter[types.ReadResourceResult | types.InputRequiredResult] = TypeAdapter(
    types.ReadResourceResult | types.InputRequiredResult
)


def _with_round(params: Any, retry: Round | None) -> Any:
    """``params`` carrying the retry's input responses and the downstream's own state, when this is a retry."""
    if retry is None:
        return params
    responses = retry.input_responses
    return params.model_copy(
        update={
            "input_responses": _INPUT_RESPONSES.validate_python(responses) if responses is not None else None,
            "request_state": retry.request_state,
        }
    )


_INPUT_RESPONSES: TypeAdapter[types.InputResponses] = TypeAdapter(types.InputResponses)


def _complete_by_default(session: ClientSession) -> None:
    """Read a stateless-era result without ``resultType`` as ``complete``, as SEP-2322 tells clients to.

    The SDK validates each result against the era's schema, where the field is required, so a server that leaves it
    out (the conformance suite's reference server does, on every tool result) failed every call through the gateway
    although its client must take the result as complete.
    """
    dispatcher = session._dispatcher
    send = dispatcher.send_raw_request

    async def defaulting(method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        raw = await send(method, params, opts)
        if isinstance(raw, dict) and "resultType" not in raw:
            raw["resultType"] = "complete"
        return raw

    dispatcher.send_raw_request = defaulting  # type: ignore[method-assign]


def _forward_capabilities(session: ClientSession) -> None:
    """Make each request of this stateless-era session declare the calling client's capabilities.

    The SDK stamps every request's ``_meta`` envelope with the capabilities of *this* session (all three, since
    the gateway relays sampling, elicitation and roots), and a server uses them to decide which input requests it
    may send. The client behind the gateway is the one that must answer, so its own declaration (none: ``{}``)
    replaces ours, after the SDK's stamp (``ClientSession._stamp``, set by ``discover``).
    """
    stamp = session._stamp

    def forwarding(data: dict[str, Any], opts: Any) -> None:
        stamp(data, opts)
        upstream = SERVING.get()
        if upstream is None or upstream.channel is None or data.get("method") == "server/discover":
            return
        declared = upstream.channel.capabilities
        meta = data.setdefault("params", {}).setdefault("_meta", {})
        meta[types.CLIENT_CAPABILITIES_META_KEY] = (
            declared.model_dump(by_alias=True, mode="json", exclude_none=True) if declared is not None else {}
        )

    session._stamp = forwarding
