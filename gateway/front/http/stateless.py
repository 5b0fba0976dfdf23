"""A 2026-07-28 request over HTTP, taken and answered by the gateway: ``serve_stateless``.

A request of that era is one POST: no ``initialize``, no session, its protocol version, client and capabilities in
``params._meta``, its answer the one response (a notification POST is acknowledged 202 and dropped). The checks and
their answers are the SDK's (``mcp.shared.inbound``: the routing headers, the envelope ladder, the ``Mcp-Param-*``
headers against the tool's schema; the HTTP status each error code maps to), and the request is served by the SDK's
runner (``serve_one``), as every request of the face is. What this module owns is how it is taken and answered:

* the message is the one the edge parsed (body.py hands it on in the scope: the body is not parsed again);
* the request is served in the POST's own task; its answer is one JSON body when the response is the first thing
  it has to send, and an event stream when a notification for it comes first (progress, a log line) or its call is
  still running after ``PING_S`` (kept alive by a comment every ``PING_S``, as the SDK's keeps it);
* a client that closes its connection cancels its request (the 2026-07-28 era's cancellation). What notices it is a
  task started only for a request still running after ``HOLD_S`` (transport.py's hold for a session's POST): most
  calls are answered sooner and never pay for one. The SDK's entry ran every request in a task of its own beside a
  watcher task, behind a memory stream, and parsed and validated the body again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Final

import anyio
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import modern_error_data, serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_PARAM_HEADER_PREFIX,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    unsupported_protocol_version_rejection,
    validate_mcp_param_headers,
)
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    HEADER_MISMATCH,
    INVALID_REQUEST,
    PARSE_ERROR,
    JSONRPCNotification,
    JSONRPCRequest,
    ProgressToken,
    RequestId,
)
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.front.http.replies import dumps, reply, respond, rpc_error
from gateway.front.http.transport import HOLD_S, taken, watch_client
from gateway.front.scope import parsed_of, unsent_of

__all__ = ["serve_stateless"]

logger = logging.getLogger("mcp.server.streamable_http")

_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]
_PING: Final = b": ping\r\n\r\n"
_PARAM_PREFIX: Final = MCP_PARAM_HEADER_PREFIX.lower()
_INVALID_BODY: Final = "Body must be a single JSON-RPC request or notification object"


def _event(document: Mapping[str, Any]) -> bytes:
    """One SSE ``message`` event."""
    return b"event: message\r\ndata: " + dumps(document) + b"\r\n\r\n"


async def _write(send: Send, document: Mapping[str, Any]) -> None:
    """A whole JSON answer, its HTTP status the one the error's code maps to (200 for a result)."""
    error = document.get("error")
    await reply(send, ERROR_CODE_HTTP_STATUS.get(error["code"], 200) if isinstance(error, Mapping) else 200, document)


def _rejection(request_id: RequestId | None, rejection: InboundLadderRejection) -> dict[str, Any]:
    return rpc_error(request_id, rejection.code, rejection.message, rejection.data)


class _Exchange:
    """One request's dispatch context (the SDK's ``DispatchContext``) and its answer on the POST's ``send``: the
    notifications it sends for the request commit the answer to an event stream; no request to the client (the
    2026-07-28 era has no back-channel)."""

    can_send_request = False

    def __init__(self, request: Request, request_id: RequestId, progress_token: ProgressToken | None, send: Send):
        self.transport = TransportContext(kind="streamable-http", can_send_request=False, headers=request.headers)
        self.request_id = request_id
        self.message_metadata = ServerMessageMetadata(request_context=request)
        self.progress_token = progress_token
        self.cancel_requested = anyio.Event()
        self.streams = False  # whether notifications go on (False: JSON answers only, or the answer has ended)
        self._send = send
        self._unsent = unsent_of(request.scope)
        self._committed = False
        self._ended = False
        self._lock: anyio.Lock | None = None
        self.quiet_since = anyio.current_time()

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if not self.streams:
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        await self.emit(_event(message))

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)

    async def emit(self, data: bytes, *, last: bool = False) -> None:
        """``data`` on the event stream (begun by the first), one writer at a time; nothing after the last."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._ended:
                logger.debug("dropped an event: the response has ended")
                return
            self._ended = last
            if not self._committed:
                self._committed = True
                await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            self.quiet_since = anyio.current_time()
            await self._send({"type": "http.response.body", "body": data, "more_body": not last})
            if not last:
                await taken(self._unsent)  # a client that does not keep up holds its stream's next event

    async def answer(self, document: Mapping[str, Any]) -> None:
        """The request's response: the stream's last event once the stream has begun, else one JSON body."""
        self.streams = False
        if self._committed:
            await self.emit(_event(document), last=True)
        else:
            self._ended = True
            await _write(self._send, document)

    async def watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        """Until the answer ends: cancel the request when its client leaves; a comment after every ``PING_S``
        without an event (the first begins the stream)."""
        await watch_client(receive, lambda: self.quiet_since, lambda: self.emit(_PING))
        scope.cancel()


async def _served(
    server: Server[Any], exchange: _Exchange, request: JSONRPCRequest, connection: Connection, lifespan_state: Any
) -> dict[str, Any]:
    """The request's response (its error, whatever the handler raised: ``modern_error_data`` maps it)."""
    try:
        result = await serve_one(
            server, exchange, request.method, request.params, connection=connection, lifespan_state=lifespan_state
        )
    except Exception as exc:
        error = modern_error_data(exc).model_dump(mode="json", by_alias=True)
        return rpc_error(request.id, error["code"], error["message"], error.get("data"))
    return {"jsonrpc": "2.0", "id": request.id, "result": result}


async def serve_stateless(
    server: Server[Any], *, json_response: bool, lifespan_state: Any, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer one 2026-07-28 request (see the module docstring)."""
    request = Request(scope, receive)
    if request.method != "POST":
        await respond(send, 405, headers=[(b"allow", b"POST")])
        return
    has_json, has_sse = check_accept_headers(request)
    if not has_json or (not json_response and not has_sse):
        await respond(send, 406)
        return
    decoded: Any = parsed_of(scope)
    if decoded is None:  # not an object, or not through the edge's body check: parsed here
        try:
            decoded = json.loads(await request.body())
        except (ValueError, RecursionError):  # an oversized integer is a bare ValueError, deep nesting recursion
            await _write(send, rpc_error(None, PARSE_ERROR, "Parse error"))
            return
    if isinstance(decoded, dict) and "id" not in decoded:  # a notification (JSON-RPC 2.0 4.1: no id member)
        await _acknowledge(decoded, request, send)
        return
    try:
        message = JSONRPCRequest.model_validate(decoded)
    except ValidationError:  # a batch, a posted response, a malformed envelope
        await _write(send, rpc_error(None, INVALID_REQUEST, _INVALID_BODY))
        return
    if message.method == "subscriptions/listen" and not has_sse:  # its answer is a stream, whatever else is asked
        await respond(send, 406)
        return
    duplicated = find_duplicated_routing_header(request.headers.items())
    if duplicated is not None:
        rejection = InboundLadderRejection(code=HEADER_MISMATCH, message=f"{duplicated} header appears more than once")
        await _write(send, _rejection(message.id, rejection))
        return
    verdict = classify_inbound_request(decoded, headers=dict(request.headers))
    if isinstance(verdict, InboundLadderRejection):
        await _write(send, _rejection(message.id, verdict))
        return
    refused = _param_headers_refused(server, message, request)
    if refused is not None:
        await _write(send, _rejection(message.id, refused))
        return
    connection = Connection.from_envelope(verdict.protocol_version, verdict.client_info, verdict.client_capabilities)
    exchange = _Exchange(request, message.id, progress_token_from_params(message.params), send)
    serve = _served(server, exchange, message, connection, lifespan_state)
    if json_response and message.method != "subscriptions/listen":
        await exchange.answer(await serve)  # the SDK's JSON mode: nothing streams, nothing watches the client
        return
    exchange.streams = True
    await _answer_held(exchange, serve, receive)


async def _answer_held(exchange: _Exchange, serve: Awaitable[dict[str, Any]], receive: Receive) -> None:
    """Serve the request in this task; a request still running after ``HOLD_S`` gets a task that watches its client
    (``_Exchange.watch``), started by a timer the event loop drops when the answer comes first."""
    answered: dict[str, Any] | None = None
    watching = False
    async with anyio.create_task_group() as tasks:

        def watch() -> None:
            nonlocal watching
            watching = True
            tasks.start_soon(exchange.watch, receive, tasks.cancel_scope)

        timer = asyncio.get_running_loop().call_later(HOLD_S, watch)
        try:
            answered = await serve
        finally:
            timer.cancel()
            if watching:  # (a cancel costs a scope's walk and a message: not paid when no task was started)
                tasks.cancel_scope.cancel()
    if answered is not None:  # else the client left and the request was cancelled
        await exchange.answer(answered)


def _param_headers_refused(
    server: Server[Any], message: JSONRPCRequest, request: Request
) -> InboundLadderRejection | None:
    """A ``tools/call``'s ``Mcp-Param-*`` headers checked against the tool's published schema (the face's
    ``get_tool_input_schema``: what this caller was shown); a lookup that fails lets the call through, as the SDK's."""
    lookup = server.get_tool_input_schema
    if message.method != "tools/call" or lookup is None:
        return None
    params = message.params or {}
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or (arguments is not None and not isinstance(arguments, Mapping)):
        return None
    arguments = arguments or {}
    if not arguments and not any(header.startswith(_PARAM_PREFIX) for header in request.headers):
        return None
    try:
        schema = lookup(name)
    except Exception:
        logger.exception("Mcp-Param header validation skipped: get_tool_input_schema raised")
        return None
    return validate_mcp_param_headers(schema, arguments, request.headers) if schema is not None else None


async def _acknowledge(decoded: dict[str, Any], request: Request, send: Send) -> None:
    """A notification POST: 202 and dropped at a served version (the era defines none a client sends over HTTP; a
    client cancels by closing its request's connection), else the version refused as a request's would be."""
    try:
        JSONRPCNotification.model_validate(decoded)
    except ValidationError:
        await _write(send, rpc_error(None, INVALID_REQUEST, _INVALID_BODY))
        return
    refused = unsupported_protocol_version_rejection(request.headers.get(MCP_PROTOCOL_VERSION_HEADER, ""))
    if refused is not None:
        await _write(send, _rejection(None, refused))
        return
    await respond(send, 202)
