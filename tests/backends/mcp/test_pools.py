"""Connections to HTTP downstreams under a flood (backends/mcp/pool.py), over a real gateway process and real
loopback servers: one caller's flood of calls on one backend stays that backend's and that caller's. Another
caller's calls on it and on other backends are served at once, and no backend's health checks wait behind the flood
or read it as a failure."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.backends.base import BackendState
from gateway.backends.mcp.pool import HttpPool
from gateway.backends.mcp.session import McpBackend
from gateway.calls import Caller, Upstream
from gateway.config import HttpServer
from gateway.errors import BackendSaturated
from tests.fixtures.gateway_proc import first_text, run_gateway
from tests.fixtures.raw_http import headers, messages, open_session, post_and_drop
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKENS = "alice=tok-alice,bob=tok-bob"
FLOOD = 110
"""More calls than httpx's default pool (100 connections) holds."""


async def call(
    http: httpx2.AsyncClient, url: str, token: str, session: str, tool: str, *, rid: int, **arguments: Any
) -> httpx2.Response:
    request = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return await http.post(url, json=request, headers=headers(token, session))


def _text(response: httpx2.Response) -> str:
    answer = messages(response)[-1]
    assert "result" in answer, answer
    return str(answer["result"]["content"][0]["text"])


async def _running(http: httpx2.AsyncClient, url: str, session: str) -> int:
    """How many sleep calls the downstream at ``url`` runs now (asked directly, not through the gateway)."""
    return int(_text(await call(http, url, "none", session, "running", rid=5)).split()[0])


async def _both_ready(http: httpx2.AsyncClient, url: str) -> bool:
    return (await http.get(url)).json()["backends"] == {"a": "ready", "b": "ready"}


async def test_a_flood_on_one_backend_leaves_other_callers_fast_and_every_backend_healthy(
    tmp_path: Path, downstream: Any
) -> None:
    a = downstream("faults", "streamable_http", own=True)
    b = downstream("faults", "streamable_http", own=True)
    health = {"connect_timeout_s": 4, "ping_interval_s": 0.3}
    settings = f"""
servers:
  a: {json.dumps(a.settings(**health))}
  b: {json.dumps(b.settings(**health))}
"""
    with run_gateway(settings, tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=30) as http:
                await eventually(lambda: _both_ready(http, gateway.url("/healthz")), within=20)  # it serves at once
                before = {
                    s["name"]: s
                    for s in (await http.get(gateway.url("/status"), headers=headers("tok-bob"))).json()["backends"]
                }
                alices = await open_session(http, url, "tok-alice")
                bobs = await open_session(http, url, "tok-bob")
                direct = await open_session(http, a.url(), "none")
                flood = {"name": "a__sleep", "arguments": {"seconds": 10}}
                async with anyio.create_task_group() as tg:
                    for n in range(FLOOD):
                        body = {"jsonrpc": "2.0", "id": 100 + n, "method": "tools/call", "params": flood}
                        tg.start_soon(post_and_drop, gateway.port, "tok-alice", alices, body)

                async def saturated() -> bool:
                    return await _running(http, a.url(), direct) >= 16

                await eventually(saturated)  # alice's calls hold a's connections
                # bob's own call on the flooded backend, as long as several of its health checks (and long enough
                # for all of alice's calls to arrive)
                on_a = await call(http, url, "tok-bob", bobs, "a__sleep", rid=3, seconds=2)
                # by now alice's calls that found no connection have failed as saturated: a's circuit is still closed
                again = await call(http, url, "tok-bob", bobs, "a__echo", rid=4, text="again")
                started = time.monotonic()
                on_b = await call(http, url, "tok-bob", bobs, "b__echo", rid=2, text="hi")
                elapsed = time.monotonic() - started
                after = {
                    s["name"]: s
                    for s in (await http.get(gateway.url("/status"), headers=headers("tok-bob"))).json()["backends"]
                }

    assert _text(on_b) == "hi" and elapsed < 3, f"bob's call on b took {elapsed:.1f} s"
    assert _text(on_a) == "slept" and _text(again) == "again"
    for name in ("a", "b"):  # neither backend was read as failed: no reconnect, no error
        assert after[name]["state"] == "ready", after[name]
        assert after[name]["since"] == before[name]["since"] and after[name]["last_error"] is None, after[name]


@pytest.mark.parametrize("protocol", ["handshake", "2026-07-28"])  # the direct lane, and the SDK's session
async def test_a_call_no_connection_comes_for_fails_as_saturated_and_the_backend_stays_ready(
    downstream: Any, protocol: str
) -> None:
    server = downstream("faults", "streamable_http")
    config = HttpServer(
        transport="streamable_http",
        url=server.url(),
        max_connections=2,
        max_connections_per_caller=1,
        connect_timeout_s=1,
        ping_interval_s=0.2,
        protocol=protocol,
    )
    alice, bob = Upstream(caller=Caller(name="alice")), Upstream(caller=Caller(name="bob"))
    http = HttpPool()
    backend = McpBackend("f", config, http=http)
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                await tg.start(backend.run)
                since = backend.status.since
                first = anyio.Event()

                async def long_call() -> None:
                    first.set()
                    await backend.call_tool("sleep", {"seconds": 2}, upstream=alice)

                tg.start_soon(long_call)
                await first.wait()
                await eventually(lambda: backend.pool_statistics().busy == 1)
                with pytest.raises(BackendSaturated) as refused:
                    await backend.call_tool("echo", {"text": "more"}, upstream=alice)  # her one connection is busy
                assert first_text(await backend.call_tool("echo", {"text": "mine"}, upstream=bob)) == "mine"
                assert backend.status.state is BackendState.READY and backend.status.since == since
                tg.cancel_scope.cancel()
    finally:
        await http.aclose()
    assert refused.value.outcome == "saturated" and not refused.value.verdict
    assert "every connection to f is busy (1 calls of max_connections 2, 0 waiting; a caller may hold 1)" in str(
        refused.value
    )
