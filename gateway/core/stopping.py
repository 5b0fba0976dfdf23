"""Stopping in order, whatever is cancelling: the steps of the gateway's exit stack (``Gateway.running``).

A context that owns a task group (the PostgreSQL ledger's writers) cannot be left inside a cancel scope opened after
it; ``held_apart`` enters it in a shielded task of its own instead, and ``shielded`` runs one closing step to its end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TypeVar

import anyio
from anyio.abc import TaskStatus

__all__ = ["held_apart", "shielded"]

T = TypeVar("T")


async def shielded(step: Callable[[], Awaitable[object]]) -> None:
    """Run one step of the gateway's stopping to its end, even while the gateway is being cancelled."""
    with anyio.CancelScope(shield=True):
        await step()


@asynccontextmanager
async def held_apart(context: AbstractAsyncContextManager[T]) -> AsyncIterator[T]:
    """Enter ``context`` in a task of its own, shielded, and leave it when this block ends: its own task group (a
    ledger's background writers) is entered and left in order whatever cancels the block, and its closing steps
    (the ledger's last commits) run to their end. A failure to enter it is raised as it is."""
    stop = anyio.Event()

    async def hold(*, task_status: TaskStatus[tuple[T | None, Exception | None]]) -> None:
        with anyio.CancelScope(shield=True):
            async with AsyncExitStack() as stack:
                try:
                    value = await stack.enter_async_context(context)
                except Exception as exc:
                    task_status.started((None, exc))
                    return
                task_status.started((value, None))
                await stop.wait()

    async with anyio.create_task_group() as tg:
        value, failure = await tg.start(hold)
        if failure is None:
            try:
                yield value
            finally:
                stop.set()
    if failure is not None:
        raise failure
