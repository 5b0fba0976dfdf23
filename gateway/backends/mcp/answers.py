"""The per-server answer limit (``max_answer_bytes``), enforced in the byte stream so that one call fails alone.

An SDK transport that meets a message over its limit ends the stream, and with it every call on the session (the
streamable-HTTP client drops SSE events over 1 MiB and closes the stream; a stdio reader cannot skip a line it
cannot hold). Here the limit is applied one level lower, where a message can still be replaced: ``LineLimit`` cuts
a byte stream into lines of at most the limit with bounded memory, and a longer line (a stdio message, an SSE
``data:`` field) is read to its end without being kept, then replaced by a JSON-RPC error answer to the same
request id (``too_large_error``): its caller gets ``BackendAnswerTooLarge`` naming the size and the limit, and the
session goes on. The request id is read from the dropped line's head or tail (the Python SDK writes ``id`` first,
the TypeScript SDK last); on a POST's own response stream the SDK routes any answer to that POST's request. A line
that is not an answer (a notification, a request of the server's) is dropped with a warning.

``LimitedTransport`` applies this to every response of one HTTP backend (streamable HTTP and SSE): SSE bodies line
by line, JSON bodies whole (held until complete, then passed on or replaced).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import structlog

__all__ = ["ANSWER_TOO_LARGE", "LimitedTransport", "LineLimit", "Oversized", "answer_too_large", "too_large_error"]

log = structlog.get_logger("gateway.backend")

ANSWER_TOO_LARGE = -32050
"""The JSON-RPC error code of an answer the gateway replaced because it was over the limit (implementation-defined
server error range); its ``data`` carries ``{DATA_KEY: {"size": ..., "limit": ...}}``."""
DATA_KEY = "mcp-gateway/answer_too_large"
EDGE_BYTES = 512
"""How much of a dropped line's head and tail is kept to find its request id."""

_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_HEAD = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?(?:"id"\s*:\s*' + _ID + rb'\s*,\s*)?"(?:result|error)"\s*:'
)
_TAIL = re.compile(rb'[,{]\s*"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z')
_SSE_DATA = re.compile(rb"\Adata: ?")


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line longer than the limit, read to its end but not kept: its size and the edges of its content."""

    size: int
    head: bytes
    tail: bytes


class LineLimit:
    """Cut a byte stream into lines (ending in ``\\n``) of at most ``limit`` bytes, holding at most one line.

    ``feed`` yields, in stream order, bytes to pass on (whole lines with their ``\\n``) and ``Oversized`` for each
    line over the limit (its ``\\n`` is dropped with it); ``flush`` yields what is left at the end of the stream.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: list[bytes] = []
        self._held_size = 0
        self._dropping = False
        self._size = 0
        self._head = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> Iterator[bytes | Oversized]:
        pos = 0
        end = len(chunk)
        while pos < end:
            if self._dropping:
                newline = chunk.find(b"\n", pos)
                stop = end if newline < 0 else newline
                self._skip(chunk[pos:stop])
                if newline < 0:
                    return
                yield Oversized(self._size, self._head, self._tail)
                self._dropping = False
                pos = newline + 1
                continue
            if self._held_size + end - pos <= self.limit:  # no line in the rest can be over: pass whole lines on
                last = chunk.rfind(b"\n", pos)
                if last < 0:
                    self._hold(chunk[pos:] if pos else chunk)
                    return
                out = b"".join([*self._held, chunk[pos : last + 1]]) if self._held else chunk[pos : last + 1]
                self._held, self._held_size = [], 0
                yield out
                pos = last + 1
                continue
            newline = chunk.find(b"\n", pos)
            stop = end if newline < 0 else newline
            if newline >= 0 and self._held_size + stop - pos <= self.limit:  # fits (a later line does not)
                yield b"".join([*self._held, chunk[pos : stop + 1]])
                self._held, self._held_size = [], 0
                pos = stop + 1
                continue
            self._start_dropping()  # this line is over: the branch above drops it (what is held goes first)

    def flush(self) -> Iterator[bytes | Oversized]:
        if self._dropping:
            self._dropping = False
            yield Oversized(self._size, self._head, self._tail)
        elif self._held:
            yield b"".join(self._held)
        self._held, self._held_size = [], 0

    def _hold(self, piece: bytes) -> None:
        self._held.append(piece)
        self._held_size += len(piece)

    def _start_dropping(self) -> None:
        held = self._held
        self._held, self._held_size = [], 0
        self._dropping, self._size, self._head, self._tail = True, 0, b"", b""
        for piece in held:
            self._skip(piece)

    def _skip(self, piece: bytes) -> None:
        if len(self._head) < EDGE_BYTES:
            self._head += piece[: EDGE_BYTES - len(self._head)]
        self._tail = (self._tail + piece[-EDGE_BYTES:])[-EDGE_BYTES:]
        self._size += len(piece)


def answered_id(head: bytes, tail: bytes) -> tuple[bool, Any]:
    """Whether a JSON-RPC message (seen only by its edges) is an answer, and the request id it answers (None when
    it cannot be read)."""
    match = _HEAD.match(head)
    if match is None:
        return False, None
    raw = match.group(1)
    if raw is None:
        at_end = _TAIL.search(tail)
        raw = at_end.group(1) if at_end is not None else None
    return True, json.loads(raw) if raw is not None else None


def too_large_error(request_id: Any, size: int, limit: int) -> bytes:
    """The JSON-RPC error answer that replaces an oversized answer to ``request_id`` (one line, no newline)."""
    error = {
        "code": ANSWER_TOO_LARGE,
        "message": f"the answer is {size:,} bytes, over the limit of {limit:,} bytes",
        "data": {DATA_KEY: {"size": size, "limit": limit}},
    }
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}, separators=(",", ":")).encode()


def answer_too_large(data: object) -> tuple[int, int] | None:
    """``(size, limit)`` when a JSON-RPC error's ``data`` says the gateway replaced an oversized answer."""
    if isinstance(data, dict):
        entry = data.get(DATA_KEY)
        if isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("limit"), int):
            return entry["size"], entry["limit"]
    return None


def replace_line(item: Oversized, limit: int, *, sse: bool, request_id: Any = None) -> bytes | None:
    """The line that stands in for an oversized one (without its newline), or None to drop it.

    ``request_id`` is the id of the request whose own response stream this is (a POST's): any oversized message on
    it fails that request. Elsewhere only an answer whose id can be read is replaced.
    """
    head, tail, size = item.head, item.tail, item.size
    if sse:
        prefix = _SSE_DATA.match(head)
        if prefix is None:  # not a data field: nothing to answer with
            return None
        head = head[prefix.end() :]
        size -= prefix.end()
    if tail.endswith(b"\r"):
        size -= 1
    is_answer, found = answered_id(head, tail)
    if request_id is None:
        if not is_answer or found is None:
            log.warning("backend.oversized_message_dropped", size=size, limit=limit, answer=is_answer)
            return None
        request_id = found
    line = too_large_error(request_id, size, limit)
    return b"data: " + line if sse else line


# ----------------------------------------------------------------------------------------------- HTTP bodies

_ID_OF_REQUEST = re.compile(rb'\A\{"jsonrpc":"2\.0","id":' + _ID)


class _LimitedBody(httpx2.AsyncByteStream):
    """A response body with the answer limit applied (see the module docstring)."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, *, sse: bool, request_id: Any) -> None:
        self._inner = inner
        self._limit = limit
        self._sse = sse
        self._request_id = request_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._sse:
            lines = LineLimit(self._limit + len(b"data: "))
            async for chunk in self._inner:
                for item in lines.feed(chunk):
                    if isinstance(item, bytes):
                        yield item
                    else:
                        line = replace_line(item, self._limit, sse=True, request_id=self._request_id)
                        if line is not None:
                            yield line + b"\n"
            for item in lines.flush():
                if isinstance(item, bytes):
                    yield item
            return
        held: list[bytes] = []
        size = 0
        async for chunk in self._inner:  # a JSON body is read whole by the SDK anyway: hold it, then decide
            size += len(chunk)
            if size <= self._limit:
                held.append(chunk)
            else:
                held = []
        if size <= self._limit or self._request_id is None:
            for chunk in held:
                yield chunk
            return
        yield too_large_error(self._request_id, size, self._limit)

    async def aclose(self) -> None:
        await self._inner.aclose()


class LimitedTransport(httpx2.AsyncBaseTransport):
    """One HTTP backend's view of a shared transport, with its answer limit on every response body."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").lower()
        if encoding not in ("", "identity") or not isinstance(response.stream, httpx2.AsyncByteStream):
            return response  # a compressed body cannot be cut by lines: the SDK's own limits apply
        request_id = None
        if request.method == "POST":
            try:
                body = request.content[:200]
            except httpx2.RequestNotRead:  # a streamed request body (the SDK sends its messages whole)
                body = b""
            found = _ID_OF_REQUEST.match(body)  # the SDK writes its requests in this shape
            request_id = json.loads(found.group(1)) if found is not None else None
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "text/event-stream":
            response.stream = _LimitedBody(response.stream, self._limit, sse=True, request_id=request_id)
        elif content_type == "application/json":
            response.stream = _LimitedBody(response.stream, self._limit, sse=False, request_id=request_id)
        return response

    async def aclose(self) -> None:  # the inner transport is shared: its owner closes it
        pass
