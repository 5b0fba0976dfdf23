"""Per-backend circuit breakers: stop sending calls to a backend that keeps failing, then try it again.

A backend's own supervisor already knows when it is *down* (its session closed, its command is missing) and
re-probes it with backoff. The breaker covers the other case: a backend that is up but whose calls keep failing
(timing out, crashing mid-call). The states, per backend:

    closed ──(``failure_threshold`` consecutive failures)──> open
    open ──(``cooldown_s`` elapsed; the next call is the trial)──> half-open
    half-open ──(the trial succeeds)──> closed
    half-open ──(the trial fails)──> open, with the cooldown doubled (capped at ``max_cooldown_s``)
    open, half-open ──(the backend reconnects)──> closed

While open, the router skips the backend (the step is recorded as ``circuit_open`` with the reason) and the route
or ladder moves on, so a sick provider costs callers nothing instead of a timeout each. Only provider failures count
(``BackendError``); a downstream ``isError`` answer, a JSON-RPC error, an oversized answer and a refused argument are
answers, and reset the count.

Three rules keep one fault from looking like many:
  * failures that share a cause count once: when a downstream crashes with 8 calls in flight, the 8 calls fail
    with the same cause (the lost session, ``BackendError.cause``) and are one failure, not 8;
  * a successful reconnect closes the breaker: the backend's own supervisor has seen it come back (READY after
    not READY), so waiting out the cooldown would only refuse calls a fresh session can serve;
  * a trial that ends without an outcome (its caller cancelled) hands the trial back: ``allow()`` answers an
    ``Admission``, and the call made under ``with admission:`` releases its trial when it raises.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType

from gateway.backends.base import Backend, BackendState
from gateway.errors import BackendError

__all__ = ["Admission", "Breaker", "BreakerState", "Breakers"]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Admission:
    """``Breaker.allow()``'s answer: true when the call may go. Entered around the call (``with admission:``), a
    trial call that raises (is cancelled) hands its trial back, so the breaker does not stay half-open forever."""

    __slots__ = ("_breaker", "_allowed")

    def __init__(self, breaker: Breaker | None, allowed: bool) -> None:
        self._breaker = breaker  # set only for the half-open trial
        self._allowed = allowed

    def __bool__(self) -> bool:
        return self._allowed

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and self._breaker is not None:
            self._breaker._release(self)


_ADMITTED = Admission(None, True)
_REFUSED = Admission(None, False)


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
    _trial: Admission | None = None
    _last_cause: object = field(default=None, repr=False)

    def allow(self) -> Admission:
        """Whether a call may go to this backend now (in half-open, only one trial at a time)."""
        if self.state is BreakerState.CLOSED:
            return _ADMITTED
        if self.state is BreakerState.OPEN:
            if self.clock() - self.opened_at < self.current_cooldown_s:
                return _REFUSED
            self.state = BreakerState.HALF_OPEN
            self._trial = None
        if self._trial is not None:
            return _REFUSED
        self._trial = Admission(self, True)
        return self._trial

    def success(self) -> None:
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.current_cooldown_s = 0.0
        self._trial = None

    def failure(self, reason: str, *, cause: object = None) -> None:
        """Count one failure; another failure with the same ``cause`` as the last one counted is not counted."""
        if cause is not None and cause == self._last_cause:
            return
        self._last_cause = cause
        self.last_failure = reason
        if self.state is BreakerState.HALF_OPEN:
            self._open(min(self.current_cooldown_s * 2, self.max_cooldown_s))
            return
        self.failures += 1
        if self.state is BreakerState.CLOSED and self.failures >= self.failure_threshold:
            self._open(self.cooldown_s)

    def judge(self, failure: BackendError | None, reason: str | None, *, abandoned: bool = False) -> None:
        """A step's verdict: an answer (even an error, thin or too large) is a sign of life; a step that never reached
        the backend (saturated) is none, and hands a trial back; so is a step whose backend was waiting for the
        caller's own answer (``abandoned``: a bridged call its client left)."""
        if failure is not None and (not failure.verdict or abandoned):
            self.abstain()
        elif failure is None or failure.answered:
            self.success()
        else:
            self.failure(reason or failure.outcome, cause=failure.cause)

    def abstain(self) -> None:
        """A call that says nothing of the backend (it was never sent): a half-open trial is handed back."""
        self._trial = None

    def reconnected(self) -> None:
        """The backend came back (its supervisor made a new session): an open or half-open breaker closes."""
        if self.state is not BreakerState.CLOSED:
            self.success()

    def _release(self, admission: Admission) -> None:
        if self._trial is admission:
            self._trial = None

    def _open(self, cooldown: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = self.clock()
        self.current_cooldown_s = cooldown
        self._trial = None

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
        self._watched: weakref.WeakSet[Backend] = weakref.WeakSet()

    def of(self, backend: Backend) -> Breaker:
        """The breaker of ``backend``, which from now on closes when the backend reconnects (READY again after
        having been anything else)."""
        if backend not in self._watched:
            self._watched.add(backend)
            self._watch(backend)
        return self[backend.name]

    def _watch(self, backend: Backend) -> None:
        ref = weakref.ref(backend)
        ready = backend.status.state is BackendState.READY

        def changed() -> None:
            nonlocal ready
            watched = ref()
            if watched is None:
                return
            was_ready, ready = ready, watched.status.state is BackendState.READY
            breaker = self._by_backend.get(watched.name)
            if ready and not was_ready and breaker is not None:
                breaker.reconnected()

        backend.subscribe(changed)

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
