"""What the gateway is serving now, for a reload's drain and the shutdown: calls in flight per backend, and a scope
per request that the shutdown cancels (``abort``), so whatever is in progress, and whatever comes later, is answered
as cancelled instead of being served."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from gateway.backends.base import Backend

__all__ = ["Drain"]


class Drain:
    """Requests in progress (``abortable``), and calls in flight per backend (``busy``)."""

    def __init__(self) -> None:
        self._inflight: dict[int, int] = {}  # id(backend) -> calls in progress on it (a reload drains by this)
        self._idle: dict[int, anyio.Event] = {}
        self._calls: set[anyio.CancelScope] = set()  # every request being served: the shutdown cancels them
        self._no_calls: anyio.Event | None = None
        self.closing: str | None = None
        """Why the gateway is stopping, once ``abort`` was called."""

    def inflight(self, backend: Backend) -> int:
        return self._inflight.get(id(backend), 0)

    async def wait_idle(self, backend: Backend) -> None:
        """Return once no call is in progress on ``backend`` (bound it with a deadline)."""
        while self._inflight.get(id(backend), 0):
            await self._idle.setdefault(id(backend), anyio.Event()).wait()

    def calls_in_progress(self) -> int:
        return len(self._calls)

    async def wait_no_calls(self) -> None:
        """Return once no request is being served (bound it with a deadline)."""
        while self._calls:
            if self._no_calls is None:
                self._no_calls = anyio.Event()
            await self._no_calls.wait()

    def abort(self, reason: str) -> None:
        """The gateway is stopping: every request in progress, and every later one, is answered as cancelled with
        ``reason`` instead of being served."""
        self.closing = reason
        for scope in list(self._calls):
            scope.cancel()

    @contextmanager
    def abortable(self) -> Iterator[anyio.CancelScope]:
        """A scope ``abort()`` cancels (the cancellation ends inside it: the caller's code after it runs); while it
        is open the request counts as in progress, and the last one to close wakes a drain waiting for none."""
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                yield scope
            finally:
                self._calls.discard(scope)
                if not self._calls and self._no_calls is not None:
                    self._no_calls.set()
                    self._no_calls = None

    @contextmanager
    def busy(self, backend: Backend) -> Iterator[None]:
        """Count a call or request as in flight on ``backend`` while the block runs (a reload drains by this)."""
        key = id(backend)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        try:
            yield
        finally:
            remaining = self._inflight[key] = self._inflight[key] - 1
            if not remaining:
                del self._inflight[key]
                idle = self._idle.pop(key, None)
                if idle is not None:
                    idle.set()
