"""What authenticating one request costs in the guard: a static bearer token vs a JWT access token (keys cached).

Usage: ``python -m bench.bench_auth [-n 5000]``

Each way drives the real ``Guard`` (gateway/http.py) in memory with a trivial app behind it, N sequential requests
after a warm-up, and reports p50 / p99 in microseconds: the guard with no credential check at all (no tokens, on
loopback: the floor), with one static token, and with an RS256 and an ES256 JWT from an issuer whose keys it fetched
once from a loopback JWKS endpoint (served here).
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
from gateway.config import OAuth
from gateway.http import Guard, Tokens

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


async def measure(guard: Guard, authorization: str | None, n: int) -> tuple[float, float]:
    for _ in range(200):
        assert await request(guard, authorization) == 200
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await request(guard, authorization)
        samples.append((time.perf_counter() - t0) * 1e6)
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
        settings = OAuth.model_validate(
            {
                "resource": RESOURCE,
                "required_scopes": ["mcp:tools"],
                "issuers": {"idp": {"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}},
            }
        )
        now = int(time.time())
        claims = {"iss": issuer, "aud": RESOURCE, "sub": "svc", "scope": "mcp:tools", "iat": now, "exp": now + 3600}
        rs256 = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "r"})
        es256 = jwt.encode(claims, ec_key, algorithm="ES256", headers={"kid": "e"})
        static = "s3cr3t-" + "x" * 40
        ways = [
            ("no credential check (no tokens, loopback)", Guard(app, tokens=Tokens(""), loopback=True), None),
            ("static token", Guard(app, tokens=Tokens(f"ops={static}"), loopback=True), f"Bearer {static}"),
        ]
        oauth = ResourceServer(settings)
        guarded = Guard(app, tokens=Tokens(f"ops={static}"), loopback=True, oauth=oauth)
        ways += [
            ("JWT RS256 (keys cached)", guarded, f"Bearer {rs256}"),
            ("JWT ES256 (keys cached)", guarded, f"Bearer {es256}"),
        ]
        print(f"{'way':45} {'p50 us':>8} {'p99 us':>8}")
        for label, guard, authorization in ways:
            p50, p99 = await measure(guard, authorization, n)
            print(f"{label:45} {p50:8.1f} {p99:8.1f}")
        print(f"JWKS fetches: {oauth.statistics()}")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000)
    anyio.run(main, parser.parse_args().n)
