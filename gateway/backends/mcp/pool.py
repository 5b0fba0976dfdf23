"""The gateway's HTTP connections: one ``BackendPool`` per HTTP backend (streamable HTTP and SSE), so one backend's
saturation is that backend's alone.

Each backend has two pools. A streamable HTTP server's calls (a JSON-RPC request POSTed for a caller: ``calls_for``
names the caller) go over the gateway's own HTTP/1.1 (wire.py) and take one of ``max_connections`` slots, shared fairly
(slots.py: a caller holds at most ``max_connections_per_caller``, and a freed slot goes to the waiting caller that holds
the fewest); a call no slot came for within ``min(connect_timeout_s, timeout_s / 2)`` is answered by the gateway itself
with a ``SATURATED`` error, which the backend reads as ``BackendSaturated``: not a transport error, never the
downstream's failure. Everything else (the handshake, health pings, lists, answers to the server's requests, streams)
goes on the control pool, which never waits behind calls; so does all of a legacy SSE server's traffic (its SDK client
sends one message at a time, each answered at once). Every session borrows a cheap client view (its own headers,
timeouts and answer limit) whose closing leaves the pools open; ``HttpPool.aclose`` closes them once, at shutdown. A
downstream's closed SSE stream is resumed when the gateway's own client resumes (polling.py). A POST's response closed
early is drained (bounded) so its connection is reused, and each view remembers the last error response, so a failed
handshake can be told in plain words (backends/mcp/failures.py).
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager

import anyio
import anyio.lowlevel
import httpx2

from gateway.backends.mcp.answers import LimitedTransport
from gateway.backends.mcp.egress import Admitting, guard
from gateway.backends.mcp.failures import FOREIGN, OWN_ANSWER, SATURATED, ResponseRecorder
from gateway.backends.mcp.framing import JsonLinesTransport
from gateway.backends.mcp.polling import HeldRetries, HeldRetry, resume_key
from gateway.backends.mcp.relay import SERVING
from gateway.backends.mcp.slots import FairSlots
from gateway.backends.mcp.wire import Http11
from gateway.config import HttpServer, SseServer

__all__ = ["CALLER", "BackendPool", "HttpPool", "calls_for"]

CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("gateway_pool_caller", default=None)
"""Whose request the HTTP requests sent now carry (``calls_for``); None: the gateway's own (handshake, pings,
lists, answers to the server's requests, streams)."""

DRAIN_LIMIT_S = 0.05
"""How long closing a POST's response may read the rest of its body so the connection can be reused."""
DRAIN_LIMIT_BYTES = 64 * 1024


class _DrainOnClose(httpx2.AsyncByteStream):
    """A POST's response body that, when closed early, first reads what is left (bounded), so the connection
    goes back to the pool instead of being torn down.

    The SDK closes a POST's SSE response as soon as it has the JSON-RPC answer, a moment before the server ends the
    stream; without the drain every call opened a new TCP connection (measured: 7-16% of the gateway's CPU per call
    and 12-19% of the downstream's). The drain runs after the answer was delivered, off the caller's path.
    """

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self._inner = inner
        self._started = False
        self._finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._started = True
        async for chunk in self._inner:
            yield chunk
        self._finished = True

    async def aclose(self) -> None:
        if self._finished or not self._started:  # read to the end already, or never read: nothing to drain
            await self._inner.aclose()
            return
        try:
            with anyio.move_on_after(DRAIN_LIMIT_S):
                drained = 0
                async for chunk in self._inner:
                    drained += len(chunk)
                    if drained > DRAIN_LIMIT_BYTES:
                        break
                    await anyio.lowlevel.checkpoint()  # the time limit can always interrupt the drain
        except FOREIGN:
            pass  # the connection is not reusable: closing it below is all that is left
        finally:
            await self._inner.aclose()


class _Released(httpx2.AsyncByteStream):
    """A call's response body whose closing gives its slot back (the connection is free again then)."""

    def __init__(self, inner: httpx2.AsyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class _BackendTransport(httpx2.AsyncBaseTransport):
    """One HTTP backend's two pools: its calls' (``FairSlots`` in front) and its control traffic's."""

    def __init__(self, name: str, config: HttpServer | SseServer, verify: ssl.SSLContext) -> None:
        self._name = name
        # Over the legacy SSE transport the SDK POSTs a session's messages one at a time and drops the session at an
        # error status: its calls take no slot (its POSTs are answered 202 at once, the answers come on its stream).
        self._gated = isinstance(config, HttpServer)
        limit = config.max_connections if isinstance(config, HttpServer) else 100
        per_caller = config.max_connections_per_caller if isinstance(config, HttpServer) else None
        self.slots = FairSlots(limit, per_caller or max(1, math.ceil(limit / 2)))
        self._wait_s = min(config.connect_timeout_s, config.timeout_s / 2)
        no_pool_wait = httpx2.Limits(max_connections=limit, max_keepalive_connections=min(limit, 20))
        # every connection checked (egress.py); the calls' own HTTP/1.1 (wire.py), httpx2's for what it does not carry
        fallback = guard(httpx2.AsyncHTTPTransport(verify=verify, limits=no_pool_wait))
        self._calls = Http11(verify, fallback, keep=min(limit, 20))
        self._control = guard(httpx2.AsyncHTTPTransport(verify=verify))
        self._held = HeldRetries()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        caller = CALLER.get()
        if caller is None or not self._gated or request.method != "POST" or not _is_request(request):
            return await self._send(self._control, request)
        if not await self.slots.take(caller, self._wait_s):
            return self._saturated(request)
        try:
            response = await self._send(self._calls, request, functools.partial(self.slots.give, caller))
        except BaseException:
            self.slots.give(caller)
            raise
        return response

    async def _send(
        self,
        inner: httpx2.AsyncBaseTransport,
        request: httpx2.Request,
        release: Callable[[], None] | None = None,
    ) -> httpx2.Response:
        last_event_id = request.headers.get("last-event-id") if request.method == "GET" else None
        inherited = None
        if last_event_id is not None:
            inherited = self._held.get(resume_key(request, last_event_id))
            await _resume_with_upstream(inherited)
        response = await inner.handle_async_request(request)
        if release is not None:  # the slot goes back when the answer's body is closed (or at once: no body to close)
            if isinstance(response.stream, httpx2.AsyncByteStream):
                response.stream = _Released(response.stream, release)
            else:
                release()
        if request.method == "POST" and isinstance(response.stream, httpx2.AsyncByteStream):
            response.stream = _DrainOnClose(response.stream)
        if (
            (request.method == "POST" or last_event_id is not None)
            and isinstance(response.stream, httpx2.AsyncByteStream)
            and response.headers.get("content-type", "").partition(";")[0].strip().lower() == "text/event-stream"
        ):
            response.stream = HeldRetry(response.stream, request, self._held, inherited)
        return response

    def _saturated(self, request: httpx2.Request) -> httpx2.Response:
        """The gateway's own answer to a call no connection came for: a JSON-RPC error the backend reads as
        ``BackendSaturated`` (failures.py), never as the downstream's failure."""
        stats = self.slots.statistics()
        text = (
            f"every connection to {self._name} is busy ({stats.busy} calls of max_connections {stats.limit}, "
            f"{stats.waiting} waiting; a caller may hold {stats.per_caller}) and none came free within "
            f"{self._wait_s:g} s"
        )
        message = json.loads(request.content)
        error = {"code": SATURATED, "message": text}
        body = {"jsonrpc": "2.0", "id": message.get("id"), "error": error}
        return httpx2.Response(503, json=body, request=request, extensions={OWN_ANSWER: True})

    async def aclose(self) -> None:  # borrowed by per-session clients; closed by HttpPool only
        pass

    async def close_pool(self) -> None:
        await self._calls.aclose()
        await self._control.aclose()


_HEAD = 512
"""Bytes of a POST's body read to tell a request from an answer or a notification (its members before the first
object-valued one: ``jsonrpc``, ``id``, ``method``)."""


def _is_request(request: httpx2.Request) -> bool:
    """Whether a POST carries a JSON-RPC request (not a notification, nor an answer to the server's request).

    The SDK and the direct lane write ``id`` and ``method`` before ``params`` (an answer has ``result`` or
    ``error`` instead), so the body's head tells without parsing arguments that may be megabytes; a head that does
    not (another order, a long id) is parsed whole.
    """
    try:
        body = request.content
    except httpx2.RequestNotRead:
        return False
    head = body[:_HEAD]
    ends = [at for at in (head.find(b'"params"'), head.find(b'"result"'), head.find(b'"error"')) if at >= 0]
    if ends:
        before = head[: min(ends)]
        return b'"method"' in before and b'"id"' in before
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and "method" in message and "id" in message


@contextmanager
def calls_for(caller: str | None) -> Iterator[None]:
    """The HTTP requests sent inside this block carry ``caller``'s request (``""``: an anonymous caller's): they take
    a slot of the backend's calls. None: the gateway's own request (subscriptions it holds), sent as control."""
    if caller is None:
        yield
        return
    token = CALLER.set(caller)
    try:
        yield
    finally:
        CALLER.reset(token)


async def _resume_with_upstream(held_ms: int | None) -> None:
    """A downstream closed a call's SSE stream mid-call (SEP-1699 polling) and the SDK is resuming it: the client of
    that call has its stream closed too (its ``BackChannel``), and the resume is sent when that client has resumed,
    or when the downstream's ``retry`` (``held_ms``, taken from the SDK by polling.py; None: the SDK waited it
    already) has passed. The resuming GET runs in the context of the POST that carried the call, so ``SERVING`` names
    that call (relay.py); a resumed standalone stream has none, and waits the downstream's ``retry``."""
    upstream = SERVING.get()
    channel = upstream.channel if upstream is not None else None
    if channel is not None:
        await channel.stream_closed(held_ms)
    elif held_ms:
        await anyio.sleep(held_ms / 1000)


class BackendPool:
    """One HTTP backend's connections (created on first use): every session to it borrows a client view."""

    def __init__(self, name: str, config: HttpServer | SseServer, verify: ssl.SSLContext | None = None) -> None:
        self._name = name
        self._config = config
        self._verify = verify
        self._transport: _BackendTransport | None = None

    @property
    def slots(self) -> FairSlots:
        return self._own().slots

    def _own(self) -> _BackendTransport:
        if self._transport is None:
            verify = self._verify if self._verify is not None else httpx2.create_ssl_context()
            self._transport = _BackendTransport(self._name, self._config, verify)
        return self._transport

    def client(
        self,
        headers: Mapping[str, str],
        timeout_s: float,
        recorder: ResponseRecorder,
        read_s: float = 300.0,
        *,
        max_answer_bytes: int,
        json_lines: bool = False,
        allow_private: bool = False,
    ) -> httpx2.AsyncClient:
        """A client on this backend's pools with its own headers, timeouts and answer limit; ``json_lines``: read
        an ``application/json`` answer as one message per line (backends/mcp/framing.py); ``allow_private``: this
        server may be reached at a private address (backends/mcp/egress.py)."""
        transport = self._own()
        inner: httpx2.AsyncBaseTransport = JsonLinesTransport(transport) if json_lines else transport
        return httpx2.AsyncClient(
            transport=LimitedTransport(Admitting(inner, allow_private), max_answer_bytes),
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout_s, read=read_s),
            trust_env=False,
            event_hooks={"response": [recorder]},
        )

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.close_pool()


class HttpPool:
    """The gateway's HTTP connections: a ``BackendPool`` per HTTP backend, all closed at once by ``aclose``.
    Creating an SSL context costs ~50 ms: one is made, on first use, and shared."""

    def __init__(self) -> None:
        self._verify: ssl.SSLContext | None = None
        self._pools: list[BackendPool] = []

    def for_backend(self, name: str, config: HttpServer | SseServer) -> BackendPool:
        if self._verify is None:
            self._verify = httpx2.create_ssl_context()
        pool = BackendPool(name, config, self._verify)
        self._pools.append(pool)
        return pool

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()
