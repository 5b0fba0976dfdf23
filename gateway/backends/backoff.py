"""How long a backend waits before it tries again: tenacity wait strategies, so every retry loop is a tenacity loop
with ``sleep=anyio.sleep`` (cancellable) and no delay arithmetic of its own.

``backoff(first_s, max_s)`` waits ``first_s`` after the first failed attempt, twice as long after each further one,
at most ``max_s``; every wait is spread by a random factor in [0.8, 1.2] (``spread``), so the retries of many
backends, and of many gateways, do not fall in step.

``supervise(serve, ...)`` is a backend's run loop: ``serve`` again and again, forever, after a wait when it failed,
telling the task that started it once the first attempt has an outcome.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio
from anyio.abc import TaskStatus
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.wait import wait_base, wait_exponential

__all__ = ["SPREAD", "backoff", "spread", "supervise"]

SPREAD = 0.2
"""Every wait is its nominal length times a random factor in [1 - SPREAD, 1 + SPREAD]."""


def spread(seconds: float) -> float:
    """``seconds`` spread by ``SPREAD`` (for a fixed period: a re-check, a ping)."""
    return seconds * random.uniform(1 - SPREAD, 1 + SPREAD)


class _Spread(wait_base):
    """A tenacity wait: ``inner``'s wait, spread by ``SPREAD``."""

    def __init__(self, inner: wait_base) -> None:
        self._inner = inner

    def __call__(self, retry_state: RetryCallState) -> float:
        return spread(self._inner(retry_state))


def backoff(first_s: float, max_s: float) -> wait_base:
    """The wait before attempt n + 1: ``first_s * 2 ** (n - 1)``, at most ``max_s``, spread by ``SPREAD``."""
    return _Spread(wait_exponential(multiplier=first_s, max=max_s))


async def supervise(
    serve: Callable[[Callable[[], None]], Awaitable[None]],
    *,
    retry: type[BaseException],
    wait: wait_base,
    task_status: TaskStatus[None],
) -> NoReturn:
    """Run ``serve(first_outcome)`` until cancelled: again at once when it returns, and after ``wait`` (tenacity's,
    from the first failure of a run of failures) when it raises ``retry``; any other exception ends the loop.
    ``task_status.started()`` is called once, at the first outcome: ``serve`` calling ``first_outcome()`` (it is
    ready) or its first failure."""
    started = False

    def first_outcome() -> None:
        nonlocal started
        if not started:
            started = True
            task_status.started()

    while True:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(retry),
            wait=wait,
            sleep=anyio.sleep,
            before_sleep=lambda state: first_outcome(),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await serve(first_outcome)
