"""The circuit breaker's state machine, driven by a fake clock (and a fake backend for its reconnects)."""

from __future__ import annotations

from gateway.backends.base import BackendState
from gateway.core.breakers import Breaker, Breakers, BreakerState
from gateway.testing import FakeBackend


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock) -> Breaker:
    return Breaker(failure_threshold=3, cooldown_s=10.0, max_cooldown_s=25.0, clock=clock)


def test_the_breaker_opens_after_the_threshold_of_consecutive_failures() -> None:
    b = breaker(Clock())
    for _ in range(2):
        assert b.allow()
        b.failure("timed out")
    assert b.state is BreakerState.CLOSED
    b.failure("timed out")
    assert b.state is BreakerState.OPEN
    assert not b.allow()
    assert "circuit open after 3 consecutive failures (last: timed out)" in b.reason()


def test_a_success_resets_the_count_of_failures() -> None:
    b = breaker(Clock())
    b.failure("x")
    b.failure("x")
    b.success()
    b.failure("x")
    b.failure("x")
    assert b.state is BreakerState.CLOSED


def test_after_the_cooldown_one_trial_call_is_let_through_and_its_success_closes_the_breaker() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failure("crash")
    clock.now += 9.9
    assert not b.allow()
    clock.now += 0.2
    assert b.allow()  # the trial
    assert b.state is BreakerState.HALF_OPEN
    assert not b.allow()  # only one trial at a time
    b.success()
    assert b.state is BreakerState.CLOSED and b.allow()


def test_a_failed_trial_reopens_with_a_doubled_capped_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failure("crash")
    for expected in (20.0, 25.0, 25.0):
        clock.now += b.current_cooldown_s
        assert b.allow()
        b.failure("still broken")
        assert b.state is BreakerState.OPEN
        assert b.current_cooldown_s == expected


def test_breakers_are_per_backend_and_can_be_forgotten() -> None:
    breakers = Breakers(failure_threshold=1)
    breakers["a"].failure("x")
    assert breakers["a"].state is BreakerState.OPEN
    assert breakers["b"].state is BreakerState.CLOSED
    breakers.forget("a")
    assert breakers.get("a") is None and breakers["a"].state is BreakerState.CLOSED


def test_failures_that_share_a_cause_count_once() -> None:
    b = breaker(Clock())
    crash, other = object(), object()
    for _ in range(8):  # eight calls lost to one crash
        b.failure("the connection closed", cause=crash)
    assert b.failures == 1 and b.state is BreakerState.CLOSED
    b.failure("the connection closed", cause=other)
    b.failure("timed out")  # no cause: each one counts
    assert b.failures == 3 and b.state is BreakerState.OPEN


def test_a_reconnect_closes_an_open_breaker() -> None:
    b = breaker(Clock())
    for _ in range(3):
        b.failure("crash")
    assert not b.allow()
    b.reconnected()
    assert b.state is BreakerState.CLOSED and b.failures == 0 and b.allow()


def test_a_trial_that_raises_hands_the_trial_back_and_only_its_own() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failure("crash")
    clock.now += 10.0
    trial = b.allow()
    assert trial and b.state is BreakerState.HALF_OPEN
    assert not b.allow()
    try:
        with trial:
            raise KeyboardInterrupt  # stands for the caller's cancellation
    except KeyboardInterrupt:
        pass
    assert b.state is BreakerState.HALF_OPEN
    second = b.allow()  # the trial is free again
    assert second
    with trial:  # the first caller's admission no longer holds the trial: leaving it releases nothing
        pass
    try:
        with b.allow():
            raise RuntimeError
    except RuntimeError:
        pass
    assert not b.allow()  # `second` still holds the trial
    b.success()
    assert b.state is BreakerState.CLOSED


def test_a_breaker_closes_when_its_backend_is_ready_again() -> None:
    backend = FakeBackend("a", ["t"])
    breakers = Breakers(failure_threshold=1)
    b = breakers.of(backend)
    b.failure("crash")
    assert b.state is BreakerState.OPEN
    backend.set_state(BackendState.FAILED, "the connection closed")
    assert b.state is BreakerState.OPEN
    backend.set_state(BackendState.READY)
    assert b.state is BreakerState.CLOSED
