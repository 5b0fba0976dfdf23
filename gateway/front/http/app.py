"""The gateway's HTTP surface: ``/mcp`` (streamable HTTP), ``/healthz``, ``/status`` and ``/metrics``, behind one guard.

The only module that imports Starlette. ``build_app(gateway, ...)`` wraps everything in one pure ASGI ``Guard`` that
checks Host/Origin (DNS-rebinding protection on loopback binds) and the bearer token — in constant time, before any
MCP work — then answers ``/healthz`` (no auth, no reasons), ``/status`` (auth, full reasons) and ``/metrics``
(Prometheus text format; auth unless ``gateway.auth.metrics_requires_token`` says otherwise — by default it is
required unless the gateway is bound to loopback). ``/metrics`` holds names, states and counts only: no reasons,
arguments or secrets. With ``gateway.auth.oauth`` a bearer that is no static token is verified as a JWT access token
(``auth/oauth.py``), the Protected Resource Metadata is served (public) at its well-known paths, and refusals carry the
RFC 6750 challenge naming it. CORS for browser-based clients (``_Cors``, after the Host/Origin checks): the
metadata for any admitted origin, ``/mcp`` for the origins of ``gateway.allowed_origins`` only. Per-caller
request rates and concurrent calls (``quotas.py``) sit between the edge and the SDK.

Host and Origin are parsed, never prefix-matched: a Host must be exactly ``name[:port]`` and an Origin exactly
``scheme://host[:port]``, and the parsed host is compared whole (``http://localhost:1.evil.example.com`` is refused).
A refusal, and any answer to a caller without a token, carries ``Connection: close``, so a connection that outlives
its first response belongs to a token holder (``connections.py`` relies on that to keep room for them). Sessions
(``CallerSessions``): each belongs to the caller that opened it, one caller holds at most
``gateway.limits.sessions_per_caller`` of them, and a session id is never logged or stored (``session_digest``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
import structlog
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth.oauth import Refusal, ResourceServer, VerifierStatistics
from gateway.auth.tokens import Tokens
from gateway.calls import Caller
from gateway.config import Limits, Policy
from gateway.core.runtime import Gateway
from gateway.front.channels import Resumes
from gateway.front.face import Face
from gateway.front.http.body import Edge, InFlight
from gateway.front.http.limits import CallerLimits
from gateway.front.http.resume import RETRY_MS, RecentEvents
from gateway.front.http.sessions import SealedSessions, session_seal
from gateway.front.http.shared import SharedRates, SharedRedis, SharedSessionEnds
from gateway.front.http.ui import UI_PATHS, build_ui
from gateway.front.scope import caller_of, session_digest, set_caller
from gateway.observe.logs import redactor
from gateway.observe.metrics import (
    CONTENT_TYPE,
    AdapterSnapshot,
    BackendSnapshot,
    OAuthSnapshot,
    SharedStoreSnapshot,
    StateSnapshot,
    TokenCacheSnapshot,
)
from gateway.version import VERSION

__all__ = [
    "CallerSessions",
    "Guard",
    "Tokens",
    "build_app",
    "is_loopback",
    "metrics_need_token",
    "state_snapshot",
    "status_document",
]

log = structlog.get_logger("gateway.http")

_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
_PORT = re.compile(r"^[0-9]{1,5}$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on loopback only ("" and 0.0.0.0 bind every interface: not loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    """Pure ASGI middleware: Host/Origin validation, then bearer auth for protected paths, before anything else."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens,
        loopback: bool,
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
        public_paths: Sequence[str] = ("/healthz",),
        oauth: ResourceServer | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.oauth = oauth
        self.required = bool(tokens) or oauth is not None
        self.loopback = loopback
        self.allowed_hosts = {h.lower().replace("[", "").replace("]", "") for h in allowed_hosts}
        self.allowed_origins = {o.lower() for o in allowed_origins}
        self.allowed_origin_parts = {p for p in map(_split_origin, self.allowed_origins) if p is not None}
        self.public_paths = set(public_paths)
        # CORS (browser-based clients on another origin): /mcp for the configured origins only, never for the
        # loopback ones the Origin check lets through by default; the public metadata for every origin it admits.
        self.mcp_cors = _Cors(self._authenticated, origins=self.allowed_origin_parts)
        self.metadata_cors = _Cors(self._authenticated, origins=None)
        self.metadata_paths = set(oauth.metadata_paths if oauth is not None else ())

    def _host_ok(self, host: str) -> bool:
        parsed = _split_host(host)
        if parsed is None:
            return False  # empty, or not host[:port] at all (e.g. "localhost:1.evil.example.com")
        name, port = parsed
        if name in self.allowed_hosts or (port is not None and f"{name}:{port}" in self.allowed_hosts):
            return True
        if not self.loopback:
            return True  # behind a real name: the operator's proxy owns Host; auth is required anyway
        return name in _LOOPBACK_NAMES

    def _origin_ok(self, origin: str) -> bool:
        parsed = _split_origin(origin)
        if parsed is not None and parsed in self.allowed_origin_parts:
            return True
        if not self.loopback:
            return not self.allowed_origins  # a list, when given, is exhaustive
        return parsed is not None and parsed[1] in _LOOPBACK_NAMES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # One pass over the request's headers for the four the guard reads (the last of a repeated one wins, as
        # in a dict of them all); the authorization travels in the scope to _authenticated, past the CORS layer.
        host = origin = authorization = None
        asks_method = False
        for key, value in scope["headers"]:
            if key == b"host":
                host = value
            elif key == b"origin":
                origin = value
            elif key == b"authorization":
                authorization = value
            elif key == b"access-control-request-method":
                asks_method = True
        if not self._host_ok(host.decode("latin-1") if host is not None else ""):
            await _plain(receive, send, 421, "Misdirected request: Host header not allowed.")
            return
        if origin is not None and not self._origin_ok(origin.decode("latin-1")):
            await _plain(receive, send, 403, "Forbidden: Origin not allowed.")
            return
        scope[_AUTHORIZATION] = authorization.decode("latin-1") if authorization is not None else None
        path = scope["path"]
        cors = self.mcp_cors if path == "/mcp" else self.metadata_cors if path in self.metadata_paths else None
        if cors is None:
            await self._authenticated(scope, receive, send)
        elif origin is None:
            # No Origin (not a browser): all the CORS layer would do is add ``Vary: Origin`` to the answer.
            await self._authenticated(scope, receive, _vary_origin(send))
        elif asks_method and scope["method"] == "OPTIONS":
            # Browsers send no credentials on a preflight: it is answered here, before auth, and does no work. The
            # caller holds no token, so the connection closes with the answer (connections.py counts on it).
            await cors(scope, receive, _closing(send))
        else:
            await cors(scope, receive, send)  # the actual request: auth as ever, CORS headers on whatever answers

    async def _authenticated(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = scope.get(_AUTHORIZATION)
        name = self.tokens.identify(authorization) if self.tokens else None
        caller = Caller(name) if name is not None else None
        public = scope["path"] in self.public_paths
        if caller is None and self.oauth is not None and not public and (offered := _bearer(authorization)):
            try:
                caller = dataclasses.replace(await self.oauth.verify(offered), token=offered)
            except Refusal as refusal:
                log.info("auth.refused", status=refusal.status, error=refusal.error, reason=refusal.description)
                extra = [(b"www-authenticate", self.oauth.challenge(refusal).encode())]
                if refusal.status == 503:
                    extra.append((b"retry-after", b"5"))
                await _plain(
                    receive, send, refusal.status, f"{_REFUSED[refusal.status]}: {refusal.description}.", extra
                )
                return
        if caller is not None:
            set_caller(scope, caller)
            # The SDK binds a session to the principal that opened it and answers 404 to any other (POST, GET and
            # DELETE alike); the caller's name is that principal (for a JWT: issuer and subject, never the token).
            access = AccessToken(
                token="",
                client_id=caller.name or "",
                scopes=sorted(caller.scopes),
                subject=caller.subject,
                claims={"iss": caller.issuer} if caller.issuer is not None else None,
            )
            scope["user"] = AuthenticatedUser(access)
        elif self.required:
            if not public:
                challenge = self.oauth.challenge() if self.oauth is not None else 'Bearer realm="mcp-gateway"'
                await _plain(
                    receive,
                    send,
                    401,
                    "Unauthorized: a valid bearer token is required.",
                    [(b"www-authenticate", challenge.encode())],
                )
                return
            send = _closing(send)  # only token holders keep a connection open (connections.py counts on it)
        await self.app(scope, receive, send)


_REFUSED = {401: "Unauthorized", 403: "Forbidden", 503: "Service unavailable"}
_AUTHORIZATION = "gateway.authorization"
"""The scope key under which the Guard hands ``_authenticated`` the request's Authorization header (or None)."""

# What a browser-based MCP client may send to /mcp (the request headers of both protocol eras; Mcp-Param-* is a
# family) and read of the answer (the session id, the 401/403 challenge, how long to back off).
CORS_METHODS = ("GET", "POST", "DELETE")
CORS_HEADERS = frozenset(
    {
        "authorization",
        "content-type",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
        "mcp-method",
        "mcp-name",
    }
)
CORS_HEADER_PREFIX = "mcp-param-"
CORS_EXPOSED = ("Mcp-Session-Id", "WWW-Authenticate", "Retry-After")


class _Cors(CORSMiddleware):
    """Starlette's CORS middleware, with two rules it cannot be configured for: an origin is compared parsed, as
    the Guard compares it (``https://a.example`` is ``https://a.example:443``), and a preflight's requested headers
    are echoed only if each is one of ``CORS_HEADERS`` or an ``Mcp-Param-*`` (a family no fixed list can name).
    ``origins=None``: every origin (``Access-Control-Allow-Origin: *``, for the public metadata)."""

    def __init__(self, app: ASGIApp, *, origins: set[tuple[str, str, int]] | None) -> None:
        super().__init__(
            app,
            allow_origins=("*",) if origins is None else (),
            allow_methods=CORS_METHODS if origins is not None else ("GET",),
            allow_headers=("*",),  # echoed, once preflight_response has checked every one of them
            # the Origin check has admitted the page already: on a loopback bind, a loopback or a configured one
            allow_private_network=True,
            expose_headers=CORS_EXPOSED if origins is not None else (),
        )
        self.origins = origins

    def is_allowed_origin(self, origin: str) -> bool:
        if self.origins is None:
            return True
        parsed = _split_origin(origin)
        return parsed is not None and parsed in self.origins

    def preflight_response(self, request_headers: Headers) -> Response:
        requested = request_headers.get("access-control-request-headers", "")
        names = [name.strip().lower() for name in requested.split(",") if name.strip()]
        refused = [n for n in names if n not in CORS_HEADERS and not n.startswith(CORS_HEADER_PREFIX)]
        if refused:
            return Response(f"Disallowed CORS headers: {', '.join(refused)}", status_code=400, media_type="text/plain")
        return super().preflight_response(request_headers)


def _bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, else None."""
    if not authorization or authorization[:7].lower() != "bearer ":
        return None
    return authorization[7:].strip() or None


def _split_host(host: str) -> tuple[str, int | None] | None:
    """A Host header's (name, port), lowercased, IPv6 without brackets; None unless it is exactly host[:port]."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        if not bracket or not name:
            return None
    else:
        name, colon, port = host.partition(":")
        rest = colon + port
        if not name or "[" in name or "]" in name:
            return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]) or int(rest[1:]) > 65535:
        return None
    return name, int(rest[1:])


def _split_origin(origin: str) -> tuple[str, str, int] | None:
    """An Origin header's (scheme, host, port), the port defaulted by scheme; None unless it is exactly
    ``scheme://host[:port]`` over http or https (``null``, paths, user info and junk after the host are refused)."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port
    except ValueError:  # e.g. "http://localhost:1.evil.example.com": not a port
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    if parts.path or parts.query or parts.fragment:
        return None
    return parts.scheme, parts.hostname, port if port is not None else _DEFAULT_PORTS[parts.scheme]


def _vary_origin(send: Send) -> Send:
    """``send`` with ``Origin`` added to the answer's ``Vary``, exactly as Starlette's CORS middleware adds it to an
    answer to a request without an Origin (one ``Vary`` header, the earlier values first)."""

    async def varied(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            values = [v for k, v in headers if k == b"vary"]
            at = next((i for i, (k, _) in enumerate(headers) if k == b"vary"), len(headers))
            kept = [(k, v) for k, v in headers if k != b"vary"] if values else headers
            kept.insert(at, (b"vary", b", ".join([*values, b"Origin"])))
            message = {**message, "headers": kept}
        await send(message)

    return varied


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` added to the response: the connection ends with this answer."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return closing


REFUSAL_DRAIN_BYTES = 64 * 1024
REFUSAL_DRAIN_S = 1.0


async def _plain(
    receive: Receive, send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A refusal. The connection is closed with it: a refused client holds no connection (connections.py).

    The request's body is read first (up to ``REFUSAL_DRAIN_BYTES``, within ``REFUSAL_DRAIN_S``): a client may send
    the body after the head, and body bytes reaching a socket already closed make the kernel answer with a reset,
    which destroys the refusal before the client reads it (it saw "connection reset", not the 401 and its
    ``WWW-Authenticate`` challenge that starts an OAuth client's sign-in)."""
    with anyio.move_on_after(REFUSAL_DRAIN_S):
        read = 0
        while read <= REFUSAL_DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
            read += len(message.get("body", b""))
    body = json.dumps({"error": text}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


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
    against concurrent ``initialize`` requests. SDK log lines are passed through ``_SessionIdFilter``.
    """

    def __init__(self, app: Server[Any], *, limits: Limits, in_flight: InFlight | None = None, **kwargs: Any) -> None:
        super().__init__(app, session_idle_timeout=limits.session_idle_s, max_sessions=limits.max_sessions, **kwargs)
        self.per_caller = limits.sessions_per_caller
        self.evicted = 0
        # The edge's ids in flight (edge.py) learn of each session's answers and ends here, so an id whose POST
        # ended before its answer stays held until the answer is produced or the session ends.
        self.in_flight = in_flight
        if in_flight is not None and isinstance(self.event_store, RecentEvents):
            in_flight.answers_known = True

    def statistics(self) -> dict[str, int]:
        """For ``/status``: sessions open now, how many were evicted at their caller's cap, and how many were
        re-created here from their sealed id (opened on another replica, or before a restart), and how many were ended
        here because another replica was sent their DELETE (shared sessions' ends), since start; and
        ``ids_held``: request ids held now for requests whose POST ended before their answer (edge.py)."""
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
            log.warning("session.refused", caller=_caller(scope), limit=self.per_caller)
            body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=str(refusal)))
            response = Response(body.model_dump_json(by_alias=True, exclude_unset=True), status_code=429)
            response.headers["content-type"] = "application/json"
            await response(scope, receive, send)

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
            # view, so a resume never replays another session's stream of the same id (events.py).
            in_flight, session = self.in_flight, transport.mcp_session_id
            answered = partial(in_flight.answered, session) if in_flight is not None and session is not None else None
            transport._event_store = self.event_store.for_session(session, answered)
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


def _caller(scope: Scope) -> str | None:
    return caller_of(scope).name


class _SessionIdFilter(logging.Filter):
    """Rewrites the SDK's log lines about sessions so that no session id reaches the log, only its digest."""

    _ID = re.compile(r"\b[0-9a-f]{32}\b|\bv1\.[A-Za-z0-9_-]{16,}")  # the SDK's ids, and sealed ones (sessions.py)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = self._ID.sub(lambda m: f"session:{session_digest(m.group(0))}", message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


_SESSION_LOGGERS = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http")


def _filter_session_ids() -> None:
    for name in _SESSION_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _SessionIdFilter) for f in logger.filters):
            logger.addFilter(_SessionIdFilter())


def status_document(
    gateway: Gateway,
    *,
    connections: int | None = None,
    sessions: dict[str, int] | None = None,
    access: dict[str, Any] | None = None,
    shared: dict[str, Any] | None = None,
    oauth: VerifierStatistics | None = None,
) -> dict[str, Any]:
    """``/status`` and ``gateway check --json``: every backend's state and reason, the catalog's size and problems.

    Reasons quote what a backend printed (a stderr tail); registered secrets are scrubbed from them.
    """
    catalog = gateway.catalog
    per_backend = catalog.by_backend()
    backends = []
    for name, kind, status in gateway.statuses():
        backends.append(
            {
                "name": name,
                "kind": kind,
                "state": str(status.state),
                "reason": redactor.scrub(status.reason),
                "declared": status.declared,
                "since": status.since,
                "last_error": redactor.scrub(status.last_error),
                "tools": per_backend.get(name, 0),
                "downstream_tools": status.tool_count,
                "variants_not_ready": [
                    {"variant": label, "reason": redactor.scrub(reason), "detected": True}
                    for label, reason in status.unready
                ],
            }
        )
    doc: dict[str, Any] = {
        "gateway": gateway.config.gateway.name,
        "version": VERSION,
        "status": "ok" if gateway.healthy() else "degraded",
        "catalog": {"tools": len(catalog), "problems": list(catalog.problems)},
        "backends": backends,
        "config": {"file": gateway.config.source, "loaded_at": gateway.loaded_at, "reload_error": gateway.reload_error},
        "time": time.time(),
    }
    if connections is not None:
        doc["connections"] = connections
    if sessions is not None:
        doc["sessions"] = sessions
    if access is not None:
        doc["access"] = access  # the policies, and per caller its policy and how many tools it sees
    if shared is not None:
        doc["shared_limits"] = shared  # the Redis of gateway.shared.redis_url: up or down, failures since start
    if oauth is not None:
        cache = oauth.token_cache
        doc["auth"] = {  # counts only: never a token, a digest or a claim
            "oauth": {
                "verifications": dict(oauth.verifications),
                "key_fetches": dict(oauth.key_fetches),
                "token_cache": dataclasses.asdict(cache) if cache is not None else None,
            }
        }
    if gateway.ledger is not None and not gateway.ledger.disabled:
        ledger = gateway.ledger.statistics()
        doc["ledger"] = {
            "engine": ledger.engine,
            "state": "spooling" if ledger.spooling else "ok",
            "spooled_rows": ledger.spooled_rows,
            "pending_rows": ledger.pending,
            "rows_written": ledger.rows_written,
            "problem": redactor.scrub(ledger.problem),
        }
    return doc


def state_snapshot(
    gateway: Gateway, shared: SharedRedis | None = None, oauth: ResourceServer | None = None
) -> StateSnapshot:
    """What ``/metrics`` reports of the gateway's current state: backend states, adapter processes, the ledger, the
    shared limits' Redis, the JWT access tokens verified."""
    catalog = gateway.catalog
    backends = [
        BackendSnapshot(name, kind, str(status.state), status.tool_count) for name, kind, status in gateway.statuses()
    ]
    adapters = []
    for backend in gateway.backends.values():
        stats = backend.process_statistics()
        if stats is not None:
            adapters.append(
                AdapterSnapshot(backend.name, stats.live_processes, stats.running_calls, stats.waiting_calls)
            )
    ledger = gateway.ledger.statistics() if gateway.ledger is not None and not gateway.ledger.disabled else None
    store = SharedStoreSnapshot(not shared.down, dict(shared.failures_by_reason)) if shared is not None else None
    tokens = None
    if oauth is not None:
        verified = oauth.statistics()
        cache = verified.token_cache
        held = TokenCacheSnapshot(cache.entries, cache.limit, cache.evicted, cache.forgotten) if cache else None
        tokens = OAuthSnapshot(verified.verifications, held)
    return StateSnapshot(
        backends=backends,
        adapters=adapters,
        ledger=ledger,
        catalog_tools=len(catalog),
        shared_store=store,
        oauth=tokens,
    )


def metrics_need_token(gateway: Gateway, host: str) -> bool:
    """Whether ``/metrics`` asks for the bearer token: ``gateway.auth.metrics_requires_token``, or by default
    yes unless the gateway is bound to loopback (a scraper on the same machine needs no token)."""
    configured = gateway.config.gateway.auth.metrics_requires_token
    return (not is_loopback(host)) if configured is None else configured


def build_app(gateway: Gateway, *, host: str, tokens: Tokens, json_response: bool = False) -> ASGIApp:
    """The gateway's HTTP app. Run it inside ``gateway.running()`` (the caller owns the gateway's lifetime)."""
    resumes = Resumes()  # SEP-1699: a call's client resuming its stream (resume.py) lets its downstream resume
    face = Face(gateway, resumes=resumes)
    server, connections = face.server(), face.clients
    _filter_session_ids()
    in_flight = InFlight()  # the edge's request ids in flight, told of answers and session ends by the manager
    shared_settings = gateway.config.gateway.shared  # read at start: a reload does not change it
    redis = SharedRedis(shared_settings) if shared_settings.redis_url is not None else None
    shared = SharedRates(redis) if redis is not None else None
    manager = CallerSessions(
        server,
        limits=gateway.config.gateway.limits,
        in_flight=in_flight,
        seal=session_seal(gateway.config.gateway, str(gateway.config.source or "")),  # sessions.py
        ends=SharedSessionEnds(redis) if redis is not None else None,  # a DELETE ends the session on every replica
        json_response=json_response,
        # resumable streams (SEP-1699), bounded in events, age and bytes: see events.py
        event_store=RecentEvents(
            max_bytes=gateway.config.gateway.edge.replay_bytes,
            max_stream_bytes=gateway.config.gateway.edge.replay_stream_bytes,
            resumes=resumes,
        ),
        retry_interval=RETRY_MS,
        # The Guard does Host/Origin checks for every path, so the SDK's own check is off (one policy, one place).
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    mcp_app = StreamableHTTPASGIApp(manager)
    oauth_settings = gateway.config.gateway.auth.oauth  # read at start, like the tokens: a reload does not change it
    oauth = ResourceServer(oauth_settings, name=gateway.config.gateway.name) if oauth_settings is not None else None

    async def index(request: Request) -> Response:
        # GET / is where a person lands first: say where things are instead of a bare 404 (no state, no reasons).
        return JSONResponse(
            {
                "gateway": gateway.config.gateway.name,
                "mcp": "/mcp (MCP over streamable HTTP: point your client here)",
                "ui": "/ui (the status page, in a browser)",
                "status": "/status (every backend's state and reason, JSON; needs the bearer token when one is set)",
                "healthz": "/healthz",
                "metrics": "/metrics",
            }
        )

    async def healthz(request: Request) -> Response:
        states = {name: str(status.state) for name, _, status in gateway.statuses()}
        return JSONResponse({"status": "ok" if gateway.healthy() else "degraded", "backends": states})

    async def status(request: Request) -> Response:
        return JSONResponse(
            status_document(
                gateway,
                connections=len(connections),
                sessions=manager.statistics(),
                access=access(),
                shared=redis.statistics() if redis is not None else None,
                oauth=oauth.statistics() if oauth is not None else None,
            )
        )

    def access() -> dict[str, Any]:
        return connections.views.statistics(gateway.catalog, tokens.names)

    gateway.metrics.watch(lambda: state_snapshot(gateway, redis, oauth))

    async def resource_metadata(request: Request) -> Response:
        assert oauth is not None
        return JSONResponse(oauth.metadata(), headers={"cache-control": "max-age=300"})

    def limit_policies() -> Mapping[str, Policy]:
        return gateway.config.limit_policies

    metadata_routes = [Route(p, resource_metadata, methods=["GET"]) for p in (oauth.metadata_paths if oauth else ())]

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.exposition(), headers={"content-type": CONTENT_TYPE})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with anyio.create_task_group() as tasks:
                if redis is not None:
                    tasks.start_soon(redis.watch)  # pings Redis, so /metrics knows it answers while no one asks
                async with manager.run():
                    yield
                tasks.cancel_scope.cancel()
        finally:
            if redis is not None:
                await redis.aclose()

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/status", status, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            # Every POST body is checked before the SDK parses it (edge.py): one rule for both protocol eras.
            # Per-caller limits (quotas.py) after the edge, which hands them the parsed message.
            Route(
                "/mcp",
                endpoint=Edge(
                    CallerLimits(mcp_app, gateway, limit_policies, shared=shared),
                    lambda: gateway.config.gateway.edge,
                    in_flight,
                ),
            ),
            # the status page; signs people in itself, with the static tokens only (so with OAuth alone it is shut)
            Mount("/ui", app=build_ui(gateway, tokens, is_loopback(host) and oauth is None, access)),
            *metadata_routes,
        ],
        lifespan=lifespan,
    )
    gateway_settings = gateway.config.gateway
    guarded = Guard(
        app,
        tokens=tokens,
        loopback=is_loopback(host),
        allowed_hosts=gateway_settings.allowed_hosts,
        allowed_origins=gateway_settings.allowed_origins,
        public_paths=("/",)
        + (("/healthz",) if metrics_need_token(gateway, host) else ("/healthz", "/metrics"))
        + UI_PATHS
        + (oauth.metadata_paths if oauth else ()),
        oauth=oauth,
    )
    return guarded
