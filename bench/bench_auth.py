"""What authenticating one request costs in the guard: a static bearer token vs a JWT access token (keys cached).

Usage: ``python -m bench.bench_auth [-n 5000]``

Each way drives the real ``Guard`` (gateway/http.py) in memory with a trivial app behind it, N sequential requests
after a warm-up, and reports p50 / p99 in microseconds: the guard with no credential check at all (no tokens, on
loopback: the floor), with one static token, and with an RS256 and an ES256 JWT from an issuer whose keys it fetched
once from a loopback JWKS endpoint (served here). Each JWT is measured in the same run with the verified-token cache
off (``token_cache_s: 0``: every request verifies in full, as before the cache) and on (the default: every request
after the first is a hit); the last row sends a new RS256 token on every request (every one a miss, remembered and,
past ``token_cache_size``, evicting the oldest), the cache's cost when it never helps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import anyio
import anyio.abc
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.types import Message, Receive, Scope, Send

from gateway.auth.oauth import ResourceServer
from gateway.auth.tokens import Tokens
from gateway.config import OAuth
from gateway.front.http.guard import Guard

RESOURCE = "http://127.0.0.1:8080/mcp"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def request(guard: Guard, authorization: str | None) -> int:
    headers = [(b"host", b"127.0.0.1:8080")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    status = 0

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await guard(scope, receive, send)
    return status


WARM_UP = 200


async def measure(guard: Guard, authorization: str | None | list[str], n: int) -> tuple[float, float]:
    """p50 and p99 of ``n`` requests after a warm-up; a list gives each request its own authorization."""
    each = authorization if isinstance(authorization, list) else [authorization] * (WARM_UP + n)
    for value in each[:WARM_UP]:
        assert await request(guard, value) == 200
    samples = []
    for value in each[WARM_UP : WARM_UP + n]:
        t0 = time.perf_counter()
        status = await request(guard, value)
        samples.append((time.perf_counter() - t0) * 1e6)
        assert status == 200
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


async def main(n: int) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    algorithms = jwt.algorithms.get_default_algorithms()
    jwks = {
        "keys": [
            {**json.loads(algorithms["RS256"].to_jwk(rsa_key.public_key())), "kid": "r", "use": "sig"},
            {**json.loads(algorithms["ES256"].to_jwk(ec_key.public_key())), "kid": "e", "use": "sig"},
        ]
    }
    body = json.dumps(jwks).encode()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            await stream.send(head.encode() + b"connection: close\r\n\r\n" + body)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    issuer = f"http://127.0.0.1:{port}"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        settings: dict[str, Any] = {
            "resource": RESOURCE,
            "required_scopes": ["mcp:tools"],
            "issuers": {"idp": {"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}},
        }
        now = int(time.time())
        claims = {"iss": issuer, "aud": RESOURCE, "sub": "svc", "scope": "mcp:tools", "iat": now, "exp": now + 3600}
        rs256 = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "r"})
        es256 = jwt.encode(claims, ec_key, algorithm="ES256", headers={"kid": "e"})
        fresh = [  # one token per request: a cache miss every time
            "Bearer " + jwt.encode({**claims, "jti": str(i)}, rsa_key, algorithm="RS256", headers={"kid": "r"})
            for i in range(WARM_UP + n)
        ]
        static = "s3cr3t-" + "x" * 40
        ways: list[tuple[str, Guard, str | None | list[str]]] = [
            ("no credential check (no tokens, loopback)", Guard(app, tokens=Tokens(""), loopback=True), None),
            ("static token", Guard(app, tokens=Tokens(f"ops={static}"), loopback=True), f"Bearer {static}"),
        ]
        uncached = ResourceServer(OAuth.model_validate({**settings, "token_cache_s": 0}))
        cached = ResourceServer(OAuth.model_validate(settings))
        full = Guard(app, tokens=Tokens(f"ops={static}"), loopback=True, oauth=uncached)
        remembered = Guard(app, tokens=Tokens(f"ops={static}"), loopback=True, oauth=cached)
        ways += [
            ("JWT RS256, token cache off", full, f"Bearer {rs256}"),
            ("JWT RS256, token cache on (hits)", remembered, f"Bearer {rs256}"),
            ("JWT ES256, token cache off", full, f"Bearer {es256}"),
            ("JWT ES256, token cache on (hits)", remembered, f"Bearer {es256}"),
            ("JWT RS256, a new token per request (misses)", remembered, fresh),
        ]
        print(f"{'way':45} {'p50 us':>8} {'p99 us':>8}")
        for label, guard, authorization in ways:
            p50, p99 = await measure(guard, authorization, n)
            print(f"{label:45} {p50:8.1f} {p99:8.1f}")
        off, on = uncached.statistics(), cached.statistics()
        print(f"JWKS fetches: cache off {dict(off.key_fetches)}, cache on {dict(on.key_fetches)}")
        print(f"tokens by result: cache off {dict(off.verifications)}, cache on {dict(on.verifications)}")
        print(f"token cache: {on.token_cache}")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000)
    anyio.run(main, parser.parse_args().n)
