"""The gateway's one HTTP connection pool, shared by every HTTP backend (streamable HTTP and SSE).

Each backend borrows a cheap client view of it (its own headers, timeouts and answer limit) whose closing leaves the
pool open; ``HttpPool.aclose`` closes it once, at shutdown. A downstream's closed SSE stream is resumed when the
gateway's own client resumes (polling.py). A POST's response closed early is drained (bounded) so its
connection is reused, and each view remembers the last error response, so a failed handshake can be told in plain
words (backends/mcp/failures.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import anyio
import anyio.lowlevel
import httpx2

from gateway.backends.mcp.answers import LimitedTransport
from gateway.backends.mcp.egress import Admitting, guard
from gateway.backends.mcp.failures import FOREIGN, ResponseRecorder
from gateway.backends.mcp.framing import JsonLinesTransport
from gateway.backends.mcp.polling import HeldRetries, HeldRetry, resume_key
from gateway.backends.mcp.relay import SERVING

__all__ = ["HttpPool"]

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


class _SharedTransport(httpx2.AsyncBaseTransport):
    """One connection pool for every HTTP backend; closing a client that borrows it leaves it open."""

    def __init__(self) -> None:
        self._inner = guard(httpx2.AsyncHTTPTransport())  # every connection checked (egress.py)
        self._held = HeldRetries()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        last_event_id = request.headers.get("last-event-id") if request.method == "GET" else None
        inherited = None
        if last_event_id is not None:
            inherited = self._held.get(resume_key(request, last_event_id))
            await _resume_with_upstream(inherited)
        response = await self._inner.handle_async_request(request)
        if request.method == "POST" and isinstance(response.stream, httpx2.AsyncByteStream):
            response.stream = _DrainOnClose(response.stream)
        if (
            (request.method == "POST" or last_event_id is not None)
            and isinstance(response.stream, httpx2.AsyncByteStream)
            and response.headers.get("content-type", "").partition(";")[0].strip().lower() == "text/event-stream"
        ):
            response.stream = HeldRetry(response.stream, request, self._held, inherited)
        return response

    async def aclose(self) -> None:  # borrowed by per-backend clients; closed by HttpPool only
        pass

    async def close_pool(self) -> None:
        await self._inner.aclose()


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


class HttpPool:
    """The gateway's one HTTP connection pool (creating an httpx2 transport costs ~50 ms: done once).

    Each HTTP backend gets a cheap client view with its own headers and a response hook that remembers the last
    non-2xx answer, so a failed handshake can be classified ("HTTP 502 with an HTML page").
    """

    def __init__(self) -> None:
        self._transport = _SharedTransport()

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
        """``json_lines``: read an ``application/json`` answer as one message per line (backends/mcp/framing.py);
        ``allow_private``: this server may be reached at a private address (backends/mcp/egress.py)."""
        inner: httpx2.AsyncBaseTransport = JsonLinesTransport(self._transport) if json_lines else self._transport
        return httpx2.AsyncClient(
            transport=LimitedTransport(Admitting(inner, allow_private), max_answer_bytes),
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout_s, read=read_s),
            trust_env=False,
            event_hooks={"response": [recorder]},
        )

    async def aclose(self) -> None:
        await self._transport.close_pool()
