"""A caller's own session to a streamable HTTP server, beside the shared one, for its calls that stream progress.

On the shared session the gateway never holds the downstream back: the SDK's server writes every stream of a
session from one task, so one call's stream left unread holds every caller's answers on that session. So the
progress of a client that does not read is read all the same and coalesced, and the call is given up once it is
clear the client takes nothing (front/outbox.py); until then the downstream produces it at full speed, on the CPU
every caller shares. A client's own connection to the server would hold the server back instead, within its
socket's buffers, and cost nobody else anything.

So a handshake-era ``tools/call`` whose client asked for progress (its progress function is a ``Paced``) goes on a
session of its caller's own (``OwnSessions.request``): opened with the shared session's own ``initialize`` (the same
version, capabilities and client info) at the caller's first such call, and read no faster than the client takes
its progress (``Paced.paced``), so a client that stops reading holds back its own session alone. The back-channel,
cancellation and errors are the shared lane's (fastpath.py), and the session's notifications go where the shared
session's go. At most ``MAX_OWN`` per server; past it the least recently used idle one is closed. A call whose own
session could not be opened goes on the shared session (its progress coalesced as before); one the server no longer
knows (404) is opened again, once. One unused for ``IDLE_S`` is closed (DELETE), and all of them with the shared
session. ``SessionLane`` is a session's lane with its callers' own sessions beside it (``own``); it ends them all.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import anyio
import httpx2
import mcp_types as types
import structlog
from mcp.shared.exceptions import MCPError

from gateway.backends.mcp.fastpath import END_S, AnswerFn, HttpLane, NotifyFn, ProgressFn, SessionGone

__all__ = ["MAX_OWN", "OwnSessions", "SessionLane"]

log = structlog.get_logger("gateway.backend")

MAX_OWN = 64
"""Callers' own sessions one server keeps open; past it the least recently used idle one is closed."""
IDLE_S = 600.0
"""An own session no call used for this long is closed (when the next caller's call comes: no timer runs)."""


class _Own:
    __slots__ = ("busy", "lane", "opened", "used")

    def __init__(self, lane: HttpLane) -> None:
        self.lane = lane
        self.busy = 0  # its calls in flight
        self.opened = anyio.Event()  # set once its handshake ended (``lane.ready`` says how)
        self.used = anyio.current_time()  # when its last call ended


class OwnSessions:
    """The callers' own sessions beside ``shared`` (a streamable HTTP server's shared session's direct lane)."""

    def __init__(self, shared: HttpLane) -> None:
        self._shared = shared
        self._owns: OrderedDict[str, _Own] = OrderedDict()  # by caller, the least recently used first
        self._closed = False

    async def request(
        self,
        caller: str,
        method: str,
        params: dict[str, Any],
        *,
        backend: str,
        timeout_s: float | None,
        progress: ProgressFn,
        relay: ProgressFn,
        answer: AnswerFn,
        notify: NotifyFn,
    ) -> dict[str, Any]:
        """Send one request on ``caller``'s own session, its progress to ``progress`` (which may wait); on the
        shared session, its progress to ``relay`` (which never waits), when no own session can be had."""
        for attempt in range(2):
            own = await self._take(caller, backend, timeout_s)
            if own is None:
                break
            own.busy += 1
            try:
                return await own.lane.request(
                    method, params, timeout_s=timeout_s, progress=progress, answer=answer, notify=notify
                )
            except SessionGone:
                if self._owns.get(caller) is own:
                    del self._owns[caller]
                if attempt:
                    raise
            finally:
                own.busy -= 1
                own.used = anyio.current_time()
        return await self._shared.request(
            method, params, timeout_s=timeout_s, progress=relay, answer=answer, notify=notify
        )

    async def _take(self, caller: str, backend: str, timeout_s: float | None) -> _Own | None:
        """``caller``'s own session, opened if it has none; None when it cannot have one."""
        own = self._owns.get(caller)
        if own is None:
            if self._closed or self._shared.hello is None:
                return None
            shared = self._shared
            own = self._owns[caller] = _Own(HttpLane(shared.client, shared.url, max_event_size=shared.max_event_size))
            self._evict(caller)
            try:
                failure = await self._open(own.lane, timeout_s)
                if failure is None:
                    log.info("backend.own_session", backend=backend, caller=caller)
                else:
                    log.warning("backend.own_session_failed", backend=backend, caller=caller, reason=failure)
            finally:
                own.opened.set()
                if not own.lane.ready and self._owns.get(caller) is own:
                    del self._owns[caller]
        else:
            self._owns.move_to_end(caller)
            self._evict(caller)
            await own.opened.wait()
        return own if own.lane.ready else None

    async def _open(self, lane: HttpLane, timeout_s: float | None) -> str | None:
        """The handshake of the shared session, again, for a session of its own; None, or why it failed (``lane``
        is then not ready)."""
        shared = self._shared
        assert shared.hello is not None
        try:
            hello = json.loads(shared.hello)
            result = await lane.request(
                "initialize", hello["params"], timeout_s=timeout_s, progress=None, answer=_refuse, notify=_drop
            )
            if lane.session_id is None:
                raise MCPError(types.INVALID_REQUEST, "the server gave the session no id")
            lane.version = str(result.get("protocolVersion") or shared.version)
            await lane.notice({"jsonrpc": "2.0", "method": "notifications/initialized"})
        except (MCPError, httpx2.HTTPError, OSError, TimeoutError, ValueError, KeyError) as exc:
            lane.version = None
            return str(exc) or type(exc).__name__
        return None

    def _evict(self, keep: str) -> None:
        """Close the sessions idle for ``IDLE_S``, and the least recently used idle ones past ``MAX_OWN`` (never
        ``keep``'s, about to be used)."""
        stale = anyio.current_time() - IDLE_S
        idle = [c for c, own in self._owns.items() if c != keep and not own.busy and own.opened.is_set()]
        for caller in idle:
            if self._owns[caller].used < stale or len(self._owns) > MAX_OWN:
                self._shared.closer_soon(self._owns.pop(caller).lane.end)

    async def aclose(self) -> None:
        """End every own session at the server, all at once, within fastpath.py's ``END_S``."""
        self._closed = True
        owns, self._owns = list(self._owns.values()), OrderedDict()
        if owns:
            with anyio.move_on_after(END_S, shield=True):
                async with anyio.create_task_group() as tg:
                    for own in owns:
                        tg.start_soon(own.lane.end)


async def _refuse(request: Any) -> Any:
    """A server's request during the handshake (none is allowed there) is refused."""
    return types.ErrorData(code=types.METHOD_NOT_FOUND, message="Method not found")


async def _drop(notification: Any) -> None:
    return None


class SessionLane(HttpLane):
    """A streamable HTTP session's direct lane, with its callers' own sessions beside it (``own``)."""

    def __init__(self, client: httpx2.AsyncClient, url: str, *, max_event_size: int) -> None:
        super().__init__(client, url, max_event_size=max_event_size)
        self.own = OwnSessions(self)

    async def aclose(self) -> None:
        """End the session and its callers' own sessions at the server, all at once, within ``END_S``, even when
        the gateway is being cancelled (stopping): the SDK's transport would send its DELETE in the cancelled scope,
        where it never leaves, and the server would keep the session until it expires there."""
        with anyio.move_on_after(END_S, shield=True):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.own.aclose)
                if self.session_id is not None:
                    tg.start_soon(self.end)
