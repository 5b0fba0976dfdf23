"""HTTP connections at the edge: ``edge_protocol`` is uvicorn's HTTP protocol with the deadlines uvicorn lacks and a
connection cap that keeps room for token holders; ``quiet_edge_logs`` throttles the reports a flood of connections
makes. uvicorn closes a kept-alive connection silent after a response and nothing else, so idle or slowloris sockets
could exhaust the open-files limit and lock every token holder out. Once a request head is complete nothing here
limits the request: a long tool call or an open GET stream (SSE) is never cut. Each request's scope is told how to
read what its connection holds unsent (front/scope.py ``unsent_of``), so an event stream can wait for a client that
does not keep up. Only the CLI uses this module.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import resource
import struct
import time
from collections.abc import Callable
from typing import Any, ClassVar

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import Limits
from gateway.front.scope import set_unsent

__all__ = [
    "MAX_HEAD_BYTES",
    "OWN_FILES",
    "PARSERS",
    "Throttle",
    "ThrottledLog",
    "edge_protocol",
    "effective_max_connections",
    "quiet_edge_logs",
    "raise_open_files_limit",
]

log = structlog.get_logger("gateway.connections")

_SIOCOUTQNSD = 0x894B
"""Linux's ioctl for the bytes a TCP socket holds not yet sent (sent but unacknowledged bytes are not counted)."""

OWN_FILES = 128
"""Open files kept free for the gateway itself (listening socket, pipes to stdio backends, the ledger, logs)."""


class Throttle:
    """At most one report per ``interval`` seconds per event; the next one carries the count of those suppressed."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def allow(self, event: str) -> int | None:
        """None while ``event`` is being suppressed; else how many were suppressed since it last passed."""
        now = self.clock()
        last = self._last.get(event)
        if last is not None and now - last < self.interval:
            self._suppressed[event] = self._suppressed.get(event, 0) + 1
            return None
        self._last[event] = now
        return self._suppressed.pop(event, 0)

    def report(self, event: str, level: str = "info", **fields: Any) -> None:
        """Log ``event`` unless it is being suppressed; a line that passes carries ``suppressed=N``."""
        suppressed = self.allow(event)
        if suppressed is not None:
            getattr(log, level)(event, suppressed=suppressed, **fields)


class ThrottledLog(logging.Filter):
    """A logging filter passing each message template at most once per second, the next one with the count of those
    suppressed: uvicorn warns once per malformed request ("Invalid HTTP request received."), which a client could
    otherwise turn into a flood."""

    def __init__(self, throttle: Throttle | None = None) -> None:
        super().__init__()
        self.throttle = throttle or Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        suppressed = self.throttle.allow(str(record.msg))
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} more like it suppressed)"
        return True


MAX_HEAD_BYTES = h11._connection.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
"""The largest request head: h11's own bound (16 KiB), which httptools does not have; a longer one is refused."""


class _Edge:
    """The deadlines and the cap, over either of uvicorn's HTTP protocols (the concrete classes below)."""

    limits: ClassVar[Limits]
    max_connections: ClassVar[int]
    throttle: ClassVar[Throttle]
    # what uvicorn's protocols (H11Protocol, HttpToolsProtocol) provide
    connections: set[Any]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any
    timeout_keep_alive_task: asyncio.TimerHandle | None
    timeout_keep_alive_handler: Callable[[], None]

    # The protocol's own hooks, shared by both: each calls uvicorn's (next in the concrete class's MRO) and then
    # does the edge's part. ``data_received`` differs (httptools may lose the connection inside it).

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._edge_init()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # uvicorn's protocol
        self._admit()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._await_head()
        super().on_response_complete()  # type: ignore[misc]  # may start a pipelined request (head parsed already)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]
        # uvicorn stops its silence timer only when the connection ended cleanly; one the client reset (a client that
        # closes a response it did not read to the end does) kept it armed, and with it the connection's protocol,
        # transport, socket and request, for keep_alive_s: hundreds of them for the collector to walk at a busy edge.
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def _edge_init(self) -> None:
        self._phase = "head"  # "head": waiting for a request head; "body": for its body; "busy": serving it
        self._waiting_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._seen: Any = None  # the last request cycle whose head the deadlines have followed
        self._head_bytes = 0  # bytes received towards a request head not yet complete

    # ------------------------------------------------------------------------------------------- the cap

    def _admit(self) -> None:
        """Called once the connection is made: make room at the cap, or refuse it."""
        live = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        if len(live) >= self.max_connections:
            waiting = [c for c in live if isinstance(c, _Edge) and c._phase == "head"]
            if not waiting:
                self.throttle.report(
                    "connection.refused", "warning", limit=self.max_connections, reason="every connection busy"
                )
                self._answer(503, "Service unavailable: too many open connections; retry shortly.", b"retry-after: 1")
                return
            oldest = min(waiting, key=lambda c: c._waiting_since)
            self.throttle.report(
                "connection.evicted", limit=self.max_connections, reason="oldest waiting for a request"
            )
            oldest._close()
        self._await_head()
        # uvicorn arms its silence timer only after a response; a fresh connection gets it too.
        self.timeout_keep_alive_task = self.loop.call_later(self.limits.keep_alive_s, self.timeout_keep_alive_handler)

    # ------------------------------------------------------------------------------------------- deadlines

    def _received(self, size: int) -> None:
        """After ``size`` bytes were parsed: follow the request, and bound a head that does not complete."""
        self._follow()
        cycle = self.cycle
        if self._phase == "head" and not self.transport.is_closing() and (cycle is None or not cycle.more_body):
            # (bytes of a body still arriving after its request was answered are not a head)
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES:
                self.throttle.report("connection.refused", limit_bytes=MAX_HEAD_BYTES, reason="request head too large")
                self._answer(431, f"Request head too large: the limit is {MAX_HEAD_BYTES:,} bytes.")

    def _follow(self) -> None:
        """Move the deadline along with the request: a new head stops the header clock and starts the body's; a
        complete body stops that. (A pipelined request's head, parsed while another is served, is followed when
        that one's response is complete.)"""
        cycle = self.cycle
        if cycle is not None and cycle is not self._seen and self._phase == "head":
            self._seen = cycle
            set_unsent(cycle.scope, self._unsent)  # before the request's task first runs
            self._phase = "body"
            self._arm(self.limits.body_timeout_s, self._body_late)
        if self._phase == "body" and cycle is not None and not cycle.more_body:
            self._phase = "busy"
            self._disarm()

    def _unsent(self) -> int:
        """Bytes of answers this connection holds and has not sent yet: asyncio's buffer and the kernel's unsent
        queue (front/scope.py ``unsent_of``)."""
        waiting = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                waiting += struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQNSD, b"\0\0\0\0"))[0]
            except OSError:  # closed, or not Linux: asyncio's buffer alone
                pass
        return waiting

    def _await_head(self) -> None:
        self._phase = "head"
        self._head_bytes = 0
        self._waiting_since = self.loop.time()
        self._arm(self.limits.header_timeout_s, self._head_late)

    def _arm(self, seconds: float, handler: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, handler)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_late(self) -> None:
        if self._phase == "head" and not self.transport.is_closing():
            self.throttle.report("connection.timeout", limit_s=self.limits.header_timeout_s, waited_for="request head")
            self._answer(408, f"Request timeout: no complete request head within {self.limits.header_timeout_s} s.")

    def _body_late(self) -> None:
        if self._phase == "body" and not self.transport.is_closing():
            self.throttle.report("connection.timeout", limit_s=self.limits.body_timeout_s, waited_for="request body")
            self._close()

    # ------------------------------------------------------------------------------------------- answers

    def _answer(self, status: int, text: str, *extra: bytes) -> None:
        """Answer outside any request (there is none yet: the protocol cannot frame it) and close."""
        body = json.dumps({"error": text}).encode()
        phrase = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
        head = [
            b"HTTP/1.1 %d %s" % (status, phrase[status]),
            b"content-type: application/json",
            b"content-length: %d" % len(body),
            b"connection: close",
            *extra,
        ]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self._close()

    def _close(self) -> None:
        self._disarm()
        self._phase = "closed"
        self.transport.close()


class _FramingChecked(h11.Connection):
    """h11's server connection, refusing a request that carries both Content-Length and Transfer-Encoding: h11 would
    frame it by Transfer-Encoding and keep the connection, so whatever follows it on the connection (a smuggled
    request) would be served too. RFC 9112 6.1 says close; refusing it (400, then closed) is what llhttp does."""

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name.lower() for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                raise h11.RemoteProtocolError("both Content-Length and Transfer-Encoding", error_status_hint=400)
        return event


class _EdgeH11(_Edge, H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's own connection, with the same bound on an incomplete event, and the framing check above
        self.conn = _FramingChecked(h11.SERVER, self.conn._max_incomplete_event_size)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._received(len(data))

    def _close(self) -> None:
        if self.conn.our_state is not h11.ERROR:
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass  # mid-request: there is nothing to close politely
        super()._close()


class _EdgeHttpTools(_Edge, HttpToolsProtocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.parser is not None:  # None: the connection was lost meanwhile
            self._received(len(data))

    def on_header(self, name: bytes, value: bytes) -> None:
        # A field value excludes its surrounding whitespace (RFC 9110, 5.5): h11 strips it, llhttp keeps the trailing
        # part, which the SDK then compares with the body (SEP-2243's Mcp-Method and Mcp-Name headers).
        super().on_header(name, value.strip(b" \t"))


PARSERS: dict[str, type[_Edge]] = {"httptools": _EdgeHttpTools, "h11": _EdgeH11}


def edge_protocol(limits: Limits, *, max_connections: int | None = None, parser: str = "httptools") -> type[Any]:
    """uvicorn's HTTP protocol (``parser``: httptools or h11, the same rules on both) with ``limits`` applied (pass it
    as ``uvicorn.Config(http=...)``):

    - ``keep_alive_s``: a connection silent while no request is on it, fresh or between requests, is closed;
    - ``header_timeout_s``: from a connection's opening (or its previous response) to a complete request head, else
      ``408`` and closed, however slowly the bytes trickle in;
    - ``body_timeout_s``: from a complete head to the end of its body, else closed (the app sees a disconnect);
    - ``max_connections``: at the cap, a new connection closes the connection that has waited longest for a request
      head; only when none is waiting (every connection is serving a request) is the new one answered ``503`` and
      closed. The Guard (guard.py) closes every connection that is refused or has no token with its response, so the
      waiting connections are fresh ones or token holders' idle ones: a token holder's new connection, which sends
      its head within milliseconds, always finds room however many idle sockets others hold.

    A request head is at most ``MAX_HEAD_BYTES`` (h11's own bound; httptools has none, so the edge keeps it: a longer
    head is answered ``431`` and closed). A request with both Content-Length and Transfer-Encoding is answered ``400``
    and its connection closed (llhttp refuses it itself; h11 is made to, ``_FramingChecked``)."""
    cap = max_connections if max_connections is not None else limits.max_connections
    attributes = {"limits": limits, "max_connections": cap, "throttle": Throttle()}
    return type("EdgeProtocol", (PARSERS[parser],), attributes)


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one; returns the limit now in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # not allowed here: keep the soft limit
    return int(soft)


def effective_max_connections(limits: Limits, open_files: int) -> int:
    """``limits.max_connections``, lowered (with a warning) so that twice as many, plus ``OWN_FILES``, fit in
    ``open_files``. Twice: asyncio accepts up to the listen backlog (which the CLI sets to this cap) in one go
    before any protocol sees a connection, so the open sockets can briefly reach the cap plus the backlog."""
    room = max((open_files - OWN_FILES) // 2, 1)
    if limits.max_connections <= room:
        return limits.max_connections
    log.warning(
        "connections.capped",
        configured=limits.max_connections,
        effective=room,
        open_files_limit=open_files,
        message="gateway.limits.max_connections lowered: twice the cap plus "
        f"{OWN_FILES} files for the gateway itself must fit in the open-files limit",
    )
    return room


_ACCEPT_ERROR = "socket.accept() out of system resource"


def quiet_edge_logs(loop: asyncio.AbstractEventLoop) -> None:
    """Report asyncio's accept failures (e.g. EMFILE: CPython logs one per pending connection, with a traceback, in a
    tight loop) once per second with a count, not once per attempt; uvicorn's per-request warnings pass the same
    throttle (``ThrottledLog``)."""
    previous = loop.get_exception_handler()
    throttle = Throttle()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_ERROR:
            throttle.report("connection.accept_failed", "error", error=str(context.get("exception")))
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ThrottledLog) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(ThrottledLog())
