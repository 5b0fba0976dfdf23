"""The edge of ``/mcp``: every POST body is checked before the SDK parses it, in both protocol eras.

The SDK's two entries disagree on what they accept: the session era (2025-xx) parses with pydantic, which refuses a
lone surrogate and deep nesting with a bare 400 parse error (no ledger row), and takes a request whose ``id`` is
``1.5``, ``null``, ``{}`` or ``true`` for a notification (202, silently dropped); the stateless era (2026-07-28)
parses with ``json``, which accepts both (and ``NaN``), and hands them on until a pipe's UTF-8 encoder or pydantic's
serializer fails on them in a downstream session every caller shares. ``Edge`` gives both eras one rule (inputs.py):
  * a body larger than ``gateway.edge.max_body_bytes`` is refused with HTTP 413 (by its Content-Length before it is
    read, else as soon as it passes the limit), so no caller makes the gateway hold more than that per request;
  * a request whose ``id`` is not a string or an integer is answered ``-32600`` (Invalid Request), HTTP 400;
  * a ``tools/call`` whose arguments hold a lone surrogate, ``NaN`` or ``Infinity``, or nest beyond
    ``gateway.edge.max_argument_depth``, is passed on with its arguments withheld (``{}``) and the finding in the
    request's scope state (``WITHHELD``): the router refuses it as invalid params naming the argument, and writes
    its ledger row, with the caller's whole context (client, session) — the SDK's own answer path, so either era
    gets its usual answer shape;
  * a ``tools/call`` whose name holds a lone surrogate is passed on with the name escaped: no published name holds
    one, so it is an unknown tool, with its ledger row;
  * any other message holding such a value is answered ``-32602`` (Invalid params) naming where, HTTP 400.
A body that is not JSON, or not one JSON object, is passed on untouched: the SDK's parse errors stand. The cost is
one extra ``json.loads`` of each POST body (microseconds for a call; the SDK reads the whole body anyway).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import EdgeSettings
from gateway.errors import quote
from gateway.inputs import argument_problem, problem
from gateway.server import WITHHELD

__all__ = ["RPC", "Edge"]

RPC = "edge.rpc"
"""The scope-state key under which the edge leaves a POST's JSON-RPC message, as sent, for what runs after it
(quotas.py); only when the body is one JSON object."""

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602


class Edge:
    """Pure ASGI middleware in front of the MCP app: refuses or withholds what must not reach the SDK or a backend."""

    def __init__(self, app: ASGIApp, settings: Callable[[], EdgeSettings]) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        limit = self.settings().max_body_bytes
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _reply(send, _too_large(int(declared), limit), 413)
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
                await _reply(send, _too_large(size, limit, more=True), 413)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            decoded = None  # the SDK answers its own parse error
        if isinstance(decoded, dict):
            params = decoded.get("params")
            scope.setdefault("state", {})[RPC] = {
                **decoded,
                "params": dict(params) if isinstance(params, dict) else params,
            }
            answer, body = self._check(decoded, scope, body)
            if answer is not None:
                await _reply(send, answer)
                return
        await self.app(scope, _replay(body, receive), send)

    def _check(self, decoded: dict[str, Any], scope: Scope, body: bytes) -> tuple[dict[str, Any] | None, bytes]:
        """(an answer to send instead, or None; the body to pass on)."""
        depth = self.settings().max_argument_depth
        request_id = decoded.get("id")
        if "method" in decoded and "id" in decoded:
            if request_id is None or isinstance(request_id, bool) or not isinstance(request_id, str | int):
                kind = "null" if request_id is None else type(request_id).__name__
                text = f"Invalid Request: a request's id must be a string or an integer, not {kind}."
                return _error(None, INVALID_REQUEST, text), body
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
            return _error(request_id, INVALID_PARAMS, f"Invalid params: at {quote('.'.join(where))}, {reason}."), body
        withheld = argument_problem(arguments, depth) if arguments is not None else None
        if withheld is not None:
            arguments = {}
            scope.setdefault("state", {})[WITHHELD] = withheld
        if withheld is None and not rewritten:
            return None, body
        if arguments is not None:
            params["arguments"] = arguments
        return None, json.dumps(decoded).encode()


def _too_large(size: int, limit: int, *, more: bool = False) -> dict[str, Any]:
    text = (
        f"Request body too large: {'more than ' if more else ''}{size:,} bytes; the limit is {limit:,} "
        "(gateway.edge.max_body_bytes)."
    )
    return _error(None, INVALID_REQUEST, text)


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


async def _reply(send: Send, answer: dict[str, Any], status: int = 400) -> None:
    body = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
