"""The status page's signed session cookie: a caller's name and an expiry, never a token.

``SessionCookies`` signs with a key drawn at random per instance (per process), so nothing a browser holds outlives
the gateway process; verification is constant-time and refuses anything missing, forged, altered or expired.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable

__all__ = ["SESSION_TTL_S", "SessionCookies"]

SESSION_TTL_S = 12 * 3600.0  # a working day; the per-process key also ends every session at a restart


class SessionCookies:
    """Signed session values: ``base64url(json {"sub": caller, "exp": unix time}) "." base64url(hmac-sha256)``.

    The key is random per instance (per process), so nothing a browser holds outlives the gateway process.
    """

    def __init__(self, ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self._key = secrets.token_bytes(32)
        self._ttl_s = ttl_s
        self._clock = clock

    def _sign(self, payload: bytes) -> str:
        return _b64(hmac.new(self._key, payload, hashlib.sha256).digest())

    def issue(self, caller: str) -> str:
        payload = _b64(json.dumps({"sub": caller, "exp": int(self._clock() + self._ttl_s)}).encode()).encode()
        return f"{payload.decode()}.{self._sign(payload)}"

    def verify(self, value: str | None) -> str | None:
        """The caller a session value names, or None when it is missing, forged, altered or expired."""
        if not value or value.count(".") != 1:
            return None
        payload, signature = value.split(".")
        if not hmac.compare_digest(signature.encode(), self._sign(payload.encode()).encode()):
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            return None
        if not isinstance(claims, dict):
            return None
        caller, expiry = claims.get("sub"), claims.get("exp")
        if not isinstance(caller, str) or not isinstance(expiry, int) or expiry <= self._clock():
            return None
        return caller


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
