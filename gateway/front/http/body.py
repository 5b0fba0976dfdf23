"""The body check at ``/mcp`` (``Edge``): every POST body is read, bounded, parsed and checked before the session, with
one rule for both protocol eras (gateway/inputs.py), and a request whose id is already in flight on its session is
refused (request_ids.py). The SDK's two entries disagree: the session era's pydantic parsing refuses a lone surrogate
or deep nesting with a bare parse error (no ledger row) and takes an ``id`` of ``1.5``, ``null``, ``{}`` or ``true``
for a notification; the stateless era's ``json`` accepts them (and ``NaN``) and hands them on to a downstream session
every caller shares. A body that is not one JSON object is passed on untouched: the SDK's parse errors stand.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp_types import INVALID_PARAMS, INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import EdgeSettings
from gateway.errors import quote
from gateway.front.http.replies import reply, rpc_error
from gateway.front.http.request_ids import InFlight, in_flight_key
from gateway.front.scope import set_message, set_parsed, set_withheld
from gateway.inputs import argument_problem, problem

__all__ = ["Edge"]


class Edge:
    """Pure ASGI middleware in front of the MCP app: refuses or withholds what must not reach the SDK or a backend.

    * a body larger than ``gateway.edge.max_body_bytes`` is answered HTTP 413 (by its Content-Length before it is
      read, else as soon as it passes the limit), so no caller makes the gateway hold more than that per request;
    * a request whose ``id`` is not a string or an integer is answered ``-32600`` (Invalid Request), HTTP 400;
    * a ``tools/call`` whose arguments hold a lone surrogate, ``NaN`` or ``Infinity``, or nest beyond
      ``gateway.edge.max_argument_depth``, is passed on with its arguments withheld (``{}``) and the finding in the
      request's scope (front/scope.py): the router refuses it as invalid params naming the argument and writes its
      ledger row, with the caller's whole context, on the SDK's own answer path (either era's answer shape);
    * a ``tools/call`` whose name holds a lone surrogate is passed on with the name escaped: no published name holds
      one, so it is an unknown tool, with its ledger row;
    * any other message holding such a value is answered ``-32602`` (Invalid params) naming where, HTTP 400;
    * a session-era request whose id is in flight on the same session is answered ``-32600`` with its id, HTTP 400
      (``InFlight``), and never reaches the SDK.

    The message parsed here is the one every request is served from: a session-era one by front/http/transport.py,
    a 2026-07-28 one by front/http/stateless.py.
    """

    def __init__(self, app: ASGIApp, settings: Callable[[], EdgeSettings], in_flight: InFlight | None = None) -> None:
        self.app = app
        self.settings = settings
        self.in_flight = in_flight if in_flight is not None else InFlight()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        settings = self.settings()
        limit = settings.max_body_bytes
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await reply(send, 413, _too_large(int(declared), limit))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before it finished sending
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # no Content-Length (chunked), or more than it said: stop reading at the limit
                await reply(send, 413, _too_large(size, limit, more=True))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            decoded = json.loads(body.decode())  # UTF-8 only, as the transport's own parse (RFC 8259 8.1)
        except (ValueError, RecursionError):
            decoded = None  # the transport answers its own parse error
        if isinstance(decoded, dict):
            params = decoded.get("params")
            set_message(scope, {**decoded, "params": dict(params) if isinstance(params, dict) else params})
            answer, body = _check(decoded, scope, body, settings.max_argument_depth)
            if answer is not None:
                await reply(send, 400, answer)
                return
            set_parsed(scope, decoded)  # what ``body`` holds now: the session transport does not parse it again
            key = in_flight_key(decoded, scope, headers)
            if key is not None:
                if not await self.in_flight.claim(key):
                    await reply(send, 400, _duplicate(decoded["id"]))
                    return
                status: list[int] = []

                async def watched(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        status.append(message["status"])
                    await send(message)

                try:
                    await self.app(scope, _replay(body, receive), watched)
                finally:
                    # 200 (the SDK's stream or JSON answer) or nothing sent yet: the SDK took the request, and it
                    # may run on unanswered; any other status is a refusal before it (404, 406, 429, ...)
                    self.in_flight.release(key, pending=status in ([], [200]))
                return
        await self.app(scope, _replay(body, receive), send)


def _check(decoded: dict[str, Any], scope: Scope, body: bytes, depth: int) -> tuple[dict[str, Any] | None, bytes]:
    """(an answer to send instead, or None; the body to pass on)."""
    request_id = decoded.get("id")
    if "method" in decoded and "id" in decoded:
        if request_id is None or isinstance(request_id, bool) or not isinstance(request_id, str | int):
            kind = "null" if request_id is None else type(request_id).__name__
            text = f"Invalid Request: a request's id must be a string or an integer, not {kind}."
            return rpc_error(None, INVALID_REQUEST, text), body
    raw_params = decoded.get("params")
    params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
    call = decoded.get("method") == "tools/call" and isinstance(raw_params, dict)
    rewritten = False
    if call and isinstance(params.get("name"), str) and problem(params["name"]) is not None:
        # No published name holds one (they are A-Z a-z 0-9 _ . -): an unknown tool, with its row, escaped.
        params["name"] = params["name"].encode("utf-8", "backslashreplace").decode("utf-8")
        rewritten = True
    arguments = params.pop("arguments", None) if call else None
    found = problem(decoded, depth + 2)  # the envelope and params around the values
    if found is not None:
        where, reason = found
        return rpc_error(request_id, INVALID_PARAMS, f"Invalid params: at {quote('.'.join(where))}, {reason}."), body
    withheld = argument_problem(arguments, depth) if arguments is not None else None
    if withheld is not None:
        arguments = {}
        set_withheld(scope, withheld)
    if arguments is not None:
        params["arguments"] = arguments
    if withheld is None and not rewritten:
        return None, body
    return None, json.dumps(decoded).encode()


def _duplicate(request_id: str | int) -> dict[str, Any]:
    shown = quote(request_id) if isinstance(request_id, str) else str(request_id)
    text = f"Invalid Request: request id {shown} is already in flight on this session."
    return rpc_error(request_id, INVALID_REQUEST, text)


def _too_large(size: int, limit: int, *, more: bool = False) -> dict[str, Any]:
    text = (
        f"Request body too large: {'more than ' if more else ''}{size:,} bytes; the limit is {limit:,} "
        "(gateway.edge.max_body_bytes)."
    )
    return rpc_error(None, INVALID_REQUEST, text)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the (possibly rewritten) body once, then whatever the client sends next."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
