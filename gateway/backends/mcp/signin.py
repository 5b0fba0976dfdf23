"""The gateway as an OAuth client of one downstream server (``auth: {oauth: ...}``): ``SignIn``.

The SDK's ``OAuthClientProvider`` does the protocol: Protected Resource Metadata from the server's 401 (RFC 9728),
authorization server metadata (RFC 8414 / OpenID discovery), the client by Client ID Metadata Document, Dynamic
Client Registration (RFC 7591) or the configured id, PKCE and ``resource`` (RFC 8707), scopes from the challenge.
The browser's part cannot run inside a call, so the flow is split: ``begin(caller)`` (the page ``/ui/connect/NAME``)
starts the flow in a task of the backend's own, which sends an ``initialize`` to the server (a 2026-07-28
``server/discover`` when it refuses that with HTTP 400; a ``tools/list`` when the handshake is open), meets its 401,
discovers and registers, and stops at the authorization redirect, whose URL ``begin`` returns (the browser is sent
there); its ``state`` is one-time and waits at most ``SIGN_IN_TTL_S``.
``finish(state, code, iss)`` (the callback) hands the code to that task, which exchanges it (the code verifier never
leaves it) and stores the tokens for the caller who began (auth/connections.py). ``per: gateway`` runs the same
request with the gateway's own grant instead (grants.py: ``client_credentials``, ``cross_app`` or a workload token).

``token(caller)`` is what a caller's session sends: the stored access token, refreshed (``refresh_token`` grant)
when it has less than ``EXPIRY_MARGIN_S`` left; with none, ``NoCredential`` carrying the sign-in link.

Every request of the flow (discovery, registration, token) goes through ``FlowTransport`` (flow_http.py): https
only, through the egress guard, answers and times bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import httpx2
import pydantic
import structlog
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import extract_field_from_www_auth
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from gateway.auth.connections import OPEN_CALLER, Connections, SignInFailed
from gateway.auth.credentials import NoCredential
from gateway.backends.mcp.flow_http import FlowStorage, FlowTransport
from gateway.backends.mcp.grants import own_provider
from gateway.config import HttpServer
from gateway.observe.logs import redactor
from gateway.version import VERSION

__all__ = [
    "CLIENT_DOCUMENT",
    "EXPIRY_MARGIN_S",
    "GATEWAY_ROW",
    "MAX_STEP_UPS",
    "SIGN_IN_TTL_S",
    "SignIn",
    "SignInFailed",
]

log = structlog.get_logger("gateway.signin")

SIGN_IN_TTL_S = 600.0
"""How long a started sign-in waits for its callback; then its ``state`` is refused."""
EXPIRY_MARGIN_S = 30.0
"""A token with less than this left is refreshed before a session is opened with it."""
CLIENT_DOCUMENT = "/ui/connect/client.json"
"""Where the gateway publishes its own Client ID Metadata Document (core/connect.py ``client_document``)."""
MAX_STEP_UPS = 2
"""Sign-ins one caller is asked for, for one scope a server wants beyond what they hold (403 ``insufficient_scope``);
past it the server's refusal is the answer."""
MAX_PENDING = 256
"""Sign-ins waiting for their callback at once, per server; past it, the oldest is dropped."""
GATEWAY_ROW = "*"
"""The caller name under which a ``per: gateway`` server's token is stored."""


@dataclass(eq=False)
class _Pending:
    """One started sign-in, between ``begin`` and its callback."""

    caller: str
    challenge: str | None = None  # a step-up: the server's 403 ``insufficient_scope`` to the caller's call
    started: float = field(default_factory=time.monotonic)
    url: str | None = None
    redirected: anyio.Event = field(default_factory=anyio.Event)
    answered: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    result: AuthorizationCodeResult | None = None
    error: str | None = None


class SignIn:
    """One OAuth-protected server's sign-ins and tokens (see the module docstring)."""

    def __init__(self, name: str, config: HttpServer, store: Connections, connect_url: str) -> None:
        assert config.auth is not None
        self.name = name
        self.oauth = config.auth.oauth
        self._config = config
        self._store = store
        self._connect_url = connect_url
        self._pending: dict[str, _Pending] = {}
        self._signing_key = self.oauth.signing_key()  # read once, at startup (config checked it opens)
        if self._signing_key is not None:
            redactor.add([self._signing_key])
        self._refreshing: dict[str, anyio.Lock] = {}
        self._challenges: dict[str, str] = {}
        self._step_ups: dict[tuple[str, frozenset[str]], int] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.on_stepped_up: Callable[[str], None] = lambda caller: None
        """Told the caller whose sign-in got more scope (their open session still carries the narrower token)."""

    @property
    def per_caller(self) -> bool:
        return self.oauth.per == "caller"

    @property
    def client_metadata_url(self) -> str | None:
        """The client id the gateway offers an authorization server that supports Client ID Metadata Documents: the
        configured ``client_metadata_url``, else its own document (``CLIENT_DOCUMENT``) when browsers reach the
        gateway over https (a client id must be an https URL an authorization server can fetch)."""
        if self.oauth.client_metadata_url is not None or not self._connect_url.startswith("https://"):
            return self.oauth.client_metadata_url
        return f"{self._connect_url}{CLIENT_DOCUMENT}"

    @property
    def link(self) -> str:
        """Where a caller signs in to this server."""
        return f"{self._connect_url}/ui/connect/{self.name}"

    @property
    def redirect_uri(self) -> str:
        return f"{self._connect_url}/ui/connect/callback"

    def row(self, caller: str) -> str:
        """Under which name ``caller``'s token is stored: the gateway's own (``per: gateway``), ``OPEN_CALLER`` for
        the unnamed caller of an open gateway, else the caller's name."""
        return GATEWAY_ROW if self.oauth.per == "gateway" else caller or OPEN_CALLER

    def attach(self, tg: anyio.abc.TaskGroup | None) -> None:
        """The task group the flows run in (the backend's own, while it runs)."""
        self._tg = tg

    # -- the authorization code flow -------------------------------------------------------------------------------

    async def begin(self, caller: str) -> str | None:
        """Start ``caller``'s sign-in: the authorization URL to send their browser to (None: the server took the
        token already stored for them, nothing to do).

        Raises:
            SignInFailed: the server, its metadata or its authorization server refused or could not be reached.
        """
        if self._tg is None:
            raise SignInFailed(f"server {self.name} is not running")
        if self.oauth.per == "gateway":
            raise SignInFailed(
                f"server {self.name} is used with the gateway's own identity: there is nothing to sign in"
            )
        self._forget_stale()
        caller = self.row(caller)
        pending = _Pending(caller, self._challenges.get(caller))
        self._tg.start_soon(self._flow, pending)
        with anyio.move_on_after(self.oauth.timeout_s * 4):
            async with anyio.create_task_group() as either:
                for event in (pending.redirected, pending.done):
                    either.start_soon(_first, event, either.cancel_scope)
        if pending.error is not None:
            raise SignInFailed(pending.error)
        if pending.url is None:
            if pending.done.is_set():
                return None
            raise SignInFailed(f"server {self.name} did not lead to an authorization server in time")
        state = parse_qs(urlsplit(pending.url).query).get("state", [""])[0]
        if len(self._pending) >= MAX_PENDING:
            self._drop(next(iter(self._pending)), "too many sign-ins waiting")
        self._pending[state] = pending
        return pending.url

    async def finish(self, state: str, code: str | None, iss: str | None, error: str | None) -> str:
        """Complete the sign-in that ``state`` names with the authorization server's answer; the caller it was for.

        Raises:
            SignInFailed: no such sign-in (unknown, used or expired ``state``), or the exchange failed.
        """
        self._forget_stale()
        pending = self._pending.pop(state, None) if state else None
        if pending is None:
            raise SignInFailed("this sign-in link is unknown, already used or expired: start again")
        if error is not None or not code:
            self._drop_pending(pending, f"the authorization server answered {error or 'no code'}")
            raise SignInFailed(f"the authorization server did not grant access ({(error or 'no code')[:64]})")
        pending.result = AuthorizationCodeResult(code=code, state=state, iss=iss)
        pending.answered.set()
        with anyio.move_on_after(self.oauth.timeout_s * 3):
            await pending.done.wait()
        if pending.error is not None or not pending.done.is_set():
            raise SignInFailed(pending.error or "the token exchange did not finish in time")
        return pending.caller

    async def _flow(self, pending: _Pending) -> None:
        """Run one sign-in: the SDK's flow on an ``initialize`` to the server, stopped at the redirect until the
        callback answers; the tokens stored for ``pending.caller``."""

        async def redirect(url: str) -> None:
            pending.url = url
            pending.redirected.set()

        async def callback() -> AuthorizationCodeResult:
            await pending.answered.wait()
            assert pending.result is not None
            return pending.result

        storage = FlowStorage(self._store, self.name, self._fixed_client())
        provider = OAuthClientProvider(
            self._config.url,
            OAuthClientMetadata(
                redirect_uris=[self.redirect_uri],  # type: ignore[list-item]
                client_name="mcp-gateway",
                grant_types=["authorization_code", "refresh_token"],
                token_endpoint_auth_method="client_secret_basic",
                scope=self.oauth.scope,
            ),
            storage,
            redirect_handler=redirect,
            callback_handler=callback,
            client_metadata_url=self.client_metadata_url,
        )
        if pending.challenge is not None:  # what the caller holds now: the SDK unions its scope with the wanted
            held = await self._store.get(self.name, pending.caller)
            storage.tokens = OAuthToken.model_validate(held["token"]) if held else None
        with anyio.move_on_after(SIGN_IN_TTL_S):
            await self._run(provider, storage, pending.caller, pending)
        if not pending.done.is_set():
            pending.error = pending.error or "the sign-in was not completed in time"
        pending.redirected.set()
        pending.done.set()

    async def _run(
        self,
        provider: httpx2.Auth,
        storage: FlowStorage,
        caller: str,
        pending: _Pending | None,
        challenge: str | None = None,
    ) -> None:
        """Send the ``initialize`` through ``provider`` and store the tokens it got for ``caller`` (a step-up when
        there is a ``challenge``: the server's 403 the flow meets first)."""
        challenge = pending.challenge if pending is not None else challenge
        held = storage.tokens
        try:
            async with httpx2.AsyncClient(
                transport=FlowTransport(self.oauth, self._config, challenge),
                timeout=self.oauth.timeout_s,
                trust_env=False,
                headers={"accept-encoding": "identity"},
            ) as http:
                headers = {"accept": "application/json, text/event-stream"}
                response = await http.post(self._config.url, json=_INITIALIZE, headers=headers, auth=provider)
                if storage.tokens is None and response.status_code == 400:  # a server of the 2026-07-28 era alone
                    stateless = headers | {"mcp-protocol-version": _MODERN, "mcp-method": "server/discover"}
                    response = await http.post(self._config.url, json=_DISCOVER, headers=stateless, auth=provider)
                session = response.headers.get("mcp-session-id")
                if storage.tokens is None and response.status_code == 200:  # it asks only past the handshake
                    headers |= {"mcp-protocol-version": _VERSION, **({"mcp-session-id": session} if session else {})}
                    for message in _PAST_HANDSHAKE:
                        response = await http.post(self._config.url, json=message, headers=headers, auth=provider)
                if session:  # the flow's own session is not kept
                    with anyio.move_on_after(self.oauth.timeout_s):
                        await http.delete(self._config.url, headers={"mcp-session-id": session}, auth=provider)
            if storage.tokens is None or storage.tokens is held:
                raise SignInFailed(f"server {self.name} answered HTTP {response.status_code} without asking to sign in")
            await self._save(caller, storage.tokens, getattr(provider, "context", None))
            log.info("signin.connected", backend=self.name, caller=caller, step_up=challenge is not None)
            if challenge is not None:
                if self._challenges.get(caller) == challenge:
                    del self._challenges[caller]
                self.on_stepped_up(caller)
        except Exception as exc:  # reported in plain words to the page (and the log), never a token
            reason = str(exc) if isinstance(exc, SignInFailed) else _plain(exc)
            log.warning("signin.failed", backend=self.name, caller=caller, reason=reason)
            if pending is not None:
                pending.error = reason
                return
            raise SignInFailed(reason) from None
        if pending is not None:
            pending.done.set()

    def _fixed_client(self) -> OAuthClientInformationFull | None:
        if self.oauth.client_id is None:
            return None
        return OAuthClientInformationFull(
            client_id=self.oauth.client_id,
            client_secret=self.oauth.client_secret,
            redirect_uris=[self.redirect_uri],  # type: ignore[list-item]
            token_endpoint_auth_method="client_secret_basic" if self.oauth.client_secret else "none",
        )

    async def _save(self, caller: str, token: OAuthToken, context: OAuthContext | None) -> None:
        metadata = context.oauth_metadata if context is not None else None
        document: dict[str, Any] = {
            "token": token.model_dump(mode="json", exclude_none=True),
            "token_endpoint": str(metadata.token_endpoint) if metadata is not None else None,
            "revocation_endpoint": str(metadata.revocation_endpoint)
            if metadata is not None and metadata.revocation_endpoint is not None
            else None,
            "resource": context.get_resource_url() if context and context.protected_resource_metadata else None,
            "client": context.client_info.model_dump(mode="json") if context and context.client_info else None,
        }
        expires_at = time.time() + token.expires_in if token.expires_in else None
        document["expires_at"] = expires_at
        await self._store.put(self.name, caller, document, expires_at)

    def _forget_stale(self) -> None:
        now = time.monotonic()
        for state, pending in list(self._pending.items()):
            if now - pending.started > SIGN_IN_TTL_S or pending.done.is_set():
                self._drop(state, "expired")

    def _drop(self, state: str, reason: str) -> None:
        pending = self._pending.pop(state, None)
        if pending is not None:
            self._drop_pending(pending, reason)

    @staticmethod
    def _drop_pending(pending: _Pending, reason: str) -> None:
        pending.error = pending.error or reason
        pending.result = None
        pending.done.set()
        pending.answered.set()  # the flow's callback wakes and fails on the missing result

    # -- step-up ---------------------------------------------------------------------------------------------------

    async def step_up(self, caller: str, challenge: str) -> bool:
        """The server answered ``caller``'s call 403 ``insufficient_scope`` (``challenge``, its ``WWW-Authenticate``):
        whether the caller is to sign in again, asking for the union of the scope they hold and the one wanted (their
        next ``begin`` does); for ``per: gateway``, whether the gateway took a token with that union now (and
        ``on_stepped_up`` was told). Bounded: never when what they hold covers what is wanted already (the server will
        not be satisfied by any sign-in), and at most ``MAX_STEP_UPS`` times for one caller and one demand."""
        caller = self.row(caller)
        wanted = frozenset((_field(challenge, "scope") or "").split())
        held = await self._store.get(self.name, caller)
        granted = frozenset(str((held or {}).get("token", {}).get("scope") or "").split())
        if not wanted or wanted <= granted:
            return False
        tries = self._step_ups.get((caller, wanted), 0)
        if tries >= MAX_STEP_UPS:
            return False
        self._step_ups[(caller, wanted)] = tries + 1
        log.info("signin.step_up", backend=self.name, caller=caller, wanted=" ".join(sorted(wanted - granted)))
        if self.oauth.per == "gateway":  # its own identity: a token with the wider scope at once
            async with self._refreshing.setdefault(caller, anyio.Lock()):
                return await self._client_credentials(challenge) is not None
        self._challenges[caller] = challenge
        return True

    # -- tokens for sessions ---------------------------------------------------------------------------------------

    async def token(self, caller: str) -> tuple[str, float | None]:
        """``caller``'s access token at this server and how long a session may use it; refreshed first when it is
        about to expire.

        Raises:
            NoCredential: the caller has not signed in (or their sign-in ran out and cannot be refreshed), with the
                link where they sign in.
        """
        row = self.row(caller)
        lock = self._refreshing.setdefault(row, anyio.Lock())
        async with lock:
            document = await self._store.get(self.name, row)
            if document is None and self.oauth.per == "gateway":
                document = await self._client_credentials()
            if document is None:
                raise self._not_signed_in(caller)
            left = _left(document)
            if left is not None and left < EXPIRY_MARGIN_S:
                document = await self._renew_once(caller, row)
                left = _left(document)
        token = str(document["token"]["access_token"])
        redactor.add([token])
        # a session lives until the margin before expiry (at least half of what is left, for short-lived tokens)
        return token, None if left is None else max(left - EXPIRY_MARGIN_S, left / 2, 0.0)

    def _not_signed_in(self, caller: str) -> NoCredential:
        return NoCredential(
            f"caller {caller or 'anonymous'} has not signed in to server {self.name}: open {self.link} in a browser "
            "to sign in, then call again",
            link=self.link,
        )

    async def _renew_once(self, caller: str, row: str) -> dict[str, Any]:
        """``row``'s document renewed, by one replica at a time: another that held the row (refreshing it) has
        written a fresh one, read again here, rather than spending a rotated refresh token a second time.

        Raises:
            NoCredential: it is gone (revoked meanwhile) or cannot be renewed.
        """
        async with self._store.exclusive(self.name, row):
            document = await self._store.get(self.name, row)
            if document is None:
                raise self._not_signed_in(caller)
            left = _left(document)
            if left is not None and left < EXPIRY_MARGIN_S:
                document = await self._renew(row, document)
            return document

    async def _renew(self, row: str, document: dict[str, Any]) -> dict[str, Any]:
        """A fresh token for ``row``: refreshed, or for the gateway a new ``client_credentials`` one.

        Raises:
            NoCredential: it cannot be renewed (the stored one is forgotten: the caller signs in again).
        """
        if self.oauth.per == "gateway":
            renewed = await self._client_credentials()
            if renewed is not None:
                return renewed
        elif (refreshed := await self._refresh(row, document)) is not None:
            return refreshed
        await self._store.delete(self.name, row)
        raise NoCredential(
            f"the sign-in of caller {row} to server {self.name} has expired and could not be renewed: open "
            f"{self.link} in a browser to sign in again, then call again",
            link=self.link,
        )

    async def refused(self, caller: str) -> None:
        """The server answered ``caller``'s token 401: it is no good (revoked, or from an authorization server it no
        longer trusts), so it is forgotten and the caller asked to sign in again; that sign-in registers again when
        the server now names another authorization server (the SDK binds a registration to its issuer, SEP-2352)."""
        await self._store.delete(self.name, self.row(caller))
        log.warning("signin.token_refused", backend=self.name, caller=self.row(caller))

    async def revoke(self, caller: str) -> None:
        """Revoke ``caller``'s tokens at the authorization server (RFC 7009: the refresh token, whose revocation
        SHOULD take its grant's access tokens with it; without one, the access token), when its metadata named a
        ``revocation_endpoint``; best effort, said in the log (never a token). The stored row is the caller's to
        forget (core/connect.py)."""
        row = self.row(caller)
        document = await self._store.get(self.name, row) or {}
        endpoint, client = document.get("revocation_endpoint"), document.get("client")
        token: dict[str, Any] = document.get("token") or {}
        if not endpoint or not client:
            return
        registered = OAuthClientInformationFull.model_validate(client)
        context, refused = self._context(registered), list[str]()
        transport = FlowTransport(self.oauth, self._config)
        async with httpx2.AsyncClient(transport=transport, timeout=self.oauth.timeout_s) as http:
            for kind in ("refresh_token",) if token.get("refresh_token") else ("access_token",):
                form = {"token": token[kind], "token_type_hint": kind, "client_id": registered.client_id}
                form, headers = context.prepare_token_auth(form, {"accept": "application/json"})
                try:
                    answer = await http.post(endpoint, data=form, headers=headers)
                    if answer.status_code != 200:
                        refused.append(f"{kind}: HTTP {answer.status_code}")
                except Exception as exc:  # best effort: the row is forgotten whatever the server says
                    refused.append(f"{kind}: {_plain(exc)}")
        log.info("signin.revoked_at_server", backend=self.name, caller=row, refused=refused or None)

    def _context(self, client: OAuthClientInformationFull) -> OAuthContext:
        """An SDK context that authenticates as ``client`` at the token and revocation endpoints."""
        context = OAuthContext(
            server_url=self._config.url,
            client_metadata=OAuthClientMetadata(redirect_uris=[self.redirect_uri]),  # type: ignore[list-item]
            storage=FlowStorage(self._store, self.name, None),
            redirect_handler=None,
            callback_handler=None,
        )
        context.client_info = client
        return context

    async def _refresh(self, row: str, document: dict[str, Any]) -> dict[str, Any] | None:
        token = document.get("token") or {}
        endpoint, client = document.get("token_endpoint"), document.get("client")
        if not token.get("refresh_token") or not endpoint or not client:
            return None
        registered = OAuthClientInformationFull.model_validate(client)
        context = self._context(registered)
        form = {"grant_type": "refresh_token", "refresh_token": token["refresh_token"]}
        form["client_id"] = registered.client_id
        if document.get("resource"):
            form["resource"] = document["resource"]
        form, headers = context.prepare_token_auth(form, {"accept": "application/json"})
        try:
            async with httpx2.AsyncClient(
                transport=FlowTransport(self.oauth, self._config), timeout=self.oauth.timeout_s
            ) as http:
                response = await http.post(endpoint, data=form, headers=headers)
            fresh = OAuthToken.model_validate_json(response.content) if response.status_code == 200 else None
        except Exception as exc:  # a refresh that fails is a sign-in to do again, said in plain words
            log.warning("signin.refresh_failed", backend=self.name, caller=row, reason=_plain(exc))
            return None
        if fresh is None:
            log.warning("signin.refresh_refused", backend=self.name, caller=row, status=response.status_code)
            return None
        redactor.add([fresh.access_token, *([fresh.refresh_token] if fresh.refresh_token else [])])
        if fresh.refresh_token is None:  # RFC 6749 section 6: the old one stays good when none is issued
            fresh.refresh_token = token["refresh_token"]
        expires_at = time.time() + fresh.expires_in if fresh.expires_in else None
        renewed = {**document, "token": fresh.model_dump(mode="json", exclude_none=True), "expires_at": expires_at}
        await self._store.put(self.name, row, renewed, expires_at)
        log.info("signin.refreshed", backend=self.name, caller=row)
        return renewed

    async def _client_credentials(self, challenge: str | None = None) -> dict[str, Any] | None:
        """The gateway's own token (``per: gateway``) by the grant its configuration names (grants.py); None when
        refused. With a ``challenge`` (a step-up), asking for the union of the scope held and the one wanted."""
        storage = FlowStorage(self._store, self.name, None)
        if challenge is not None:
            held = await self._store.get(self.name, GATEWAY_ROW)
            storage.tokens = OAuthToken.model_validate(held["token"]) if held else None
        try:
            provider = await own_provider(self._config, storage, self._signing_key)
        except Exception as exc:  # said in plain words, never a token
            reason = str(exc) if isinstance(exc, SignInFailed) else _plain(exc)
            log.warning("signin.failed", backend=self.name, caller=GATEWAY_ROW, reason=reason)
            return None
        try:
            await self._run(provider, storage, GATEWAY_ROW, None, challenge)
        except SignInFailed:
            return None
        return await self._store.get(self.name, GATEWAY_ROW)

    async def latest(self, exclude: Sequence[str] = ()) -> str | None:
        """The caller who signed in (or refreshed) last, besides ``exclude``: whose token the shared session lists
        with."""
        return await self._store.latest(self.name, exclude)

    def owns(self, state: str) -> bool:
        return state in self._pending


async def _first(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _left(document: dict[str, Any]) -> float | None:
    """Seconds the document's access token has left (None: the server did not say)."""
    expires_at = document.get("expires_at")
    return float(expires_at) - time.time() if isinstance(expires_at, int | float) else None


def _field(challenge: str, name: str) -> str | None:
    """A parameter of a ``WWW-Authenticate`` header."""
    return extract_field_from_www_auth(httpx2.Response(401, headers={"www-authenticate": challenge}), name)


def _plain(exc: BaseException) -> str:
    """An error in words that quote nothing it was given: a validation error names its fields, never their values."""
    if isinstance(exc, pydantic.ValidationError):
        fields = ", ".join(".".join(map(str, e["loc"])) or "(the whole)" for e in exc.errors()[:5])
        return f"{type(exc).__name__}: {exc.title} refused at {fields}"
    text = str(exc).split(":", 1)[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}{f': {text}' if text else ''}"


_VERSION, _MODERN = "2025-11-25", "2026-07-28"
_INFO = {"name": "mcp-gateway", "version": VERSION}
_INITIALIZE = {
    "jsonrpc": "2.0", "id": 0, "method": "initialize",
    "params": {"protocolVersion": _VERSION, "capabilities": {}, "clientInfo": _INFO},
}  # fmt: skip
_META = "io.modelcontextprotocol/"
_DISCOVER = {
    "jsonrpc": "2.0", "id": 0, "method": "server/discover",
    "params": {
        "_meta": {_META + "protocolVersion": _MODERN, _META + "clientInfo": _INFO, _META + "clientCapabilities": {}}
    },
}  # fmt: skip
_PAST_HANDSHAKE = (
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
)
"""What the flow sends after a handshake the server answered without asking to sign in: a server that asks only for
its operations (the specification allows it) answers these 401, which starts the sign-in."""
