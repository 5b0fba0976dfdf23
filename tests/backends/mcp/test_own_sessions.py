"""A caller's calls that stream progress go on a session of its own beside a streamable HTTP server's shared session
(backends/mcp/own.py): one per caller, opened at its first such call and kept; another caller's are their own; a
call without progress stays on the shared session; a session the server no longer knows is opened again and the
call answered; the sessions end at the server with the gateway. Over a real gateway process and the real fidelity
server on loopback, which notes the session of every call it receives."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest

from gateway.backends.mcp import own
from gateway.backends.mcp.own import SessionLane
from tests.fixtures.downstreams import Downstream, Downstreams
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

    # The gateway stopped: the sessions it opened, the shared one and its callers' own, were ended at the server, not
    # left to expire there.
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        for session in (shared, own_b, reopened):
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            headers = {
                "mcp-session-id": session,
                "mcp-protocol-version": "2025-06-18",
                "accept": "application/json, text/event-stream",
            }
            assert (await http.post(served.url(), json=ping, headers=headers)).status_code == 404


class Beside:
    """A shared session's direct lane to a real server, opened by hand, and calls on its callers' own sessions."""

    def __init__(self, http: httpx2.AsyncClient, served: Downstream, closer: anyio.abc.TaskGroup | None) -> None:
        self.http, self.served = http, served
        self.shared = SessionLane(http, served.url(), max_event_size=1 << 20)
        self.shared.closer = closer
        self.paced: list[float] = []
        self.relayed: list[float] = []

    async def open(self) -> None:
        await self.shared.see(await self.http.post(self.served.url(), json=INITIALIZE, headers={"accept": ACCEPT}))
        self.shared.version = "2025-06-18"
        assert self.shared.session_id is not None

    async def call(self, caller: str, steps: int = 1) -> str:
        """``caller``'s progress call; the session it went on (as the server noted it)."""

        async def paced(value: float, total: float | None, message: str | None) -> None:
            self.paced.append(value)

        async def relay(value: float, total: float | None, message: str | None) -> None:
            self.relayed.append(value)

        async def answer(request: object) -> object:
            raise AssertionError("the fidelity server's progress tool asks nothing")

        async def notify(notification: object) -> None:
            return None

        with anyio.fail_after(WAIT):
            raw = await self.shared.own.request(
                caller,
                "tools/call",
                {"name": "progress", "arguments": {"steps": steps}},
                backend="f",
                timeout_s=WAIT,
                progress=paced,
                relay=relay,
                answer=answer,
                notify=notify,
            )
        assert raw["content"][0]["text"] == "done"
        return sessions(self.served.output(), "progress")[-1]

    async def ended(self, session: str) -> None:
        """Wait until the server no longer knows ``session`` (it answers 404)."""
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"mcp-session-id": session, "mcp-protocol-version": "2025-06-18", "accept": ACCEPT}

        async def gone() -> bool:
            return (await self.http.post(self.served.url(), json=ping, headers=headers)).status_code == 404

        await eventually(gone, within=WAIT)


@asynccontextmanager
async def beside(served: Downstream) -> AsyncIterator[Beside]:
    async with httpx2.AsyncClient(timeout=WAIT) as http, anyio.create_task_group() as closer:
        lane = Beside(http, served, closer)
        await lane.open()
        yield lane
        await lane.shared.aclose()
        closer.cancel_scope.cancel()


async def test_past_the_limit_the_least_recently_used_idle_session_is_ended(
    downstream: Downstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three callers' own sessions where two may be kept: the first caller's is ended at the server, and that
    caller's next call opens another."""
    monkeypatch.setattr(own, "MAX_OWN", 2)
    async with beside(downstream("fidelity", "streamable_http", "--name", "f", own=True)) as lane:
        first = await lane.call("a")
        await lane.call("b")
        await lane.call("c")  # past the limit: a's session, the least recently used, is ended
        await lane.ended(first)
        assert await lane.call("a") != first
    assert lane.paced == [1, 1, 1, 1] and lane.relayed == []


async def test_a_session_unused_for_its_idle_time_is_ended(
    downstream: Downstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the next caller's call comes, a session unused for ``IDLE_S`` is ended at the server."""
    async with beside(downstream("fidelity", "streamable_http", "--name", "f", own=True)) as lane:
        first = await lane.call("a")
        assert await lane.call("a") == first  # kept while it is used
        monkeypatch.setattr(own, "IDLE_S", 0.0)
        await lane.call("b")
        await lane.ended(first)


async def test_a_caller_whose_own_session_cannot_be_opened_is_served_on_the_shared_one(downstream: Downstreams) -> None:
    """The server refuses the own session's handshake: the call goes on the shared session, its progress relayed
    by the form that never waits."""
    async with beside(downstream("fidelity", "streamable_http", "--name", "f", own=True)) as lane:
        lane.shared.hello = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 7}}'
        assert await lane.call("alice", steps=2) == lane.shared.session_id
    assert lane.relayed == [1, 2] and lane.paced == []
