"""The gateway's own identity at a server (``per: gateway``): ``own_provider`` picks the grant that gets its token.

- ``client_credentials`` with ``client_secret``, or with a client assertion signed with the configured key
  (``private_key_jwt``, RFC 7523; its audience the authorization server's issuer);
- ``cross_app``: an ID-JAG from the identity provider, presented with the ``jwt-bearer`` grant (cross_app.py);
- ``workload_token`` / ``workload_token_file``: workload identity federation (SEP-1933), a JWT the platform issued
  to the gateway presented with the ``jwt-bearer`` grant as a public client (``WorkloadIdentityOAuthProvider``).

A workload token is read at each grant (a file afresh: platforms rotate it) and sent only to an authorization server
its ``aud`` names, by issuer or token endpoint (RFC 7523 section 3): the server's resource metadata chooses the
authorization server, so without that check a server could have the gateway hand its workload token to another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx2
import jwt
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.shared.auth import JWT_BEARER_GRANT_TYPE

from gateway.auth.connections import SignInFailed
from gateway.backends.mcp import cross_app
from gateway.backends.mcp.flow_http import read_credential
from gateway.config import HttpServer

__all__ = ["ASSERTION_TTL_S", "WorkloadIdentityOAuthProvider", "own_provider", "workload_audience_names"]

ASSERTION_TTL_S = 60
"""How long a client assertion (``private_key_jwt``) is valid: it is made for one token request."""
_NEVER_SENT = "-"
"""The client id and secret the SDK's jwt-bearer provider insists on; a public client's token request carries
neither (only a configured ``client_id``)."""


class WorkloadIdentityOAuthProvider(IdentityAssertionOAuthProvider):
    """The SDK's jwt-bearer provider (the issuer's metadata, its token endpoint on the issuer's origin, the token
    stored and renewed on 401 or 403 ``insufficient_scope``) as a public client: the token request carries the
    workload JWT as ``assertion``, ``resource``, ``scope`` and ``client_id`` when one is configured, no secret."""

    def __init__(
        self,
        server_url: str,
        storage: TokenStorage,
        issuer: str,
        assertion_provider: Callable[[str, str], Awaitable[str]],
        *,
        client_id: str | None = None,
        scope: str | None = None,
    ) -> None:
        super().__init__(
            server_url, storage, client_id or _NEVER_SENT, _NEVER_SENT, issuer, assertion_provider, scope=scope
        )
        self._public_client_id = client_id

    @property
    def token_endpoint(self) -> str | None:
        return self._token_endpoint

    def _build_token_request(self, scope: str | None, assertion: str) -> httpx2.Request:
        assert self._token_endpoint is not None
        data = {"grant_type": JWT_BEARER_GRANT_TYPE, "assertion": assertion, "resource": self._resource}
        if self._public_client_id:
            data["client_id"] = self._public_client_id
        if scope:
            data["scope"] = scope
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        return httpx2.Request("POST", self._token_endpoint, data=data, headers=headers)


async def own_provider(server: HttpServer, storage: TokenStorage, signing_key: str | None) -> httpx2.Auth:
    """The SDK provider that gets ``server``'s token for the gateway's own identity (see the module docstring).

    Raises:
        SignInFailed: the server names no authorization server (cross_app, workload token).
    """
    assert server.auth is not None
    oauth = server.auth.oauth
    if oauth.cross_app is not None:
        return await cross_app.provider(server, storage)
    if oauth.workload_token is not None or oauth.workload_token_file is not None:
        return await _workload_provider(server, storage)
    assert oauth.client_id is not None
    if signing_key is not None:
        assertion = SignedJWTParameters(
            issuer=oauth.client_id,
            subject=oauth.client_id,
            signing_key=signing_key,
            signing_algorithm=oauth.signing_algorithm,
            lifetime_seconds=ASSERTION_TTL_S,
        ).create_assertion_provider()
        return PrivateKeyJWTOAuthProvider(server.url, storage, oauth.client_id, assertion, scope=oauth.scope)
    assert oauth.client_secret is not None
    return ClientCredentialsOAuthProvider(server.url, storage, oauth.client_id, oauth.client_secret, scope=oauth.scope)


async def _workload_provider(server: HttpServer, storage: TokenStorage) -> WorkloadIdentityOAuthProvider:
    assert server.auth is not None
    oauth = server.auth.oauth

    async def assertion(issuer: str, resource: str) -> str:
        token = await read_credential(oauth.workload_token, oauth.workload_token_file, "workload_token")
        if not workload_audience_names(token, issuer, provider.token_endpoint):
            raise SignInFailed(
                f"the workload token's audience does not name the authorization server {issuer[:200]} (its issuer or "
                "token endpoint): it is not sent there; have the platform issue it for that audience"
            )
        return token

    issuer = await cross_app.authorization_server(server)
    provider = WorkloadIdentityOAuthProvider(
        server.url, storage, issuer, assertion, client_id=oauth.client_id, scope=oauth.scope
    )
    return provider


def workload_audience_names(token: str, issuer: str, token_endpoint: str | None) -> bool:
    """Whether the JWT ``token``'s ``aud`` names the authorization server: its ``issuer`` or its ``token_endpoint``
    (compared without a trailing slash; the signature is the authorization server's to check).

    Raises:
        SignInFailed: ``token`` is not a JWT (nothing of it said).
    """
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise SignInFailed("the workload token is not a JWT") from None
    audience = claims.get("aud")
    named = {str(a).rstrip("/") for a in (audience if isinstance(audience, list) else [audience]) if a}
    return bool(named & {issuer.rstrip("/"), *([token_endpoint.rstrip("/")] if token_endpoint else [])})
