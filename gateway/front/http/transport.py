"""A handshake-era session's HTTP transport, with the session's messages routed and answered by the gateway:
``SessionTransport``.

The SDK's transport keeps what a session is (its streams by request, resumable events, the idle countdown,
termination); this one owns how a request is taken and answered. A POST's JSON-RPC message is the one the edge parsed
(body.py hands it on in the scope: the body is not parsed twice), validated once and handed to the session. Each
message the session sends is routed to its stream as it is sent (``_route``, in the sender's task), and a stream is
written to its connection by ``_stream`` directly: each event as it comes, framed once (the event store's bytes,
resume.py), with one task beside it that notices the client leaving and keeps an idle stream alive. The SDK passed
every message through a router task, a memory stream, a writer task and sse-starlette's response (a task group of
five tasks, a lock and a timeout scope for every event). The GET stream and a resumed stream (``Last-Event-ID``) are
written by the same ``_stream``.

A POST's answer is one JSON body when the first thing the session sends for the request is its response, within
``HOLD_S`` (most calls: nothing to stream, nothing to resume, and a client reads the body to its end and keeps its
connection); it is an event stream, primed for resumption, when something else comes first (progress, a request of
the back-channel, the stream closed for polling, the client's cancellation) or nothing has come by then (a long call,
kept alive by pings). The answer's head waits for that choice (``_Pending``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from http import HTTPStatus
from typing import Any, TypeVar

import anyio
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.streamable_http import (
    CONTENT_TYPE_SSE,
    GET_STREAM_KEY,
    LAST_EVENT_ID_HEADER,
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    PARSE_ERROR,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.front.http.resume import SessionEvents
from gateway.front.scope import parsed_of, unsent_of
from gateway.front.streams import WriteEnd

__all__ = ["HOLD_S", "PING_S", "UNSENT_BYTES", "SessionTransport", "taken", "watch_client"]

logger = logging.getLogger("mcp.server.streamable_http")  # its lines pass the session-id filter (sessions.py)

PING_S = 15.0
"""An event stream that sent nothing for this long is sent a comment, so that proxies keep the connection open."""

UNSENT_BYTES = 64 * 1024
"""An event stream's connection holding more than this unsent means its client does not keep up: the stream's next
event waits (meanwhile the request's outbox coalesces its progress, and may give the client up: front/outbox.py).
Only unsent bytes count, not those under way to a distant client, so a fast client far away is not slowed; without
it, a client that stops reading would be sent until the kernel's buffers are full (``gateway.edge.send_buffer_bytes``
and its own) before anything notices."""
UNSENT_POLL_S = 0.005
"""How often a waiting event stream looks again."""

HOLD_S = 1.0
"""How long a POST's answer holds its head for the request's response, to send it as one JSON body."""

Emit = Callable[[bytes], Awaitable[None]]


async def watch_client(receive: Receive, quiet_since: Callable[[], float], ping: Callable[[], Awaitable[None]]) -> None:
    """Watch an event stream's client until it leaves (then return): ``ping()`` (a comment) whenever the stream has
    sent nothing for ``PING_S`` since ``quiet_since()``, so that proxies keep the connection open."""
    while True:
        with anyio.move_on_after(quiet_since() + PING_S - anyio.current_time()):
            if (await receive())["type"] == "http.disconnect":
                return
            continue
        if anyio.current_time() >= quiet_since() + PING_S:
            await ping()


async def taken(unsent: Callable[[], int] | None) -> None:
    """Return once the connection holds at most ``UNSENT_BYTES`` unsent: an event stream's next event waits for a
    client that does not keep up."""
    # polled: the kernel's queue draining wakes nothing here (asyncio's transport owns the socket)
    while unsent is not None and unsent() > UNSENT_BYTES:  # noqa: ASYNC110
        await anyio.sleep(UNSENT_POLL_S)


T = TypeVar("T")


def frame(event: SSEEvent | bytes) -> bytes:
    """One event in the stream's wire form (the event store's are framed already: resume.py ``event_data``)."""
    if isinstance(event, bytes):
        return event
    lines = [f"{field}: {event[field]}" for field in ("id", "event") if field in event]
    lines += [f"data: {line}" for line in str(event.get("data", "")).splitlines() or [""]]
    if "retry" in event:
        lines.append(f"retry: {event['retry']}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def hand_over(stream: MemoryObjectSendStream[T], item: T) -> None:
    """``stream.send(item)`` without a turn of the event loop when a reader waits or its buffer has room (anyio's
    ``send`` always yields first: a turn for every message a session sends, and a progress flood is many)."""
    try:
        stream.send_nowait(item)
    except anyio.WouldBlock:
        await stream.send(item)


async def take(stream: MemoryObjectReceiveStream[T]) -> T:
    """``stream.receive()`` without a turn of the event loop when an item waits already."""
    try:
        return stream.receive_nowait()
    except anyio.WouldBlock:
        return await stream.receive()


class _Routed(WriteEnd[SessionMessage]):
    """The session's outbound stream: each message routed to its request's stream (or the GET stream) as it is
    sent, in the sender's task (the SDK's transport handed every message to a router task first)."""

    def __init__(self, transport: SessionTransport) -> None:
        self._transport = transport
        self._closed = False

    async def send(self, item: SessionMessage, /) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        await self._transport._route(item)

    def close(self) -> None:
        self._closed = True

    async def aclose(self) -> None:
        self._closed = True


class _Pending:
    """A POST whose answer has not started: one JSON body if the request's response is the first thing sent for it
    (``answered``), else an event stream (``stream``), whose priming event is stored before anything else of it."""

    __slots__ = ("_mint", "_primed", "decided", "json", "priming")

    def __init__(self, mint: Callable[[], Awaitable[SSEEvent | None]]) -> None:
        self._mint = mint
        self._primed: anyio.Event | None = None
        self.decided = anyio.Event()
        self.json: bool | None = None  # undecided
        self.priming: SSEEvent | None = None

    def answered(self) -> bool:
        """The response is here: whether it is the answer's one JSON body (nothing made the answer a stream yet)."""
        if self.json is None:
            self.json = True
            self.decided.set()
        return self.json

    def stream(self) -> None:
        """The answer is an event stream, unless its JSON body is on its way already."""
        if self.json is None:
            self.json = False
            self.decided.set()

    async def primed(self) -> SSEEvent | None:
        """The stream's priming event (None for a client before 2025-11-25), stored by the first to ask."""
        if self._primed is None:
            self._primed = anyio.Event()
            try:
                self.priming = await self._mint()
            finally:
                self._primed.set()
        else:
            await self._primed.wait()
        return self.priming


class SessionTransport(StreamableHTTPServerTransport):
    """The SDK's session transport, its POST, GET and resumed streams answered by the gateway (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, _Pending] = {}  # by request id: the POSTs whose answer has not started

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Any, _Routed]]:
        """The session's streams: what its clients send, read by the session's dispatcher, and where the
        dispatcher's messages go (``_route``, in the writer's own task; the SDK's router task is left idle)."""
        async with super().connect() as (read_stream, _):
            routed = _Routed(self)
            self._write_stream = routed  # type: ignore[assignment]  # what terminate() closes, unanswered requests use
            try:
                yield read_stream, routed
            finally:
                routed.close()

    async def _route(self, session_message: SessionMessage) -> None:
        """One outbound message to its stream: a response to its request's, a message about a request to that
        request's (none in JSON-response mode: a JSON body holds the response alone), any other to the GET stream;
        stored first, so a client that resumes its stream gets it even when it is not connected now."""
        message, metadata = session_message.message, session_message.metadata
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            stream_id = str(message.id)
        elif isinstance(metadata, ServerMessageMetadata) and metadata.related_request_id is not None:
            if self.is_json_response_enabled:
                return
            stream_id = str(metadata.related_request_id)
        else:
            stream_id = GET_STREAM_KEY
        pending = self._pending.get(stream_id)
        if pending is not None and isinstance(message, JSONRPCResponse | JSONRPCError) and pending.answered():
            event_id = None  # one JSON body, which no client resumes: not stored
            if isinstance(self._event_store, SessionEvents):
                self._event_store.sent(message)
        else:
            if pending is not None:
                pending.stream()
                await pending.primed()  # stored before anything else of the stream
            event_id = await self._event_store.store_event(stream_id, message) if self._event_store else None
        streams = self._request_streams.get(stream_id)
        if streams is not None:
            try:
                await hand_over(streams[0], EventMessage(message, event_id))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._request_streams.pop(stream_id, None)

    def _cancelled(self, request_id: object) -> None:
        """A request its client cancelled is answered (its -32800, if anything) on an event stream, not as a JSON
        body: a client that cancelled no longer reads the answer, and the SDK's client, which forwards a JSON body
        to its session even after the session closed, fails on it as it exits (a stream's late event it drops)."""
        pending = self._pending.get(str(request_id)) if isinstance(request_id, int | str) else None
        if pending is not None:
            pending.stream()

    def close_sse_stream(self, request_id: RequestId) -> None:
        pending = self._pending.get(str(request_id))
        if pending is not None:
            pending.stream()  # an answer not started yet starts now, as a stream its client resumes
        super().close_sse_stream(request_id)

    async def terminate(self) -> None:
        for pending in self._pending.values():
            pending.stream()
        await super().terminate()

    def _sse_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"cache-control", b"no-cache, no-transform"),
            (b"connection", b"keep-alive"),
            (b"content-type", CONTENT_TYPE_SSE.encode()),
        ]
        if self.mcp_session_id:
            headers.append((MCP_SESSION_ID_HEADER.encode(), self.mcp_session_id.encode()))
        headers.append((b"x-accel-buffering", b"no"))
        return headers

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        produce: Callable[[Emit], Awaitable[None]],
        unsent: Callable[[], int] | None = None,
    ) -> None:
        """Answer with an event stream of what ``produce`` emits, until it returns or the client leaves (``produce``
        is then cancelled). The stream is sent a comment after every ``PING_S`` without an event. An event is not
        done with while its connection holds more than ``UNSENT_BYTES`` unsent (the client does not keep up)."""
        await send({"type": "http.response.start", "status": 200, "headers": self._sse_headers()})
        quiet_since = anyio.current_time()
        left = False

        async def emit(data: bytes) -> None:
            nonlocal quiet_since
            quiet_since = anyio.current_time()
            await send({"type": "http.response.body", "body": data, "more_body": True})
            await taken(unsent)

        async def watch() -> None:
            nonlocal left
            await watch_client(
                receive, lambda: quiet_since, lambda: emit(f": ping - {datetime.now(UTC)}\r\n\r\n".encode())
            )
            left = True
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await produce(emit)
            tg.cancel_scope.cancel()
        if not left:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _forward(self, stream_id: str, reader: MemoryObjectReceiveStream[EventMessage], emit: Emit) -> None:
        """Emit the events of ``stream_id``'s stream until its answer (or until it is closed: ``close_sse_stream``,
        the session's end), then forget the stream."""
        try:
            async with reader:
                while True:
                    event_message = await take(reader)
                    await emit(frame(self._create_event_data(event_message)))
                    if isinstance(event_message.message, JSONRPCResponse | JSONRPCError):
                        break
        except anyio.EndOfStream:
            pass
        except anyio.ClosedResourceError:
            logger.debug("SSE stream closed by close_sse_stream()")
        finally:
            await self._clean_up_memory_streams(stream_id)

    def _open_stream(self, stream_id: str) -> MemoryObjectReceiveStream[EventMessage]:
        """Register ``stream_id``'s stream, so that ``_route`` hands it its events; its reading end."""
        self._request_streams[stream_id] = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        return self._request_streams[stream_id][1]

    async def _handle_post_request(self, scope: Scope, request: Request, receive: Receive, send: Send) -> None:
        writer = self._read_stream_writer
        if writer is None:
            raise ValueError("No read stream writer available. Ensure connect() is called first.")
        try:
            if not await self._validate_accept_header(request, scope, send):
                return
            if not self._check_content_type(request):
                text = "Unsupported Media Type: Content-Type must be application/json"
                await self._create_error_response(text, HTTPStatus.UNSUPPORTED_MEDIA_TYPE)(scope, receive, send)
                return
            raw = parsed_of(scope)
            if raw is None:  # not through the edge's body check (a test's transport, say): parsed here
                try:
                    raw = pydantic_core.from_json(await request.body())
                except ValueError as e:
                    error = self._create_error_response(f"Parse error: {e}", HTTPStatus.BAD_REQUEST, PARSE_ERROR)
                    await error(scope, receive, send)
                    return
            try:
                message = jsonrpc_message_adapter.validate_python(raw, by_name=False)
            except ValidationError as e:
                error = self._create_error_response(f"Validation error: {e}", HTTPStatus.BAD_REQUEST, INVALID_PARAMS)
                await error(scope, receive, send)
                return
            opening = isinstance(message, JSONRPCRequest) and message.method == "initialize"
            if opening:
                asked = self._get_session_id(request)
                if self.mcp_session_id and asked and asked != self.mcp_session_id:
                    text = "Not Found: Invalid or expired session ID"
                    await self._create_error_response(text, HTTPStatus.NOT_FOUND)(scope, receive, send)
                    return
            elif not await self._validate_request_headers(request, send):
                return
            if not isinstance(message, JSONRPCRequest):  # a notification or a response: accepted, then handed on
                if isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
                    self._cancelled((message.params or {}).get("requestId"))
                await self._create_json_response(None, HTTPStatus.ACCEPTED)(scope, receive, send)
                await writer.send(SessionMessage(message, metadata=self._message_metadata(request)))
                return
            request_id = str(message.id)
            if self.is_json_response_enabled:
                await self._answer_json(scope, request, receive, send, message, request_id)
                return
            version = (
                str(message.params.get("protocolVersion", DEFAULT_NEGOTIATED_VERSION))
                if opening and message.params
                else request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
            )
            reader = self._open_stream(request_id)
            pending = self._pending[request_id] = _Pending(partial(self._mint_priming_event, request_id, version))
            try:
                # Handed to the session before the answer starts: it runs on whatever becomes of this connection.
                await writer.send(self._create_session_message(message, request, request_id, version))
                with anyio.move_on_after(HOLD_S):
                    await pending.decided.wait()
                pending.stream()  # if nothing came in time
                if pending.json:
                    await self._json_answer(scope, receive, send, reader)
                    return
                priming = await pending.primed()

                async def produce(emit: Emit) -> None:
                    if priming is not None:
                        await emit(frame(priming))
                    await self._forward(request_id, reader, emit)

                await self._stream(receive, send, produce, unsent_of(scope))
            finally:
                if self._pending.get(request_id) is pending:  # (a reused id's own POST may have replaced it)
                    del self._pending[request_id]
                await self._clean_up_memory_streams(request_id)
        except Exception as err:
            logger.exception("Error handling POST request")
            text = "Error handling POST request"
            await self._create_error_response(text, HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR)(
                scope, receive, send
            )
            await writer.send(Exception(err))

    async def _answer_json(
        self, scope: Scope, request: Request, receive: Receive, send: Send, message: JSONRPCRequest, request_id: str
    ) -> None:
        """A request's answer as one JSON body (``json_response``): its response alone, nothing of its stream."""
        assert self._read_stream_writer is not None
        reader = self._open_stream(request_id)
        unanswered = partial(self._terminate_unanswered_request, message.id)
        metadata = self._message_metadata(request, on_request_unanswered=unanswered)
        try:
            await self._read_stream_writer.send(SessionMessage(message, metadata=metadata))
            await self._json_answer(scope, receive, send, reader)
        finally:
            await self._clean_up_memory_streams(request_id)

    async def _json_answer(
        self, scope: Scope, receive: Receive, send: Send, reader: MemoryObjectReceiveStream[EventMessage]
    ) -> None:
        """The next message of ``reader`` (the request's response) as one JSON body."""
        try:
            event_message = await take(reader)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            logger.debug("Session terminated with a request in flight; no response to send")
            text = "Session terminated before the request completed"
            response = self._create_error_response(text, HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR)
        else:
            response = self._create_json_response(event_message.message)
        await response(scope, receive, send)

    async def _handle_get_request(self, request: Request, send: Send) -> None:
        if self._read_stream_writer is None:
            raise ValueError("No read stream writer available. Ensure connect() is called first.")
        scope, receive = request.scope, request.receive
        if not check_accept_headers(request)[1]:
            text = "Not Acceptable: Client must accept text/event-stream"
            await self._create_error_response(text, HTTPStatus.NOT_ACCEPTABLE)(scope, receive, send)
            return
        if not await self._validate_request_headers(request, send):
            return
        if last_event_id := request.headers.get(LAST_EVENT_ID_HEADER):
            await self._replay_events(last_event_id, request, send)
            return
        if GET_STREAM_KEY in self._request_streams:
            text = "Conflict: Only one SSE stream is allowed per session"
            await self._create_error_response(text, HTTPStatus.CONFLICT)(scope, receive, send)
            return
        reader = self._open_stream(GET_STREAM_KEY)
        try:
            await self._stream(receive, send, partial(self._forward, GET_STREAM_KEY, reader), unsent_of(scope))
        finally:
            await self._clean_up_memory_streams(GET_STREAM_KEY)

    async def _replay_events(self, last_event_id: str, request: Request, send: Send) -> None:
        """A resumed stream: what it was sent after ``last_event_id``, then (when it is still open) its next events."""
        event_store = self._event_store
        if event_store is None:
            return
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)

        async def produce(emit: Emit) -> None:
            async def replayed(event_message: EventMessage) -> None:
                await emit(frame(self._create_event_data(event_message)))

            stream_id = await event_store.replay_events_after(last_event_id, replayed)
            if stream_id and stream_id not in self._request_streams:
                priming = await self._mint_priming_event(stream_id, version)
                reader = self._open_stream(stream_id)
                if priming is not None:
                    await emit(frame(priming))
                await self._forward(stream_id, reader, emit)

        try:
            await self._stream(request.receive, send, produce, unsent_of(request.scope))
        except Exception:
            logger.exception("Error replaying events")
