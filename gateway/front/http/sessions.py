"""Sessions any replica can serve: a session-era (2025-xx) session's own state travels sealed in its ``Mcp-Session-Id``.

At ``initialize`` the gateway mints the session id itself (``SessionSeal.mint``): the negotiated protocol version,
the client's info and capabilities, a digest of the caller that opened it (the SDK's ``AuthorizationContext``: the
token's caller name, or a JWT's issuer and subject), when it was opened and until when it may be used, sealed with
the SDK's AES-256-GCM codec under the key of ``gateway.continuation`` (continuation.py's ``load_key``: several
comma-separated keys for a rotation, the first seals, all open), derived for this one purpose so that a session id
and a ``requestState`` can never stand in for each other. A replica that is sent an id it does not hold opens it and,
when it unseals, is unexpired and belongs to the caller presenting it, re-creates the session from it: a server
session that is already initialized (``Connection.for_loop`` with the client's params), so the client goes on
without a new ``initialize`` and a balancer needs no affinity. An id that does not unseal (tampered, or minted by a
deployment with another key), has expired, or belongs to another caller answers 404, exactly as an unknown one.

What stays with the replica that holds it: an open GET stream, a call's back-channel on its own POST stream (both
are connections to that process), and what the client changed after ``initialize`` (its ``logging/setLevel``, its
resource subscriptions): a replica that re-creates the session starts from the client's ``initialize`` and no
subscriptions. A session this replica ended (DELETE, idle timeout, eviction at the caller's cap) answers 404 here.

A DELETE ends the session on every replica when they share a store (``ends``: Redis, shared_limits.py): the replica
that gets it, once it knows the DELETE comes from the session's owner, records the end for what is left of the id's
lifetime, and every replica asks before it serves any other request on a sealed id, held or about to be re-created
(one ``EXISTS`` round trip per request); a replica that learns its session was ended elsewhere ends it too (its GET
stream closes) and answers 404. When the store cannot answer, ``gateway.shared.redis_down`` decides as for the
limits: ``open`` serves the request, ``closed`` answers 503; a DELETE is then an end on this replica only (logged).
Without a shared store, another replica accepts an ended session's id until ``gateway.shared.session_max_age_s``
after its ``initialize``. Idle timeouts and evictions stay per replica: they are this replica's bookkeeping, not the
client's word.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import structlog
from anyio.abc import TaskStatus
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
from mcp.server.connection import Connection
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp_types import INTERNAL_ERROR, ErrorData, InitializeRequestParams, JSONRPCError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.config import GatewaySettings, environ
from gateway.front.continuation import load_key
from gateway.front.scope import message_of

__all__ = ["MAX_SEALED_ID", "SealedSession", "SealedSessions", "SessionSeal", "session_seal"]

logger = logging.getLogger("mcp.server.streamable_http_manager")  # its lines pass the session-id filter (http.py)

_VERSION = 1
_KEY_LABEL = b"mcp-gateway/session-id/v1:"
MAX_SEALED_ID = 4096
"""The longest sealed id minted (a client's info and capabilities are its own to make large); past it the session
gets a plain random id and lives on this replica only (said in a log line)."""
MAX_ENDED = 100_000
"""Ids of sessions this replica ended, remembered (until they expire) so that they answer 404 here."""

_MINTED: contextvars.ContextVar[str | None] = contextvars.ContextVar("gateway.session_id", default=None)


class SessionEnds(Protocol):
    """Ends of sessions shared by the replicas (shared_limits.py ``SharedSessionEnds``)."""

    fail_open: bool

    async def end(self, session_id: str, ttl_s: float) -> bool: ...

    async def ended(self, session_id: str) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class SealedSession:
    """What an opened session id says."""

    owner: str | None
    """A digest of the caller that opened it (None: no caller, an unauthenticated loopback gateway)."""
    protocol_version: str
    client_params: dict[str, Any]
    """The client's ``initialize`` params (protocol version, capabilities, client info), as it sent them."""
    expires: float


def owner_digest(owner: AuthorizationContext | None) -> str | None:
    if owner is None:
        return None
    text = json.dumps(dict(owner), sort_keys=True, separators=(",", ":"))
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:16]).decode().rstrip("=")


class SessionSeal:
    """Mints and opens sealed session ids under the replicas' shared keys (the first seals, every one opens)."""

    def __init__(self, keys: Sequence[bytes], max_age_s: float, *, clock: Callable[[], float] = time.time) -> None:
        self._codec = AESGCMRequestStateCodec([_KEY_LABEL + key for key in keys])
        self._max_age = max_age_s
        self._clock = clock

    def mint(self, *, owner: AuthorizationContext | None, protocol_version: str, client_params: Any) -> str | None:
        """A sealed id for a session opened now, or None when it would be longer than ``MAX_SEALED_ID``."""
        claims = {
            "v": _VERSION,
            "exp": round(self._clock() + self._max_age, 3),
            "o": owner_digest(owner),
            "pv": protocol_version,
            "cp": client_params,
        }
        token = self._codec.seal(json.dumps(claims, separators=(",", ":")).encode())
        return token if len(token) <= MAX_SEALED_ID else None

    def open(self, session_id: str) -> SealedSession | None:
        """The session an id carries; None unless it unseals under one of the keys, is well-formed and unexpired."""
        if len(session_id) > MAX_SEALED_ID:
            return None
        try:
            claims = json.loads(self._codec.unseal(session_id))
        except (InvalidRequestState, ValueError):
            return None
        if not isinstance(claims, dict) or claims.get("v") != _VERSION:
            return None
        expires, owner, version, params = claims.get("exp"), claims.get("o"), claims.get("pv"), claims.get("cp")
        if not isinstance(expires, int | float) or not self._clock() < expires:
            return None
        if not isinstance(owner, str | None) or not isinstance(version, str) or not isinstance(params, dict):
            return None
        return SealedSession(owner, version, params, float(expires))


def _requestor(scope: Scope) -> AuthorizationContext | None:
    user = scope.get("user")
    return authorization_context(user) if isinstance(user, AuthenticatedUser) else None


class SealedSessions(StreamableHTTPSessionManager):
    """The SDK's session manager with sealed session ids: any replica holding the key serves any session.

    ``seal=None`` keeps the SDK's random ids (sessions of this process only)."""

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
        if self.ends is not None and not await self._shared_end(
            session_id, held, opened, requestor, scope, receive, send
        ):
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
        receive: Receive,
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
            error = ErrorData(
                code=INTERNAL_ERROR,
                message="The session cannot be checked: the shared store (gateway.shared.redis_url) does not answer "
                "and gateway.shared.redis_down is closed; retry shortly.",
            )
            body = JSONRPCError(jsonrpc="2.0", id=None, error=error).model_dump_json(by_alias=True)
            await Response(body, status_code=503, media_type="application/json", headers={"retry-after": "1"})(
                scope, receive, send
            )
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
        minted = _MINTED.get()
        if minted is None:
            return super()._admit_session(requestor)
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        transport = StreamableHTTPServerTransport(
            mcp_session_id=minted,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        if requestor is not None:
            self._session_owners[minted] = requestor
        self._server_instances[minted] = transport
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
            error = ErrorData(code=INTERNAL_ERROR, message="Too many open sessions")
            body = JSONRPCError(jsonrpc="2.0", id=None, error=error).model_dump_json(by_alias=True)
            await Response(body, status_code=503, media_type="application/json")(scope, receive, send)
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


def session_seal(config: GatewaySettings, file: str = "") -> SessionSeal:
    """The seal of this gateway's session ids, under the ``gateway.continuation`` key (the one replicas share)."""
    settings = config.continuation
    ledger = config.audit.path if config.audit.enabled else None
    keys, source = load_key(settings.key_env, environ(settings.key_env), ledger, file=file)
    if not source.startswith("environment") and (config.audit.url or config.shared.redis_url):
        # The signs of several replicas (a shared ledger, shared limits) without a shared key: say it once.
        structlog.get_logger("gateway.sessions").warning(
            "sessions.own_key",
            note=f"{settings.key_env} is not set: this replica seals session ids with a key of its own ({source}), so "
            "another replica answers 404 to its sessions; give every replica the same key",
        )
    return SessionSeal(keys, config.shared.session_max_age_s)
