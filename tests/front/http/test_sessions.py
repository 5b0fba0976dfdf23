"""Sessions at the HTTP edge (``gateway/http.py``, ``CallerSessions``), over a real gateway process on loopback:
a session belongs to the caller that opened it (any other caller gets 404 for POST, GET and DELETE), one caller's
sessions are capped (its least-recently-used idle session is evicted, other callers are unaffected), and a session
id never reaches the log or the ledger (only a short digest of it)."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.ledger.engines import open_reader
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer
from tests.fixtures.raw_http import INITIALIZE, headers, messages, open_session

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKENS = "alice=tok-alice,bob=tok-bob"


def config(limits: str = "") -> str:
    return f"""
gateway:
  audit: {{path: audit.db}}
  limits: {{{limits}}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""


async def call_echo(http: httpx2.AsyncClient, url: str, token: str, session: str, text: str) -> httpx2.Response:
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": text}},
    }
    return await http.post(url, json=request, headers=headers(token, session))


def echoed(response: httpx2.Response) -> str:
    assert response.status_code == 200, response.text
    (message,) = [m for m in messages(response) if m.get("id") == 7]
    return str(message["result"]["content"][0]["text"])


def stop(server: RunningServer) -> str:
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=20)
    return server.output()


async def test_another_caller_gets_404_for_a_session_it_did_not_open_and_cannot_end_it(tmp_path: Path) -> None:
    with run_gateway(config(), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(30):
            async with httpx2.AsyncClient(timeout=10) as http:
                alices = await open_session(http, url, "tok-alice")
                assert echoed(await call_echo(http, url, "tok-alice", alices, "mine")) == "mine"

                hijacked = await call_echo(http, url, "tok-bob", alices, "not yours")
                assert hijacked.status_code == 404, hijacked.text
                stream = await http.get(url, headers=headers("tok-bob", alices))
                assert stream.status_code == 404, stream.text
                ended = await http.delete(url, headers=headers("tok-bob", alices))
                assert ended.status_code == 404, ended.text

                assert echoed(await call_echo(http, url, "tok-alice", alices, "still mine")) == "still mine"
                assert (await http.delete(url, headers=headers("tok-alice", alices))).status_code == 200
                assert (await call_echo(http, url, "tok-alice", alices, "gone")).status_code == 404
        log = stop(gateway)

    rows = open_reader(tmp_path / "audit.db").query()
    assert [(row.caller, row.tool) for row in rows] == [("alice", "echo"), ("alice", "echo")]
    digest = hashlib.sha256(alices.encode()).hexdigest()[:12]
    assert {row.session_id for row in rows} == {digest}  # correlatable, not the id
    ledger = await anyio.to_thread.run_sync(lambda: b"".join(p.read_bytes() for p in tmp_path.glob("audit.db*")))
    assert alices.encode() not in ledger
    assert alices not in log
    assert digest in log  # the tool.call line names the session by its digest


async def test_a_caller_at_its_session_cap_loses_its_oldest_idle_session_and_others_are_unaffected(
    tmp_path: Path,
) -> None:
    with run_gateway(config("sessions_per_caller: 3, max_sessions: 8"), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                bobs = await open_session(http, url, "tok-bob")
                alices = [await open_session(http, url, "tok-alice") for _ in range(3)]
                assert echoed(await call_echo(http, url, "tok-alice", alices[0], "used")) == "used"  # [1] is now LRU
                more = [await open_session(http, url, "tok-alice") for _ in range(5)]  # far beyond her cap

                alive = []
                for session in [*alices, *more]:
                    response = await call_echo(http, url, "tok-alice", session, "x")
                    assert response.status_code in (200, 404), response.text
                    alive.append(response.status_code == 200)
                assert alive == [False, False, False, False, False, True, True, True]  # her 3 newest survive

                # Bob, within his own share, is untouched: his session works and he can open more.
                assert echoed(await call_echo(http, url, "tok-bob", bobs, "bob's")) == "bob's"
                second = await open_session(http, url, "tok-bob")
                assert echoed(await call_echo(http, url, "tok-bob", second, "again")) == "again"
                status = (await http.get(gateway.url("/status"), headers=headers("tok-bob"))).json()
                assert status["sessions"] == {
                    "open": 5,
                    "evicted": 5,
                    "revived": 0,
                    "ended_elsewhere": 0,
                    "ids_held": 0,
                }  # alice's 3, bob's 2
            async with mcp_session(url, token="tok-bob") as session:  # the SDK's own client, too
                assert (await session.call_tool("echo", {"text": "sdk"})).content[0].text == "sdk"  # type: ignore[union-attr]
        log = stop(gateway)
    assert "session.evicted" in log
    assert "caller=alice" in log or '"caller": "alice"' in log


async def test_a_caller_whose_sessions_are_all_busy_is_refused_with_its_cap_named(tmp_path: Path) -> None:
    with run_gateway(config("sessions_per_caller: 1"), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(30):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, url, "tok-alice")
                async with http.stream("GET", url, headers=headers("tok-alice", session)) as stream:  # holds it
                    assert stream.status_code == 200
                    refused = await http.post(url, json=INITIALIZE, headers=headers("tok-alice"))
                assert refused.status_code == 429, refused.text
                (error,) = messages(refused)
                assert "alice" in error["error"]["message"]
                assert "1 open session" in error["error"]["message"]
                assert "gateway.limits.sessions_per_caller" in error["error"]["message"]
                assert (await http.post(url, json=INITIALIZE, headers=headers("tok-bob"))).status_code == 200
        stop(gateway)


async def test_an_idle_session_expires_after_session_idle_s(tmp_path: Path) -> None:
    with run_gateway(config("session_idle_s: 1"), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(30):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, url, "tok-alice")
                assert echoed(await call_echo(http, url, "tok-alice", session, "x")) == "x"
                await anyio.sleep(2.5)  # the passing of idle time is the subject here, not a synchronisation
                assert (await call_echo(http, url, "tok-alice", session, "x")).status_code == 404
        stop(gateway)


def test_the_limits_have_defaults_and_a_per_caller_share_cannot_exceed_the_whole() -> None:
    limits = parse_config("", file="federation.yaml", env={}).gateway.limits
    assert (limits.sessions_per_caller, limits.max_sessions, limits.session_idle_s) == (64, 1000, 300.0)
    with pytest.raises(ConfigError) as refused:
        parse_config(
            "gateway:\n  limits: {sessions_per_caller: 20, max_sessions: 10}\n", file="federation.yaml", env={}
        )
    assert str(refused.value) == (
        "federation.yaml:2: gateway.limits: sessions_per_caller (20) is larger than max_sessions (10): "
        "one caller could then take every session"
    )
