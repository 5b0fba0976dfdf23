"""``FairSlots`` (backends/mcp/slots.py): a backend's calls at once, shared fairly by callers, in memory."""

from __future__ import annotations

import anyio
import pytest

from gateway.backends.mcp.slots import FairSlots

pytestmark = pytest.mark.anyio


async def test_a_caller_holds_at_most_its_share_and_another_caller_gets_a_slot_at_once() -> None:
    slots = FairSlots(4, 2)
    assert await slots.take("alice", 1) and await slots.take("alice", 1)
    assert not await slots.take("alice", 0.01)  # her share is 2, though 2 slots are free
    assert await slots.take("bob", 0.01)
    assert slots.statistics().busy == 3


async def test_a_freed_slot_goes_to_the_waiting_caller_that_holds_the_fewest() -> None:
    slots = FairSlots(2, 2)
    assert await slots.take("alice", 1) and await slots.take("alice", 1)
    order: list[str] = []

    async def wait(caller: str) -> None:
        assert await slots.take(caller, 5)
        order.append(caller)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "alice")  # alice came first, but holds two already
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(wait, "bob")
            await anyio.wait_all_tasks_blocked()
            slots.give("alice")
            await anyio.wait_all_tasks_blocked()
            assert order == ["bob"]
            slots.give("alice")
    assert order == ["bob", "alice"]


async def test_a_waiter_that_gives_up_or_is_cancelled_leaves_no_slot_taken() -> None:
    slots = FairSlots(1, 1)
    assert await slots.take("alice", 1)
    assert not await slots.take("bob", 0.01)
    with anyio.move_on_after(0.01):
        await slots.take("carol", 5)
    assert slots.statistics().waiting == 0
    slots.give("alice")
    assert slots.statistics().busy == 0
    assert await slots.take("bob", 0.01)
