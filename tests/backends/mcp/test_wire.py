"""The calls' own HTTP/1.1 (backends/mcp/wire.py) against a scripted loopback server: connections kept and reused
only when the answer was whole and the server keeps them, every failure as httpx2's error, every connection made
through the egress check."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
import trustme
from anyio.streams.tls import TLSListener

from gateway.backends.mcp.egress import LOOPBACK_RECEIVE_BYTES, REFUSED
from gateway.backends.mcp.wire import Http11

pytestmark = pytest.mark.anyio

CALL = b'{"jsonrpc":"2.0","id":"gw-1","method":"tools/call","params":{"name":"echo"}}'


def answer(body: bytes, *extra: bytes, status: bytes = b"200 OK") -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(line + b"\r\n" for line in extra) + b"\r\n" + body


def chunked(*pieces: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@dataclass
class Step:
    """What the server does with one request: send ``reply``, then close the connection when ``close``; or never
    answer when ``hold``."""

    reply: bytes = b""
    close: bool = False
    hold: bool = False
    closed: anyio.Event = field(default_factory=anyio.Event)  # set once the server closed after this step


@dataclass
class Server:
    steps: list[Step]
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def serve(self, stream: anyio.abc.ByteStream) -> None:
        self.connections += 1
        buffered = b""
        async with stream:
            while self.steps:
                while b"\r\n\r\n" not in buffered:
                    try:
                        buffered += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                while len(buffered) < length:
                    buffered += await stream.receive()
                self.requests.append(head + b"\r\n\r\n" + buffered[:length])
                buffered = buffered[length:]
                step = self.steps.pop(0)
                if step.hold:
                    await anyio.sleep_forever()
                if step.reply:
                    await stream.send(step.reply)
                if step.close:
                    await stream.aclose()
                    step.closed.set()
                    return


@asynccontextmanager
async def scripted(steps: Sequence[Step], tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server(list(steps))
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
    server.port = tcp.extra(anyio.abc.SocketAttribute.local_port)
    listener: anyio.abc.Listener[Any] = tcp if tls is None else TLSListener(tcp, tls, standard_compatible=False)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.serve)
        yield server
        tg.cancel_scope.cancel()


def wire(verify: ssl.SSLContext | None = None) -> Http11:
    return Http11(verify or ssl.create_default_context(), httpx2.AsyncHTTPTransport(), keep=4)


async def post(transport: Http11, port: int, *, read_s: float = 5, scheme: str = "http") -> bytes:
    request = httpx2.Request(
        "POST",
        f"{scheme}://127.0.0.1:{port}/mcp?x=1",
        content=CALL,
        headers={"content-type": "application/json"},
        extensions={"timeout": {"connect": 5, "read": read_s, "write": 5, "pool": 5}},
    )
    response = await transport.handle_async_request(request)
    try:
        return b"%d " % response.status_code + b"".join([chunk async for chunk in response.stream])
    finally:
        await response.stream.aclose()


async def test_a_whole_answer_leaves_its_connection_for_the_next_call() -> None:
    steps = [Step(answer(b'{"n":1}')), Step(chunked(b"data: a\n\n", b"data: b\n\n")), Step(answer(b'{"n":3}'))]
    with anyio.fail_after(10):
        async with scripted(steps) as server:
            transport = wire()
            assert await post(transport, server.port) == b'200 {"n":1}'
            assert await post(transport, server.port) == b"200 data: a\n\ndata: b\n\n"
            assert await post(transport, server.port) == b'200 {"n":3}'
            await transport.aclose()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /mcp?x=1 HTTP/1.1\r\n")
    assert b"\r\nhost: 127.0.0.1:%d\r\n" % server.port in first.lower()
    assert first.endswith(b"\r\n\r\n" + CALL)


async def test_a_connection_the_server_closes_is_never_used_again() -> None:
    """Said (``Connection: close``), or done without a word while the connection was idle: the next call connects
    anew and is sent once."""
    steps = [Step(answer(b"1", b"connection: close"), close=True), Step(answer(b"2"), close=True), Step(answer(b"3"))]
    with anyio.fail_after(10):
        async with scripted(steps) as server:
            transport = wire()
            assert await post(transport, server.port) == b"200 1"
            assert await post(transport, server.port) == b"200 2"
            await steps[1].closed.wait()  # closed while idle, before the next call
            assert await post(transport, server.port) == b"200 3"
            await transport.aclose()
    assert server.connections == 3
    assert len(server.requests) == 3


async def test_an_interim_answer_is_skipped_and_what_follows_the_answer_never_reaches_the_next_call() -> None:
    """A ``100 Continue`` before the answer is passed over; bytes after the answer (a second response the server
    sent unasked) are not read as the next call's answer: that call goes on a connection of its own."""
    unasked = answer(b'{"forged":true}')
    steps = [Step(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b'{"n":1}') + unasked), Step(answer(b'{"n":2}'))]
    with anyio.fail_after(10):
        async with scripted(steps) as server:
            transport = wire()
            assert await post(transport, server.port) == b'200 {"n":1}'
            assert await post(transport, server.port) == b'200 {"n":2}'
            await transport.aclose()
    assert server.connections == 2


async def test_an_answer_read_only_in_part_closes_its_connection() -> None:
    steps = [Step(chunked(b"data: a\n\n", b"data: b\n\n")), Step(answer(b"2"))]
    with anyio.fail_after(10):
        async with scripted(steps) as server:
            transport = wire()
            request = httpx2.Request("POST", f"http://127.0.0.1:{server.port}/", content=CALL)
            response = await transport.handle_async_request(request)
            assert response.headers["content-type"] == "text/event-stream"
            await response.stream.aclose()  # the caller stopped reading
            assert await post(transport, server.port) == b"200 2"
            await transport.aclose()
    assert server.connections == 2


async def test_a_body_without_a_length_runs_to_the_close() -> None:
    steps = [Step(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"whole":true}', close=True)]
    with anyio.fail_after(10):
        async with scripted(steps) as server:
            transport = wire()
            assert await post(transport, server.port) == b'200 {"whole":true}'
            await transport.aclose()


@pytest.mark.parametrize(
    ("step", "error", "says"),
    [
        (Step(close=True), httpx2.RemoteProtocolError, "Server disconnected without sending a response"),
        (Step(answer(b"0123456789")[:-4], close=True), httpx2.RemoteProtocolError, "without sending complete"),
        (Step(b"SSH-2.0-OpenSSH_9.2\r\n\r\n", close=True), httpx2.RemoteProtocolError, "not HTTP/1.1"),
        (
            Step(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n"),
            httpx2.RemoteProtocolError,
            "not HTTP",
        ),
        (Step(hold=True), httpx2.ReadTimeout, "did not come in time"),
    ],
    ids=["no answer", "cut body", "not http", "both lengths", "silence"],
)
async def test_a_broken_answer_is_httpx2s_error_and_its_connection_is_dropped(
    step: Step, error: type[Exception], says: str
) -> None:
    with anyio.fail_after(10):
        async with scripted([step, Step(answer(b"next"))]) as server:
            transport = wire()
            with pytest.raises(error, match=says):
                await post(transport, server.port, read_s=0.5)
            assert await post(transport, server.port) == b"200 next"
            await transport.aclose()
    assert server.connections == 2


async def test_a_header_with_a_line_break_is_never_sent() -> None:
    with anyio.fail_after(10):
        async with scripted([Step(answer(b"1"))]) as server:
            transport = wire()
            request = httpx2.Request("POST", f"http://127.0.0.1:{server.port}/", content=CALL)
            request.headers["x-note"] = "a\r\nx-injected: 1"
            with pytest.raises(httpx2.LocalProtocolError, match="line break"):
                await transport.handle_async_request(request)
            await transport.aclose()
    assert server.connections == 0


@pytest.mark.parametrize("host", ["169.254.169.254", "[fd00:ec2::254]"])
async def test_a_call_connects_only_where_the_egress_check_allows(host: str) -> None:
    transport = wire()
    request = httpx2.Request("POST", f"http://{host}:80/mcp", content=CALL)
    with anyio.fail_after(10), pytest.raises(httpx2.ConnectError, match=f"^{REFUSED} .*a cloud metadata address"):
        await transport.handle_async_request(request)


async def test_a_calls_connection_to_loopback_keeps_a_fixed_receive_buffer() -> None:
    with anyio.fail_after(10):
        async with scripted([Step(answer(b"1"))]) as server:
            transport = wire()
            assert await post(transport, server.port) == b"200 1"
            (kept,) = transport._idle[("http", "127.0.0.1", server.port)]
            assert kept.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * LOOPBACK_RECEIVE_BYTES
            await transport.aclose()


async def test_a_refused_port_is_a_connect_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    transport = wire()
    with anyio.fail_after(10), pytest.raises(httpx2.ConnectError):
        await post(transport, port)


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def server_tls(authority: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(*names).configure_cert(context)
    return context


async def test_a_call_over_tls_is_verified_and_its_connection_kept(authority: trustme.CA) -> None:
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    with anyio.fail_after(10):
        async with scripted([Step(answer(b"1")), Step(answer(b"2"))], server_tls(authority, "127.0.0.1")) as server:
            transport = wire(trusting)
            assert await post(transport, server.port, scheme="https") == b"200 1"
            assert await post(transport, server.port, scheme="https") == b"200 2"
            await transport.aclose()
    assert server.connections == 1


@pytest.mark.parametrize("case", ["unknown authority", "another name"])
async def test_a_certificate_that_does_not_verify_is_a_connect_error(authority: trustme.CA, case: str) -> None:
    trusting = ssl.create_default_context()
    if case == "another name":
        authority.configure_trust(trusting)
    names = ("127.0.0.1",) if case == "unknown authority" else ("gateway.example",)
    with anyio.fail_after(10):
        async with scripted([Step(answer(b"1"))], server_tls(authority, *names)) as server:
            transport = wire(trusting)
            with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await post(transport, server.port, scheme="https")
            await transport.aclose()
