"""A backend's calls over HTTP/1.1 on connections of the gateway's own: ``Http11``, the transport under the calls of
a streamable HTTP backend (pool.py).

Every call a caller sends to an HTTP backend is one POST and its answer. Through httpx2's transport each went through
httpcore2's connection pool and h11's pure-Python parser: about as much CPU as the bare relay spends on its whole call
(docs/benchmarks.md, "Where the time goes"). ``Http11`` writes the request's bytes itself and parses the answer with
httptools (llhttp, the parser the edge already uses), on a connection it keeps for the next call. What it keeps of
httpx2's transport:

  * it is an ``httpx2.AsyncBaseTransport``: the layers above it (the answer limit, the fair slots, the drain,
    SEP-1699's held retry) wrap its response as they wrapped httpx2's, and the client decodes its body as before;
  * every connection is made through the egress check (egress.py ``admitted``: the addresses the host resolves to,
    each allowed for the server whose request it is, and the connection made to the address checked), with the
    loopback receive buffer, and TLS verified against the pool's context;
  * the request's timeouts (connect, read, write) as httpx2 applies them, and its failures as httpx2's errors
    (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``, ``WriteTimeout``, ``WriteError``,
    ``RemoteProtocolError``, ``LocalProtocolError``), so failures.py maps them as before;
  * a connection goes back to the pool only when its answer was read to the end, nothing followed it, and the server
    keeps it alive; an idle one found readable (the server closed it) or idle longer than ``KEEPALIVE_S`` is dropped,
    as httpcore2 drops it; at most ``keep`` idle ones are kept. A POST is never sent twice.

A request it does not carry (a body not read into memory, a scheme other than http and https) goes to ``fallback``,
httpx2's transport.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from typing import Any

import anyio
import anyio.abc
import httpcore2
import httptools
import httpx2
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSStream

from gateway.backends.mcp.egress import admitted, socket_options_for

__all__ = ["KEEPALIVE_S", "Http11"]

KEEPALIVE_S = 5.0
"""How long an idle connection is kept (httpcore2's ``keepalive_expiry``)."""
READ_BYTES = 64 * 1024

Key = tuple[str, str, int]
"""A connection's origin: scheme, host, port."""


class _Connection:
    __slots__ = ("idle_since", "sock", "stream")

    def __init__(self, stream: anyio.abc.ByteStream, sock: socket.socket) -> None:
        self.stream = stream
        self.sock = sock
        self.idle_since = 0.0

    def stale(self, now: float) -> bool:
        """Idle too long, or readable while idle (the server closed it, or said something unasked)."""
        if now - self.idle_since > KEEPALIVE_S or self.sock.fileno() < 0:
            return True
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        return bool(poll.poll(0))

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            try:
                await self.stream.aclose()
            except (OSError, anyio.BrokenResourceError, ssl.SSLError):
                pass  # already broken: nothing is left to close


class _Answer:
    """httptools' callbacks for one response on a connection: its interim answers (``100 Continue``) skipped, and
    anything the server sends after it kept out of it (the connection is then not used again)."""

    __slots__ = ("chunks", "complete", "extra", "head", "headers", "interim", "keep", "parser", "status")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.head = False
        self.complete = False
        self.interim = False
        self.extra = False  # bytes after the answer: another message the connection must not carry to the next call
        self.keep = False  # whether the server keeps the connection after this answer
        self.status = 0
        self.parser: Any = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        if self.interim:  # the answer after an interim one
            self.headers, self.interim = [], False
        elif self.head:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.extra:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.extra:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.interim = True
            return
        self.head, self.status = True, status
        self.keep = self.parser.should_keep_alive()  # llhttp forgets it once the message is complete

    def on_body(self, body: bytes) -> None:
        if not self.extra:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.head and not self.extra:
            self.complete = True


class Http11(httpx2.AsyncBaseTransport):
    """HTTP/1.1 requests on pooled connections of the gateway's own (see the module docstring)."""

    def __init__(self, verify: ssl.SSLContext, fallback: httpx2.AsyncBaseTransport, *, keep: int) -> None:
        self._verify = verify
        self._fallback = fallback
        self._keep = keep
        self._idle: dict[Key, list[_Connection]] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        try:
            body = request.content
        except httpx2.RequestNotRead:
            return await self._fallback.handle_async_request(request)
        if url.scheme not in ("http", "https") or "transfer-encoding" in request.headers:
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        head = _head(request)
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        connection = await self._take(key, timeouts.get("connect"), request)
        try:
            await _send(connection, head + body, timeouts.get("write"), request)
            answer = _Answer()
            parser = answer.parser
            read_s = timeouts.get("read")
            while not answer.head:
                data = await _receive(connection, read_s, request)
                if not data:
                    raise httpx2.RemoteProtocolError("Server disconnected without sending a response.", request=request)
                _feed(parser, data, request)
        except BaseException:
            await connection.aclose()
            raise
        stream = _Body(self, key, connection, answer, read_s, request)
        return httpx2.Response(
            answer.status,
            headers=answer.headers,
            stream=stream,
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def _take(self, key: Key, connect_s: float | None, request: httpx2.Request) -> _Connection:
        idle = self._idle.get(key)
        if idle:
            now = time.monotonic()
            while idle:
                connection = idle.pop()  # the most recently used first
                if not connection.stale(now):
                    return connection
                await connection.aclose()
        return await self._connect(key, connect_s, request)

    async def _connect(self, key: Key, connect_s: float | None, request: httpx2.Request) -> _Connection:
        scheme, host, port = key
        try:
            with anyio.fail_after(connect_s):
                last: Exception | None = None
                for address in await admitted(host, port, None):
                    try:
                        plain = await anyio.connect_tcp(str(address), port)
                    except OSError as exc:
                        last = exc
                        continue
                    sock = plain.extra(SocketAttribute.raw_socket)
                    for option in socket_options_for(address):
                        sock.setsockopt(*option)
                    stream: anyio.abc.ByteStream = plain
                    if scheme == "https":
                        try:
                            stream = await TLSStream.wrap(
                                plain, hostname=host, ssl_context=self._verify, standard_compatible=False
                            )
                        except BaseException:
                            await plain.aclose()
                            raise
                    return _Connection(stream, sock)
                raise httpcore2.ConnectError(str(last) if last is not None else f"{host} has no address")
        except TimeoutError:
            raise httpx2.ConnectTimeout(f"no connection to {host}:{port} in time", request=request) from None
        except (httpcore2.ConnectError, OSError, anyio.BrokenResourceError, ssl.SSLError) as exc:
            raise httpx2.ConnectError(str(exc) or type(exc).__name__, request=request) from exc

    async def _give(self, key: Key, connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if self._closed or len(idle) >= self._keep:
            await connection.aclose()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                await connection.aclose()
        await self._fallback.aclose()


class _Body(httpx2.AsyncByteStream):
    """An answer's body, read from its connection as it is iterated; closing it gives the connection back to the
    pool when the answer was read to its end and the server keeps the connection, and closes it otherwise."""

    def __init__(
        self,
        pool: Http11,
        key: Key,
        connection: _Connection,
        answer: _Answer,
        read_s: float | None,
        request: httpx2.Request,
    ) -> None:
        self._pool = pool
        self._key = key
        self._connection: _Connection | None = connection
        self._answer = answer
        self._read_s = read_s
        self._request = request
        headers = {name.lower() for name, _ in answer.headers}
        # A body without a length nor chunks runs until the connection closes (not kept then).
        self._until_close = b"content-length" not in headers and b"transfer-encoding" not in headers

    async def __aiter__(self) -> Any:
        answer = self._answer
        connection = self._connection
        while True:
            if answer.chunks:
                chunks, answer.chunks = answer.chunks, []
                for chunk in chunks:
                    yield chunk
            if answer.complete or connection is None:
                return
            data = await _receive(connection, self._read_s, self._request)
            if not data:
                if self._until_close and not answer.complete:
                    self._until_close = False  # ended as it said it would; the connection is not kept
                    return
                raise httpx2.RemoteProtocolError(
                    "peer closed connection without sending complete message body", request=self._request
                )
            _feed(answer.parser, data, self._request)

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        answer = self._answer
        if answer.complete and answer.keep and not answer.chunks and not answer.extra:
            await self._pool._give(self._key, connection)
        else:
            await connection.aclose()


def _head(request: httpx2.Request) -> bytes:
    raw = request.headers.raw
    lines = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    for name, value in raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    head = b"".join(lines)
    ends = len(raw) + 2  # every line ends in CRLF, and no CR, LF or NUL stands anywhere else
    if head.count(b"\n") != ends or head.count(b"\r") != ends or b"\0" in head:
        raise httpx2.LocalProtocolError("a header name or value holds a line break", request=request)
    return head


async def _send(connection: _Connection, data: bytes, write_s: float | None, request: httpx2.Request) -> None:
    try:
        if write_s is None:
            await connection.stream.send(data)
            return
        with anyio.CancelScope(deadline=anyio.current_time() + write_s):  # fail_after, without its contextlib
            await connection.stream.send(data)
            return
        raise httpx2.WriteTimeout("the request could not be written in time", request=request)  # the deadline passed
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError) as exc:
        raise httpx2.WriteError(str(exc) or type(exc).__name__, request=request) from exc


async def _receive(connection: _Connection, read_s: float | None, request: httpx2.Request) -> bytes:
    try:
        if read_s is None:
            return await connection.stream.receive(READ_BYTES)
        with anyio.CancelScope(deadline=anyio.current_time() + read_s):  # fail_after, without its contextlib
            return await connection.stream.receive(READ_BYTES)
        raise httpx2.ReadTimeout("the answer did not come in time", request=request)  # the scope's deadline passed
    except anyio.EndOfStream:
        return b""
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError) as exc:
        raise httpx2.ReadError(str(exc) or type(exc).__name__, request=request) from exc


def _feed(parser: Any, data: bytes, request: httpx2.Request) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise httpx2.RemoteProtocolError(f"the server's answer is not HTTP/1.1: {exc}", request=request) from None
