"""Sealed session ids: a session's own state carried in its ``Mcp-Session-Id``, so that any replica can serve it.

At ``initialize`` ``SessionSeal.mint`` seals the negotiated protocol version, the client's ``initialize`` params, a
digest of the caller that opened the session (``owner_digest`` of the SDK's ``AuthorizationContext``: a token's caller
name, or a JWT's issuer and subject) and an expiry, with the SDK's AES-256-GCM codec under the ``gateway.continuation``
key (continuation.py's ``load_key``: of several comma-separated keys the first seals, all open), derived for this one
purpose so that a session id and a ``requestState`` never stand in for each other. ``open`` gives the state back, or
None for an id that does not unseal (tampered, or another deployment's key), is malformed or has expired.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState

from gateway.config import GatewaySettings, environ
from gateway.front.continuation import load_key

__all__ = ["MAX_SEALED_ID", "SealedSession", "SessionSeal", "owner_digest", "session_seal"]

_VERSION = 1
_KEY_LABEL = b"mcp-gateway/session-id/v1:"
MAX_SEALED_ID = 4096
"""The longest sealed id minted (a client's info and capabilities are its own to make large); past it the session
gets a plain random id and lives on this replica only (said in a log line)."""


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
    """How a sealed id names the caller that opened it: 16 bytes of a SHA-256 of its context, never the context."""
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
