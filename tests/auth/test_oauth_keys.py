"""How ``gateway/auth/oauth.py`` fetches an issuer's keys, against a real loopback HTTP server that can be made to stall
or fail: one fetch serves many requests, a fetch in progress never holds up a request whose key is held, a stalled
fetch is cut at ``fetch_timeout_s``, an issuer that is down is not asked again by every request, and discovery reads
``jwks_uri`` from the issuer's metadata (which must name the same issuer)."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.auth.oauth import Refusal, ResourceServer
from gateway.config import OAuth

pytestmark = pytest.mark.anyio

RESOURCE = "http://127.0.0.1:9/mcp"


@dataclass
class Issuer:
    """A minimal authorization server: metadata at the RFC 8414 path, keys at /jwks; ``stall`` holds every answer."""

    port: int = 0
    keys: dict[str, Any] = field(default_factory=dict)
    stall: bool = False
    down: bool = False
    requests: list[str] = field(default_factory=list)
    metadata_issuer: str | None = None
    stalled: anyio.Event = field(default_factory=anyio.Event)
    flood: bytes | None = None
    """When set, /jwks answers this chunk over and over (``flood_bytes`` in all, no Content-Length), gzip-encoded
    when ``flood_gzip``; ``sent`` counts what the socket took before the reader hung up."""
    flood_bytes: int = 0
    flood_gzip: bool = False
    sent: int = 0
    hung_up: anyio.Event = field(default_factory=anyio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_key(self, kid: str, key: Any) -> None:
        jwk = json.loads(
            jwt.algorithms.get_default_algorithms()[
                "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "RS256"
            ].to_jwk(key.public_key())
        )
        self.keys[kid] = {**jwk, "kid": kid, "use": "sig"}

    def token(self, kid: str, key: Any, alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "aud": RESOURCE, "sub": "svc", "scope": "mcp:tools", "iat": now, "exp": now + 60}
        return jwt.encode({**payload, **claims}, key, algorithm=alg, headers={"kid": kid})

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive()
            path = request.split(b" ", 2)[1].decode()
            self.requests.append(path)
            if self.stall:
                self.stalled.set()
                await anyio.sleep_forever()
            if self.flood is not None and path == "/jwks":
                await self._flood(stream)
                return
            if self.down:
                status, body = "500 Internal Server Error", b"{}"
            elif path == "/.well-known/oauth-authorization-server":
                issuer = self.metadata_issuer or self.url
                status, body = "200 OK", json.dumps({"issuer": issuer, "jwks_uri": f"{self.url}/jwks"}).encode()
            elif path == "/jwks":
                status, body = "200 OK", json.dumps({"keys": list(self.keys.values())}).encode()
            else:
                status, body = "404 Not Found", b"{}"
            head = (
                f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n"
            )
            await stream.send(head.encode() + body)

    async def _flood(self, stream: anyio.abc.SocketStream) -> None:
        assert self.flood is not None
        encoding = "content-encoding: gzip\r\n" if self.flood_gzip else ""
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{encoding}connection: close\r\n\r\n"
        try:
            await stream.send(head.encode())
            while self.sent < self.flood_bytes:
                await stream.send(self.flood)
                self.sent += len(self.flood)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self.hung_up.set()


@asynccontextmanager
async def serving() -> AsyncIterator[Issuer]:
    issuer = Issuer()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    issuer.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, issuer.handle)
        try:
            yield issuer
        finally:
            tg.cancel_scope.cancel()


def server(issuer: Issuer, **settings: Any) -> ResourceServer:
    spec: dict[str, Any] = {"issuer": issuer.url}
    if settings.pop("discover", False) is False:
        spec["jwks_uri"] = f"{issuer.url}/jwks"
    config = {"resource": RESOURCE, "issuers": {"idp": spec}, "required_scopes": ["mcp:tools"], **settings}
    return ResourceServer(OAuth.model_validate(config))


async def test_one_fetch_serves_every_request_whose_key_is_known() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving() as issuer:
        issuer.add_key("a", key)
        rs = server(issuer)
        with anyio.fail_after(10):
            for _ in range(5):
                principal = await rs.verify(issuer.token("a", key))
        assert (principal.name, principal.subject, principal.scopes) == ("idp:svc", "svc", frozenset({"mcp:tools"}))
        assert issuer.requests == ["/jwks"]
        assert rs.statistics().key_fetches == {"idp": 1}


async def test_a_stalled_refetch_does_not_hold_up_a_request_whose_key_is_held_and_is_cut_at_the_timeout() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving() as issuer:
        issuer.add_key("a", key)
        rs = server(issuer, fetch_timeout_s=1.0, jwks_refresh_min_s=0)
        with anyio.fail_after(10):
            await rs.verify(issuer.token("a", key))
            issuer.stall = True
            outcome: dict[str, Any] = {}

            async def unknown() -> None:
                started = time.monotonic()
                try:
                    await rs.verify(issuer.token("b", key))
                except Refusal as refusal:
                    outcome["refusal"], outcome["waited"] = refusal, time.monotonic() - started

            async with anyio.create_task_group() as tg:
                tg.start_soon(unknown)
                await issuer.stalled.wait()  # the refetch has reached the server, which holds it
                started = time.monotonic()
                assert (await rs.verify(issuer.token("a", key))).subject == "svc"
                assert time.monotonic() - started < 0.2
                assert "refusal" not in outcome  # the refetch is still waiting meanwhile
        assert outcome["refusal"].status == 503
        assert 0.9 < outcome["waited"] < 3


async def test_an_issuer_that_is_down_is_answered_503_and_not_asked_again_by_every_request() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    async with serving() as issuer:
        issuer.add_key("a", key)
        issuer.down = True
        rs = server(issuer)
        with anyio.fail_after(10):
            for _ in range(3):
                with pytest.raises(Refusal) as refused:
                    await rs.verify(issuer.token("a", key, alg="ES256"))
                assert (refused.value.status, refused.value.error) == (503, None)
        assert issuer.requests == ["/jwks"]
        assert rs.challenge(refused.value).startswith('Bearer resource_metadata="http://127.0.0.1:9/.well-known/')


async def test_keys_are_discovered_from_the_issuers_metadata_which_must_name_the_same_issuer() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving() as issuer:
        issuer.add_key("a", key)
        with anyio.fail_after(10):
            assert (await server(issuer, discover=True).verify(issuer.token("a", key))).name == "idp:svc"
            assert issuer.requests == ["/.well-known/oauth-authorization-server", "/jwks"]
            issuer.metadata_issuer = "http://127.0.0.1:1"  # a metadata document that speaks for someone else
            with pytest.raises(Refusal) as refused:
                await server(issuer, discover=True).verify(issuer.token("a", key))
        assert refused.value.status == 503


async def test_a_key_is_used_only_with_the_algorithm_it_is_published_for() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving() as issuer:
        issuer.add_key("a", key)
        issuer.keys["a"]["alg"] = "RS256"
        rs = server(issuer)
        with anyio.fail_after(10), pytest.raises(Refusal) as refused:
            await rs.verify(issuer.token("a", key, alg="PS256"))
        assert refused.value.description == "the token's algorithm is not the one its key is published for"


@pytest.mark.parametrize(
    ("claims", "description"),
    [
        ({"exp": -120}, "the token has expired"),  # times relative to the test's run, not its collection
        ({"nbf": 120}, "the token is not valid yet"),
        ({"exp": None}, "the token has no 'exp' claim"),
        ({"sub": None}, "the token names no caller (claim 'sub')"),
        ({"aud": ["http://127.0.0.1:9/other", RESOURCE]}, None),  # a list that contains the resource is fine
        ({"scope": None, "scp": ["mcp:tools"]}, None),  # scopes as a list, as some providers write them
    ],
)
async def test_the_registered_claims_are_checked_within_the_leeway(
    claims: dict[str, Any], description: str | None
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving() as issuer:
        issuer.add_key("a", key)
        rs = server(issuer, leeway_s=30)
        now = int(time.time())
        claims = {k: now + v if k in ("exp", "nbf") and v is not None else v for k, v in claims.items()}
        token = issuer.token("a", key, **claims)
        payload = jwt.decode(token, options={"verify_signature": False})
        token = jwt.encode(
            {k: v for k, v in payload.items() if v is not None}, key, algorithm="RS256", headers={"kid": "a"}
        )
        with anyio.fail_after(10):
            if description is None:
                assert (await rs.verify(token)).name == "idp:svc"
            else:
                with pytest.raises(Refusal) as refused:
                    await rs.verify(token)
                assert (refused.value.status, refused.value.description) == (401, description)


async def test_a_key_set_larger_than_the_limit_is_refused_without_reading_it_to_its_end() -> None:
    # 300 MB of JSON-looking bytes and no Content-Length: the fetch must stop at the limit, not read it all first.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving() as issuer:
        issuer.flood, issuer.flood_bytes = b"[" * (1024 * 1024), 300 * 1024 * 1024
        rs = server(issuer)
        with anyio.fail_after(20):
            with pytest.raises(Refusal) as refused:
                await rs.verify(issuer.token("a", key))
            await issuer.hung_up.wait()
        assert refused.value.status == 503
        assert issuer.sent < 16 * 1024 * 1024, f"the issuer got {issuer.sent:,} bytes out before the gateway hung up"


async def test_a_gzip_key_set_that_expands_past_the_limit_is_refused_without_expanding_it_whole() -> None:
    # 64 MB of zeros, gzipped (about 64 KB on the wire): the limit holds after decompression, and what is held in
    # memory while reading stays near the limit, not near the expanded size.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bomb = gzip.compress(b"0" * (64 * 1024 * 1024), compresslevel=9)
    async with serving() as issuer:
        issuer.flood, issuer.flood_bytes, issuer.flood_gzip = bomb, len(bomb), True
        rs = server(issuer)
        tracemalloc.start()
        try:
            with anyio.fail_after(20):
                with pytest.raises(Refusal) as refused:
                    await rs.verify(issuer.token("a", key))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert refused.value.status == 503
        assert peak < 16 * 1024 * 1024, f"{peak:,} bytes held at the peak while reading a 64 MB expansion"
