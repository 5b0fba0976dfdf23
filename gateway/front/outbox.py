"""What one request's client is sent while the request is served (its progress, its log messages): ``Outbox``.

A downstream says these on the shared session (or the call's own stream), and whoever reads them must never wait for
the client to take them: a client that stops reading would otherwise hold up the read of the shared session (every
caller's calls and the health pings behind it), or make the gateway keep everything the downstream says in memory.
So a notification is put here without waiting, and delivered by a task of its own, in order. While the client does
not keep up (half of ``gateway.edge.client_buffer_bytes`` waits, or a send to it has been under way for ``SLOW_S``),
its progress is coalesced to the latest; its log messages wait, at most ``client_buffer_bytes`` of them. A client
that leaves a notification unread for ``client_stall_s`` while more come, that has more log messages waiting than
``client_buffer_bytes``, or that takes nothing while more than ``FLOOD_BYTES`` of progress is coalesced away (a
downstream flooding it: a direct client that stopped reading would hold the downstream back within its socket's
buffers; the gateway, which never holds a shared downstream back, stops the work instead) is shed: the request's work is
cancelled (its downstream call too, which is told) and the request is answered as given up, for that client alone.
When the request ends, what is waiting is delivered first (bounded by ``FLUSH_S``), so a client that reads gets every
notification before the answer.

A downstream session of the caller's own (backends/mcp/own.py) may be held back instead, as the caller's own
connection to the server would hold it: its progress comes through ``Paced.paced``, which waits while the last
progress has not been taken for delivery (at most ``client_stall_s``: then the client is shed as above). Nothing of
it is coalesced, and the downstream produces no more than the client takes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import anyio
import mcp_types as types
import structlog
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from gateway.backends.base import Paced, ProgressFn
from gateway.config.settings import EdgeSettings

__all__ = ["FLOOD_BYTES", "FLUSH_S", "Outbox", "Outboxes", "size_of"]

T = TypeVar("T")

log = structlog.get_logger("gateway.server")

FLUSH_S = 1.0
"""How long a request's end waits for its waiting notifications to reach its client before the answer goes."""
SLOW_S = 0.25
"""A send to the client under way this long means it does not keep up: its progress is coalesced from then on. A
send waits only while the connection holds more than ``UNSENT_BYTES`` unsent (front/http/transport.py) or the
kernel's buffers are full: a client that reads, even slowly, frees them sooner; one that took nothing for this long
while a downstream floods it costs every caller's CPU for each moment more it is waited for (a flood over stdio is
read whole: the pipe is shared)."""
FLOOD_BYTES = 64 * 1024
"""Progress coalesced away while a send has been stuck for ``SLOW_S`` beyond this (about 600 notifications, where a
progress bar needs a few a second) is a flood its client does not read: the request is given up."""

Send = Callable[[], Awaitable[object]]
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]

_PROGRESS_BYTES = 96
"""What one progress notification costs on the wire besides its message."""


class Outbox:
    """One request's notifications to its client (see the module docstring).

    Args:
        report: sends one progress notification to the client (None: it asked for no progress).
        spawn: starts the delivering task (the gateway's task group); it is started at the first notification.
        limit_bytes: ``gateway.edge.client_buffer_bytes``.
        stall_s: ``gateway.edge.client_stall_s``.
        caller: who the client is, for the log line of a shed.
    """

    __slots__ = (
        "_busy_since",
        "_bytes",
        "_log_bytes",
        "_unread",
        "_delivering",
        "_drained",
        "_pending",
        "_limit",
        "_open",
        "_queue",
        "_report",
        "_spawn",
        "_stall_s",
        "_taken",
        "_wake",
        "caller",
        "scope",
        "shed",
    )

    def __init__(
        self, report: ProgressFn | None, spawn: Spawn, *, limit_bytes: int, stall_s: float, caller: str | None
    ) -> None:
        self._report = report
        self._spawn = spawn
        self._limit = limit_bytes
        self._stall_s = stall_s
        self.caller = caller
        self._queue: deque[tuple[list[Any] | None, Send | None, int]] = deque()
        self._pending: list[Any] | None = None  # the last progress waiting in the queue: [progress, total, message]
        self._bytes = 0  # everything waiting
        self._log_bytes = 0  # the log messages waiting (what cannot be coalesced)
        self._unread = 0  # bytes of progress coalesced away while a send has been stuck for SLOW_S
        self._wake = anyio.Event()
        self._taken: anyio.Event | None = None  # set when the progress waiting in the queue is taken (``_paced``)
        self._drained: anyio.Event | None = None
        self._busy_since: float | None = None
        self._delivering: anyio.CancelScope | None = None
        self._open = True
        self.scope = anyio.CancelScope()
        """The request's work runs in it: shedding the client cancels it."""
        self.shed: str | None = None
        """Why the client was shed (None while it was not)."""

    @property
    def progress(self) -> Paced | None:
        """The request's progress function for the backends (None when the client asked for none): never waits;
        its ``paced`` form waits for the client."""
        return Paced(self._progress, self._paced) if self._report is not None else None

    async def _paced(self, progress: float, total: float | None, message: str | None) -> None:
        if self._pending is not None and self._open:
            taken = self._taken = self._taken or anyio.Event()
            with anyio.move_on_after(self._stall_s) as waited:
                await taken.wait()
            if waited.cancelled_caught:
                self._shed(f"it took no progress for more than gateway.edge.client_stall_s ({self._stall_s:g} s)")
                return
        await self._progress(progress, total, message)

    async def _progress(self, progress: float, total: float | None, message: str | None) -> None:
        if not self._open:
            return
        pending = self._pending
        busy = self._busy_since
        slow = busy is not None and time.monotonic() - busy > SLOW_S
        if pending is not None and (slow or self._bytes > self._limit // 2):
            pending[:] = (progress, total, message)  # the client is not keeping up: only the latest will do
            if slow:  # and takes nothing: what it leaves unread is work done for no one
                self._unread += _PROGRESS_BYTES + len(message or "")
        else:
            size = _PROGRESS_BYTES + len(message or "")
            self._pending = [progress, total, message]
            self._queue.append((self._pending, None, size))
            self._bytes += size
        self._pushed()

    def send(self, send: Send, size: int) -> None:
        """Queue ``send`` (one notification of about ``size`` bytes) for the client, in order; never waits."""
        if not self._open:
            return
        self._queue.append((None, send, size))
        self._bytes += size
        self._log_bytes += size
        self._pushed()

    def _pushed(self) -> None:
        if self._log_bytes > self._limit:
            self._shed(
                f"{self._log_bytes:,} bytes of its log messages were waiting for it, over "
                f"gateway.edge.client_buffer_bytes ({self._limit:,})"
            )
            return
        if self._unread > FLOOD_BYTES:
            self._shed(
                f"{self._unread:,} bytes of its progress went unread while it took nothing for over {SLOW_S:g} s "
                f"(over {FLOOD_BYTES:,})"
            )
            return
        busy = self._busy_since
        if busy is not None and time.monotonic() - busy > self._stall_s:
            self._shed(
                f"it left a notification unread for more than gateway.edge.client_stall_s ({self._stall_s:g} s) "
                "while more came"
            )
            return
        if self._delivering is None:
            self._delivering = anyio.CancelScope()
            self._spawn(self._deliver)
        self._wake.set()

    def _release(self) -> None:
        """Wake a ``_paced`` relay waiting for the progress in the queue to be taken."""
        if self._taken is not None:
            self._taken.set()
            self._taken = None

    def _shed(self, reason: str) -> None:
        self.shed = reason
        self._open = False
        self._queue.clear()
        self._pending, self._bytes, self._log_bytes, self._unread = None, 0, 0, 0
        self._release()
        log.warning("client.shed", caller=self.caller, reason=reason)
        self.scope.cancel()
        if self._delivering is not None:
            self._delivering.cancel()

    async def _deliver(self) -> None:
        assert self._delivering is not None
        with self._delivering:
            while True:
                while self._queue:
                    progress, send, size = self._queue.popleft()
                    self._bytes -= size
                    if progress is None:
                        self._log_bytes -= size
                    else:
                        if progress is self._pending:
                            self._pending = None
                            self._release()
                        if self._report is None:
                            continue
                        send = partial(self._report, *progress)
                    assert send is not None
                    self._busy_since = time.monotonic()
                    try:
                        await send()
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, MCPError, OSError):
                        self._open = False  # the client is gone: nothing more reaches it
                        self._queue.clear()
                        self._pending = None
                        self._release()
                    finally:
                        self._busy_since, self._unread = None, 0  # it took one: it reads again
                if self._drained is not None:
                    self._drained.set()
                await self._wake.wait()
                self._wake = anyio.Event()

    async def close(self) -> None:
        """The request ends: deliver what waits (at most ``FLUSH_S``), then stop delivering."""
        if self._delivering is None:
            self._open = False
            return
        try:
            if (self._queue or self._busy_since is not None) and self._open:  # waiting, or being sent
                self._drained = anyio.Event()
                self._wake.set()
                with anyio.move_on_after(FLUSH_S):
                    await self._drained.wait()
        finally:
            self._open = False
            self._release()
            self._delivering.cancel()

    def refusal(self) -> MCPError:
        """What the shed request is answered (if its client ever reads it)."""
        return MCPError(
            types.INTERNAL_ERROR,
            f"The gateway gave this request up: its client does not read what it is sent ({self.shed}).",
        )


class Outboxes:
    """Each request's ``Outbox`` while it is served (``serve``), found by its context.

    Args:
        edge: the current ``gateway.edge`` settings.
        spawn: starts a task in the gateway's task group (``Gateway.start_soon``).
    """

    def __init__(self, edge: Callable[[], EdgeSettings], spawn: Callable[..., None]) -> None:
        self._edge = edge
        self._spawn = spawn
        self._open: dict[int, Outbox] = {}  # id(the request's context) -> its outbox, while it is served

    def of(self, ctx: ServerRequestContext[Any]) -> Outbox | None:
        return self._open.get(id(ctx))

    def progress(self, ctx: ServerRequestContext[Any]) -> ProgressFn | None:
        """The request's progress relay to its client (None when it asked for none): through its outbox, which
        never waits for the client, when it has one."""
        outbox = self._open.get(id(ctx))
        if outbox is not None:
            return outbox.progress
        return ctx.session.report_progress if ctx.meta and ctx.meta.get("progress_token") is not None else None

    async def serve(self, ctx: ServerRequestContext[Any], caller: str | None, work: Callable[[], Awaitable[T]]) -> T:
        """``work()``, the request served with an outbox: what waits for the client is delivered before the answer.

        Raises:
            MCPError: the client was shed (``Outbox.refusal``); the work was cancelled.
        """
        edge, spawn = self._edge(), self._spawn
        report = ctx.session.report_progress if ctx.meta and ctx.meta.get("progress_token") is not None else None
        outbox = self._open[id(ctx)] = Outbox(
            report,
            lambda deliver: spawn(deliver, name="client-outbox"),
            limit_bytes=edge.client_buffer_bytes,
            stall_s=edge.client_stall_s,
            caller=caller,
        )
        try:
            with outbox.scope:
                result = await work()
            if outbox.shed is not None:
                raise outbox.refusal()
            return result
        finally:
            del self._open[id(ctx)]
            await outbox.close()


def size_of(notification: Any) -> int:
    """About how many bytes a notification takes on the wire (for ``Outbox.send``)."""
    try:
        return len(notification.model_dump_json(by_alias=True, exclude_none=True))
    except (AttributeError, ValueError):
        return 256
