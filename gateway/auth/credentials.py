"""What a downstream server's per-caller sessions carry: ``${caller.secret:NAME}`` values (auth/secrets.py) and an
RFC 8693 exchanged token (auth/exchange.py), for one caller at a time.

``CallerCredentials.for_server(config, secrets)`` is None for a server whose sessions are shared (its headers are
fixed); otherwise ``gateway_headers()`` are its own session's headers (the ``"*"`` secrets; the exchange's token
is never used there) and ``for_caller(caller, subject_token)`` a caller's, with how long they hold. A caller that
cannot have them gets ``NoCredential``, whose message names the caller and what is missing, never a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import anyio.to_thread

from gateway.auth.exchange import ExchangeRefused, exchange
from gateway.auth.secrets import CallerSecrets, MissingSecret, uses_caller_secrets
from gateway.config import ServerConfig, TokenExchange
from gateway.errors import ConfigError

__all__ = ["CallerCredentials", "NoCredential", "SessionCredentials"]


class NoCredential(Exception):
    """The caller cannot have a session to this server (no secret, no access token, a refused exchange, no sign-in:
    ``link`` is then where they sign in)."""

    def __init__(self, message: str, *, link: str | None = None) -> None:
        super().__init__(message)
        self.link = link


class SessionCredentials(Protocol):
    """What a server's per-caller sessions are opened with (this module's ``CallerCredentials``, or an OAuth
    server's, backends/mcp/signin.py)."""

    def gateway_headers(self) -> dict[str, str]: ...

    async def for_caller(
        self, caller: str | None, subject_token: str | None
    ) -> tuple[dict[str, str], float | None]: ...


class CallerCredentials:
    def __init__(self, headers: Mapping[str, str], secrets: CallerSecrets | None, token: TokenExchange | None) -> None:
        self._headers = dict(headers)
        self._secrets = secrets
        self._exchange = token

    @classmethod
    def for_server(cls, config: ServerConfig, secrets: CallerSecrets | None) -> CallerCredentials | None:
        headers: Mapping[str, str] = getattr(config, "headers", {})
        token: TokenExchange | None = getattr(config, "token_exchange", None)
        per_caller = secrets if secrets is not None and uses_caller_secrets(headers) else None
        if per_caller is None and token is None:
            return None
        return cls(headers, per_caller, token)

    def gateway_headers(self) -> dict[str, str]:
        """The gateway's own session's headers: the ``"*"`` entry's secrets (a header it lacks is left out)."""
        if self._secrets is None:
            return dict(self._headers)
        return self._secrets.headers_for(None, self._headers, gateway=True)

    async def for_caller(self, caller: str | None, subject_token: str | None) -> tuple[dict[str, str], float | None]:
        """``caller``'s headers, and for how many seconds they hold (None: as long as the session lasts).

        Raises:
            NoCredential: naming the caller and what it lacks.
        """
        headers = dict(self._headers)
        if self._secrets is not None:
            try:
                await anyio.to_thread.run_sync(self._secrets.refresh)
                headers = self._secrets.headers_for(caller, headers)
            except (MissingSecret, ConfigError) as exc:
                raise NoCredential(str(exc)) from None
        if self._exchange is None:
            return headers, None
        who = caller or "anonymous"
        if subject_token is None:
            raise NoCredential(
                f"caller {who} did not sign in with an OAuth access token, which this server's token exchange needs"
            )
        try:
            exchanged = await exchange(self._exchange, subject_token)
        except ExchangeRefused as exc:
            raise NoCredential(f"the token exchange for caller {who} failed: {exc}") from None
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {exchanged.token}"
        return headers, exchanged.lifetime_s
