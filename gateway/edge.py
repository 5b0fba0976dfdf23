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
  * any other message holding such a value is answered ``-32602`` (Invalid params) naming where, HTTP 400;
  * a request whose id is already in flight on the same session (same caller, same ``Mcp-Session-Id``) is answered
    ``-32600`` (Invalid Request) with its id, HTTP 400, and never reaches the SDK: the SDK keys a session's
    requests by id (the transport's streams by ``str(id)``, the dispatcher's table by ``coerce_request_id``, so
    ``7`` and ``"7"`` are one id), and a second request with the id takes over the first's answer stream, so the
    first is never answered. The first request goes on and is answered. A reuse of an id whose POST is just ending
    waits for it (``RELEASE_GRACE_S``). See ``InFlight``.
A body that is not JSON, or not one JSON object, is passed on untouched: the SDK's parse errors stand. The cost is
one extra ``json.loads`` of each POST body (microseconds for a call; the SDK reads the whole body anyway).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from mcp.shared.dispatcher import coerce_request_id
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import EdgeSettings
from gateway.errors import quote
from gateway.inputs import argument_problem, problem
from gateway.server import WITHHELD

__all__ = ["RPC", "Edge", "InFlight"]

RPC = "edge.rpc"
"""The scope-state key under which the edge leaves a POST's JSON-RPC message, as sent, for what runs after it
(quotas.py); only when the body is one JSON object."""

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602


RELEASE_GRACE_S = 1.0
"""How long a request reusing an in-flight id waits for that request to end before it is refused: a client may
reuse an id as soon as it has read the answer, which reaches it a moment before the answering POST has ended."""

Key = tuple[str | None, str, str | int]


class InFlight:
    """The request ids in flight per session, so that a duplicate is refused before the SDK sees it.

    An id is claimed when its POST is handed to the SDK and released when that POST's ASGI call ends, however it
    ends: its answer sent, the request cancelled (the session era answers a cancelled request on its stream), the
    client gone, the session ended or deleted (the SDK closes the session's streams). So the table holds at most one
    entry per POST being served: it is bounded by the server's concurrent connections and cannot outlive them.
    Holding the id until the POST has ended, not just until its answer was written, matters: the SDK's transport
    drops the stream of whatever request holds the id when the old POST finishes, so a reuse in between would hang.
    Keys are (caller, session id, the SDK's correlation id): another caller naming this session id has keys of its
    own (and the SDK answers it 404), and the stateless era (told, as the SDK tells it, by the protocol version
    header; each POST its own exchange) is not tracked. A POST the client abandons frees its id although the SDK
    may still be working on it: the SDK then gives a later request reusing that id the abandoned one's answer if it
    comes first, within the same session only.
    """

    def __init__(self) -> None:
        self._ids: dict[Key, anyio.Event] = {}

    def __len__(self) -> int:
        return len(self._ids)

    async def claim(self, key: Key) -> bool:
        """Claim ``key``, waiting up to ``RELEASE_GRACE_S`` for its holder to end; False if it is still held."""
        held = self._ids.get(key)
        if held is not None:
            with anyio.move_on_after(RELEASE_GRACE_S):
                await held.wait()
            if key in self._ids:  # still held, or taken by another request that waited too
                return False
        self._ids[key] = anyio.Event()
        return True

    def release(self, key: Key) -> None:
        self._ids.pop(key).set()


class Edge:
    """Pure ASGI middleware in front of the MCP app: refuses or withholds what must not reach the SDK or a backend."""

    def __init__(self, app: ASGIApp, settings: Callable[[], EdgeSettings]) -> None:
        self.app = app
        self.settings = settings
        self.in_flight = InFlight()

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
            key = _in_flight_key(decoded, scope)
            if key is not None:
                if not await self.in_flight.claim(key):
                    await _reply(send, _duplicate(decoded["id"]))
                    return
                try:
                    await self.app(scope, _replay(body, receive), send)
                finally:
                    self.in_flight.release(key)
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


def _in_flight_key(decoded: dict[str, Any], scope: Scope) -> Key | None:
    """The in-flight key of a session-era request (its id already checked to be a string or an integer), else None."""
    if "method" not in decoded or "id" not in decoded:
        return None  # a notification or a response: the SDK answers 202 and correlates no answer stream by it
    headers = Headers(scope=scope)
    session, version = headers.get("mcp-session-id"), headers.get("mcp-protocol-version")
    if session is None or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
        # initialize, or the stateless era (which the SDK tells by this header alone, as here): each POST is its
        # own exchange, and nothing else can share its id
        return None
    caller = scope.get("state", {}).get("caller")
    return (caller if isinstance(caller, str) else None, session, coerce_request_id(decoded["id"]))


def _duplicate(request_id: str | int) -> dict[str, Any]:
    shown = quote(request_id) if isinstance(request_id, str) else str(request_id)
    text = f"Invalid Request: request id {shown} is already in flight on this session."
    return _error(request_id, INVALID_REQUEST, text)


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
