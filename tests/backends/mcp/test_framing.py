"""JSON-lines answers reframed as SSE events for the SDK client (gateway/backends/framing.py), in memory, on exact
bytes and whatever the chunking."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2
import pytest

from gateway.backends.mcp.framing import JsonLinesTransport

pytestmark = pytest.mark.anyio


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


class _Answers(httpx2.AsyncBaseTransport):
    """A transport that answers every request with a fixed body (the downstream's bytes under test)."""

    def __init__(self, body: bytes, size: int, content_type: str = "application/json") -> None:
        self._chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        self._content_type = content_type

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        headers = {"content-type": self._content_type, "content-length": str(sum(map(len, self._chunks)))}
        return httpx2.Response(200, headers=headers, stream=_Chunks(self._chunks))


async def _events(body: bytes, size: int, content_type: str = "application/json") -> tuple[str, list[object]]:
    async with httpx2.AsyncClient(transport=JsonLinesTransport(_Answers(body, size, content_type))) as client:
        request = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call"}).encode()
        stateless = {"mcp-protocol-version": "2026-07-28"}  # only that era's answers are reframed
        response = await client.post("http://downstream/mcp", content=request, headers=stateless)
        text = (await response.aread()).decode()
    if response.headers["content-type"] != "text/event-stream":
        return response.headers["content-type"], [text]
    events = [event for event in text.split("\n\n") if event]
    messages = []
    for event in events:
        lines = event.split("\n")
        assert lines[0] == "event: message", event
        messages.append(json.loads("\n".join(line.removeprefix("data: ") for line in lines[1:])))
    return response.headers["content-type"], messages


@pytest.mark.parametrize("size", [1, 5, 4096])
async def test_one_message_per_line_becomes_one_event_each(size: int) -> None:
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 5}}
    result = {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}
    body = json.dumps(progress).encode() + b"\n" + json.dumps(result).encode()  # no line break after the last
    assert await _events(body, size) == ("text/event-stream", [progress, result])


@pytest.mark.parametrize("size", [1, 3, 4096])
async def test_a_pretty_printed_message_stays_one_message(size: int) -> None:
    result = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "a}\\n]b"}], "x": [1, [2]]}}
    body = json.dumps(result, indent=2).encode() + b"\n"
    assert await _events(body, size) == ("text/event-stream", [result])


async def test_an_empty_body_is_a_parse_error_for_the_request_not_a_lost_stream() -> None:
    _, messages = await _events(b"", 1)
    assert messages == [
        {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32700, "message": "The server answered with an empty application/json body."},
        }
    ]


async def test_an_sse_answer_passes_untouched() -> None:
    body = b"id: 3\nretry: 5000\ndata: \n\nevent: message\ndata: {}\n\n"
    async with httpx2.AsyncClient(transport=JsonLinesTransport(_Answers(body, 4, "text/event-stream"))) as client:
        response = await client.post("http://downstream/mcp", content=b"{}")
        assert await response.aread() == body


async def test_a_handshake_era_answer_is_left_as_it_came() -> None:
    # A server of both eras answers its handshake session's requests as that era does: one JSON message.
    body = b'{"jsonrpc": "2.0", "id": 7, "result": {}}\n{"stray": 1}\n'
    transport = JsonLinesTransport(_Answers(body, 4096))
    async with httpx2.AsyncClient(transport=transport) as client:
        response = await client.post(
            "http://downstream/mcp", content=b"{}", headers={"mcp-protocol-version": "2025-11-25"}
        )
    assert (response.headers["content-type"], response.content) == ("application/json", body)
