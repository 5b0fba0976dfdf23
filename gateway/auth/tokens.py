"""The static bearer tokens (``gateway.auth.tokens_env``, default ``GATEWAY_TOKENS``): who holds which.

``GATEWAY_TOKENS="alice=tok1,bob=tok2"`` names callers; a bare token is named by its hash prefix. A token is compared
in constant time against every token held, and never logged, stored or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import re

__all__ = ["Tokens"]

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class Tokens:
    """Accepted bearer tokens. ``GATEWAY_TOKENS="alice=tok1,bob=tok2"`` names callers; a bare token is named by
    its hash prefix. Tokens are compared in constant time and never logged or stored."""

    def __init__(self, spec: str | None) -> None:
        self._tokens: list[tuple[bytes, str]] = []
        for item in (spec or "").split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, token = (part.strip() for part in item.partition("="))
            if not (sep and _NAME.fullmatch(name) and token.strip("=")):
                name, token = "", item  # a bare token (which may itself contain '=', e.g. base64 padding)
            digest = hashlib.sha256(token.encode()).hexdigest()[:12]
            self._tokens.append((token.encode(), name or f"token-{digest}"))

    def __bool__(self) -> bool:
        return bool(self._tokens)

    @property
    def names(self) -> tuple[str, ...]:
        """The callers' names (for /status: who may call, never how)."""
        return tuple(dict.fromkeys(name for _, name in self._tokens))

    @property
    def secrets(self) -> list[str]:
        return [token.decode() for token, _ in self._tokens]

    def identify(self, authorization: str | None) -> str | None:
        """The caller's name for a valid ``Authorization: Bearer`` header, else None."""
        if not authorization or not authorization[:7].lower() == "bearer ":
            return None
        offered = authorization[7:].strip().encode()
        if not offered:
            return None
        found: str | None = None
        for token, name in self._tokens:  # compare against every token: timing reveals nothing
            if hmac.compare_digest(offered, token):
                found = name
        return found
