"""The client-facing stdio transport of ``gateway serve --stdio``, on the event loop.

The SDK's ``mcp.server.stdio.stdio_server()`` reads stdin and writes stdout through ``anyio.wrap_file``: every line
read and every flush is a hop to a worker thread and back (a py-spy profile of ``serve --stdio`` put 20% and 14% of
its samples there). When stdin and stdout are pipes or sockets (what a client that
spawns the gateway hands it), :func:`stdio_edge` serves them as non-blocking pipes on the event loop instead
(``loop.connect_read_pipe`` / ``connect_write_pipe``), with no task between the pipes and the session: the session's
read loop reads and parses each line as it asks for the next message (``_Input``), and each message the session sends
is written by the task that sends it (``_Output``):

- one JSON-RPC message per line, UTF-8 (invalid bytes replaced, as the SDK's text layer does); a line that does not
  parse is delivered on the read stream as the exception, and reading goes on; a line may be of any length;
- end of file ends the read stream; an unterminated last line is parsed as a line (the SDK's line iterator yields it);
  given ``linger``, not before every request read has been answered (or cancelled by the client), or ``linger()``
  has returned: the session cancels what is in flight once its input ends, so a request read before the end (one
  waiting for the backends to start, a call in progress) would get no answer, or "Connection closed" (the SDK's
  transport is wrapped alike);
- a broken stdout (the client went away) ends both streams cleanly: nothing is left to answer to;
- while serving, fd 0 reads the null device and fd 1 writes to stderr, so a handler or child that touches them
  cannot read or tear the wire; both are restored on exit (the SDK does the same).

Anything else (a terminal, a regular file, streams replaced in ``sys``) falls back to the SDK's transport.

Known difference: the SDK's text layer also ends a line at a lone ``\\r``; here only ``\\n`` does (a ``\\r`` before it
is JSON whitespace, so CRLF framing is read alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from gateway.front.streams import ReadEnd, WriteEnd

# Lines parsed but not yet taken by the session before stdin is paused: bounds the memory a fast writer can fill.
READ_AHEAD_LINES = 64
WRITE_HIGH_WATER = 256 * 1024  # stdout bytes queued in the transport before a send waits for the pipe to drain
FLUSH_ON_EXIT_S = 2.0  # how long the answers already written may take to reach the client on exit (then dropped)

Memory = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
Streams = Memory | tuple["_Input", "_Output"]
Linger = Callable[[], Awaitable[None]]
"""At end of input with requests still unanswered: returns when they have had their time (then the input ends)."""


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _backed_by(stream: Any, fd: int) -> bool:
    try:
        return bool(stream.buffer.fileno() == fd)
    except (AttributeError, OSError, ValueError):
        return False


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another anyio backend (trio)
        return False
    return True


def can_serve() -> bool:
    """Whether stdin and stdout are pipes or sockets this transport can serve (else the SDK's is used)."""
    return _backed_by(sys.stdin, 0) and _backed_by(sys.stdout, 1) and _is_pipe(0) and _is_pipe(1)


@contextlib.asynccontextmanager
async def stdio_edge(linger: Linger | None = None) -> AsyncIterator[Streams]:
    """Serve MCP over the process's stdin and stdout; the SDK's ``stdio_server()`` where they are not pipes.

    Args:
        linger: at end of input, how long the requests read may still be answered before the session is told
            (None: it is told at once).
    """
    if not can_serve() or not _on_asyncio():
        async with stdio_server() as streams:
            if linger is None:
                yield streams
                return
            async with _lingering(streams, linger) as tracked:
                yield tracked
        return
    async with _claimed() as (wire_in, wire_out):
        async with _serve(wire_in, wire_out, linger) as streams:
            yield streams


class _Unanswered:
    """The client's requests read and not answered yet (nor cancelled by the client)."""

    def __init__(self) -> None:
        self.ids: set[types.RequestId] = set()
        self._none = anyio.Event()
        self._none.set()

    def read(self, item: SessionMessage | Exception) -> None:
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            if not self.ids:
                self._none = anyio.Event()
            self.ids.add(message.id)
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            request_id = (message.params or {}).get("requestId")
            if isinstance(request_id, int | str):
                self._settled(request_id)

    def wrote(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id is not None:
            self._settled(message.id)

    def _settled(self, request_id: types.RequestId) -> None:
        if request_id in self.ids:
            self.ids.discard(request_id)
            if not self.ids:
                self._none.set()

    async def wait_answered(self, linger: Linger | None, gone: anyio.Event | None = None) -> None:
        """Until every request read is answered, ``linger()`` returns, or ``gone`` is set (no answer can be sent)."""
        if linger is None or not self.ids:
            return
        async with anyio.create_task_group() as tg:

            async def until(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(until, self._none)
            if gone is not None:
                tg.start_soon(until, gone)
            await linger()
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _lingering(streams: Memory, linger: Linger) -> AsyncIterator[Memory]:
    """The SDK's streams, relayed so that their end of input waits for the answers (as ``_serve`` does inline)."""
    sdk_read, sdk_write = streams
    unanswered = _Unanswered()
    read_send, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def relay_in() -> None:
        async with read_send:
            async for item in sdk_read:
                unanswered.read(item)
                try:
                    await read_send.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
            await unanswered.wait_answered(linger)

    out_done = anyio.Event()

    async def relay_out() -> None:
        try:
            async with write_receive, sdk_write:
                async for item in write_receive:
                    await sdk_write.send(item)
                    unanswered.wrote(item)
        finally:
            out_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay_in)
        tg.start_soon(relay_out)
        try:
            yield read_stream, write_stream
        finally:
            write_stream.close()  # relay_out hands on what the session said, then ends
            with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_ON_EXIT_S):
                await out_done.wait()
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _claimed() -> AsyncIterator[tuple[int, int]]:
    """Move the wire to private descriptors and point fd 0 at the null device, fd 1 at stderr, until exit."""
    sys.stdout.flush()
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    try:
        yield wire_in, wire_out
    finally:
        for fd, wire in ((0, wire_in), (1, wire_out)):
            with contextlib.suppress(OSError):
                os.set_blocking(wire, True)  # the flag is the pipe's (shared with fd 0/1 once restored)
                os.dup2(wire, fd)
            with contextlib.suppress(OSError):
                os.close(wire)


class _LineReader(asyncio.Protocol):
    """Splits stdin into lines in ``data_received``; pauses the pipe while the session has enough unread."""

    def __init__(self) -> None:
        self.lines: deque[bytes] = deque()
        self.partial = bytearray()
        self.eof = False
        self.ready = asyncio.Event()
        self.transport: asyncio.ReadTransport | None = None
        self.paused = False
        self.stopped = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's pipe transports do not derive from asyncio's classes: typed, not checked
        self.transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        start = 0
        end = data.find(b"\n")
        while end >= 0:
            if self.partial:
                self.partial += data[start:end]
                self.lines.append(bytes(self.partial))
                self.partial.clear()
            else:
                self.lines.append(data[start:end])
            start = end + 1
            end = data.find(b"\n", start)
        if start < len(data):
            self.partial += data[start:]
        if self.lines:
            self.ready.set()
            if len(self.lines) >= READ_AHEAD_LINES and self.transport is not None and not self.paused:
                self.paused = True
                self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self._end()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self.eof:
            self.eof = True
            if self.partial:
                self.lines.append(bytes(self.partial))
                self.partial.clear()
            self.ready.set()

    def stop(self) -> None:
        """Read no more: ``next_line`` answers None from now on."""
        self.stopped = True
        self.ready.set()

    async def next_line(self) -> bytes | None:
        """The next line, or None at end of file (or once stopped)."""
        while not self.lines or self.stopped:
            if self.eof or self.stopped:
                return None
            self.ready.clear()
            if self.paused and self.transport is not None:
                self.paused = False
                self.transport.resume_reading()
            await self.ready.wait()
        return self.lines.popleft()


class _Writer(asyncio.Protocol):
    """Flow control for stdout: ``pause_writing`` / ``resume_writing`` from the transport, and its loss (which
    stops ``reader``: no answer can reach the client any more)."""

    def __init__(self, reader: _LineReader) -> None:
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.lost = anyio.Event()
        self._reader = reader

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()
        self.can_write.set()
        self._reader.stop()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = line.decode("utf-8", errors="replace")  # what the SDK's text layer (errors="replace") hands on
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except Exception as exc:  # delivered to the session as the SDK's transport delivers it
        return exc


class _Input(ReadEnd[SessionMessage | Exception]):
    """The session's read stream: each line of stdin read and parsed when the session's read loop asks for it (no
    task and no stream between the pipe and the session). It ends at end of file (after ``linger``, while requests
    read are unanswered) or at once when stdout is lost: no answer can reach the client any more."""

    def __init__(self, reader: _LineReader, unanswered: _Unanswered, linger: Linger | None, lost: anyio.Event) -> None:
        self._reader = reader
        self._unanswered = unanswered
        self._linger = linger
        self._lost = lost
        self._ended = False

    async def receive(self) -> SessionMessage | Exception:
        if not self._ended:
            line = await self._reader.next_line()
            if line is not None and not self._lost.is_set():
                message = _parse(line)
                self._unanswered.read(message)
                return message
            self._ended = True
            await self._unanswered.wait_answered(self._linger, self._lost)
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self._ended = True


class _Output(WriteEnd[SessionMessage]):
    """The session's write stream: each message written to stdout by the task that sends it, once the pipe has room
    (``WRITE_HIGH_WATER``); dropped once the client is gone, so that the session can finish."""

    def __init__(self, transport: asyncio.WriteTransport, writer: _Writer, unanswered: _Unanswered) -> None:
        self._transport = transport
        self._writer = writer
        self._unanswered = unanswered
        self._closed = False

    async def send(self, item: SessionMessage, /) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        await self._writer.can_write.wait()
        if self._writer.lost.is_set():
            return  # the client is gone: what the session still says is dropped
        data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
        self._transport.write(data.encode() + b"\n")
        self._unanswered.wrote(item)

    async def aclose(self) -> None:
        self._closed = True


@contextlib.asynccontextmanager
async def _serve(wire_in: int, wire_out: int, linger: Linger | None = None) -> AsyncIterator[Streams]:
    loop = asyncio.get_running_loop()
    reader = _LineReader()
    writer = _Writer(reader)
    # The transports own (and close) these file objects; the descriptors are private duplicates of the wire.
    read_transport, _ = await loop.connect_read_pipe(
        lambda: reader, os.fdopen(wire_in, "rb", buffering=0, closefd=False)
    )
    write_transport, _ = await loop.connect_write_pipe(
        lambda: writer, os.fdopen(wire_out, "wb", buffering=0, closefd=False)
    )
    write_transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    unanswered = _Unanswered()
    try:
        yield _Input(reader, unanswered, linger, writer.lost), _Output(write_transport, writer, unanswered)
    finally:
        read_transport.close()
        write_transport.close()  # writes what is buffered, then reports the connection lost
        with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_ON_EXIT_S):
            await writer.lost.wait()
