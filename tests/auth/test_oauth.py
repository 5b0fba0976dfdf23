"""The gateway as an OAuth 2.1 resource server (``auth/oauth.py`` behind the guard of ``gateway/http.py``), against
a real OpenID provider (npm ``oidc-provider`` on loopback, ``tests/fixtures/identity.py``) and a real ``gateway
serve``: Protected Resource Metadata (RFC 9728) at both well-known paths, the ``WWW-Authenticate`` challenges of
RFC 6750 section 3, and every bad token answered as the MCP authorization section says (expired, another audience,
another issuer, an unpublished key, a forged signature, a refused algorithm: 401 ``invalid_token``; a missing scope:
403 ``insufficient_scope``), key rotation (one refetch, then the new key verifies and the retired one does not),
sessions bound to the token's issuer and subject, and the ledger naming the caller, never the token."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.ledger.engines import open_reader
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.identity import IdentityProvider, start_identity_provider
from tests.fixtures.procs import RunningServer, free_port
from tests.fixtures.raw_http import ACCEPT, INITIALIZE, headers
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


def config(issuer: str, resource: str, extra: str = "") -> str:
    return f"""
gateway:
  audit: {{path: audit.db}}
  auth:
    oauth:
      resource: {resource}
      required_scopes: [mcp:tools]
      scopes_supported: [mcp:tools, mcp:read]
      leeway_s: 5
      issuers:
        test-idp: {{issuer: "{issuer}"}}
{extra}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""


@dataclass
class World:
    idp: IdentityProvider
    stranger: IdentityProvider
    gateway: RunningServer
    resource: str
    folder: Path

    @property
    def url(self) -> str:
        return self.gateway.url()

    def metadata_url(self) -> str:
        return self.gateway.url("/.well-known/oauth-protected-resource/mcp")


@contextmanager
def start_world(folder: Path, *, static_tokens: str = "ops=tok-ops", extra: str = "") -> Iterator[World]:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    with (
        start_identity_provider(resource, other_resource=f"http://127.0.0.1:{port}/other") as idp,
        start_identity_provider(resource) as stranger,  # a real issuer the gateway does not trust
        run_gateway(config(idp.issuer, resource, extra), folder, tokens=static_tokens, port=port) as gateway,
    ):
        yield World(idp, stranger, gateway, resource, folder)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One provider, one untrusted provider and one gateway for the tests that only read."""
    with start_world(tmp_path_factory.mktemp("oauth")) as world:
        yield world


async def initialize(url: str, token: str | None) -> httpx2.Response:
    sent = headers(token) if token is not None else {"Accept": ACCEPT}
    with anyio.fail_after(15):
        async with httpx2.AsyncClient(timeout=10) as http:
            return await http.post(url, json=INITIALIZE, headers=sent)


def challenge(response: httpx2.Response) -> dict[str, str]:
    """The parameters of a ``WWW-Authenticate: Bearer k="v", ...`` header."""
    value = response.headers["www-authenticate"]
    scheme, _, rest = value.partition(" ")
    assert scheme == "Bearer", value
    params = {}
    for part in rest.split('", '):
        key, _, quoted = part.partition("=")
        params[key.strip()] = quoted.strip().strip('"')
    return params


def forged(world: World, *, kid: str, claims: dict[str, Any] | None = None, alg: str = "RS256") -> str:
    """A token with every right claim, signed by a key the issuer never published."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    payload = {"iss": world.idp.issuer, "aud": world.resource, "sub": "mallory", "scope": "mcp:tools"}
    payload |= {"iat": now, "exp": now + 300, **(claims or {})}
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid, "typ": "at+jwt"})


# ------------------------------------------------------------------------------------------ discovery


async def test_protected_resource_metadata_is_served_at_the_path_suffixed_and_the_root_well_known_uri(
    world: World,
) -> None:
    expected = {
        "resource": world.resource,
        "authorization_servers": [world.idp.issuer],
        "bearer_methods_supported": ["header"],
        "resource_signing_alg_values_supported": ["RS256", "PS256", "ES256", "EdDSA"],
        "resource_name": "mcp-gateway",
        "scopes_supported": ["mcp:tools", "mcp:read"],
    }
    with anyio.fail_after(10):
        async with httpx2.AsyncClient(timeout=5) as http:
            for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
                response = await http.get(world.gateway.url(path))  # no token: the metadata is public
                assert response.status_code == 200, response.text
                assert response.headers["content-type"] == "application/json"
                assert response.json() == expected


async def test_the_gateway_is_no_authorization_server_and_says_which_one_to_use(world: World) -> None:
    with anyio.fail_after(10):
        async with httpx2.AsyncClient(timeout=5) as http:
            metadata = await http.get(world.gateway.url("/.well-known/oauth-authorization-server"))
            register = await http.post(world.gateway.url("/register"), json={"redirect_uris": ["http://x/cb"]})
    for answer in (metadata, register):
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == (
            "Not found: this gateway is no authorization server; "
            f"{world.gateway.url('/.well-known/oauth-protected-resource/mcp')} names the one to use."
        )


async def test_a_request_without_a_token_gets_401_naming_the_metadata_and_a_client_can_follow_it_to_a_token(
    world: World,
) -> None:
    refused = await initialize(world.url, None)
    assert refused.status_code == 401
    assert challenge(refused) == {"resource_metadata": world.metadata_url(), "scope": "mcp:tools"}
    assert "error" not in challenge(refused)  # RFC 6750 3.1: no error code when no token was offered

    # The client's side of the MCP spec: metadata -> authorization server -> its metadata -> token endpoint.
    with anyio.fail_after(15):
        async with httpx2.AsyncClient(timeout=5) as http:
            resource = (await http.get(challenge(refused)["resource_metadata"])).json()
            (server,) = resource["authorization_servers"]
            metadata = (await http.get(f"{server}/.well-known/oauth-authorization-server")).json()
            assert metadata["issuer"] == server
            answer = await http.post(
                metadata["token_endpoint"],
                data={
                    "grant_type": "client_credentials",
                    "scope": refused_scope(refused),
                    "resource": resource["resource"],
                },
                auth=("alpha", "alpha-secret"),
            )
            token = answer.json()["access_token"]
    accepted = await initialize(world.url, token)
    assert accepted.status_code == 200, accepted.text
    assert accepted.headers["mcp-session-id"]


def refused_scope(response: httpx2.Response) -> str:
    return challenge(response)["scope"]


# ------------------------------------------------------------------------------------------ bad tokens


async def test_an_expired_token_gets_401_invalid_token(world: World) -> None:
    world.idp.clock(-3600)  # the provider's clock an hour behind: what it issues expired long ago
    try:
        token = await world.idp.client_credentials()
    finally:
        world.idp.clock(0)
    assert jwt.decode(token, options={"verify_signature": False})["exp"] < time.time() - 3000
    refused = await initialize(world.url, token)
    assert refused.status_code == 401
    assert challenge(refused) == {
        "error": "invalid_token",
        "resource_metadata": world.metadata_url(),
        "error_description": "the token has expired",
        "scope": "mcp:tools",
    }


async def test_a_token_for_another_resource_gets_401(world: World) -> None:
    token = await world.idp.client_credentials(resource=world.gateway.url("/other"))
    assert jwt.decode(token, options={"verify_signature": False})["aud"] == world.gateway.url("/other")
    refused = await initialize(world.url, token)
    assert refused.status_code == 401
    assert challenge(refused)["error"] == "invalid_token"
    assert (
        challenge(refused)["error_description"]
        == "the token was not issued for this resource (its audience is another)"
    )


async def test_a_token_from_an_issuer_the_gateway_does_not_trust_gets_401(world: World) -> None:
    token = await world.stranger.client_credentials()  # a real token, for this very resource, from another issuer
    assert jwt.decode(token, options={"verify_signature": False})["aud"] == world.resource
    refused = await initialize(world.url, token)
    assert refused.status_code == 401
    assert challenge(refused)["error_description"] == "the token was not issued by an issuer this gateway trusts"


@pytest.mark.parametrize(
    ("make", "description"),
    [
        (lambda w: forged(w, kid="never-published"), "the token is signed with a key issuer test-idp does not publish"),
        (lambda w: forged(w, kid=w.idp.kid), "the token's signature does not verify"),
        (
            lambda w: forged(w, kid=w.idp.kid, alg="RS512"),
            "the token is signed with an algorithm this gateway does not accept",
        ),
        (
            lambda w: jwt.encode({"iss": w.idp.issuer, "aud": w.resource, "sub": "x", "exp": 2**31}, "k" * 32, "HS256"),
            "the token is signed with an algorithm this gateway does not accept",
        ),
        (lambda w: "not-a-jwt-and-not-a-static-token", "the token is not a JWT access token"),
    ],
    ids=["unknown-key", "forged-signature", "refused-alg", "hmac", "not-a-jwt"],
)
async def test_a_token_the_issuer_did_not_sign_gets_401(world: World, make: Any, description: str) -> None:
    refused = await initialize(world.url, make(world))
    assert refused.status_code == 401
    assert challenge(refused)["error"] == "invalid_token"
    assert challenge(refused)["error_description"] == description
    assert refused.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32000, "message": f"Unauthorized: {description}."},
    }


async def test_a_token_without_the_required_scope_gets_403_insufficient_scope_naming_the_scope(world: World) -> None:
    token = await world.idp.client_credentials(scope="mcp:read")
    refused = await initialize(world.url, token)
    assert refused.status_code == 403
    assert challenge(refused) == {
        "error": "insufficient_scope",
        "resource_metadata": world.metadata_url(),
        "error_description": "the token lacks the scope mcp:tools",
        "scope": "mcp:read mcp:tools",  # what it holds and what it needs: a step-up keeps the granted scope
    }


async def test_a_static_token_keeps_working_beside_oauth(world: World) -> None:
    accepted = await initialize(world.url, "tok-ops")
    assert accepted.status_code == 200, accepted.text


# ------------------------------------------------------------------------------------------ callers and sessions


async def test_a_valid_token_calls_a_tool_and_the_ledger_names_the_caller_never_the_token(tmp_path: Path) -> None:
    with start_world(tmp_path) as world:
        alpha = await world.idp.client_credentials("alpha")
        alpha_again = await world.idp.client_credentials("alpha")
        beta = await world.idp.client_credentials("beta")
        person = await world.idp.authorization_code("ada")
        with anyio.fail_after(30):
            async with mcp_session(world.url, token=alpha) as session:
                result = await session.call_tool("echo", {"text": "hello"})
                assert result.content[0].text == "hello"  # type: ignore[union-attr]
            async with mcp_session(world.url, token=person) as session:
                result = await session.call_tool("echo", {"text": "from ada"})
                assert result.content[0].text == "from ada"  # type: ignore[union-attr]

            async with httpx2.AsyncClient(timeout=10) as http:
                opened = await http.post(world.url, json=INITIALIZE, headers=headers(alpha))
                session_id = opened.headers["mcp-session-id"]
                done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                assert (await http.post(world.url, json=done, headers=headers(alpha, session_id))).status_code == 202
                call = {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "x"}},
                }
                # Another OAuth caller (another subject of the same issuer) cannot use alpha's session ...
                assert (await http.post(world.url, json=call, headers=headers(beta, session_id))).status_code == 404
                assert (await http.delete(world.url, headers=headers(beta, session_id))).status_code == 404
                # ... while alpha's renewed token (same issuer and subject) still can.
                renewed = await http.post(world.url, json=call, headers=headers(alpha_again, session_id))
                assert renewed.status_code == 200, renewed.text

        ledger = tmp_path / "audit.db"
        await eventually(lambda: len(open_reader(tmp_path / "audit.db").query()) == 3)
        rows = open_reader(ledger).query()
        assert [(row.caller, row.tool, row.status) for row in rows] == [
            ("test-idp:alpha", "echo", "ok"),
            ("test-idp:ada", "echo", "ok"),
            ("test-idp:alpha", "echo", "ok"),
        ]
        stored = await anyio.to_thread.run_sync(lambda: b"".join(p.read_bytes() for p in tmp_path.glob("audit.db*")))
        log = world.gateway.output()
        for token in (alpha, alpha_again, beta, person):
            signature = token.rsplit(".", 1)[1]
            assert signature.encode() not in stored
            assert signature not in log


async def test_a_rotated_key_is_fetched_once_and_the_retired_key_no_longer_verifies(tmp_path: Path) -> None:
    with start_world(tmp_path) as world:
        before = await world.idp.client_credentials()
        assert (await initialize(world.url, before)).status_code == 200
        assert world.idp.jwks_requests() == 1  # fetched on first use, not per request
        assert (await initialize(world.url, before)).status_code == 200
        assert world.idp.jwks_requests() == 1

        old_kid = world.idp.kid
        assert world.idp.rotate() != old_kid  # the provider now signs with, and publishes, only a new key
        after = await world.idp.client_credentials()
        assert jwt.get_unverified_header(after)["kid"] == world.idp.kid
        assert (await initialize(world.url, after)).status_code == 200
        assert world.idp.jwks_requests() == 2  # the unknown kid refetched the key set once

        retired = await initialize(world.url, before)
        assert retired.status_code == 401
        assert (
            challenge(retired)["error_description"] == "the token is signed with a key issuer test-idp does not publish"
        )
        assert (await initialize(world.url, forged(world, kid="another-unknown"))).status_code == 401
        assert world.idp.jwks_requests() == 2  # unknown kids within jwks_refresh_min_s do not refetch again


# ------------------------------------------------------------------------------------------ configuration


def test_the_oauth_settings_validate_and_errors_name_the_key_path_and_line() -> None:
    base = """gateway:
  auth:
    oauth:
      resource: https://gw.example.com/mcp
      issuers:
        corp: {issuer: "ISSUER"}
      algorithms: [ALGS]
"""
    ok = parse_config(base.replace("ISSUER", "https://idp.example.com").replace("ALGS", "RS256, ES256"))
    assert ok.gateway.auth.oauth is not None
    assert ok.gateway.auth.oauth.issuers["corp"].issuer == "https://idp.example.com"
    with pytest.raises(ConfigError) as plain:
        parse_config(base.replace("ISSUER", "http://idp.example.com").replace("ALGS", "RS256"), file="f.yaml")
    assert str(plain.value).startswith("f.yaml:6: gateway.auth.oauth.issuers.corp.issuer: the issuer must use https")
    with pytest.raises(ConfigError) as symmetric:
        parse_config(base.replace("ISSUER", "https://idp.example.com").replace("ALGS", "HS256"), file="f.yaml")
    assert str(symmetric.value).startswith("f.yaml:7: gateway.auth.oauth.algorithms: algorithm 'HS256' is not accepted")
    with pytest.raises(ConfigError) as missing:
        parse_config("gateway: {auth: {oauth: {issuers: {}}}}\n", file="f.yaml")
    assert "gateway.auth.oauth.resource: required key is missing" in str(missing.value)


async def test_a_stateless_2026_07_28_request_is_authenticated_the_same_way(world: World) -> None:
    token = await world.idp.client_credentials("beta")
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    request = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "stateless"}, "_meta": meta},
    }
    era = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo"}
    with anyio.fail_after(15):
        async with httpx2.AsyncClient(timeout=10) as http:
            refused = await http.post(world.url, json=request, headers={**headers("expired.or.bad"), **era})
            answered = await http.post(world.url, json=request, headers={**headers(token), **era})
    assert refused.status_code == 401 and challenge(refused)["error"] == "invalid_token"
    assert answered.status_code == 200, answered.text
    if answered.headers["content-type"].startswith("text/event-stream"):
        (data,) = [line[5:] for line in answered.text.splitlines() if line.startswith("data:") and line[5:].strip()]
        message = json.loads(data)
    else:
        message = answered.json()
    assert message["result"]["content"][0]["text"] == "stateless"
