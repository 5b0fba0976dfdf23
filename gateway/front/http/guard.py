"""The guard in front of every HTTP path: ``Guard``, pure ASGI middleware, checks Host and Origin and then the caller's
bearer, in constant time, before any other work.

Host and Origin are parsed, never prefix-matched: a Host must be exactly ``name[:port]`` and an Origin exactly
``scheme://host[:port]``, and the parsed host is compared whole (``http://localhost:1.evil.example.com`` is refused);
on a loopback bind only loopback names pass unless configured (DNS-rebinding protection). A bearer is a static token
(``Tokens``) or, with ``gateway.auth.oauth``, a JWT access token verified by ``auth/oauth.py``; either becomes the
request's ``Caller`` (front/scope.py), and refusals carry the RFC 6750 challenge (``error="invalid_token"`` for a
token offered and refused; with OAuth, naming the Protected Resource Metadata). A path the gateway does not serve is
404 to anyone, before auth (so a client's OAuth discovery and registration at the gateway end at once). Every refusal
is a JSON-RPC error document, which MCP clients show word for word; a static-token refusal is logged
(``auth.refused``, once per kind and client address a minute, counting the rest; never the token). A refusal, and
any answer to a caller without a token, carries ``Connection: close``, so a connection that
outlives its first response belongs to a token holder (connections.py relies on that to keep room for them). CORS
for browser-based clients comes after the Host/Origin checks: the metadata for any admitted origin, ``/mcp`` for the
origins of ``gateway.allowed_origins`` only.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import anyio
import structlog
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth.oauth import Refusal, ResourceServer
from gateway.auth.tokens import Tokens
from gateway.calls import Caller
from gateway.errors import quote
from gateway.front.http.replies import reply, rpc_error
from gateway.front.scope import set_caller

__all__ = ["REFUSED", "Guard", "RefusalLog", "is_loopback"]

log = structlog.get_logger("gateway.http")

REFUSED = -32000
"""The JSON-RPC error code of the guard's refusals (the implementation-defined server-error range, as the reference
SDK's transports answer a refused request); the HTTP status says which refusal it is."""

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
        public_prefixes: tuple[str, ...] = (),
        oauth: ResourceServer | None = None,
        serves: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.serves = serves
        """Whether the app serves a request's path (None: every path); one it does not is 404, before auth."""
        self.refusals = RefusalLog()
        self.tokens = tokens
        self.oauth = oauth
        self.required = bool(tokens) or oauth is not None
        self.loopback = loopback
        self.allowed_hosts = {h.lower().replace("[", "").replace("]", "") for h in allowed_hosts}
        self.allowed_origins = {o.lower() for o in allowed_origins}
        self.allowed_origin_parts = {p for p in map(_split_origin, self.allowed_origins) if p is not None}
        self.public_paths = set(public_paths)
        self.public_prefixes = public_prefixes
        """Paths under these are let past the bearer check too (the app under them authenticates itself)."""
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
            await _refuse(receive, send, 421, "Misdirected request: Host header not allowed.")
            return
        if origin is not None and not self._origin_ok(origin.decode("latin-1")):
            await _refuse(receive, send, 403, "Forbidden: Origin not allowed.")
            return
        path = scope["path"]
        if path != "/mcp" and self.serves is not None and not self.serves(scope):
            await _refuse(receive, send, 404, self._not_found(path))
            return
        scope[_AUTHORIZATION] = authorization.decode("latin-1") if authorization is not None else None
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
        public = scope["path"] in self.public_paths or scope["path"].startswith(self.public_prefixes)
        if caller is None and self.oauth is not None and not public and (offered := _bearer(authorization)):
            try:
                caller = dataclasses.replace(await self.oauth.verify(offered), token=offered)
            except Refusal as refusal:
                log.info("auth.refused", status=refusal.status, error=refusal.error, reason=refusal.description)
                extra = [(b"www-authenticate", self.oauth.challenge(refusal).encode())]
                if refusal.status == 503:
                    extra.append((b"retry-after", b"5"))
                await _refuse(
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
                await self._unauthorized(scope, receive, send, authorization)
                return
            send = _closing(send)  # only token holders keep a connection open (connections.py counts on it)
        await self.app(scope, receive, send)

    def _not_found(self, path: str) -> str:
        """The 404's sentence: for an OAuth discovery or sign-in path, what to do instead (a client shows it)."""
        if _SIGN_IN.match(path) is None:
            return f"Not found: this gateway serves nothing at {quote(path)}."
        if self.oauth is None:
            return "Not found: this gateway does no OAuth sign-in; it takes a bearer token from its operator."
        return f"Not found: this gateway is no authorization server; {self.oauth.metadata_url} names the one to use."

    async def _unauthorized(self, scope: Scope, receive: Receive, send: Send, authorization: str | None) -> None:
        """401 for a request without a token the gateway accepts. Without OAuth, a bearer token offered is told
        ``invalid_token`` (RFC 6750 3.1; none offered: no error code), and the refusal is logged."""
        if self.oauth is not None:  # no bearer offered (a JWT offered was refused by the verifier, with its reason)
            text, challenge = "Unauthorized: a valid bearer token is required.", self.oauth.challenge()
        elif _bearer(authorization) is not None:
            text = "Unauthorized: the bearer token is not valid for this gateway."
            challenge = 'Bearer realm="mcp-gateway", error="invalid_token", error_description="the token is not valid"'
            self.refusals.note(scope, "invalid_token", "a bearer token the gateway does not hold")
        else:
            text, challenge = "Unauthorized: a valid bearer token is required.", 'Bearer realm="mcp-gateway"'
            self.refusals.note(scope, "missing_token", "no bearer token")
        await _refuse(receive, send, 401, text, [(b"www-authenticate", challenge.encode())])


class RefusalLog:
    """The log of static-token refusals: one ``auth.refused`` line per kind (``error``) and client address every
    ``every_s`` seconds, the next one counting those left out meanwhile (``suppressed``). Never the token."""

    def __init__(self, every_s: float = 60.0, most: int = 1_000) -> None:
        self.every_s = every_s
        self._most = most
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (error, client) -> (last logged, left out since)

    def note(self, scope: Scope, error: str, reason: str) -> None:
        """One refusal of ``scope`` for ``error``: logged unless one like it was within ``every_s``."""
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        key, now = (error, address), time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.every_s:
            self._last[key] = (last[0], last[1] + 1)
            return
        if len(self._last) >= self._most:
            self._last.clear()  # many addresses at once: start counting afresh rather than grow
        self._last[key] = (now, 0)
        (log.warning if error == "invalid_token" else log.info)(
            "auth.refused",
            status=401,
            error=error,
            reason=reason,
            client=address,
            path=scope.get("path"),
            suppressed=last[1] if last is not None else 0,
        )


_REFUSED = {401: "Unauthorized", 403: "Forbidden", 503: "Service unavailable"}
_SIGN_IN = re.compile(
    r"^/(\.well-known/(oauth-authorization-server|openid-configuration|oauth-protected-resource)|register|authorize|token)"
    r"(/|$)"
)
"""The paths of OAuth discovery and sign-in that clients try at an MCP server after a 401."""
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


async def _refuse(
    receive: Receive, send: Send, status: int, text: str, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A refusal: ``status``, and ``text`` as a JSON-RPC error without an id (what the client's SDK shows). The
    connection is closed with it: a refused client holds no connection (connections.py).

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
    await reply(send, status, rpc_error(None, REFUSED, text), [(b"connection", b"close"), *extra])
