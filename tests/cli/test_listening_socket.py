"""The socket ``gateway serve`` listens on: what every accepted connection inherits from it."""

from __future__ import annotations

import asyncio
import socket

from gateway.cli.serving import _bound_socket


async def _accepted(listening: socket.socket, level: int, option: int) -> int:
    """The ``option`` of a connection accepted on ``listening``."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(level, option))

    server = await loop.create_server(Probe, sock=listening)  # as uvicorn serves `sockets=[...]`
    try:
        port = listening.getsockname()[1]
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        try:
            return await asyncio.wait_for(accepted, 5)
        finally:
            writer.close()
    finally:
        server.close()


def test_accepted_connections_send_without_nagle_delay() -> None:
    """A response goes out in several writes (head, body, the chunked end). With Nagle's algorithm on the accepted
    socket, each write after the first waits for the client's delayed ACK: every request after the first on a
    kept-alive connection took 44 ms instead of 1 ms. asyncio turns Nagle off only on sockets made for IPPROTO_TCP."""
    listening = _bound_socket("127.0.0.1", 0)
    assert asyncio.run(_accepted(listening, socket.IPPROTO_TCP, socket.TCP_NODELAY)) != 0


def test_accepted_connections_hold_a_bounded_send_buffer() -> None:
    """What a client that stops reading can make the gateway send before the gateway knows it is the connection's
    send buffer: bounded, not the 4 MiB the kernel grows it to (Linux keeps twice what is asked)."""
    bounded = _bound_socket("127.0.0.1", 0, 256 * 1024)
    assert asyncio.run(_accepted(bounded, socket.SOL_SOCKET, socket.SO_SNDBUF)) == 2 * 256 * 1024
    free = _bound_socket("127.0.0.1", 0)
    assert asyncio.run(_accepted(free, socket.SOL_SOCKET, socket.SO_SNDBUF)) != 2 * 256 * 1024
