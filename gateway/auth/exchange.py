"""OAuth 2.0 Token Exchange (RFC 8693): a downstream token for one caller, minted from the caller's own token.

The MCP specification forbids passing a client's token on to another server. With ``token_exchange`` on a server,
the gateway instead asks the identity provider's token endpoint, as its own confidential client (HTTP Basic, RFC 6749
section 2.3.1), for a token meant for that server, presenting the caller's access token as the ``subject_token``
(``urn:ietf:params:oauth:token-type:access_token``), with the configured ``audience``, ``resource`` and ``scope``.
The answer's ``access_token`` becomes that caller's ``Authorization: Bearer`` on its own session to the server,
until ``expires_in`` (less a margin) runs out. Neither token is ever logged or put in an error: both are registered
with the log redactor, and a refusal says only the provider's ``error`` code and HTTP status.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx2

from gateway.config import TokenExchange
from gateway.observe.logs import redactor

__all__ = ["GRANT_TYPE", "Exchanged", "ExchangeRefused", "exchange"]

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
EXPIRY_MARGIN_S = 30.0
"""An exchanged token is replaced this long before it expires (a call under way must not meet its expiry)."""
MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Exchanged:
    token: str
    lifetime_s: float | None
    """How long the session may use it (``expires_in`` less the margin); None when the provider did not say."""


class ExchangeRefused(Exception):
    """The token endpoint did not give a token; the message holds no token."""


async def exchange(settings: TokenExchange, subject_token: str) -> Exchanged:
    """Exchange ``subject_token`` (the caller's access token) for a token for the downstream.

    Raises:
        ExchangeRefused: the endpoint refused, failed or answered something that is not a token.
    """
    redactor.add([subject_token])
    form = {"grant_type": GRANT_TYPE, "subject_token": subject_token, "subject_token_type": ACCESS_TOKEN_TYPE}
    for key in ("audience", "resource", "scope"):
        value = getattr(settings, key)
        if value is not None:
            form[key] = value
    started = time.monotonic()
    try:
        async with httpx2.AsyncClient(timeout=settings.timeout_s, trust_env=False) as http:
            response = await http.post(
                settings.token_endpoint,
                data=form,
                auth=(settings.client_id, settings.client_secret),
                headers={"accept": "application/json"},
            )
    except httpx2.HTTPError as exc:
        raise ExchangeRefused(f"the token endpoint could not be reached ({type(exc).__name__})") from None
    if len(response.content) > MAX_ANSWER_BYTES:
        raise ExchangeRefused(f"the token endpoint answered {len(response.content)} bytes, not a token")
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        code = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), str) else None
        raise ExchangeRefused(
            f"the token endpoint refused the exchange (HTTP {response.status_code}"
            + (f", {code[:64]}" if code else "")
            + ")"
        )
    token = body.get("access_token")
    if not isinstance(token, str) or not token or str(body.get("token_type", "")).lower() != "bearer":
        raise ExchangeRefused("the token endpoint's answer holds no bearer access_token")
    redactor.add([token])
    expires = body.get("expires_in")
    lifetime = None
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        lifetime = max(0.0, float(expires) - EXPIRY_MARGIN_S - (time.monotonic() - started))
    return Exchanged(token, lifetime)
