"""Downstream HTTP answers reframed into what the SDK client reads, where servers and the SDK disagree.

* **JSON lines.** Some 2026-07-28 servers (the conformance suite's reference server among them) stream a request's
  messages as ``application/json`` with one JSON-RPC message per line: a progress or log notification and then the
  result, or a ``subscriptions/listen`` stream that never ends. The SDK reads an ``application/json`` answer as one
  message, so such a call failed through the gateway (-32700) and a listen stream was never heard. Every 200 answer
  to a POST in ``application/json`` is therefore handed to the SDK as ``text/event-stream``, one event per message.
  A message ends at a line break after a line that completes a JSON value (a line ending in ``}`` or ``]`` is
  tried); the last message is whatever remains at the end, so a one-message body without a trailing line break is
  never parsed here. Only answers to stateless-era requests are reframed (a server of both eras answers the
  handshake's as that era does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = ["JsonLinesTransport"]


class JsonLinesTransport(httpx2.AsyncBaseTransport):
    """A transport whose ``application/json`` answers to POSTs reach the SDK as SSE events, one per message."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        reframe(request, response)
        return response

    async def aclose(self) -> None:  # the inner transport is shared: its owner closes it
        pass


def reframe(request: httpx2.Request, response: httpx2.Response) -> None:
    """Reframe ``response`` in place for the SDK client (see the module docstring)."""
    if not isinstance(response.stream, httpx2.AsyncByteStream):
        return
    if response.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        return  # a compressed body cannot be cut by lines
    content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if (
        content_type == "application/json"
        and request.method == "POST"
        and response.status_code == 200
        and request.headers.get("mcp-protocol-version") in MODERN_PROTOCOL_VERSIONS  # that era's servers only
    ):
        response.headers["content-type"] = "text/event-stream"
        response.headers.pop("content-length", None)
        response.stream = _JsonLinesAsEvents(response.stream, request)


class _JsonLinesAsEvents(httpx2.AsyncByteStream):
    """An ``application/json`` body of one or more messages, as SSE events."""

    def __init__(self, inner: httpx2.AsyncByteStream, request: httpx2.Request) -> None:
        self._inner = inner
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = False
        held: list[bytes] = []  # the lines of the message being read
        partial = b""
        async for chunk in self._inner:
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                if line.strip() or held:
                    held.append(line)
                # A line that may close a JSON value, with its line break: if the message is whole, send it now
                # (a listen stream's frame must not wait for the next one).
                if held and line.rstrip().endswith((b"}", b"]")) and _is_json(b"\n".join(held)):
                    yield _event(held)
                    held.clear()
                    sent = True
        if partial.strip() or held:
            held.append(partial)
        if any(line.strip() for line in held):
            yield _event(held)
        elif not sent:
            yield _empty_answer(self._request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _empty_answer(request: httpx2.Request) -> bytes:
    """An empty body, told as the parse error it is (as the SDK tells an empty JSON answer); without an event the
    SDK would take the ended stream for a lost connection."""
    try:
        found = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        found = None
    request_id = found.get("id") if isinstance(found, dict) else None
    error = {"code": -32700, "message": "The server answered with an empty application/json body."}
    return _event([json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()])


def _is_json(text: bytes) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _event(lines: list[bytes]) -> bytes:
    # Each line of the message is one `data:` field; SSE joins them with line breaks, which JSON ignores between
    # tokens (a JSON string never holds a raw line break).
    return b"event: message\n" + b"".join(b"data: " + line.rstrip(b"\r") + b"\n" for line in lines) + b"\n"
