"""What the gateway's clients hold on one downstream across its sessions: the log level and resource subscriptions.

``Held`` keeps them and restores them on each new handshake-era session (``restore``), and the level alone on a
dual-era downstream's handshake twin as it opens (``restore_log_level``: subscriptions are made on it from the first).
A subscription is counted: the downstream is asked once for a URI however many clients subscribe, and told when the
last one goes. Setting the log level or restoring either never raises (a failure is logged); a first subscription
raises the backend's error.

A stateless-era (2026-07-28) downstream has no ``resources/subscribe``: its session is ``listening``, and the URIs
subscribed are the ``resourceSubscriptions`` of its ``subscriptions/listen`` stream (lists.py ``hold_listen``, which
reads them with ``take`` and re-opens the stream each time they change). A first subscription waits, at most
``connect_timeout_s``, for a stream that honours its URI (``acknowledged``); the last one's going re-opens the
stream without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.client.session import ClientSession

from gateway.backends.mcp.failures import FOREIGN
from gateway.errors import BackendError, BackendUnavailable

__all__ = ["Held"]

log = structlog.get_logger("gateway.backend")

Send = Callable[[Any], Awaitable[object]]
"""Send a request answered by an empty result through the backend (its errors are ``BackendError``)."""


class Held:
    """The log level and the counted resource subscriptions of one downstream."""

    def __init__(self, backend: str, connect_timeout_s: float, send: Send) -> None:
        self._name = backend
        self._timeout_s = connect_timeout_s
        self._send = send
        self._log_level: types.LoggingLevel | None = None
        self._subscribed: dict[str, int] = {}
        self.listening = False
        """The subscriptions are the listen stream's (a stateless-era session; set by ``restore``)."""
        self._changed = anyio.Event()
        self._generation = 0  # of the URIs subscribed: bumped on each change, acknowledged by the stream
        self._honoured: tuple[int, frozenset[str]] = (0, frozenset())
        self._acked = anyio.Event()

    async def set_log_level(
        self, level: types.LoggingLevel | None, session: ClientSession | None, caps: types.ServerCapabilities | None
    ) -> None:
        """Keep ``level`` and ask the ready ``session`` (if any) for log messages from it up; ``None`` forgets it."""
        self._log_level = level
        if level is None or session is None:
            return
        await self._apply_log_level(session, caps, level)

    async def subscribe(self, uri: str) -> None:
        """Count one subscription to ``uri``; the first asks the downstream.

        Raises:
            BackendError: the backend is not ready or refused the subscription.
        """
        if self._subscribed.get(uri, 0) == 0:
            if self.listening:
                await self._listen_for(uri)
                return
            await self._send(types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)))
        self._subscribed[uri] = self._subscribed.get(uri, 0) + 1

    async def unsubscribe(self, uri: str, *, connected: bool) -> None:
        """Drop one subscription to ``uri``; the downstream is told when the last one goes (if ``connected``)."""
        count = self._subscribed.get(uri, 0)
        if count > 1:
            self._subscribed[uri] = count - 1
            return
        self._subscribed.pop(uri, None)
        if count and self.listening:
            self._change()  # the stream is re-opened without it
            return
        if count == 0 or not connected:
            return
        request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
        try:
            with anyio.fail_after(self._timeout_s):
                await self._send(request)
        except (BackendError, TimeoutError) as exc:
            log.info("backend.unsubscribe_failed", backend=self._name, uri=uri, error=str(exc))

    async def restore(
        self, session: ClientSession, caps: types.ServerCapabilities | None, *, listening: bool = False
    ) -> None:
        """After a (re)connect: the log level and the subscriptions, on the new ``session``; a ``listening`` one
        (stateless era) has no log level, and its subscriptions are restored by its listen stream."""
        self.listening = listening
        if listening:
            return
        await self.restore_log_level(session, caps)
        for uri in list(self._subscribed):
            request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
            await self._send_or_log(session, request, "backend.resubscribe_failed", uri=uri)

    async def restore_log_level(self, session: ClientSession, caps: types.ServerCapabilities | None) -> None:
        """The level kept (if any) on ``session``, a handshake session opened since the level was set."""
        if self._log_level is not None:
            await self._apply_log_level(session, caps, self._log_level)

    # -- a stateless-era downstream: the listen stream's resourceSubscriptions ------------------------------------

    def take(self) -> tuple[int, tuple[str, ...]]:
        """The URIs the listen stream must carry now, and their generation (for ``acknowledged``)."""
        self._changed = anyio.Event()
        return self._generation, tuple(sorted(self._subscribed)) if self.listening else ()

    async def wait_changed(self) -> None:
        """Until the URIs change (the stream must be re-opened)."""
        await self._changed.wait()

    def acknowledged(self, generation: int, honoured: Sequence[str]) -> None:
        """A stream carrying the URIs of ``generation`` was acknowledged, honouring ``honoured``."""
        self._honoured = (generation, frozenset(honoured))
        self._acked.set()
        self._acked = anyio.Event()

    def _change(self) -> None:
        self._generation += 1
        self._changed.set()

    async def _listen_for(self, uri: str) -> None:
        """Add ``uri`` to the listen stream and wait for a stream that honours it (raises, and forgets it, if none
        does within the connect timeout)."""
        self._subscribed[uri] = 1
        self._change()
        wanted = self._generation
        with anyio.move_on_after(self._timeout_s):
            while self._honoured[0] < wanted:
                await self._acked.wait()
        generation, honoured = self._honoured
        if generation >= wanted and uri in honoured:
            return
        if self._subscribed.get(uri) == 1:
            self._subscribed.pop(uri)
            self._change()
        reason = (
            f"the server's subscriptions/listen stream left {uri!r} out of its acknowledgment"
            if generation >= wanted
            else f"no subscriptions/listen stream was acknowledged within {self._timeout_s:g} s (connect_timeout_s)"
        )
        raise BackendUnavailable(self._name, reason)

    async def _apply_log_level(
        self, session: ClientSession, caps: types.ServerCapabilities | None, level: types.LoggingLevel
    ) -> None:
        if caps is None or caps.logging is None:
            return
        request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))
        await self._send_or_log(session, request, "backend.set_log_level_failed", level=level)

    async def _send_or_log(self, session: ClientSession, request: Any, event: str, **fields: Any) -> None:
        """Send ``request`` (answered by an empty result) within the connect timeout; a failure is logged as a
        warning ``event`` with ``fields``, not raised."""
        try:
            with anyio.fail_after(self._timeout_s):
                await session.send_request(request, types.EmptyResult)
        except FOREIGN as exc:
            log.warning(event, backend=self._name, **fields, error=str(exc))
