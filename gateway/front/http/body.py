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
    request's scope (front/scope.py): the router refuses it as invalid params naming the argument, and writes
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
    waits for it (``RELEASE_GRACE_S``). An id whose POST ended before its answer (the client went away) stays in
    flight until the SDK has produced that answer or the session has ended, so a reuse is never handed another
    request's answer. See ``InFlight``.
A body that is not JSON, or not one JSON object, is passed on untouched: the SDK's parse errors stand. The cost is
one extra ``json.loads`` of each POST body (microseconds for a call; the SDK reads the whole body anyway).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from mcp.shared.dispatcher import coerce_request_id
from mcp_types import INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.models import EdgeSettings
from gateway.errors import quote
from gateway.front.http.replies import reply, rpc_error
from gateway.front.scope import caller_of, set_message, set_withheld
from gateway.inputs import argument_problem, problem

__all__ = ["Edge", "InFlight"]

RELEASE_GRACE_S = 1.0
"""How long a request reusing an in-flight id waits for that request to end before it is refused: a client may
reuse an id as soon as it has read the answer, which reaches it a moment before the answering POST has ended."""

Key = tuple[str | None, str, str | int]


class _Claim:
    """One claimed id: set ``ended`` when it is free again."""

    __slots__ = ("answered", "ended", "gone")

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.answered = False  # the SDK produced its answer (events.py told us)
        self.gone = False  # its session ended


class InFlight:
    """The request ids in flight per session, so that a duplicate is refused before the SDK sees it.

    An id is claimed when its POST is handed to the SDK and released when that POST's ASGI call ends, however it
    ends: its answer sent, the request cancelled (the session era answers a cancelled request on its stream), the
    session ended or deleted (the SDK closes the session's streams), the SDK refused it (any status but 200). Holding
    the id until the POST has ended, not just until its answer was written, matters: the SDK's transport drops the
    stream of whatever request holds the id when the old POST finishes, so a reuse in between would hang.

    A POST that ends while its request goes on — the client went away, or the SSE stream was closed for it to
    resume later — keeps its id *held* until the SDK produces the request's answer (``answered``, from the session's
    event view, events.py: every answer passes through it, to a stream or to no one) or its session ends
    (``session_ended``, from ``CallerSessions``): the SDK keys the request by its id until then, and routes its answer
    to whatever stream has that id, so a reuse would be handed the abandoned request's answer. A hold is bounded by
    the call's own timeout (``servers.<name>.timeout_s``: the gateway answers a timed-out call), by a cancellation
    (answered -32800), and by its session's end (DELETE, idle timeout, eviction); it holds only while something will
    end it, so only when ``answers_known`` (the session manager feeds ``answered``) is it kept at all.
    Keys are (caller, session id, the SDK's correlation id): another caller naming this session id has keys of its
    own (and the SDK answers it 404), and the stateless era (told, as the SDK tells it, by the protocol version
    header; each POST its own exchange) is not tracked. The table holds one entry per POST being served and per
    request the SDK is still working on, so it cannot outlive the sessions that hold them.
    """

    def __init__(self) -> None:
        self._ids: dict[Key, _Claim] = {}
        self._sessions: dict[str, set[Key]] = {}  # session id -> its claimed keys
        self._held: set[Key] = set()  # keys whose POST ended while the SDK still works on the request
        self.answers_known = False
        """True once something calls ``answered`` for every answer the SDK produces (``CallerSessions``)."""

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def held(self) -> int:
        """Ids held for requests whose POST ended before their answer."""
        return len(self._held)

    async def claim(self, key: Key) -> bool:
        """Claim ``key``, waiting up to ``RELEASE_GRACE_S`` for its holder to end; False if it is still held."""
        held = self._ids.get(key)
        if held is not None:
            with anyio.move_on_after(RELEASE_GRACE_S):
                await held.ended.wait()
            if key in self._ids:  # still held, or taken by another request that waited too
                return False
        self._ids[key] = _Claim()
        self._sessions.setdefault(key[1], set()).add(key)
        return True

    def release(self, key: Key, *, pending: bool = False) -> None:
        """The POST of ``key`` ended; ``pending``: the SDK took the request and may not have answered it yet."""
        claim = self._ids[key]
        if pending and self.answers_known and not (claim.answered or claim.gone):
            self._held.add(key)
        else:
            self._drop(key)

    def answered(self, session: str, request_id: str | int) -> None:
        """The SDK produced the answer to ``request_id`` (its correlation id) on ``session``."""
        for key in [k for k in self._sessions.get(session, ()) if k[2] == request_id]:
            if key in self._held:
                self._drop(key)
            else:
                self._ids[key].answered = True

    def session_ended(self, session: str) -> None:
        """``session`` ended: its held ids are free, and those of POSTs still ending are not held."""
        for key in list(self._sessions.get(session, ())):
            if key in self._held:
                self._drop(key)
            else:
                self._ids[key].gone = True

    def _drop(self, key: Key) -> None:
        self._ids.pop(key).ended.set()
        self._held.discard(key)
        keys = self._sessions[key[1]]
        keys.discard(key)
        if not keys:
            del self._sessions[key[1]]


class Edge:
    """Pure ASGI middleware in front of the MCP app: refuses or withholds what must not reach the SDK or a backend."""

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
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            decoded = None  # the SDK answers its own parse error
        if isinstance(decoded, dict):
            params = decoded.get("params")
            set_message(scope, {**decoded, "params": dict(params) if isinstance(params, dict) else params})
            answer, body = _check(decoded, scope, body, settings.max_argument_depth)
            if answer is not None:
                await reply(send, 400, answer)
                return
            key = _in_flight_key(decoded, scope, headers)
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
    if withheld is None and not rewritten:
        return None, body
    if arguments is not None:
        params["arguments"] = arguments
    return None, json.dumps(decoded).encode()


def _in_flight_key(decoded: dict[str, Any], scope: Scope, headers: Headers) -> Key | None:
    """The in-flight key of a session-era request (its id already checked to be a string or an integer), else None."""
    if "method" not in decoded or "id" not in decoded:
        return None  # a notification or a response: the SDK answers 202 and correlates no answer stream by it
    session, version = headers.get("mcp-session-id"), headers.get("mcp-protocol-version")
    if session is None or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
        # initialize, or the stateless era (which the SDK tells by this header alone, as here): each POST is its
        # own exchange, and nothing else can share its id
        return None
    return (caller_of(scope).name, session, coerce_request_id(decoded["id"]))


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
