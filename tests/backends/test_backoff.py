"""The waits between a backend's attempts (gateway/backends/backoff.py), computed as tenacity computes them."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from tenacity import RetryCallState, wait_fixed

from gateway.backends.backoff import SPREAD, backoff, spread, supervise


class _Down(Exception):
    pass


def _wait_after(attempt: int, first_s: float, max_s: float) -> float:
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = attempt
    return backoff(first_s, max_s)(state)


def test_the_wait_doubles_from_the_first_step_up_to_the_cap_each_spread_by_a_fifth() -> None:
    for attempt, nominal in [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (50, 30.0), (10_000, 30.0)]:
        waits = [_wait_after(attempt, 0.5, 30.0) for _ in range(200)]
        assert all(nominal * (1 - SPREAD) <= w <= nominal * (1 + SPREAD) for w in waits), attempt
        assert len(set(waits)) > 1  # spread, so many backends do not retry in step


def test_a_fixed_period_is_spread_the_same_way() -> None:
    periods = [spread(60.0) for _ in range(200)]
    assert all(48.0 <= p <= 72.0 for p in periods) and len(set(periods)) > 1


@pytest.mark.anyio
async def test_supervise_starts_at_the_first_failure_retries_and_serves_again_after_a_return() -> None:
    attempts: list[str] = []
    ended = anyio.Event()

    async def serve(ready: Callable[[], None]) -> None:
        attempts.append("try")
        if len(attempts) <= 2:
            raise _Down  # retried after the wait
        ready()  # a second "ready" after the first outcome must not call started() again
        if len(attempts) == 4:
            ended.set()
            await anyio.sleep_forever()
        # returns: served again at once

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(
                lambda task_status: supervise(serve, retry=_Down, wait=wait_fixed(0), task_status=task_status)
            )
            assert attempts == ["try"]  # started at the first outcome: its failure
            await ended.wait()
            tg.cancel_scope.cancel()
    assert attempts == ["try"] * 4


@pytest.mark.anyio
async def test_supervise_lets_any_other_error_end_the_loop() -> None:
    async def serve(ready: Callable[[], None]) -> None:
        raise ValueError("a bug")

    with anyio.fail_after(5), pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: supervise(serve, retry=_Down, wait=wait_fixed(0), task_status=anyio.TASK_STATUS_IGNORED)
            )
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
