"""SEP-1699 polling through the gateway: a downstream's closed stream is resumed when the gateway's client resumes.

A downstream may close a call's SSE stream mid-call and say, with ``retry``, when to resume it. ``HeldRetry`` hands
the SDK client each stream with its ``retry`` set to 0 (so the SDK resumes at once) and remembers the downstream's;
the pool then holds the resuming GET until the call's own client has resumed its stream (its ``BackChannel``) or the
downstream's ``retry`` has passed. So the downstream is resumed as soon as a client connected to it directly would
resume it, never sooner, and a downstream that keeps a call's output only for a connected stream loses nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator

import httpx2

__all__ = ["HeldRetries", "HeldRetry", "resume_key"]

KEPT = 1024
"""How many held ``retry`` values a pool remembers (one per stream the downstream closed, until resumed)."""

LINE_HELD = 1024
"""The longest start of a line held back until its end (``retry`` and ``id`` lines are short; data lines pass)."""

Key = tuple[str, str | None, str]
"""A downstream stream's resume: the URL, the downstream's session id, the last event id the client saw."""


class HeldRetries:
    """The ``retry`` (ms) each downstream stream asked for before it ended, by how its resume will be asked."""

    def __init__(self) -> None:
        self._held: OrderedDict[Key, int] = OrderedDict()

    def remember(self, key: Key, retry_ms: int) -> None:
        self._held[key] = retry_ms
        self._held.move_to_end(key)
        while len(self._held) > KEPT:
            self._held.popitem(last=False)

    def get(self, key: Key) -> int | None:
        """Kept (not taken): a resume the SDK repeats after a failure waits again, as it would have."""
        return self._held.get(key)


def resume_key(request: httpx2.Request, last_event_id: str) -> Key:
    return (str(request.url), request.headers.get("mcp-session-id"), last_event_id)


class HeldRetry(httpx2.AsyncByteStream):
    """A downstream's SSE body with its ``retry`` fields set to 0; if the stream ends (the downstream closed it, or
    the connection broke) after an event id, the ``retry`` it asked for is remembered for the resume from there.

    ``inherited``: the ``retry`` in force when this stream is itself a resume (the SDK carries the last one over).
    Lines are split on LF (CRLF too); a body that ends its lines with a lone CR is passed on untouched, and the SDK
    then waits what it was told, as without the gateway."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, request: httpx2.Request, held: HeldRetries, inherited: int | None
    ) -> None:
        self._inner = inner
        self._request = request
        self._held = held
        self._retry_ms = inherited
        self._pending_id: str | None = None
        self._last_id: str | None = None
        self._partial = b""  # the start of a line not ended yet, held to see whole fields
        self._mid_line = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                out = self._rewrite(chunk)
                if out:
                    yield out
        except GeneratorExit:
            raise  # the SDK stopped reading (it has its answer): no resume follows
        except BaseException:
            self._remember()
            raise
        if self._partial:
            yield self._partial
        self._remember()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def _rewrite(self, chunk: bytes) -> bytes:
        data, self._partial = self._partial + chunk, b""
        head = b""
        if self._mid_line:  # the rest of a long line already passed on: no field of interest
            end = data.find(b"\n")
            if end < 0:
                return data
            head, data, self._mid_line = data[: end + 1], data[end + 1 :], False
        *lines, rest = data.split(b"\n")
        out = [self._line(line) for line in lines]
        if len(rest) > LINE_HELD:  # a long line (a large message's data): passed on now, not held
            out.append(rest)
            self._mid_line = True
        else:
            self._partial = rest
        return head + b"\n".join(out) + (b"" if self._mid_line or not lines else b"\n")

    def _line(self, line: bytes) -> bytes:
        text = line.rstrip(b"\r")
        if text.startswith(b"retry:"):
            value = text[6:].strip()
            if value.isdigit():
                self._retry_ms = int(value)
                return b"retry: 0" + line[len(text) :]
        elif text.startswith(b"id:"):
            value = text[3:].removeprefix(b" ")
            if b"\0" not in value:
                self._pending_id = value.decode("utf-8", "replace")
        elif not text and self._pending_id:
            self._last_id = self._pending_id  # an event is dispatched with the last id seen (the SSE rules)
        return line

    def _remember(self) -> None:
        if self._retry_ms is not None and self._last_id:
            self._held.remember(resume_key(self._request, self._last_id), self._retry_ms)
