"""What a stdio server says for a direct call that has ended (stdio.py ``StdioLane``): it is the lane's own, and the
SDK session on the same pipes is handed none of it.

A direct call's id and progress token are the lane's (``gw-N``, never one of the session's integer ids). While the
call waits, the reader hands its lines to it; once it has ended (answered, cancelled, shed because its client does
not read), what the server still says for it (the progress already in the pipe, a late answer) belonged to no one.
Handed to the SDK session, each such line was validated by pydantic and spawned a task of its own, on the one read
of the shared pipe that every other caller's answers from that server wait behind. Real process:
tests/fixtures/fidelity_server.py over stdio.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession

from gateway.backends.mcp.fastpath import MESSAGES_PER_TURN
from gateway.backends.mcp.stdio import open_stdio
from tests.fixtures.gateway_proc import FIDELITY
from tests.fixtures.turns import Handed

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


async def _answer(*_: Any) -> None:
    return None


async def test_progress_for_a_cancelled_direct_call_never_reaches_the_session() -> None:
    seen: list[str | None] = []  # what the session was handed, by method

    async def handler(message: Any) -> None:
        seen.append(getattr(message, "method", None))

    with tempfile.TemporaryFile() as stderr, anyio.fail_after(30):
        async with open_stdio(sys.executable, [str(FIDELITY), "--stdio"], env=None, cwd=None, stderr=stderr) as (
            read,
            write,
            proc,
        ):
            async with ClientSession(read, write, message_handler=handler) as session:
                init = await session.initialize()
                proc.lane.version = init.protocol_version
                progressed = anyio.Event()

                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    progressed.set()

                async with anyio.create_task_group() as tg:

                    async def flood() -> None:
                        await proc.lane.request(
                            "tools/call",
                            {"name": "progress", "arguments": {"steps": 200_000}},
                            timeout_s=None,
                            progress=on_progress,
                            answer=_answer,
                            notify=_answer,
                        )

                    tg.start_soon(flood)
                    await progressed.wait()
                    tg.cancel_scope.cancel()  # the call ends; the server is told, and stops when it reads that
                # The server answers in order: whatever it said for the call before this answer has been read.
                assert (await session.list_tools()).tools
    assert "notifications/progress" not in seen  # before: the progress in the pipe when the call was cancelled


async def test_a_flood_is_handed_on_a_few_messages_per_turn_so_every_other_task_runs_between() -> None:
    # A server flooding progress fills each 64 KiB read with hundreds of lines; handed on in one piece (tens of
    # microseconds each), every other caller's request waited behind each read, and behind the call's own delivery.
    handed = Handed()
    with tempfile.TemporaryFile() as stderr, anyio.fail_after(60):
        async with open_stdio(sys.executable, [str(FIDELITY), "--stdio"], env=None, cwd=None, stderr=stderr) as (
            read,
            write,
            proc,
        ):
            async with ClientSession(read, write) as session:
                proc.lane.version = (await session.initialize()).protocol_version
                await handed.flood(proc.lane, 20_000)
    assert handed.count == 20_000
    assert max(handed.gaps) <= 2 * MESSAGES_PER_TURN, f"{max(handed.gaps)} handed on in one turn"
