"""The verified-token cache of ``gateway/auth/oauth.py``, against a real OpenID provider (npm ``oidc-provider`` on
loopback, ``tests/fixtures/identity.py``): a token verified once is accepted again without a second check; it is
refused as soon as its ``exp`` passes by the clock of the request, however recently it was remembered; a key removed
from the issuer's JWKS takes the tokens it verified with it (whether a token naming the new key or the keys' own
expiry fetched the new set); and the cache holds at most ``token_cache_size`` tokens, least recently used out first,
never one that was refused. A real ``gateway serve`` shows the cache's counts and the tokens by result in ``/status``
and ``/metrics``, never a token, its digest or a claim."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth.oauth import Refusal, ResourceServer
from gateway.calls import Caller
from gateway.config import OAuth, parse_config
from gateway.errors import ConfigError
from tests.fixtures.gateway_proc import PYTHON, echo_argv, run_gateway
from tests.fixtures.identity import IdentityProvider, start_identity_provider
from tests.fixtures.procs import free_port
from tests.fixtures.raw_http import INITIALIZE, headers
from tests.fixtures.waiting import POLL_S

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

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
    """The cache's counts (entries, hits, misses, evicted, forgotten), as ``/status`` shows them."""
    cache = oauth.statistics().token_cache
    assert cache is not None
    return {key: value for key, value in dataclasses.asdict(cache).items() if key not in ("ttl_s", "limit")}


def counts(entries: int, hits: int, misses: int, evicted: int = 0, forgotten: int = 0) -> dict[str, int]:
    return {"entries": entries, "hits": hits, "misses": misses, "evicted": evicted, "forgotten": forgotten}


def results(cached: int = 0, verified: int = 0, refused: int = 0, unavailable: int = 0) -> dict[str, int]:
    return {"cached": cached, "verified": verified, "refused": refused, "unavailable": unavailable}


async def verify(oauth: ResourceServer, token: str) -> Caller:
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
    assert first.name == "idp:alpha" and first.scopes >= {"mcp:tools"}
    assert cache_statistics(oauth) == counts(entries=1, hits=0, misses=1)
    again = await verify(oauth, token)
    assert again is first  # the remembered principal: no second parse or signature check
    assert cache_statistics(oauth) == counts(entries=1, hits=1, misses=1)
    assert oauth.statistics().verifications == results(cached=1, verified=1)

    uncached = server(idp, token_cache_s=0)
    assert uncached.token_cache is None
    one, two = await verify(uncached, token), await verify(uncached, token)
    assert one == two and one is not two  # verified in full each time
    assert uncached.statistics().token_cache is None
    assert uncached.statistics().verifications == results(verified=2)


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
    # ... and forgotten when it expired: that lookup missed, and the token was refused after its full check
    assert cache_statistics(oauth) == counts(entries=0, hits=len(accepted_at), misses=2)
    assert oauth.statistics().verifications == results(cached=len(accepted_at), verified=1, refused=1)


async def test_a_key_removed_from_the_jwks_takes_the_tokens_it_verified_with_it(idp: IdentityProvider) -> None:
    oauth = server(idp, jwks_refresh_min_s=0)
    before = await idp.client_credentials("alpha")
    await verify(oauth, before)
    await verify(oauth, before)
    assert cache_statistics(oauth) == counts(entries=1, hits=1, misses=1)

    old_kid = idp.kid
    assert idp.rotate() != old_kid  # the provider now publishes only the new key
    after = await idp.client_credentials("beta")
    assert (await verify(oauth, after)).name == "idp:beta"  # its unknown kid fetched the new key set
    # only the new token: the old key's token was forgotten at once
    assert cache_statistics(oauth) == counts(entries=1, hits=1, misses=2, forgotten=1)
    retired = await refusal(oauth, before)
    assert (retired.status, retired.description) == (401, "the token is signed with a key issuer idp does not publish")
    assert cache_statistics(oauth) == counts(entries=1, hits=1, misses=3, forgotten=1)
    assert oauth.statistics().verifications == results(cached=1, verified=2, refused=1)


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
    assert cache_statistics(oauth)["entries"] == 0


def forged(idp: IdentityProvider, *, resource: str = RESOURCE, issuer: str | None = None) -> str:
    """Every right claim and the issuer's kid, signed by a key the issuer never published."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    claims = {"iss": issuer or idp.issuer, "aud": resource, "sub": "mallory", "scope": "mcp:tools"}
    claims |= {"iat": now, "exp": now + 300, "jti": f"forged-{now}"}
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
    assert cache_statistics(oauth) == counts(entries=2, hits=1, misses=3, evicted=1)
    assert await verify(oauth, one) is first
    again = await verify(oauth, two)
    assert again == second and again is not second  # verified in full again
    assert cache_statistics(oauth) == counts(entries=2, hits=2, misses=4, evicted=2)

    idp.clock(-3600)
    try:
        expired = await idp.client_credentials()
    finally:
        idp.clock(0)
    unscoped = await idp.client_credentials(scope="mcp:read")
    for bad, status in [(forged(idp), 401), (expired, 401), (unscoped, 403), (one[:-4] + "AAAA", 401)]:
        for _ in range(3):  # refused in full every time: nothing remembered
            assert (await refusal(oauth, bad)).status == status
    assert cache_statistics(oauth) == counts(entries=2, hits=2, misses=16, evicted=2)
    assert oauth.statistics().verifications == results(cached=2, verified=4, refused=12)


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


# ------------------------------------------------------------------------------------------ /status and /metrics


def gateway_config(resource: str, issuer: str, gone: str) -> str:
    return f"""
gateway:
  audit: {{enabled: false}}
  auth:
    oauth:
      resource: {resource}
      required_scopes: [mcp:tools]
      issuers:
        test-idp: {{issuer: "{issuer}"}}
        gone: {{issuer: "{gone}", jwks_uri: "{gone}/jwks"}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""


def secrets_of(token: str) -> list[str]:
    """A token, its signature, its SHA-256 digest (hex and both base64 forms) and its ``jti`` claim."""
    digest = hashlib.sha256(token.encode()).digest()
    claims = jwt.decode(token, options={"verify_signature": False})
    return [
        token,
        token.rsplit(".", 1)[1],
        digest.hex(),
        base64.b64encode(digest).decode().rstrip("="),
        base64.urlsafe_b64encode(digest).decode().rstrip("="),
        str(claims["jti"]),
    ]


def oauth_samples(text: str) -> dict[tuple[str, str], float]:
    """The scrape's ``mcp_gateway_oauth_*`` samples, keyed by (name, the ``result`` label or "")."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("mcp_gateway_oauth_"):
                out[(sample.name, sample.labels.get("result", ""))] = sample.value
    return out


def expected_samples(verifications: dict[str, int], cache: dict[str, Any]) -> dict[tuple[str, str], float]:
    name = "mcp_gateway_oauth_token_verifications_total"
    out = {(name, result): float(count) for result, count in verifications.items()}
    out[("mcp_gateway_oauth_token_cache_entries", "")] = cache["entries"]
    out[("mcp_gateway_oauth_token_cache_entries_limit", "")] = cache["limit"]
    out[("mcp_gateway_oauth_token_cache_evicted_total", "")] = cache["evicted"]
    out[("mcp_gateway_oauth_token_cache_forgotten_total", "")] = cache["forgotten"]
    return out


async def test_status_and_metrics_show_the_cache_and_the_tokens_by_result_and_never_a_token(tmp_path: Path) -> None:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    gone = f"http://127.0.0.1:{free_port()}"  # an issuer nothing listens for: its keys cannot be had (503)
    requests = 5
    with (
        start_identity_provider(resource) as idp,
        run_gateway(gateway_config(resource, idp.issuer, gone), tmp_path, tokens="ops=tok-ops", port=port) as gateway,
    ):
        token = await idp.client_credentials("alpha")
        bad = forged(idp, resource=resource)
        unjudged = forged(idp, resource=resource, issuer=gone)
        ops = {"Authorization": "Bearer tok-ops"}  # a static token: never counted among the JWTs

        async def read() -> tuple[str, dict[str, Any], str]:
            status = await http.get(gateway.url("/status"), headers=ops)
            metrics = await http.get(gateway.url("/metrics"), headers=ops)
            assert status.status_code == 200 and metrics.status_code == 200
            return status.text, status.json()["auth"]["oauth"], metrics.text

        with anyio.fail_after(30):
            async with httpx2.AsyncClient(timeout=10) as http:
                for _ in range(requests):
                    answered = await http.post(gateway.url(), json=INITIALIZE, headers=headers(token))
                    assert answered.status_code == 200, answered.text
                status_text, oauth, metrics_text = await read()
                cache = {"ttl_s": 60.0, "limit": 4096, "entries": 1, "hits": requests - 1, "misses": 1}
                cache |= {"evicted": 0, "forgotten": 0}
                verifications = results(cached=requests - 1, verified=1)
                assert oauth == {
                    "verifications": verifications,
                    "key_fetches": {"test-idp": 1, "gone": 0},
                    "token_cache": cache,
                }
                assert oauth_samples(metrics_text) == expected_samples(verifications, cache)

                for _ in range(2):  # refused after the full check each time, and never remembered
                    refused = await http.post(gateway.url(), json=INITIALIZE, headers=headers(bad))
                    assert refused.status_code == 401, refused.text
                assert (await http.post(gateway.url(), json=INITIALIZE, headers=headers(unjudged))).status_code == 503
                later_status, oauth, later_metrics = await read()
                cache |= {"entries": 1, "misses": 4}
                verifications = results(cached=requests - 1, verified=1, refused=2, unavailable=1)
                assert oauth["verifications"] == verifications and oauth["token_cache"] == cache
                assert oauth_samples(later_metrics) == expected_samples(verifications, cache)

    for where, text in [("status", status_text + later_status), ("metrics", metrics_text + later_metrics)]:
        for secret in secrets_of(token) + secrets_of(bad) + secrets_of(unjudged):
            assert secret not in text, f"a token's secret is in {where}"


async def test_without_oauth_neither_document_has_an_oauth_part(tmp_path: Path) -> None:
    config = f"gateway:\n  audit: {{enabled: false}}\nservers:\n  e:\n    transport: stdio\n    command: {PYTHON}\n"
    config += f"    args: {json.dumps(echo_argv()[1:])}\n"
    with run_gateway(config, tmp_path, tokens="ops=tok-ops") as gateway:
        with anyio.fail_after(30):
            async with httpx2.AsyncClient(timeout=10, headers={"Authorization": "Bearer tok-ops"}) as http:
                status = (await http.get(gateway.url("/status"))).json()
                metrics = (await http.get(gateway.url("/metrics"))).text
    assert "auth" not in status and status["gateway"] == "mcp-gateway"
    assert "mcp_gateway_catalog_tools" in metrics and "mcp_gateway_oauth_" not in metrics
