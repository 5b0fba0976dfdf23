"""The status page's signed session cookie: a caller's name and an expiry, never a token.

``SessionCookies`` signs with itsdangerous (HMAC-SHA256 over a timestamped payload, constant-time verification) and a
key drawn at random per instance (per process), so nothing a browser holds outlives the gateway process; anything
missing, forged, altered or expired is refused.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

from itsdangerous import BadSignature, URLSafeTimedSerializer

__all__ = ["SESSION_TTL_S", "SessionCookies"]

SESSION_TTL_S = 12 * 3600.0  # a working day; the per-process key also ends every session at a restart
_SALT = "gateway.ui.session"  # keys this signer's use apart from any other use of the same key


class _Serializer(URLSafeTimedSerializer):
    """The timestamp comes from the instance's clock (tests move it; production reads time.time)."""

    clock: Callable[[], float] = time.time

    def __init__(self, key: bytes, clock: Callable[[], float]) -> None:
        super().__init__(key, salt=_SALT, signer_kwargs={"digest_method": hashlib.sha256})
        self.clock = clock

    def make_signer(self, salt: str | bytes | None = None):  # type: ignore[no-untyped-def]
        signer = super().make_signer(salt)
        signer.get_timestamp = lambda: int(self.clock())  # type: ignore[attr-defined]
        return signer


class SessionCookies:
    """Signed session values: ``{"sub": caller}``, timestamped and signed; valid for ``ttl_s`` after issue."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self._serializer = _Serializer(secrets.token_bytes(32), clock)
        self._ttl_s = ttl_s

    def issue(self, caller: str) -> str:
        return self._serializer.dumps({"sub": caller})

    def verify(self, value: str | None) -> str | None:
        """The caller a session value names, or None when it is missing, forged, altered or expired."""
        if not value:
            return None
        try:
            claims = self._serializer.loads(value, max_age=int(self._ttl_s))
        except BadSignature:  # SignatureExpired and BadTimeSignature are BadSignatures too
            return None
        caller = claims.get("sub") if isinstance(claims, dict) else None
        return caller if isinstance(caller, str) else None
