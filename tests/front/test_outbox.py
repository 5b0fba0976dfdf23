"""``Outbox`` in memory, against a client that reads and one that never does: nothing put in it waits for the
client, a reading client gets every notification in order before the request ends, progress for a client that does
not read is coalesced to the latest (past half of ``limit_bytes``), and log messages waiting beyond ``limit_bytes``
shed the client (tests/front/test_slow_clients.py drives the same over a real gateway, downstream and socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

import gateway.front.outbox as outbox_module
from gateway.front.outbox import FLOOD_BYTES, SLOW_S, Outbox

pytestmark = pytest.mark.anyio


class Client:
    """A client's end: ``report`` and ``say`` record what was sent; with ``reading`` cleared, the first send to it
    blocks (``stuck`` tells when) and nothing after it is taken."""

    def __init__(self, *, reading: bool) -> None:
        self.sent: list[Any] = []
        self.reading = reading
        self.stuck = anyio.Event()

    async def _take(self, item: Any) -> None:
        if not self.reading:
            self.stuck.set()
            await anyio.sleep_forever()
        self.sent.append(item)

    async def report(self, progress: float, total: float | None, message: str | None) -> None:
        await self._take(("progress", progress))

    def say(self, text: str) -> Callable[[], Coroutine[Any, Any, None]]:
        return lambda: self._take(("log", text))


@asynccontextmanager
async def outbox(client: Client, *, limit_bytes: int = 4096) -> AsyncIterator[Outbox]:
    async with anyio.create_task_group() as tg:
        box = Outbox(
            client.report, lambda deliver: tg.start_soon(deliver), limit_bytes=limit_bytes, stall_s=60, caller="c"
        )
        yield box
        with anyio.fail_after(5):
            await box.close()


async def stuck(box: Outbox, client: Client) -> Any:
    """``box``'s progress function, once a first progress is being sent to ``client`` (who never takes it)."""
    progress = box.progress
    assert progress is not None
    await progress(1, None, None)
    with anyio.fail_after(5):
        await client.stuck.wait()  # the first is being sent, and never taken
    return progress


async def test_a_reading_client_gets_every_notification_in_order_before_the_request_ends() -> None:
    client = Client(reading=True)
    async with outbox(client) as box:
        progress = box.progress
        assert progress is not None
        await progress(1, 3, None)
        box.send(client.say("one"), 10)
        await progress(2, 3, None)
        box.send(client.say("two"), 10)
    assert client.sent == [("progress", 1), ("log", "one"), ("progress", 2), ("log", "two")]
    assert box.shed is None


async def test_progress_for_a_client_that_does_not_read_is_coalesced_to_the_latest() -> None:
    client = Client(reading=False)
    async with outbox(client, limit_bytes=1024) as box:
        progress = await stuck(box, client)
        for step in range(2, 100_000):  # nothing waits for the client
            await progress(step, None, None)
        waiting = list(box._queue)  # up to half the limit in bytes, then only the latest is kept
        assert sum(size for _, _, size in waiting) <= 1024 // 2 + 96
        assert waiting[-1][0] == [99_999, None, None]
        assert box.shed is None


async def test_log_messages_waiting_beyond_the_limit_shed_the_client_alone() -> None:
    client = Client(reading=False)
    async with outbox(client, limit_bytes=1024) as box:
        box.send(client.say("first"), 600)
        with anyio.fail_after(5):
            await client.stuck.wait()
        box.send(client.say("second"), 600)
        assert box.shed is None
        box.send(client.say("third"), 600)
        assert box.shed is not None and "gateway.edge.client_buffer_bytes (1,024)" in box.shed
        assert box.scope.cancel_called  # the request's work is given up
        box.send(client.say("fourth"), 600)  # and nothing more is kept for it
        assert not box._queue
    assert client.sent == []


async def test_progress_flooding_a_client_that_takes_nothing_sheds_it_once_its_unread_bytes_pass_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a client leaves unread of a flood costs the downstream's work, and everyone else's CPU, even though the
    # gateway keeps only the latest: once a send has been stuck for SLOW_S, the progress coalesced away is counted
    # against FLOOD_BYTES, and the client is shed long before client_stall_s. The outbox's clock is the test's.
    now = [1000.0]
    monkeypatch.setattr(outbox_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    client = Client(reading=False)
    async with outbox(client, limit_bytes=4096) as box:
        progress = await stuck(box, client)
        now[0] += SLOW_S * 0.9
        for step in range(2, 2_000):  # stuck, but not yet for SLOW_S: only coalesced
            await progress(step, None, None)
        assert box.shed is None
        now[0] += SLOW_S * 0.2  # stuck for over SLOW_S
        step = 2_000
        while box.shed is None and step < 4_000:
            await progress(step, None, None)
            step += 1
        assert box.shed is not None and "progress" in box.shed and f"(over {FLOOD_BYTES:,})" in box.shed
        assert step - 2_000 <= FLOOD_BYTES // 96 + 2  # shed at the bound, not later
        assert box.scope.cancel_called


async def test_a_slow_client_that_keeps_reading_is_never_shed_for_the_progress_it_misses() -> None:
    # A client that takes each notification in under SLOW_S is behind, not stalled: its progress is coalesced, and
    # however much is coalesced away, its call goes on.
    sent: list[float] = []

    async def slow_report(progress: float, total: float | None, message: str | None) -> None:
        await anyio.sleep(0.01)
        sent.append(progress)

    async with anyio.create_task_group() as tg:
        box = Outbox(slow_report, lambda deliver: tg.start_soon(deliver), limit_bytes=1024, stall_s=60, caller="c")
        progress = box.progress
        assert progress is not None
        with anyio.fail_after(10):
            for step in range(20_000):
                await progress(step, None, None)
                if step % 100 == 0:
                    await anyio.sleep(0.005)
        assert box.shed is None
        with anyio.fail_after(5):
            await box.close()
    assert sent and sent[-1] == 19_999 and len(sent) < 20_000
