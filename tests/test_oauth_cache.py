"""The verified-token cache of ``gateway/auth/oauth.py``, against a real OpenID provider (npm ``oidc-provider`` on
loopback, ``tests/fixtures/identity.py``): a token verified once is accepted again without a second check; it is
refused as soon as its ``exp`` passes by the clock of the request, however recently it was remembered; a key removed
from the issuer's JWKS takes the tokens it verified with it (whether a token naming the new key or the keys' own
expiry fetched the new set); and the cache holds at most ``token_cache_size`` tokens, least recently used out first,
never one that was refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.auth.oauth import Principal, Refusal, ResourceServer
from gateway.config import OAuth, parse_config
from gateway.errors import ConfigError
from tests.fixtures.identity import IdentityProvider, start_identity_provider
from tests.fixtures.waiting import POLL_S

pytestmark = pytest.mark.anyio

RESOURCE = "http://127.0.0.1:9/mcp"
TOKEN_TTL_S = 300  # what oidc_provider.mjs gives an access token


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    with start_identity_provider(RESOURCE) as provider:
        yield provider


def server(idp: IdentityProvider, **settings: Any) -> ResourceServer:
    config = {"resource": RESOURCE, "issuers": {"idp": {"issuer": idp.issuer}}, "required_scopes": ["mcp:tools"]}
    return ResourceServer(OAuth.model_validate(config | settings))


def cache_statistics(oauth: ResourceServer) -> dict[str, int]:
    assert oauth.token_cache is not None
    return oauth.token_cache.statistics()


async def verify(oauth: ResourceServer, token: str) -> Principal:
    with anyio.fail_after(10):
        return await oauth.verify(token)


async def refusal(oauth: ResourceServer, token: str) -> Refusal:
    with pytest.raises(Refusal) as refused:
        await verify(oauth, token)
    return refused.value


async def test_a_verified_token_is_accepted_again_from_the_cache(idp: IdentityProvider) -> None:
    oauth = server(idp)
    token = await idp.client_credentials("alpha")
    first = await verify(oauth, token)
    assert first.caller == "idp:alpha" and first.scopes >= {"mcp:tools"}
    assert cache_statistics(oauth) == {"tokens": 1, "hits": 0, "evicted": 0}
    again = await verify(oauth, token)
    assert again is first  # the remembered principal: no second parse or signature check
    assert cache_statistics(oauth) == {"tokens": 1, "hits": 1, "evicted": 0}

    uncached = server(idp, token_cache_s=0)
    assert uncached.token_cache is None
    one, two = await verify(uncached, token), await verify(uncached, token)
    assert one == two and one is not two  # verified in full each time


async def test_a_remembered_token_is_refused_once_its_exp_passes_by_the_clock_at_use(idp: IdentityProvider) -> None:
    oauth = server(idp, leeway_s=0, token_cache_s=60)  # the cache would keep it a minute: exp must end it first
    idp.clock(-(TOKEN_TTL_S - 3))  # issued "297 s ago": it expires within 2 to 3 s
    try:
        token = await idp.client_credentials()
    finally:
        idp.clock(0)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert time.time() + 1 < exp <= time.time() + 3
    await verify(oauth, token)
    accepted_at = []
    with anyio.fail_after(10):
        while True:
            now = time.time()
            try:
                await oauth.verify(token)
            except Refusal as refused:
                assert refused.description == "the token has expired"
                assert now >= exp - 0.01  # (PyJWT's and this clock are read microseconds apart)
                break
            accepted_at.append(now)
            await anyio.sleep(POLL_S)
    assert accepted_at and max(accepted_at) < exp  # accepted until its exp, from the cache ...
    assert cache_statistics(oauth)["hits"] == len(accepted_at)
    assert cache_statistics(oauth)["tokens"] == 0  # ... and forgotten when it expired


async def test_a_key_removed_from_the_jwks_takes_the_tokens_it_verified_with_it(idp: IdentityProvider) -> None:
    oauth = server(idp, jwks_refresh_min_s=0)
    before = await idp.client_credentials("alpha")
    await verify(oauth, before)
    await verify(oauth, before)
    assert cache_statistics(oauth) == {"tokens": 1, "hits": 1, "evicted": 0}

    old_kid = idp.kid
    assert idp.rotate() != old_kid  # the provider now publishes only the new key
    after = await idp.client_credentials("beta")
    assert (await verify(oauth, after)).caller == "idp:beta"  # its unknown kid fetched the new key set
    assert cache_statistics(oauth)["tokens"] == 1  # only the new token: the old key's token was forgotten at once
    retired = await refusal(oauth, before)
    assert (retired.status, retired.description) == (401, "the token is signed with a key issuer idp does not publish")
    assert cache_statistics(oauth)["hits"] == 1


async def test_a_remembered_token_is_checked_again_when_the_keys_expire_and_refused_if_its_key_is_gone(
    idp: IdentityProvider,
) -> None:
    oauth = server(idp, jwks_ttl_s=1.0)
    token = await idp.client_credentials()
    await verify(oauth, token)
    idp.rotate()  # no token names the new key: only the keys' own expiry can learn of the rotation
    with anyio.fail_after(10):
        while True:
            try:
                await oauth.verify(token)
            except Refusal as refused:
                assert refused.description == "the token is signed with a key issuer idp does not publish"
                break
            await anyio.sleep(POLL_S)
    assert idp.jwks_requests() == 2
    assert cache_statistics(oauth)["tokens"] == 0


def forged(idp: IdentityProvider) -> str:
    """Every right claim and the issuer's kid, signed by a key the issuer never published."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    claims = {"iss": idp.issuer, "aud": RESOURCE, "sub": "mallory", "scope": "mcp:tools", "iat": now, "exp": now + 300}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": idp.kid})


async def test_the_cache_holds_at_most_its_size_least_recently_used_out_first_and_never_a_refused_token(
    idp: IdentityProvider,
) -> None:
    oauth = server(idp, token_cache_size=2)
    one, two, three = [await idp.client_credentials(client) for client in ("alpha", "beta", "alpha")]
    first = await verify(oauth, one)
    second = await verify(oauth, two)
    assert await verify(oauth, one) is first  # one is now the most recently used
    await verify(oauth, three)  # a third: two, the least recently used, makes room
    assert cache_statistics(oauth) == {"tokens": 2, "hits": 1, "evicted": 1}
    assert await verify(oauth, one) is first
    again = await verify(oauth, two)
    assert again == second and again is not second  # verified in full again
    assert cache_statistics(oauth) == {"tokens": 2, "hits": 2, "evicted": 2}

    idp.clock(-3600)
    try:
        expired = await idp.client_credentials()
    finally:
        idp.clock(0)
    unscoped = await idp.client_credentials(scope="mcp:read")
    for bad, status in [(forged(idp), 401), (expired, 401), (unscoped, 403), (one[:-4] + "AAAA", 401)]:
        for _ in range(3):  # refused in full every time: nothing remembered
            assert (await refusal(oauth, bad)).status == status
    assert cache_statistics(oauth) == {"tokens": 2, "hits": 2, "evicted": 2}


def test_the_cache_settings_validate_and_errors_name_the_key_path() -> None:
    base = "gateway:\n  auth:\n    oauth:\n      resource: https://gw.example.com/mcp\n"
    base += "      issuers: {idp: {issuer: 'https://idp.example.com'}}\n"
    config = parse_config(base, file="federation.yaml", env={})
    assert config.gateway.auth.oauth is not None
    assert (config.gateway.auth.oauth.token_cache_s, config.gateway.auth.oauth.token_cache_size) == (60.0, 4096)
    for line, key in [("token_cache_s: 301", "token_cache_s"), ("token_cache_size: 0", "token_cache_size")]:
        with pytest.raises(ConfigError) as refused:
            parse_config(base + f"      {line}\n", file="federation.yaml", env={})
        assert f"gateway.auth.oauth.{key}" in str(refused.value)
