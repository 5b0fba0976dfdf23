"""Where the gateway may connect on a downstream's behalf: every TCP connection of the HTTP pool (a server's URL, a
redirect, the endpoint an SSE server names) is checked against the addresses its host resolves to, at connect time,
and made to the address that was checked, so a name that resolves elsewhere a moment later (DNS rebinding) gains
nothing.

Never: link-local (169.254.0.0/16, fe80::/10), the cloud metadata addresses (169.254.169.254, fd00:ec2::254,
100.100.100.200), unspecified, multicast and reserved addresses. Private addresses (10/8, 172.16/12, 192.168/16,
100.64/10 shared, fc00::/7 unique-local) only for a server with ``allow_private: true``. Loopback stays allowed: local
servers and every test listen there, and reaching them needs no more than the file already says. A name with one
refused address among several is refused whole. A connection already open in the pool is reused without a check.

A connection to a loopback address keeps a fixed receive buffer (``LOOPBACK_RECEIVE_BYTES``): the kernel grows the
buffer of a connection read fast (to ``tcp_rmem``'s maximum, tens of MiB), which across a network keeps a long round
trip full but on loopback buys nothing; grown, it is what a server flooding a client that stops reading (through its
session of its own, backends/mcp/own.py) fills before it is held back, where a client's own connection would hold it
within the kernel's default.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import anyio
import httpcore2
import httpx2

__all__ = [
    "LOOPBACK_RECEIVE_BYTES",
    "REFUSED",
    "AddressRefused",
    "Admitting",
    "GuardedNetwork",
    "admitted",
    "guard",
    "refusal",
    "socket_options_for",
]

REFUSED = "the gateway does not connect to"
"""How every ``AddressRefused`` message starts (backends/mcp/failures.py shows it as the backend's reason)."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)
"""Cloud instance metadata and credential endpoints (AWS, GCP and Azure share the first; AWS IPv6; Alibaba; ECS)."""
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: private in all but name

LOOPBACK_RECEIVE_BYTES = 128 * 1024
"""``SO_RCVBUF`` of a connection to a loopback address: Linux's default (``tcp_rmem``), fixed (Linux doubles it for its
own bookkeeping)."""

_ALLOW_PRIVATE: ContextVar[bool] = ContextVar("gateway_egress_allow_private", default=False)


class AddressRefused(httpcore2.ConnectError):
    """A connection the gateway will not open: the message names the host, the address and why."""


def refusal(address: IPAddress, allow_private: bool) -> str | None:
    """Why ``address`` may not be connected to, or None when it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_loopback:
        return None
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "not a unicast address"
    if (address.is_private or address in _SHARED) and not allow_private:
        return "a private address (set allow_private: true on the server to allow it)"
    return None


async def _addresses(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in found))


async def admitted(host: str, port: int, timeout: float | None) -> list[IPAddress]:  # noqa: ASYNC109
    """The addresses ``host`` resolves to, when ``refusal`` allows every one of them (with the ``allow_private`` of
    the server whose request is being sent: ``Admitting``).

    Raises:
        AddressRefused: an address ``host`` resolves to is refused.
        httpcore2.ConnectError: ``host`` did not resolve (within ``timeout``).
    """
    allow_private = _ALLOW_PRIVATE.get()
    try:
        with anyio.fail_after(timeout):
            addresses = await _addresses(host, port)
    except (OSError, TimeoutError) as exc:
        raise httpcore2.ConnectError(f"{host} did not resolve: {exc}") from exc
    for address in addresses:
        why = refusal(address, allow_private)
        if why is not None:
            shown = host if host == str(address) else f"{host} ({address})"
            raise AddressRefused(f"{REFUSED} {shown}: {why}")
    return addresses


def socket_options_for(address: IPAddress) -> list[tuple[int, int, int]]:
    """The socket options of a connection to ``address`` (a loopback one's fixed receive buffer)."""
    return [(socket.SOL_SOCKET, socket.SO_RCVBUF, LOOPBACK_RECEIVE_BYTES)] if address.is_loopback else []


class GuardedNetwork(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend, connecting only to addresses ``refusal`` allows (see the module docstring)."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Resolve ``host``, refuse it if any address is refused, else connect to the first that answers.

        Raises:
            AddressRefused: an address ``host`` resolves to is refused.
            httpcore2.ConnectError: no address answered (the last failure), or ``host`` did not resolve.
        """
        addresses = await admitted(host, port, timeout)
        last: Exception | None = None
        for address in addresses:
            options = [*(socket_options or ()), *socket_options_for(address)]
            try:
                return await self._inner.connect_tcp(str(address), port, timeout, local_address, options or None)
            except httpcore2.ConnectError as exc:
                last = exc
        raise last if last is not None else httpcore2.ConnectError(f"{host} has no address")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guard(transport: httpx2.AsyncHTTPTransport) -> httpx2.AsyncHTTPTransport:
    """``transport`` with its pool's connections made through ``GuardedNetwork`` (tests/backends/mcp/test_egress.py
    holds httpcore2 to the attributes this reaches)."""
    pool = transport._pool
    pool._network_backend = GuardedNetwork(pool._network_backend)
    return transport


class Admitting(httpx2.AsyncBaseTransport):
    """One server's requests through the shared pool, with that server's ``allow_private``."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, allow_private: bool) -> None:
        self._inner = inner
        self._allow_private = allow_private

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        with _allowing(self._allow_private):
            return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@contextmanager
def _allowing(allow_private: bool) -> Iterator[None]:
    token = _ALLOW_PRIVATE.set(allow_private)
    try:
        yield
    finally:
        _ALLOW_PRIVATE.reset(token)
