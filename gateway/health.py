"""Per-backend circuit breakers: stop sending calls to a backend that keeps failing, then try it again.

A backend's own supervisor already knows when it is *down* (its session closed, its command is missing) and
re-probes it with backoff. The breaker covers the other case: a backend that is up but whose calls keep failing
(timing out, crashing mid-call). The states, per backend:

    closed ──(``failure_threshold`` consecutive failures)──> open
    open ──(``cooldown_s`` elapsed; the next call is the trial)──> half-open
    half-open ──(the trial succeeds)──> closed
    half-open ──(the trial fails)──> open, with the cooldown doubled (capped at ``max_cooldown_s``)

While open, the router skips the backend (the step is recorded as ``circuit_open`` with the reason) and the route
or ladder moves on, so a sick provider costs callers nothing instead of a timeout each. Only provider failures count
(``BackendError``); a downstream ``isError`` answer and a refused argument are answers, and reset the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Breaker", "BreakerState", "Breakers"]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass
class Breaker:
    failure_threshold: int = 5
    cooldown_s: float = 30.0
    max_cooldown_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    current_cooldown_s: float = 0.0
    last_failure: str | None = None
    _trial_out: bool = False

    def allow(self) -> bool:
        """Whether a call may go to this backend now (in half-open, only one trial at a time)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if self.clock() - self.opened_at < self.current_cooldown_s:
                return False
            self.state = BreakerState.HALF_OPEN
            self._trial_out = False
        if self._trial_out:
            return False
        self._trial_out = True
        return True

    def success(self) -> None:
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.current_cooldown_s = 0.0
        self._trial_out = False

    def failure(self, reason: str) -> None:
        self.last_failure = reason
        if self.state is BreakerState.HALF_OPEN:
            self._open(min(self.current_cooldown_s * 2, self.max_cooldown_s))
            return
        self.failures += 1
        if self.state is BreakerState.CLOSED and self.failures >= self.failure_threshold:
            self._open(self.cooldown_s)

    def _open(self, cooldown: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = self.clock()
        self.current_cooldown_s = cooldown
        self._trial_out = False

    def reason(self) -> str:
        remaining = max(0.0, self.current_cooldown_s - (self.clock() - self.opened_at))
        if self.state is BreakerState.OPEN:
            return (
                f"circuit open after {self.failures} consecutive failures (last: {self.last_failure}); "
                f"next trial in {remaining:.0f} s"
            )
        if self.state is BreakerState.HALF_OPEN:
            return f"circuit half-open: trying one call (last failure: {self.last_failure})"
        return "circuit closed"


class Breakers:
    """One breaker per backend name, created on first use with the same settings."""

    def __init__(self, failure_threshold: int = 5, cooldown_s: float = 30.0, max_cooldown_s: float = 300.0) -> None:
        self._settings = (failure_threshold, cooldown_s, max_cooldown_s)
        self._by_backend: dict[str, Breaker] = {}

    def __getitem__(self, backend: str) -> Breaker:
        breaker = self._by_backend.get(backend)
        if breaker is None:
            threshold, cooldown, cap = self._settings
            breaker = self._by_backend[backend] = Breaker(threshold, cooldown, cap)
        return breaker

    def get(self, backend: str) -> Breaker | None:
        return self._by_backend.get(backend)

    def forget(self, backend: str) -> None:
        self._by_backend.pop(backend, None)
