"""Cross App Access (SEP-990, Enterprise-Managed Authorization): the gateway's token at a server, obtained from
the enterprise identity provider instead of a user's consent (``auth: {oauth: {per: gateway, cross_app: ...}}``).

``provider`` finds the server's authorization server as every sign-in does (its 401's ``resource_metadata``, else
the well-known Protected Resource Metadata, RFC 9728), unless ``issuer`` fixes it, and returns the SDK's
``IdentityAssertionOAuthProvider`` for that issuer: on the server's 401 it reads the issuer's metadata (RFC 8414) and
presents an ID-JAG with the ``jwt-bearer`` grant (RFC 7523, ``client_secret_basic``). The ID-JAG comes from
``id_jag``: an RFC 8693 token exchange at the identity provider (the configured ID token, or ``id_token_file`` read
afresh, as ``subject_token``, the issuer as ``audience``, the server as ``resource``), made for every new token.
Every request goes through ``FlowTransport`` (https only, the egress guard, bounded answers); the ID token, the ID-JAG
and the secrets are given to the log redactor and never appear in an error.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

import httpx2
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.auth.utils import (
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
)
from mcp.shared.auth import ProtectedResourceMetadata

from gateway.auth.connections import SignInFailed
from gateway.backends.mcp.flow_http import FlowTransport, read_credential
from gateway.config import CrossApp, HttpServer
from gateway.observe.logs import redactor

__all__ = ["ID_JAG", "ID_TOKEN", "TOKEN_EXCHANGE", "authorization_server", "id_jag", "provider"]

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"


async def provider(server: HttpServer, storage: TokenStorage) -> IdentityAssertionOAuthProvider:
    """The SDK's jwt-bearer provider for ``server``'s authorization server, with ``id_jag`` as its assertion.

    Raises:
        SignInFailed: the server names no authorization server, or its metadata cannot be had.
    """
    assert server.auth is not None and server.auth.oauth.cross_app is not None
    oauth, cross_app = server.auth.oauth, server.auth.oauth.cross_app
    assert oauth.client_id is not None and oauth.client_secret is not None
    issuer = cross_app.issuer or await authorization_server(server)

    async def assertion(audience: str, resource: str) -> str:
        return await id_jag(server, cross_app, audience, resource)

    return IdentityAssertionOAuthProvider(
        server.url,
        storage,
        oauth.client_id,
        oauth.client_secret,
        issuer,
        assertion,
        scope=oauth.scope,
        token_endpoint_auth_method="client_secret_basic",
    )


async def id_jag(server: HttpServer, cross_app: CrossApp, audience: str, resource: str) -> str:
    """An ID-JAG for ``audience`` (the authorization server's issuer) and ``resource`` (the server), exchanged for
    the configured ID token at the identity provider (RFC 8693; its client authenticated by HTTP Basic when it has a
    secret, else named by ``client_id``).

    Raises:
        SignInFailed: the identity provider refused or answered something that is not an ID-JAG (its ``error`` code
            and HTTP status said, never a token).
    """
    assert server.auth is not None
    id_token = await read_credential(cross_app.id_token, cross_app.id_token_file, "id_token")
    redactor.add([id_token, *([cross_app.client_secret] if cross_app.client_secret else [])])
    form = {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": id_token,
        "subject_token_type": ID_TOKEN,
        "requested_token_type": ID_JAG,
        "audience": audience,
        "resource": resource,
    }
    headers = {"accept": "application/json"}
    if cross_app.client_secret:  # RFC 6749 section 2.3.1: each part form-encoded, then base64
        pair = f"{quote(cross_app.client_id, safe='')}:{quote(cross_app.client_secret, safe='')}"
        headers["authorization"] = f"Basic {base64.b64encode(pair.encode()).decode()}"
    else:
        form["client_id"] = cross_app.client_id
    async with _client(server) as http:
        answer = await http.post(cross_app.token_endpoint, data=form, headers=headers)
    try:
        body = answer.json()
    except ValueError:
        body = None
    token = body.get("access_token") if isinstance(body, dict) else None
    if answer.status_code != 200 or not isinstance(token, str) or not token:
        code = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), str) else None
        raise SignInFailed(
            f"the identity provider did not give an ID-JAG for server {server.url} (HTTP {answer.status_code}"
            + (f", {code[:64]}" if code else "")
            + ")"
        )
    if isinstance(body, dict) and body.get("issued_token_type") not in (None, ID_JAG):
        raise SignInFailed(f"the identity provider issued {str(body['issued_token_type'])[:80]}, not an ID-JAG")
    redactor.add([token])
    return token


async def authorization_server(server: HttpServer) -> str:
    """The server's authorization server, from its Protected Resource Metadata (where its 401 points, else the
    well-known locations)."""
    async with _client(server) as http:
        first = await http.post(server.url, json=_PING, headers={"accept": "application/json, text/event-stream"})
        pointed = extract_resource_metadata_from_www_auth(first) if first.status_code == 401 else None
        for url in build_protected_resource_metadata_discovery_urls(pointed, server.url):
            answer = await http.get(url, headers={"accept": "application/json"})
            if answer.status_code != 200:
                continue
            try:
                metadata = ProtectedResourceMetadata.model_validate_json(answer.content)
            except ValueError:
                continue
            return str(metadata.authorization_servers[0])
    raise SignInFailed(f"server {server.url} names no authorization server (no Protected Resource Metadata)")


def _client(server: HttpServer) -> httpx2.AsyncClient:
    assert server.auth is not None
    oauth = server.auth.oauth
    return httpx2.AsyncClient(transport=FlowTransport(oauth, server), timeout=oauth.timeout_s, trust_env=False)


_PING = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
"""What the discovery sends the server unauthenticated, to meet its 401 (and its ``resource_metadata``)."""
