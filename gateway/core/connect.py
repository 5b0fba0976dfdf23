"""Callers' connections to OAuth-protected servers (``auth: {oauth: ...}``), for the pages and the command:
``SignIns`` starts and finishes sign-ins (backends/mcp/signin.py), lists who is connected to what and revokes.

``open_connections(config)`` is the store (auth/connections.py): where the audit ledger is (its PostgreSQL database
when ``gateway.audit.url`` is set, shared by replicas, else its SQLite file), sealed under a key derived from the
state key (``gateway.continuation.key_env``, else the key file beside the ledger's file: replicas must then share it
through the variable, said in the log); in memory when the ledger is off (a restart forgets the sign-ins).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from gateway.auth.connections import Connection, Connections, SignInFailed
from gateway.auth.keys import load_key
from gateway.backends.base import Backend, SignsIn
from gateway.backends.mcp.signin import CLIENT_DOCUMENT
from gateway.config import Federation, HttpServer
from gateway.config.loading import environ

__all__ = ["SignIns", "client_document", "connect_url", "open_connections", "uses_oauth"]

log = structlog.get_logger("gateway.signin")


def uses_oauth(config: Federation) -> bool:
    return any(isinstance(s, HttpServer) and s.auth is not None for s in config.servers.values())


def open_connections(config: Federation) -> Connections:
    """The sealed token store this gateway keeps callers' downstream tokens in (see the module docstring)."""
    if not uses_oauth(config):  # nothing to keep: no file touched (a server added by a reload keeps its in memory)
        return Connections(None, [os.urandom(32)])
    audit = config.gateway.audit
    ledger = audit.path if audit.enabled else None
    key_env = config.gateway.continuation.key_env
    keys, source = load_key(key_env, environ(key_env), ledger, file=str(config.source or ""))
    if ledger is None:
        log.warning("signin.tokens_in_memory", note="the audit ledger is off: sign-ins end at a restart")
    elif audit.url is not None and not source.startswith("environment"):
        log.warning(
            "signin.key_not_shared",
            note=f"tokens are sealed under this replica's own key file: set {key_env} on every replica to share them",
        )
    return Connections(audit.url if audit.enabled and audit.url is not None else ledger, keys)


def connect_url(config: Federation) -> str:
    """Where browsers reach the gateway: ``gateway.auth.connect_url``, else the listen address."""
    settings = config.gateway
    if settings.auth.connect_url is not None:
        return settings.auth.connect_url
    host = settings.listen.host
    return f"http://{'[' + host + ']' if ':' in host else host}:{settings.listen.port}"


def client_document(connect_url: str, name: str) -> dict[str, Any]:
    """The gateway's Client ID Metadata Document (draft-ietf-oauth-client-id-metadata-document), served at
    ``connect_url`` + ``CLIENT_DOCUMENT``: its ``client_id`` is that URL; a public client (no secret), redirected
    to the gateway's callback, with the grants a sign-in uses."""
    return {
        "client_id": f"{connect_url}{CLIENT_DOCUMENT}",
        "client_name": name,
        "client_uri": connect_url,
        "redirect_uris": [f"{connect_url}/ui/connect/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }


class SignIns:
    """The running backends' sign-ins, found by server name or by a pending ``state``."""

    def __init__(
        self,
        backends: Callable[[], Mapping[str, Backend]],
        store: Connections,
        document: Mapping[str, Any] | None = None,
    ) -> None:
        self._backends = backends
        self.store = store
        self.client_document = document
        """The gateway's Client ID Metadata Document (backends/mcp/signin.py ``client_document``), None: none."""
        store.on_change(self._changed)

    def _signins(self) -> dict[str, SignsIn]:
        return {name: signin for name, backend in self._backends().items() if (signin := backend.signin) is not None}

    def servers(self) -> list[str]:
        """The servers callers sign in to (``per: caller``)."""
        return [name for name, signin in self._signins().items() if signin.per_caller]

    async def begin(self, backend: str, caller: str) -> str | None:
        """The authorization URL for ``caller``'s sign-in to ``backend`` (None: already connected).

        Raises:
            SignInFailed: no such server to sign in to, or it could not start.
        """
        signin = self._signins().get(backend)
        if signin is None:
            raise SignInFailed(f"there is no server {backend!r} to sign in to")
        return await signin.begin(caller)

    async def finish(self, state: str, code: str | None, iss: str | None, error: str | None) -> tuple[str, str]:
        """Complete the sign-in ``state`` names: (the server, the caller).

        Raises:
            SignInFailed: unknown or expired ``state``, or the token exchange failed.
        """
        for name, signin in self._signins().items():
            if signin.owns(state):
                return name, await signin.finish(state, code, iss, error)
        raise SignInFailed("this sign-in link is unknown, already used or expired: start again")

    async def connected(self, caller: str | None = None) -> list[Connection]:
        return await self.store.connected(caller)

    async def revoke(self, caller: str, backend: str | None = None) -> list[str]:
        """Forget ``caller``'s tokens (at ``backend``, or everywhere); the servers it was connected to. The caller's
        open sessions there end at their token's expiry at the latest; the next call asks to sign in again."""
        for name, signin in self._signins().items():  # at the authorization server first (RFC 7009), then here
            if backend is None or name == backend:
                await signin.revoke(caller)
        gone = await self.store.delete(backend, caller)
        for name in gone:
            log.info("signin.revoked", backend=name, caller=caller)
        return gone

    def _changed(self, backend: str, caller: str, removed: bool) -> None:
        found = self._backends().get(backend)
        if found is not None:
            found.connection_changed(caller, removed)
