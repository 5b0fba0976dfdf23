"""A caller's calls that stream progress go on a session of its own beside a streamable HTTP server's shared session
(backends/mcp/own.py): one per caller, opened at its first such call and kept; another caller's are their own; a
call without progress stays on the shared session; a session the server no longer knows is opened again and the
call answered; the sessions end at the server with the gateway. Over a real gateway process and the real fidelity
server on loopback, which notes the session of every call it receives."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.backends.mcp import own
from gateway.backends.mcp.fastpath import HttpLane
from tests.fixtures.downstreams import Downstreams
from tests.fixtures.gateway_proc import first_text, mcp_session, run_gateway
from tests.fixtures.raw_http import ACCEPT, INITIALIZE
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKENS = "alice=tok-alice-0123,bob=tok-bob-4567"
WAIT = 20


def sessions(text: str, tool: str) -> list[str]:
    """The session of each ``tool`` call the server noted, in order."""
    return re.findall(rf"tools/call {tool} id=\S+ session=(\S+)", text)


async def test_progress_calls_go_on_their_callers_own_sessions(tmp_path: Path, downstream: Downstreams) -> None:
    served = downstream("fidelity", "streamable_http", "--name", "f", own=True)
    config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  f: {{transport: streamable_http, url: "{served.url()}"}}
"""
    with run_gateway(config, tmp_path, tokens=TOKENS) as gateway:
        seen: dict[str, list[float]] = {"alice": [], "bob": []}

        def relay(who: str):  # type: ignore[no-untyped-def]
            async def progress(value: float, total: float | None, message: str | None) -> None:
                seen[who].append(value)

            return progress

        async with (
            mcp_session(gateway.url(), token="tok-alice-0123") as alice,
            mcp_session(gateway.url(), token="tok-bob-4567") as bob,
        ):
            with anyio.fail_after(WAIT):
                await bob.call_tool("pid", {})  # no progress: the shared session
                for _ in range(2):
                    done = await alice.call_tool("progress", {"steps": 3}, progress_callback=relay("alice"))
                    assert first_text(done) == "done"
                assert first_text(await bob.call_tool("progress", {"steps": 3}, progress_callback=relay("bob")))
            assert seen == {"alice": [1, 2, 3, 1, 2, 3], "bob": [1, 2, 3]}
            shared, (own_a, again_a, own_b) = sessions(served.output(), "pid")[0], sessions(served.output(), "progress")
            assert own_a == again_a  # one session per caller, kept
            assert len({shared, own_a, own_b}) == 3  # each caller's own, and neither the shared one

            # The server forgets alice's session (it expired there): her next call opens another and is answered.
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                ended = await http.delete(
                    served.url(),
                    headers={"mcp-session-id": own_a, "mcp-protocol-version": "2025-06-18"},
                )
                assert ended.status_code == 200
            with anyio.fail_after(WAIT):
                done = await alice.call_tool("progress", {"steps": 2}, progress_callback=relay("alice"))
            assert first_text(done) == "done" and seen["alice"][-2:] == [1, 2]
            reopened = sessions(served.output(), "progress")[-1]
            assert reopened not in (own_a, own_b, shared)

    # The gateway stopped: the sessions it opened for its callers were ended at the server, not left to expire there.
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        for session in (own_b, reopened):
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            headers = {
                "mcp-session-id": session,
                "mcp-protocol-version": "2025-06-18",
                "accept": "application/json, text/event-stream",
            }
            assert (await http.post(served.url(), json=ping, headers=headers)).status_code == 404


async def test_past_the_limit_the_least_recently_used_idle_session_is_ended(
    downstream: Downstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three callers' own sessions where two may be kept: the first caller's is ended at the server (it answers 404),
    and that caller's next call opens another."""
    served = downstream("fidelity", "streamable_http", "--name", "f", own=True)
    monkeypatch.setattr(own, "MAX_OWN", 2)
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async def answer(request: object) -> object:
        raise AssertionError("the fidelity server's progress tool asks nothing")

    async def notify(notification: object) -> None:
        return None

    async with httpx2.AsyncClient(timeout=WAIT) as http, anyio.create_task_group() as closer:
        shared = HttpLane(http, served.url(), max_event_size=1 << 20)
        shared.closer = closer
        hello = await http.post(
            served.url(), json=INITIALIZE, headers={"accept": "application/json, text/event-stream"}
        )
        await shared.see(hello)
        shared.version = "2025-06-18"

        async def call(caller: str) -> str:
            with anyio.fail_after(WAIT):
                raw = await shared.own.request(
                    caller,
                    "tools/call",
                    {"name": "progress", "arguments": {"steps": 1}},
                    backend="f",
                    timeout_s=WAIT,
                    progress=progress,
                    relay=progress,
                    answer=answer,
                    notify=notify,
                )
            assert raw["content"][0]["text"] == "done"
            return sessions(served.output(), "progress")[-1]

        first = await call("a")
        await call("b")
        await call("c")  # past the limit: a's session, the least recently used, is ended
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"mcp-session-id": first, "mcp-protocol-version": "2025-06-18", "accept": ACCEPT}

        async def ended() -> bool:
            return (await http.post(served.url(), json=ping, headers=headers)).status_code == 404

        await eventually(ended, within=WAIT)
        assert await call("a") != first
        await shared.aclose()
        closer.cancel_scope.cancel()
    assert seen == [1, 1, 1, 1]


async def test_a_caller_whose_own_session_cannot_be_opened_is_served_on_the_shared_one(downstream: Downstreams) -> None:
    """The server refuses the own session's handshake: the call goes on the shared session, its progress relayed
    by the form that never waits."""
    served = downstream("fidelity", "streamable_http", "--name", "f", own=True)
    relayed: list[float] = []

    async def paced(value: float, total: float | None, message: str | None) -> None:
        raise AssertionError("the shared session's progress is never paced")

    async def relay(value: float, total: float | None, message: str | None) -> None:
        relayed.append(value)

    async def answer(request: object) -> object:
        raise AssertionError("the fidelity server's progress tool asks nothing")

    async def notify(notification: object) -> None:
        return None

    async with httpx2.AsyncClient(timeout=WAIT) as http:
        shared = HttpLane(http, served.url(), max_event_size=1 << 20)
        hello = await http.post(served.url(), json=INITIALIZE, headers={"accept": ACCEPT})
        await shared.see(hello)
        shared.version = "2025-06-18"
        assert shared.session_id is not None
        shared.hello = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 7}}'
        with anyio.fail_after(WAIT):
            raw = await shared.own.request(
                "alice",
                "tools/call",
                {"name": "progress", "arguments": {"steps": 2}},
                backend="f",
                timeout_s=WAIT,
                progress=paced,
                relay=relay,
                answer=answer,
                notify=notify,
            )
        assert raw["content"][0]["text"] == "done" and relayed == [1, 2]
        assert sessions(served.output(), "progress")[-1] == shared.session_id
