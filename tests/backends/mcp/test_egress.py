"""Where the gateway connects on a downstream's behalf (backends/mcp/egress.py): link-local and metadata addresses
never, private ones only with ``allow_private``, loopback always; checked against what the host resolves to, at
connect time, for a server's URL and for a redirect alike."""

from __future__ import annotations

import http.server
import ipaddress
import json
import socket
import threading
from collections.abc import Iterator

import anyio
import httpcore2
import httpx2
import pytest

from gateway.backends.mcp.egress import LOOPBACK_RECEIVE_BYTES, REFUSED, GuardedNetwork, refusal
from gateway.backends.mcp.failures import ResponseRecorder
from gateway.backends.mcp.pool import HttpPool
from gateway.config import HttpServer
from gateway.testing import in_process_gateway
from tests.fixtures.gateway_proc import echo_argv
from tests.fixtures.procs import LOOPBACK, free_port, start_http_server


@pytest.mark.parametrize(
    ("address", "allow_private", "why"),
    [
        ("169.254.169.254", True, "a cloud metadata address"),
        ("::ffff:169.254.169.254", True, "a cloud metadata address"),  # IPv4 dressed as IPv6
        ("fd00:ec2::254", True, "a cloud metadata address"),
        ("100.100.100.200", True, "a cloud metadata address"),
        ("169.254.1.1", True, "a link-local address"),
        ("fe80::1", True, "a link-local address"),
        ("0.0.0.0", True, "not a unicast address"),
        ("224.0.0.1", True, "not a unicast address"),
        ("10.1.2.3", False, "a private address (set allow_private: true on the server to allow it)"),
        ("192.168.1.1", False, "a private address (set allow_private: true on the server to allow it)"),
        ("100.64.0.1", False, "a private address (set allow_private: true on the server to allow it)"),
        ("fd12::1", False, "a private address (set allow_private: true on the server to allow it)"),
        ("10.1.2.3", True, None),
        ("127.0.0.1", False, None),
        ("::1", False, None),
        ("93.184.215.14", False, None),
    ],
)
def test_which_addresses_are_refused_and_why(address: str, allow_private: bool, why: str | None) -> None:
    assert refusal(ipaddress.ip_address(address), allow_private) == why


def _server(url: str) -> HttpServer:
    return HttpServer(transport="streamable_http", url=url)


def test_the_pool_connects_through_the_guard() -> None:
    """egress.guard reaches into httpx2's transport: this fails first if httpcore2 moves what it reaches."""
    transport = HttpPool().for_backend("s", _server("http://127.0.0.1:1/mcp"))._own()
    for inner in (
        transport._calls._fallback,
        transport._control,
    ):  # what the calls' own transport does not carry; control
        assert isinstance(inner._pool._network_backend, GuardedNetwork)


@pytest.mark.anyio
@pytest.mark.parametrize("host", ["169.254.169.254", "0xa9fea9fe"])  # the second resolves to the first (inet_aton)
async def test_a_server_url_at_a_metadata_address_is_refused_by_what_it_resolves_to(host: str) -> None:
    config = f"""
gateway: {{audit: {{enabled: false}}}}
servers:
  meta: {{transport: streamable_http, url: "http://{host}/mcp", connect_timeout_s: 5}}
"""
    with anyio.fail_after(20):
        async with in_process_gateway(config) as (_, gateway):
            [(_, _, status)] = gateway.statuses()
    assert status.state.value == "failed"
    assert status.reason is not None and status.reason.startswith(REFUSED)
    assert "a cloud metadata address" in status.reason and "169.254.169.254" in status.reason


def _own_private_address() -> str | None:
    """This machine's address on its network when that address is private (as on CI's and developers' machines)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    parsed = ipaddress.ip_address(address)
    return address if parsed.is_private and not parsed.is_loopback else None


@pytest.mark.anyio
@pytest.mark.spawns
@pytest.mark.parametrize("allow_private", [False, True])
async def test_a_server_at_a_private_address_is_reached_only_with_allow_private(allow_private: bool) -> None:
    address = _own_private_address()
    if address is None:
        pytest.skip("this machine has no private non-loopback address")
    port = free_port()
    with start_http_server(echo_argv("--http", str(port), "--host", address), port, host=address):
        config = f"""
gateway: {{audit: {{enabled: false}}}}
servers:
  near: {{transport: streamable_http, url: "http://{address}:{port}/mcp", allow_private: {json.dumps(allow_private)}}}
"""
        with anyio.fail_after(30):
            async with in_process_gateway(config) as (client, gateway):
                [(_, _, status)] = gateway.statuses()
                if allow_private:
                    assert status.state.value == "ready", status.reason
                    echoed = await client.call_tool("echo", {"text": "hi"})
                    assert not echoed.is_error
                else:
                    assert status.state.value == "failed"
                    assert (
                        status.reason
                        == f"{REFUSED} {address}: a private address (set allow_private: true on the server to allow it)"
                    )


class _Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(307)
        self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.anyio
async def test_a_redirect_to_a_metadata_address_is_refused_at_its_connect(redirecting: str) -> None:
    pool = HttpPool()
    client = pool.for_backend("s", _server(redirecting)).client({}, 5.0, ResponseRecorder(), max_answer_bytes=1 << 20)
    client.follow_redirects = True  # the gateway's own clients follow none; a hop that is followed is checked
    try:
        with anyio.fail_after(10), pytest.raises(httpx2.ConnectError, match="169.254.169.254: a cloud metadata"):
            await client.get(redirecting)
    finally:
        await client.aclose()
        await pool.aclose()


@pytest.mark.anyio
async def test_a_name_that_does_not_resolve_is_a_connect_error() -> None:
    guarded = GuardedNetwork(httpcore2.AnyIOBackend())
    with anyio.fail_after(10), pytest.raises(httpcore2.ConnectError, match="did not resolve"):
        await guarded.connect_tcp("no-such-host.invalid", 80, timeout=5)


@pytest.mark.anyio
async def test_a_connection_to_loopback_keeps_a_fixed_receive_buffer() -> None:
    # The kernel would grow it while the gateway reads fast (to tcp_rmem's maximum), and a server flooding a client
    # that stops reading would fill all of it before it was held back (tests/front/test_slow_clients.py).
    listener = socket.create_server((LOOPBACK, 0))
    guarded = GuardedNetwork(httpcore2.AnyIOBackend())
    try:
        with anyio.fail_after(10):
            stream = await guarded.connect_tcp("localhost", listener.getsockname()[1], timeout=5)
        sock = stream.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * LOOPBACK_RECEIVE_BYTES  # Linux doubles it
        await stream.aclose()
    finally:
        listener.close()
