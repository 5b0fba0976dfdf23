"""Connections at the HTTP edge (``gateway/connections.py``), over a real gateway process on loopback: silent,
slowloris and slow-body connections are closed on their deadlines, idle sockets beyond the cap (and beyond the
process's open-files limit) do not keep a token holder out, a connection beyond the cap while every connection is
busy is answered 503 at once, and accept errors are reported once per second, not once per attempt."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream

from gateway.front.http.connections import MAX_HEAD_BYTES, PARSERS, Throttle, ThrottledLog
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session
from tests.fixtures.procs import LOOPBACK, RunningServer, free_port, start_http_server

pytestmark = pytest.mark.anyio

TOKEN = "tok-alice"


def config(limits: str) -> str:
    return f"""
gateway:
  audit: {{enabled: false}}
  limits: {{{limits}}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""


@pytest.fixture(params=sorted(PARSERS))
def parser(request: pytest.FixtureRequest) -> str:
    """Each of uvicorn's HTTP parsers the edge runs on (GATEWAY_HTTP_PARSER; httptools unless told)."""
    return str(request.param)


@contextmanager
def gateway(folder: Path, limits: str, parser: str, *, open_files: int | None = None) -> Iterator[RunningServer]:
    """The real gateway on ``parser`` with ``limits``; with ``open_files``, under that hard RLIMIT_NOFILE (via
    prlimit)."""
    path = folder / "federation.yaml"
    path.write_text(config(limits))
    port = free_port()
    argv = [PYTHON, "-m", "gateway", "serve", "-c", str(path), "--port", str(port)]
    if open_files is not None:
        argv = ["prlimit", f"--nofile={open_files}:{open_files}", *argv]
    env = {**os.environ, "GATEWAY_TOKENS": f"alice={TOKEN}", "GATEWAY_HTTP_PARSER": parser}
    with start_http_server(argv, port, env=env, cwd=folder) as server:
        yield server


async def read_to_close(stream: SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while True:
        try:
            chunks.append(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return b"".join(chunks)


@pytest.mark.spawns
async def test_a_silent_connection_is_closed_after_keep_alive_s(tmp_path: Path, parser: str) -> None:
    with gateway(tmp_path, "keep_alive_s: 0.5, header_timeout_s: 30", parser) as gw:
        with anyio.fail_after(5):
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                started = time.monotonic()
                assert await read_to_close(stream) == b""
                assert time.monotonic() - started >= 0.4


@pytest.mark.spawns
async def test_a_request_head_that_never_completes_is_answered_408_and_closed(tmp_path: Path, parser: str) -> None:
    with gateway(tmp_path, "keep_alive_s: 0.5, header_timeout_s: 1.5", parser) as gw:
        with anyio.fail_after(6):
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                await stream.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                started = time.monotonic()

                async def trickle() -> None:  # slowloris: a header line every 0.2 s, forever
                    for n in range(1000):
                        await anyio.sleep(0.2)
                        try:
                            await stream.send(b"X-Slow-%d: y\r\n" % n)
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                            return

                async with anyio.create_task_group() as tg:
                    tg.start_soon(trickle)
                    answer = await read_to_close(stream)
                    tg.cancel_scope.cancel()
                assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
                assert b"no complete request head within 1.5 s" in answer
                assert 1.3 <= time.monotonic() - started < 5


@pytest.mark.spawns
async def test_a_request_head_larger_than_the_limit_is_refused_at_once_and_closed(tmp_path: Path, parser: str) -> None:
    with gateway(tmp_path, "keep_alive_s: 30, header_timeout_s: 30", parser) as gw:
        with anyio.fail_after(6):
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                await stream.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                started = time.monotonic()
                line = b"X-Big: " + b"y" * 1000 + b"\r\n"
                for _ in range(MAX_HEAD_BYTES // len(line) + 2):  # a head that grows past the limit, never ending
                    try:
                        await stream.send(line)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        break
                answer = await read_to_close(stream)
                # h11 refuses it itself (uvicorn's 400), httptools has no bound of its own: the edge's 431
                assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 Request Header Fields Too Large\r\n"))
                assert time.monotonic() - started < 5
        with anyio.fail_after(10):
            async with mcp_session(gw.url(), token=TOKEN) as session:  # and the gateway serves on
                result = await session.call_tool("echo", {"text": "after a big head"})
                assert result.content[0].text == "after a big head"  # type: ignore[union-attr]


@pytest.mark.spawns
async def test_a_header_values_surrounding_whitespace_is_not_part_of_it(tmp_path: Path, parser: str) -> None:
    # RFC 9110 5.5: h11 strips it, llhttp keeps the trailing part; the SDK compares the session id as given.
    def post(body: dict[str, object], *extra: str) -> bytes:
        text = json.dumps(body)
        head = [
            "POST /mcp HTTP/1.1",
            "Host: 127.0.0.1",
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
            f"Authorization: Bearer {TOKEN}  ",
            *extra,
            f"Content-Length: {len(text)}",
            "Connection: close",
        ]
        return ("\r\n".join(head) + "\r\n\r\n" + text).encode()

    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    with gateway(tmp_path, "", parser) as gw:
        with anyio.fail_after(10):
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                await stream.send(post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))
                answer = await read_to_close(stream)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            session = next(
                line.split(b":", 1)[1].strip().decode()
                for line in answer.split(b"\r\n")
                if line.lower().startswith(b"mcp-session-id:")
            )
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
                await stream.send(post(listing, f"Mcp-Session-Id: {session} \t", "Mcp-Protocol-Version:  2025-06-18 "))
                answer = await read_to_close(stream)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert b'"name":"echo"' in answer


@pytest.mark.spawns
async def test_a_request_body_that_stops_arriving_is_cut_after_body_timeout_s(tmp_path: Path, parser: str) -> None:
    with gateway(tmp_path, "body_timeout_s: 1", parser) as gw:
        with anyio.fail_after(6):
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                head = (
                    "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {TOKEN}\r\n"
                    "Content-Length: 1000\r\n\r\n"
                )
                await stream.send(head.encode() + b'{"jsonrpc": "2.0", ')
                started = time.monotonic()
                await read_to_close(stream)
                assert 0.8 <= time.monotonic() - started < 5


@pytest.mark.spawns
async def test_a_token_holder_is_served_while_idle_sockets_beyond_the_cap_and_the_open_files_limit_are_held(
    tmp_path: Path, parser: str
) -> None:
    idle = 300  # more than the gateway may open files (200)
    with gateway(
        tmp_path, "max_connections: 40, keep_alive_s: 120, header_timeout_s: 120", parser, open_files=200
    ) as gw:
        async with AsyncExitStack() as held:
            with anyio.fail_after(30):
                sockets = [
                    await held.enter_async_context(await anyio.connect_tcp(LOOPBACK, gw.port)) for _ in range(idle)
                ]
                async with mcp_session(gw.url(), token=TOKEN) as session:
                    for n in range(3):
                        result = await session.call_tool("echo", {"text": f"still served {n}"})
                        assert result.content[0].text == f"still served {n}"  # type: ignore[union-attr]
            assert len(sockets) == idle
        output = gw.output()
    assert "Too many open files" not in output
    assert output.count("connection.evicted") <= 35  # one line a second, with a count of the rest


@pytest.mark.spawns
async def test_beyond_the_cap_with_every_connection_busy_a_new_connection_gets_503_at_once(
    tmp_path: Path, parser: str
) -> None:
    with gateway(tmp_path, "max_connections: 4, body_timeout_s: 60", parser) as gw:
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
        ).encode()
        async with AsyncExitStack() as held:
            with anyio.fail_after(10):
                for _ in range(4):  # four requests in progress: none of them may be evicted
                    busy = await held.enter_async_context(await anyio.connect_tcp(LOOPBACK, gw.port))
                    await busy.send(head)
                    # "100 Continue" comes when the app first reads the body: the server has the head.
                    assert (await busy.receive()).startswith(b"HTTP/1.1 100 ")
                    await busy.send(b"{")
                async with await anyio.connect_tcp(LOOPBACK, gw.port) as extra:
                    started = time.monotonic()
                    answer = await read_to_close(extra)
                    assert time.monotonic() - started < 2
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            assert b"retry-after: 1" in answer
            assert b"too many open connections" in answer


def test_a_throttled_report_passes_once_per_interval_and_then_counts_what_it_suppressed() -> None:
    now = [100.0]
    throttle = Throttle(interval=1.0, clock=lambda: now[0])
    assert throttle.allow("accept") == 0
    assert [throttle.allow("accept") for _ in range(500)] == [None] * 500
    assert throttle.allow("other") == 0  # events are throttled separately
    now[0] += 1.0
    assert throttle.allow("accept") == 500
    assert throttle.allow("accept") is None


@pytest.mark.spawns
async def test_malformed_requests_are_warned_about_once_a_second_with_a_count(tmp_path: Path, parser: str) -> None:
    with gateway(tmp_path, "", parser) as gw:
        with anyio.fail_after(10):
            for _ in range(50):
                async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                    await stream.send(b"NOT HTTP AT ALL\r\n\r\n")
                    assert (await read_to_close(stream)).startswith(b"HTTP/1.1 400 ")
        output = gw.output()
    warnings = [line for line in output.splitlines() if "Invalid HTTP request received." in line]
    assert 1 <= len(warnings) <= 3, output  # 50 before the throttle


def test_a_throttled_log_filter_passes_a_template_once_per_interval_and_then_names_the_count() -> None:
    now = [0.0]
    throttled = ThrottledLog(Throttle(interval=1.0, clock=lambda: now[0]))

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, None, None)

    assert throttled.filter(record("Invalid HTTP request received."))
    assert not any(throttled.filter(record("Invalid HTTP request received.")) for _ in range(9))
    now[0] = 1.5
    passed = record("Invalid HTTP request received.")
    assert throttled.filter(passed)
    assert passed.getMessage() == "Invalid HTTP request received. (9 more like it suppressed)"


@pytest.mark.spawns
async def test_a_request_with_both_content_length_and_transfer_encoding_is_refused_and_its_connection_closed(
    tmp_path: Path, parser: str
) -> None:
    # RFC 9112 6.1: such a request is a smuggling attempt; whatever is answered, the connection must close after it,
    # so the request pipelined behind it (here a GET of /healthz) is never served on the same connection.
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    smuggled = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
        b"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
        + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    with gateway(tmp_path, "keep_alive_s: 30", parser) as gw:
        with anyio.fail_after(10):
            async with await anyio.connect_tcp(LOOPBACK, gw.port) as stream:
                await stream.send(smuggled)
                answer = await read_to_close(stream)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert answer.count(b"HTTP/1.1 ") == 1, answer  # the pipelined request was not answered: the connection closed
        with anyio.fail_after(10):
            async with mcp_session(gw.url(), token=TOKEN) as session:  # and the gateway serves on
                result = await session.call_tool("echo", {"text": "after"})
                assert result.content[0].text == "after"  # type: ignore[union-attr]


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_connection_the_client_ends_is_let_go_at_once_even_when_reset(parser: str, reset: bool) -> None:
    # uvicorn stopped a connection's silence timer only when it ended cleanly: one the client reset (a client that
    # closes a response it did not read to the end does) stayed referenced by that timer for keep_alive_s, protocol,
    # transport, socket and request, for every full collection of the garbage collector to walk.
    import asyncio
    import gc
    import socket
    import struct
    import weakref

    import uvicorn
    from uvicorn.server import ServerState

    from gateway.config import Limits
    from gateway.front.http.connections import edge_protocol

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("no request is sent")

    edge = edge_protocol(Limits(keep_alive_s=60), parser=parser)
    lost = anyio.Event()
    made: list[weakref.ref[object]] = []

    class Watched(edge):  # type: ignore[misc, valid-type]
        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            lost.set()

    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()

    def factory() -> object:
        protocol = Watched(config=config, server_state=state, app_state={}, _loop=loop)
        made.append(weakref.ref(protocol))
        return protocol

    server = await loop.create_server(factory, LOOPBACK, 0)
    try:
        port = server.sockets[0].getsockname()[1]
        with anyio.fail_after(10):
            client = await anyio.connect_tcp(LOOPBACK, port)
            raw = client.extra(anyio.abc.SocketAttribute.raw_socket)
            if reset:  # closed with SO_LINGER 0: the kernel sends RST
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await client.aclose()
            await lost.wait()
        await anyio.lowlevel.checkpoint()  # the transport's own close callbacks
        gc.collect()
        assert [ref() for ref in made] == [None]
    finally:
        server.close()
        await server.wait_closed()
