"""A request sent straight on a downstream session, without the SDK client session's round trip.

Through the SDK, a ``tools/call`` to a downstream goes from the caller's task through a memory stream to the
session's dispatcher, on to the transport's writer task (over streamable HTTP, one more task per POST, whose SSE
events come back through another memory stream), and the answer back to the dispatcher, which wakes the caller. That
machinery (task groups, cancel scopes, events, memory streams, each asking anyio which library runs) was the largest
part of the gateway's CPU per call (docs/benchmarks.md, "Where the time goes"). A ``DirectLane`` sends the same
request on the same session (its negotiated version, its answer limit) and waits for the answer in the caller's own
task. What every lane keeps (``DirectLane.request``):

  * the request is what the SDK would send, with an id of the gateway's own (``gw-N``: never one of the SDK
    session's integer ids on the same session), the SDK's client span and the W3C trace context in ``_meta``;
  * ``notifications/progress`` for the call's token goes to the caller's progress function;
  * the answer is the call's result, or ``MCPError`` with the downstream's error (an answer over the limit arrives
    as answers.py's replacement error, as through the SDK);
  * the call's time limit ends it with the SDK's request-timeout error, and a cancelled call (the client gave up, a
    deadline) sends ``notifications/cancelled`` downstream before it unwinds, as the SDK's session does.

Two lanes: ``HttpLane`` here (one JSON-RPC POST on the streamable HTTP session, its answer stream read by the
caller), and stdio.py's ``StdioLane`` (a line written onto the child's stdin, its answer taken from stdout
by the transport's reader, which owns the pipes). Over HTTP, everything else the downstream says on the call's
stream is handled as the SDK handles it:

  * a request of the server's (``elicitation/create``, ``sampling/createMessage``, ``roots/list``, ``ping``) is
    answered through ``answer`` (the backend's back-channel, relay.py) and the answer POSTed back on the session;
  * any other notification (a log message, a list change) goes to ``notify``, the session's message handler;
  * a stream that ends without the answer but with an event id is resumed with ``Last-Event-ID`` (SEP-1699), as
    the SDK's transport does; one that cannot be resumed ends the call with the SDK's ``CONNECTION_CLOSED`` error.

A flood (a server streaming progress as fast as it can) arrives in reads of many messages each. A lane hands on at
most ``MESSAGES_PER_TURN`` of them before it lets the event loop's other tasks run (``Turns``): every other caller's
request goes on between them, as it would beside a quiet server, and the flood is read at the share of the CPU the
gateway gives it (its server is then held within its pipe or socket), not in one piece while everyone waits.

Errors are the SDK's (``MCPError`` with its codes, httpx2's errors), so the backend maps them exactly as it maps
the SDK path's (failures.py ``map_call_errors``). Which requests take a lane is the backend's choice (session.py
``McpBackend.call_tool``); everything else goes through the SDK session.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

__all__ = [
    "CONNECTION_CLOSED",
    "LANE_ID_PREFIX",
    "MESSAGES_PER_TURN",
    "DirectCall",
    "DirectLane",
    "HttpLane",
    "SessionGone",
    "Turns",
    "answer_of",
    "progress_of",
]

LANE_ID_PREFIX = "gw-"
"""A direct request's id (and progress token) is this and a number: never one of the SDK session's (integer) ids on
the same session, so a line is known to be a direct call's by its id alone."""
MESSAGES_PER_TURN = 32
"""A downstream's messages handed on at most before the other tasks run (tens of microseconds each: a 64 KiB read of a
flood holds hundreds)."""

REQUEST_TIMEOUT = -32001  # the SDK's code for a request that timed out (mcp.shared.exceptions.REQUEST_TIMEOUT)
CONNECTION_CLOSED = -32000  # the SDK's code for a request whose answer can no longer come
CANCEL_NOTICE_S = 2.0
"""Bound on telling the downstream that a call was cancelled (the caller is not kept waiting longer)."""
RESUME_ATTEMPTS = 2  # as the SDK's transport (MAX_RECONNECTION_ATTEMPTS)
RESUME_DELAY_MS = 1000  # its default when the server names no retry interval
END_S = 2.0
"""Bound on ending a session at the server (its DELETE)."""
DRAIN_LIMIT_S = 0.05  # how long the rest of an answered stream is read (as backends/mcp/pool.py drains a body)

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
AnswerFn = Callable[[Any], Awaitable[Any]]
"""Answer a server's request (a ``types.ServerRequest``): its result model, or an ``ErrorData``."""
NotifyFn = Callable[[Any], Awaitable[None]]


class Turns:
    """Counts the messages a reader hands on: ``await turns.taken()`` after each lets the other tasks run once every
    ``MESSAGES_PER_TURN`` (see the module docstring)."""

    __slots__ = ("_left",)

    def __init__(self) -> None:
        self._left = MESSAGES_PER_TURN

    async def taken(self) -> None:
        self._left -= 1
        if not self._left:
            self._left = MESSAGES_PER_TURN
            await anyio.lowlevel.checkpoint()


_TRACER = trace.get_tracer("mcp-python-sdk")
_SERVER_REQUEST: Any = None
_SERVER_NOTIFICATION: Any = None


def _adapters() -> tuple[Any, Any]:
    global _SERVER_REQUEST, _SERVER_NOTIFICATION
    if _SERVER_REQUEST is None:
        from pydantic import TypeAdapter

        _SERVER_REQUEST = TypeAdapter(types.ServerRequest)
        _SERVER_NOTIFICATION = TypeAdapter(types.ServerNotification)
    return _SERVER_REQUEST, _SERVER_NOTIFICATION


class SessionGone(MCPError):
    """The server answered 404: it no longer knows the session (the SDK's ``Session terminated``)."""


class DirectCall:
    """One request on a lane: ``send`` puts it on the wire (outside the call's time limit, as the SDK's request
    clock starts after its write), ``outcome`` waits for its answer (within it). ``sent`` says whether it may have
    reached the downstream (a cancellation is then sent after it)."""

    def __init__(self, rid: str, progress: ProgressFn | None) -> None:
        self.rid = rid
        self.progress = progress
        self.sent = False

    async def send(self, body: bytes) -> None:
        raise NotImplementedError

    async def outcome(self) -> dict[str, Any]:
        raise NotImplementedError


class DirectLane:
    """One downstream session, for requests sent straight on it. ``version`` is the protocol version its handshake
    agreed (set once it completed); a subclass says how a call goes out (``_begin``) and how a message nobody waits
    for is delivered (``_notice``)."""

    def __init__(self) -> None:
        self.version: str | None = None
        self._ids = itertools.count(1)

    @property
    def ready(self) -> bool:
        return self.version is not None

    def _begin(self, rid: str, progress: ProgressFn | None, answer: AnswerFn, notify: NotifyFn) -> DirectCall:
        raise NotImplementedError

    async def _notice(self, message: Mapping[str, Any]) -> None:
        """Deliver a notification (or a response) that no one waits for; a lost connection is not an error."""
        raise NotImplementedError

    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        timeout_s: float | None,
        progress: ProgressFn | None,
        answer: AnswerFn,
        notify: NotifyFn,
    ) -> dict[str, Any]:
        """Send one request, return its result (the JSON object); raise ``MCPError`` for its error."""
        rid = f"{LANE_ID_PREFIX}{next(self._ids)}"
        meta = dict(params.get("_meta") or {})
        if progress is not None:
            meta["progressToken"] = rid
        call = self._begin(rid, progress, answer, notify)
        try:
            with _client_span(method, params.get("name"), rid, meta):
                params = {**params, "_meta": meta} if meta else {k: v for k, v in params.items() if k != "_meta"}
                message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
                await call.send(json.dumps(message, separators=(",", ":")).encode())
                with anyio.fail_after(timeout_s):
                    return await call.outcome()
        except TimeoutError:
            await self._cancel(rid, "timed out")
            raise MCPError(
                REQUEST_TIMEOUT, f"Timed out while waiting for response to {method}. Waited {timeout_s} seconds."
            ) from None
        except anyio.get_cancelled_exc_class():
            if call.sent:
                await self._cancel(rid, "the request was cancelled")
            raise

    async def _cancel(self, rid: str, reason: str) -> None:
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid, "reason": reason}}
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_NOTICE_S):
            await self._notice(note)


def _client_span(method: str, target: object, rid: str, meta: dict[str, Any]) -> AbstractContextManager[object]:
    """The SDK's client span (its tracer's name, the span's name and attributes), with the W3C trace context put in
    ``meta`` (SEP-414), as its session would send them (mcp.shared._otel, private to the SDK). With no tracer provider
    installed and no span current (tracing off, the default) that span would be the invalid one and nothing would be
    put in ``meta``: then nothing is made at all (3-4% of a ``serve --stdio`` call's CPU)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) and not (
        trace.get_current_span().get_span_context().is_valid
    ):
        return nullcontext()
    return _traced(method, target, rid, meta)


@contextmanager
def _traced(method: str, target: object, rid: str, meta: dict[str, Any]) -> Iterator[None]:
    name = f"MCP send {method}{f' {target}' if isinstance(target, str) else ''}"
    attributes = {"mcp.method.name": method, "jsonrpc.request.id": rid}
    with _TRACER.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes):
        propagate.inject(meta)
        yield


def answer_of(message: Mapping[str, Any], rid: str) -> dict[str, Any] | None:
    """The result when ``message`` (a response, no ``method``) answers ``rid``; None when it answers another id.

    Raises:
        MCPError: the answer is the downstream's error, or carries neither a result nor an error.
    """
    if message.get("id") != rid:
        return None  # an answer to something else (the SDK routes answers by id; none is ours here)
    if isinstance(message.get("error"), dict):
        raise _error(message["error"])
    result = message.get("result")
    if not isinstance(result, dict):
        raise MCPError(types.INVALID_REQUEST, "the answer carried neither a result nor an error")
    return result


def progress_of(params: Mapping[str, Any]) -> tuple[float, float | None, str | None]:
    """A ``notifications/progress``' params as the progress function takes them."""
    return params.get("progress", 0.0), params.get("total"), params.get("message")


class HttpLane(DirectLane):
    """One streamable HTTP session to a downstream, for requests sent straight on it.

    ``client`` is the backend's own client (shared pool, answer limit); the session id is taken from the
    downstream's answers (``see``, an httpx2 response hook, on the shared session), with the ``initialize`` that
    opened it (``hello``): a caller's own session (own.py) is opened with the same.
    """

    def __init__(self, client: httpx2.AsyncClient, url: str, *, max_event_size: int) -> None:
        super().__init__()
        self.client = client
        self.url = url
        self.max_event_size = max_event_size
        self.session_id: str | None = None
        self.hello: bytes | None = None
        self.said: str | None = None  # the version its client's requests carry after the handshake (for ``end``)
        self.closer: anyio.abc.TaskGroup | None = None  # where a read response is closed, off the caller's path
        self._template: tuple[tuple[str | None, str | None], httpx2.Request] | None = None

    @property
    def ready(self) -> bool:
        return self.session_id is not None and self.version is not None

    async def see(self, response: httpx2.Response) -> None:
        """Response hook: remember the session id the downstream assigned (on its answer to ``initialize``), and
        that ``initialize``."""
        if self.session_id is None:
            found = response.headers.get("mcp-session-id")
            if found:
                self.session_id = found
                self.hello = response.request.content
        elif self.said is None:
            self.said = response.request.headers.get("mcp-protocol-version")

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
        if self.version is not None:
            headers["mcp-protocol-version"] = self.version
        return headers

    def post(self, body: bytes) -> httpx2.Request:
        """The POST of one message. The client's URL, headers and timeout are merged with the session's headers once
        per session (``build_request`` merged them anew for every message: 60-90 us); while the client holds cookies
        (a balancer's, say), which it merges per request, it builds each request itself."""
        client = self.client
        if client.cookies:
            return client.build_request("POST", self.url, content=body, headers=self._headers())
        key = (self.session_id, self.version)
        if self._template is None or self._template[0] != key:
            template = client.build_request("POST", self.url, headers=self._headers())
            del template.headers["content-length"]  # the body's own is set for each request
            self._template = (key, template)
        template = self._template[1]
        return httpx2.Request(
            "POST", template.url, headers=template.headers, content=body, extensions=template.extensions
        )

    async def send(self, request: httpx2.Request) -> httpx2.Response:
        """``client.send(request, stream=True)`` without what a lane's request never uses of it (an auth flow and
        redirects: the backend's client has neither, and a redirect is answered as an error), keeping what it does:
        the client's response hooks (the failure recorder, ``see``), its cookies and the request on the response
        and on a transport error (about 120 us of CPU a call, measured against it interleaved in one process)."""
        client = self.client
        if client.auth is not None or client.follow_redirects:
            return await client.send(request, stream=True)
        try:
            response = await client._transport.handle_async_request(request)
        except httpx2.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        try:
            for hook in client.event_hooks["response"]:
                await hook(response)
            if "set-cookie" in response.headers:
                client.cookies.extract_cookies(response)
        except BaseException:
            await response.aclose()
            raise
        return response

    def _begin(self, rid: str, progress: ProgressFn | None, answer: AnswerFn, notify: NotifyFn) -> DirectCall:
        return _Exchange(self, rid, progress, answer, notify)

    async def _notice(self, message: Mapping[str, Any]) -> None:
        try:
            await self._post_message(message)
        except (httpx2.HTTPError, OSError):
            pass  # the downstream is gone or unreachable: nothing is left to tell there

    async def notice(self, message: Mapping[str, Any]) -> None:
        await self._notice(message)

    async def end(self) -> None:
        """End the session at the server (DELETE), bounded; a server that cannot be reached is left as it is."""
        headers = self._headers()
        headers.pop("content-type", None)
        if self.said is not None:
            headers.setdefault("mcp-protocol-version", self.said)
        with anyio.move_on_after(END_S):
            try:
                await (await self.client.delete(self.url, headers=headers)).aclose()
            except (httpx2.HTTPError, OSError):
                pass

    def closer_soon(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work`` in the session's closing task group (dropped when the session is closing)."""
        if self.closer is not None:
            self.closer.start_soon(work)

    async def _post_message(self, message: Mapping[str, Any]) -> None:
        """POST a notification or a response (answered 202, or an error status that nobody waits for)."""
        content = json.dumps(message, separators=(",", ":")).encode()
        response = await self.client.post(self.url, content=content, headers=self._headers())
        await response.aclose()


class _Exchange(DirectCall):
    """One request's POST and the stream that answers it (and its resumptions)."""

    def __init__(self, lane: HttpLane, rid: str, progress: ProgressFn | None, answer: AnswerFn, notify: NotifyFn):
        super().__init__(rid, progress)
        self.lane = lane
        self.answer = answer
        self.notify = notify
        self.body = b""
        self.serving: dict[str, anyio.CancelScope] = {}  # the server's requests being answered, by id
        self.events: AsyncIterator[Any] | None = None  # the events of the stream read last (_drain)

    async def send(self, body: bytes) -> None:
        self.body = body  # POSTed by ``outcome``: the POST's answer may be the call's, so it is within the time limit

    async def outcome(self) -> dict[str, Any]:
        lane = self.lane
        request = lane.post(self.body)
        self.sent = True
        response = await lane.send(request)
        if lane.session_id is None:  # an own session's initialize (own.py)
            lane.session_id = response.headers.get("mcp-session-id")
        try:
            outcome = await self._read(response)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await response.aclose()
            raise
        if lane.closer is not None:
            # The answer is read: what is left of the stream (its end) is drained and the connection pooled after
            # the caller has it, as the SDK's transport does in its own task (backends/mcp/pool.py).
            lane.closer.start_soon(_drain, self.events, response)
        else:
            await response.aclose()
        return outcome

    async def _read(self, response: httpx2.Response) -> dict[str, Any]:
        status = response.status_code
        content_type = response.headers.get("content-type", "").lower()
        if status == 202:
            raise MCPError(types.INVALID_REQUEST, "server answered a request with 202 Accepted")
        if status >= 400:
            if content_type.startswith("application/json"):
                try:
                    parsed = json.loads(await response.aread())
                except (ValueError, httpx2.StreamError):
                    parsed = None
                if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                    error = _error(parsed["error"])
                    raise (
                        SessionGone(error.error.code, error.error.message, error.error.data) if status == 404 else error
                    )
            if status == 404:
                raise SessionGone(types.INVALID_REQUEST, "Session terminated")
            raise MCPError(types.INTERNAL_ERROR, "Server returned an error response")
        if 300 <= status < 400:
            raise MCPError(types.INVALID_REQUEST, f"the server redirected the request (HTTP {status}); not followed")
        if content_type.startswith("application/json"):
            try:
                message = json.loads(await response.aread())
            except ValueError as exc:
                raise MCPError(types.PARSE_ERROR, f"Failed to parse JSON response: {exc}") from None
            outcome = await self._message(message)
            if outcome is None:
                raise MCPError(types.INVALID_REQUEST, "the JSON response was not the answer to the request")
            return outcome
        if not content_type.startswith("text/event-stream"):
            raise MCPError(types.INVALID_REQUEST, f"Unexpected content type: {content_type}")
        last_id, retry_ms, outcome = await self._events(response)
        attempts = 0
        while outcome is None:
            if last_id is None or attempts >= RESUME_ATTEMPTS:
                raise MCPError(CONNECTION_CLOSED, "SSE stream ended without a response")
            await anyio.sleep((retry_ms if retry_ms is not None else RESUME_DELAY_MS) / 1000)
            headers = {**self.lane._headers(), "last-event-id": last_id}
            headers.pop("content-type", None)
            resumed = self.lane.client.build_request("GET", self.lane.url, headers=headers)
            again = await self.lane.send(resumed)
            try:
                if again.status_code >= 400 or not again.headers.get("content-type", "").startswith(
                    "text/event-stream"
                ):
                    attempts += 1
                    continue
                before = last_id
                found_id, found_retry, outcome = await self._events(again)
                last_id = found_id or last_id
                retry_ms = found_retry if found_retry is not None else retry_ms
                attempts = 0 if last_id != before else attempts + 1
            finally:
                await again.aclose()
        return outcome

    async def _events(self, response: httpx2.Response) -> tuple[str | None, int | None, dict[str, Any] | None]:
        """Read one SSE stream until the answer: (last event id, retry interval, the result or None).

        A request of the server's is answered in a task of its own while the stream is read on (the server may
        cancel it, or say more, before it is answered): the task group is opened only when the first one comes."""
        stream = _Stream(aiter(httpx2.EventSource(response, max_event_size=self.lane.max_event_size)))
        self.events = stream.events
        first = await self._consume(stream, None)
        if first is None:
            return stream.last_id, stream.retry_ms, stream.outcome
        failure: BaseException | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve, first)
            try:
                await self._consume(stream, tg)
            except Exception as exc:  # raised after the task group, not wrapped in an exception group
                failure = exc
            tg.cancel_scope.cancel()  # answered (or failed): a request of the server's still open is moot
        if failure is not None:
            raise failure
        return stream.last_id, stream.retry_ms, stream.outcome

    async def _consume(self, stream: _Stream, tg: anyio.abc.TaskGroup | None) -> dict[str, Any] | None:
        """Read ``stream`` until the answer or its end; without ``tg``, stop at the first request of the server's
        and return it (the caller opens the task group to answer it in)."""
        turns = Turns()
        try:
            while True:
                await turns.taken()
                try:
                    sse = await anext(stream.events)
                except StopAsyncIteration:
                    return None
                if sse.id:
                    stream.last_id = sse.id
                if sse.retry is not None:
                    stream.retry_ms = sse.retry
                if sse.event != "message" or not sse.data:
                    continue  # a priming event (id only), or an event type MCP does not use
                try:
                    message = json.loads(sse.data)
                except ValueError as exc:
                    raise MCPError(types.PARSE_ERROR, f"Failed to parse SSE message: {exc}") from None
                if isinstance(message, dict) and "method" in message and "id" in message:
                    if tg is None:
                        return message
                    tg.start_soon(self._serve, message)
                    continue
                outcome = await self._message(message)
                if outcome is not None:
                    stream.outcome = outcome
                    return None
        except httpx2.SSEError as exc:
            raise MCPError(CONNECTION_CLOSED, f"SSE stream failed: {exc}") from None
        except (httpx2.ReadError, httpx2.RemoteProtocolError):
            return None  # the stream broke off: resumed when it can be, as the SDK does

    async def _message(self, message: Any) -> dict[str, Any] | None:
        """Handle one message of the call's stream (not a request); the result when it is the answer."""
        if not isinstance(message, dict):
            return None
        method = message.get("method")
        if method is None:
            return answer_of(message, self.rid)
        params = message.get("params") or {}
        if method == "notifications/progress" and params.get("progressToken") == self.rid:
            if self.progress is not None:
                await self.progress(*progress_of(params))
            return None
        if method == "notifications/cancelled":
            scope = self.serving.get(_key(params.get("requestId")))
            if scope is not None:
                scope.cancel()  # the server gave up on its request: so does the relay (and the client is told)
            return None
        _, notifications = _adapters()
        try:
            notification = notifications.validate_python(message, by_name=False)
        except ValueError:
            return None  # a notification the SDK would not know either
        await self.notify(notification)
        return None

    async def _serve(self, message: dict[str, Any]) -> None:
        """Answer a request of the server's, made on the call's stream, and POST the answer back (none when the
        server cancelled it, as the SDK does)."""
        request_id = message["id"]
        requests, _ = _adapters()
        reply: dict[str, Any]
        if message.get("method") == "ping":
            reply = {"jsonrpc": "2.0", "id": request_id, "result": {}}
        else:
            try:
                request = requests.validate_python(message, by_name=False)
            except ValueError:
                request = None
            outcome: Any = types.ErrorData(code=types.METHOD_NOT_FOUND, message="Method not found")
            if request is not None:
                key = _key(request_id)
                with anyio.CancelScope() as scope:
                    self.serving[key] = scope
                    try:
                        outcome = await self.answer(request)
                    finally:
                        self.serving.pop(key, None)
                if scope.cancelled_caught:
                    return
            if isinstance(outcome, types.ErrorData):
                dumped = outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
                reply = {"jsonrpc": "2.0", "id": request_id, "error": dumped}
            else:
                result = outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
                reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
        await self.lane._notice(reply)  # lost or not, the server's stream goes on or ends the call: it is read there


class _Stream:
    __slots__ = ("events", "last_id", "outcome", "retry_ms")

    def __init__(self, events: AsyncIterator[Any]) -> None:
        self.events = events
        self.last_id: str | None = None
        self.retry_ms: int | None = None
        self.outcome: dict[str, Any] | None = None


def _key(request_id: Any) -> str:
    return json.dumps(request_id)  # "1" and 1 are different ids


async def _drain(events: AsyncIterator[Any] | None, response: httpx2.Response) -> None:
    """Read an answered stream's events to its end (bounded as pool.py bounds a drain), then close it. Reading it
    to the end lets every async generator under the event iterator finish: one left suspended is finalized by the
    garbage collector instead, and asyncio's finalizer hook wakes the loop through its self-pipe and spawns a task to
    close it, for each of the seven generators of the chain, on every call (docs/benchmarks.md, "History of a
    call's cost")."""
    if events is not None:
        try:
            with anyio.move_on_after(DRAIN_LIMIT_S):
                async for _ in events:
                    pass  # what follows the answer on its stream: normally nothing but the stream's end
        except Exception:  # a stream that breaks off here only loses its connection (closed below)
            pass
    await _close_quietly(response)


async def _close_quietly(response: httpx2.Response) -> None:
    try:
        await response.aclose()
    except Exception:  # a read answer's stream that fails to close leaves nothing to do but drop it
        pass  # (httpcore has already discarded the connection); it must not end the task group the session lives in


def _error(error: Mapping[str, Any]) -> MCPError:
    code = error.get("code")
    return MCPError(
        code if isinstance(code, int) else types.INTERNAL_ERROR, str(error.get("message", "")), error.get("data")
    )
