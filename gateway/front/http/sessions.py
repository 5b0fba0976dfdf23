"""The gateway's session manager: the SDK's ``StreamableHTTPSessionManager`` with session ids any replica can serve
(``SealedSessions``, ids from seal.py) and a fair share of the sessions for each caller (``CallerSessions``).

A replica sent a sealed id it does not hold re-creates the session from it when the id unseals, is unexpired and
belongs to the caller presenting it: a server session born initialized, so the client needs no new ``initialize``
and a balancer no affinity; any other id answers 404, as an unknown one does. What stays with the replica that holds
a session: its open GET stream, a call's back-channel on its own POST stream, and what the client changed after
``initialize`` (its ``logging/setLevel``, its resource subscriptions). A DELETE ends a session on every replica that
shares a store (``SessionEnds``); idle timeouts and evictions are each replica's own. Session ids are bearer
credentials: the SDK's log lines about them name them by digest only (``filter_session_ids``).
"""

from __future__ import annotations

import contextvars
import logging
import math
import re
import time
from functools import partial
from typing import Any, Protocol
from uuid import uuid4

import anyio
import structlog
from anyio.abc import TaskStatus
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, InitializeRequestParams
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.config import Limits
from gateway.front.http.replies import reply, rpc_error
from gateway.front.http.request_ids import InFlight
from gateway.front.http.resume import RecentEvents
from gateway.front.http.seal import SealedSession, SessionSeal, owner_digest
from gateway.front.http.stateless import serve_stateless
from gateway.front.http.transport import SessionTransport
from gateway.front.scope import caller_of, message_of, session_digest

__all__ = ["CallerSessions", "SealedSessions", "SessionEnds", "filter_session_ids"]

log = structlog.get_logger("gateway.http")
logger = logging.getLogger("mcp.server.streamable_http_manager")  # its lines pass the session-id filter

MAX_ENDED = 100_000
"""Ids of sessions this replica ended, remembered (until they expire) so that they answer 404 here."""

_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("latin-1")
_MINTED: contextvars.ContextVar[str | None] = contextvars.ContextVar("gateway.session_id", default=None)


class SessionEnds(Protocol):
    """Ends of sessions shared by the replicas (shared.py ``SharedSessionEnds``)."""

    fail_open: bool

    async def end(self, session_id: str, ttl_s: float) -> bool: ...

    async def ended(self, session_id: str) -> bool | None: ...


def _requestor(scope: Scope) -> AuthorizationContext | None:
    user = scope.get("user")
    return authorization_context(user) if isinstance(user, AuthenticatedUser) else None


class SealedSessions(StreamableHTTPSessionManager):
    """The SDK's session manager with sealed session ids: any replica holding the key serves any session.

    ``seal=None`` keeps the SDK's random ids (sessions of this process only). A session this replica ended (DELETE,
    idle timeout, eviction) answers 404 here. With ``ends`` (Redis, shared.py), the replica sent a DELETE by the
    session's owner records the end for what is left of the id's lifetime, and every replica asks before it serves
    any other request on a sealed id, held or about to be re-created (one ``EXISTS`` per request), and ends its own
    copy of a session ended elsewhere (its GET stream closes). When the store cannot answer,
    ``gateway.shared.redis_down`` decides as for the limits: ``open`` serves the request, ``closed`` answers 503, and
    a DELETE ends the session on this replica only (logged). Without a shared store another replica accepts an ended
    session's id until ``gateway.shared.session_max_age_s`` after its ``initialize``."""

    def __init__(
        self, app: Any, *, seal: SessionSeal | None = None, ends: SessionEnds | None = None, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self.seal = seal
        self.ends = ends if seal is not None else None
        self.revived = 0
        self.ended_elsewhere = 0
        self._ended: dict[str, float] = {}
        # Ids re-created here whose transport is registered (so the caps count it) but not yet connected: a request
        # served on it then would meet the SDK's "No read stream writer available" (a bare 500).
        self._reviving: set[str] = set()
        self._security = TransportSecurityMiddleware(self.security_settings)

    async def _handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request of the 2026-07-28 era (told by its ``MCP-Protocol-Version`` header alone, as the SDK tells it)
        is served by stateless.py, any other by the SDK's session handling below."""
        version = next((v for k, v in scope["headers"] if k == _VERSION_HEADER), None)
        if version is None or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS:
            await super()._handle_request(scope, receive, send)
            return
        if self._task_group is None:
            raise RuntimeError("Task group is not initialized. Make sure to use run().")
        refused = await self._security.validate_request(Request(scope, receive), is_post=scope["method"] == "POST")
        if refused is not None:
            await refused(scope, receive, send)
            return
        await serve_stateless(
            self.app,
            json_response=self.json_response,
            lifespan_state=self._lifespan_state,
            scope=scope,
            receive=receive,
            send=send,
        )

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        seal = self.seal
        if seal is None:
            await super()._handle_stateful_request(scope, receive, send)
            return
        session_id = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == MCP_SESSION_ID_HEADER.encode()), None
        )
        if session_id is None:
            token = _MINTED.set(self._mint(seal, scope))
            try:
                await super()._handle_stateful_request(scope, receive, send)
            finally:
                _MINTED.reset(token)
            return
        if session_id in self._ended:
            await super()._handle_stateful_request(scope, receive, send)  # 404: ended here
            return
        requestor = _requestor(scope)
        held = self._serving(session_id)
        opened: SealedSession | None = None
        if not held:
            opened = seal.open(session_id)
            if opened is None or opened.owner != owner_digest(requestor):
                await super()._handle_stateful_request(scope, receive, send)  # 404, as for any unknown id
                return
        if self.ends is not None and not await self._shared_end(session_id, held, opened, requestor, scope, send):
            return
        if self._serving(session_id) or session_id in self._ended or opened is None:
            await super()._handle_stateful_request(scope, receive, send)  # served here, or 404: ended (elsewhere)
            return
        await self._revive(session_id, opened, requestor, scope, receive, send)

    def _serving(self, session_id: str) -> bool:
        """Whether this replica holds the session with its server task running (one being re-created is served
        once it is: its requests wait for the creation lock in ``_revive``)."""
        return session_id in self._server_instances and session_id not in self._reviving

    async def _shared_end(
        self,
        session_id: str,
        held: bool,
        opened: SealedSession | None,
        requestor: AuthorizationContext | None,
        scope: Scope,
        send: Send,
    ) -> bool:
        """Before a request on a sealed id: a DELETE from its owner records the end for every replica; any other
        request ends the session here if another replica ended it. False when the request was answered here (503:
        the store cannot answer and ``redis_down`` is closed)."""
        assert self.ends is not None and self.seal is not None
        if scope.get("method") == "DELETE":
            if held and requestor != self._session_owners.get(session_id):
                return True  # another caller's DELETE: the SDK answers 404, and nothing is recorded
            opened = opened or self.seal.open(session_id)
            if opened is not None and not await self.ends.end(session_id, opened.expires - time.time()):
                structlog.get_logger("gateway.sessions").warning(
                    "sessions.end_not_shared",
                    note="the shared store (gateway.shared.redis_url) did not answer: this session ends on this "
                    "replica only; another replica accepts its id until gateway.shared.session_max_age_s",
                )
            return True
        ended = await self.ends.ended(session_id)
        if ended is None and not self.ends.fail_open:
            text = (
                "The session cannot be checked: the shared store (gateway.shared.redis_url) does not answer "
                "and gateway.shared.redis_down is closed; retry shortly."
            )
            await reply(send, 503, rpc_error(None, INTERNAL_ERROR, text), [(b"retry-after", b"1")])
            return False
        if ended:
            self.ended_elsewhere += 1
            transport = self._server_instances.get(session_id)
            if transport is not None:  # held here: end it here too (its GET stream closes)
                await self._discard_session(session_id, transport)
            else:
                self._remember_ended(session_id)
        return True

    def _mint(self, seal: SessionSeal, scope: Scope) -> str | None:
        message = message_of(scope)
        if message is None or message.get("method") != "initialize" or "id" not in message:
            return None  # not an opening request: the SDK refuses it
        params = message.get("params")
        if not isinstance(params, dict):
            return None  # invalid params: the SDK answers the error, and no session is kept
        requested = params.get("protocolVersion")
        # the SDK's negotiation (ServerRunner._negotiate_initialize): the client's version if it is one we speak
        negotiated = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
        minted = seal.mint(owner=_requestor(scope), protocol_version=negotiated, client_params=params)
        if minted is None:
            logger.warning("A client's initialize params are too large for a sealed session id: this replica only")
        return minted

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        session_id = _MINTED.get() or uuid4().hex  # sealed when minted, else the SDK's kind of id (this replica's)
        transport = SessionTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        return transport

    async def _revive(
        self,
        session_id: str,
        opened: SealedSession,
        requestor: AuthorizationContext | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Re-create a session this replica has not seen from its sealed state, then serve the request on it."""
        async with self._session_creation_lock:  # so that two first requests of one id re-create it once
            transport = self._server_instances.get(session_id)
            if transport is None:
                token = _MINTED.set(session_id)
                try:
                    transport = self._admit_session(requestor)  # the caps apply as to an initialize
                finally:
                    _MINTED.reset(token)
                if transport is not None:
                    # Registered now, connected only once its server task runs: until then the id's other
                    # requests come here (``_serving``) and wait for the lock rather than meet an unconnected transport.
                    self._reviving.add(session_id)
                    try:
                        await self._start_revived(session_id, transport, opened)
                    finally:
                        self._reviving.discard(session_id)
        if transport is None:  # at max_sessions: the SDK's answer to a new session there (sent outside the lock)
            await reply(send, 503, rpc_error(None, INTERNAL_ERROR, "Too many open sessions"))
            return
        await transport.handle_request(scope, receive, send)
        if transport.is_terminated:
            await self._discard_session(session_id, transport)

    async def _start_revived(
        self, session_id: str, transport: StreamableHTTPServerTransport, opened: SealedSession
    ) -> None:
        """Start a re-created session's server task (quick: it returns once the transport is connected)."""
        try:
            params = InitializeRequestParams.model_validate(opened.client_params, by_name=False)
        except ValueError:
            params = None
        assert self._task_group is not None
        try:
            await self._task_group.start(self._run_revived, session_id, transport, opened, params)
        except BaseException:
            await self._discard_session(session_id, transport)
            raise
        self.revived += 1
        logger.info(f"Re-created session {session_id} from its sealed state")

    async def _run_revived(
        self,
        session_id: str,
        transport: StreamableHTTPServerTransport,
        opened: SealedSession,
        params: InitializeRequestParams | None,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The server task of a re-created session: the SDK's loop, on a connection born initialized."""
        async with transport.connect() as (read_stream, write_stream):
            task_status.started()
            try:
                idle_scope = transport.idle_scope if transport.idle_scope is not None else anyio.CancelScope()
                with idle_scope:
                    dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                        read_stream, write_stream, inline_methods=frozenset({"initialize"})
                    )
                    connection = Connection.for_loop(dispatcher, session_id=session_id)
                    connection.client_params = params
                    connection.protocol_version = opened.protocol_version
                    connection.initialized.set()
                    await serve_connection(
                        self.app, dispatcher, connection=connection, lifespan_state=self._lifespan_state
                    )
            except Exception:
                logger.exception(f"Session {session_id} crashed")
            finally:
                await self._discard_session(session_id, transport)

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        if self.seal is not None:
            self._remember_ended(session_id)
        await super()._discard_session(session_id, transport)

    def _remember_ended(self, session_id: str) -> None:
        opened = self.seal.open(session_id) if self.seal is not None else None
        if opened is None:
            return
        if len(self._ended) >= MAX_ENDED:
            now = time.time()
            for sid in [sid for sid, exp in self._ended.items() if exp <= now] or list(self._ended)[: MAX_ENDED // 10]:
                del self._ended[sid]
        self._ended[session_id] = opened.expires


class _CallerAtCap(Exception):
    """Raised inside session admission: the caller's sessions are all busy and it is at its cap."""


class CallerSessions(SealedSessions):
    """The SDK's session manager, shared fairly between callers (``gateway.limits``).

    A session belongs to the caller that opened it: the Guard puts the caller in ``scope["user"]`` and the SDK
    answers 404 to every other caller, for POST, GET and DELETE alike, as if the session did not exist. One caller
    holds at most ``sessions_per_caller`` sessions. At that cap its new ``initialize`` closes its own
    least-recently-used *idle* session (no request in flight, no open GET stream), whose id then answers 404 (a
    client that comes back re-initializes, as for an expired session); if every one of its sessions is busy, the
    new ``initialize`` is answered 429 naming the cap. Other callers are never touched: only ``max_sessions``, which
    many callers within their shares are needed to reach, is global. The choice to evict rather than refuse is
    deliberate: a client that forgets to DELETE its sessions keeps working instead of locking itself out for
    ``session_idle_s``, and it can only ever displace its own sessions.

    Admission overrides the SDK's ``_admit_session``, which runs under the SDK's creation lock, so the cap holds
    against concurrent ``initialize`` requests.
    """

    def __init__(self, app: Server[Any], *, limits: Limits, in_flight: InFlight | None = None, **kwargs: Any) -> None:
        super().__init__(app, session_idle_timeout=limits.session_idle_s, max_sessions=limits.max_sessions, **kwargs)
        self.per_caller = limits.sessions_per_caller
        self.evicted = 0
        # The edge's ids in flight (body.py) learn of each session's answers and ends here, so an id whose POST
        # ended before its answer stays held until the answer is produced or the session ends.
        self.in_flight = in_flight
        if in_flight is not None and isinstance(self.event_store, RecentEvents):
            in_flight.answers_known = True

    def statistics(self) -> dict[str, int]:
        """For ``/status``: sessions open now, how many were evicted at their caller's cap, and how many were
        re-created here from their sealed id (opened on another replica, or before a restart), and how many were ended
        here because another replica was sent their DELETE (shared sessions' ends), since start; and
        ``ids_held``: request ids held now for requests whose POST ended before their answer (body.py)."""
        held = self.in_flight.held if self.in_flight is not None else 0
        return {
            "open": len(self._server_instances),
            "evicted": self.evicted,
            "revived": self.revived,
            "ended_elsewhere": self.ended_elsewhere,
            "ids_held": held,
        }

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super()._handle_stateful_request(scope, receive, send)
        except _CallerAtCap as refusal:  # raised before anything was sent
            log.warning("session.refused", caller=caller_of(scope).name, limit=self.per_caller)
            await reply(send, 429, rpc_error(None, INVALID_REQUEST, str(refusal)))

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        owners = self._session_owners
        mine = [sid for sid in self._server_instances if owners.get(sid) == requestor]
        if len(mine) >= self.per_caller:
            victim = self._least_recently_used_idle(mine)
            caller = requestor["client_id"] if requestor is not None else "anonymous"
            if victim is None:
                raise _CallerAtCap(
                    f"Too many open sessions for caller {caller}: it has {len(mine)} open session"
                    f"{'' if len(mine) == 1 else 's'}, the limit (gateway.limits.sessions_per_caller), and all are "
                    "busy; end one with DELETE or let one go idle, then initialize again."
                )
            self._evict(victim)
            log.info("session.evicted", caller=caller, session=session_digest(victim), limit=self.per_caller)
        transport = super()._admit_session(requestor)
        if transport is not None and isinstance(self.event_store, RecentEvents):
            # The SDK hands every session the one store and names streams by request id: each session gets its own
            # view, so a resume never replays another session's stream of the same id (resume.py).
            in_flight, session = self.in_flight, transport.mcp_session_id
            answered = partial(in_flight.answered, session) if in_flight is not None and session is not None else None
            view = transport._event_store = self.event_store.for_session(session, answered)
            # Each event's JSON made once, by the store, and framed once (transport.py sends the bytes as they are).
            transport._create_event_data = view.event_data  # type: ignore[method-assign,assignment]
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        # Every way a session ends passes here (DELETE, idle timeout, eviction, a crash, shutdown).
        if self.in_flight is not None:
            self.in_flight.session_ended(session_id)
        await super()._discard_session(session_id, transport)

    def _least_recently_used_idle(self, sessions: list[str]) -> str | None:
        """Of ``sessions``, the one idle longest. A transport's idle deadline is its last request's end plus the
        (shared) idle timeout while nothing is in flight, and infinite while something is: so the smallest finite
        deadline is the least recently used idle session."""
        idle = []
        for sid in sessions:
            scope = self._server_instances[sid].idle_scope
            if scope is not None and math.isfinite(scope.deadline) and not scope.cancel_called:
                idle.append((scope.deadline, sid))
        return min(idle)[1] if idle else None

    def _evict(self, session_id: str) -> None:
        """Forget the session now (its id answers 404 at once) and end its server task, which terminates the
        transport on its way out, exactly as an idle timeout does."""
        transport = self._server_instances.pop(session_id)
        self._session_owners.pop(session_id, None)
        if transport.idle_scope is not None:
            transport.idle_scope.cancel()
        self.evicted += 1


class _SessionIdFilter(logging.Filter):
    """Rewrites the SDK's log lines about sessions so that no session id reaches the log, only its digest."""

    _ID = re.compile(r"\b[0-9a-f]{32}\b|\bv1\.[A-Za-z0-9_-]{16,}")  # the SDK's ids, and sealed ones (seal.py)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = self._ID.sub(lambda m: f"session:{session_digest(m.group(0))}", message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


_SESSION_LOGGERS = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http")


def filter_session_ids() -> None:
    """Pass the SDK's session log lines through ``_SessionIdFilter`` (once, however often it is called)."""
    for name in _SESSION_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, _SessionIdFilter) for f in target.filters):
            target.addFilter(_SessionIdFilter())
