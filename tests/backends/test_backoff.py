"""The waits between a backend's attempts (gateway/backends/backoff.py), computed as tenacity computes them."""

from __future__ import annotations

from tenacity import RetryCallState

from gateway.backends.backoff import SPREAD, backoff, spread


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
