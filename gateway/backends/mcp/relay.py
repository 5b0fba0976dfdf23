"""The back-channel: a downstream's requests to *its* client, relayed to the gateway's client whose call caused them.

A downstream server may ask its client for an LLM completion (``sampling/createMessage``), for user input
(``elicitation/create``) or for its roots (``roots/list``). Behind the gateway, "its client" is whichever upstream
client's call the downstream is serving, and the answer must come from that client, on that call's own stream.

Attribution, in order of precedence:
  * ``UPSTREAM``, a context variable holding the upstream request (``ServerRequestContext``) the current task works
    for. The server sets it around every upstream request. Over streamable HTTP the SDK carries the sender's
    context with each message, through the POST that carried the call, into the downstream session's callbacks —
    so a request the downstream sends on that POST's stream (``related_request_id``, as the Python SDK's
    ``ctx.session`` helpers do) sees the very call that caused it, however many calls run at once (exact).
  * Otherwise nothing links a downstream's request to a call: over stdio and SSE, and over streamable HTTP when the
    downstream sends it on its standalone GET stream (the TypeScript SDK's ``server.request()`` does). So each
    session keeps the upstream calls it is serving in an ``InFlight`` registry: with exactly one in flight, that one
    caused it (exact); with none or several, there is no one to ask and the downstream gets a JSON-RPC error at
    once. A server configured with ``session: per_client`` gives every client that can answer such requests its own
    downstream session, where every call in flight belongs to that one client (exact again, and the client's roots
    are its own).

The relay goes on the upstream request's own stream (``related_request_id``): a streamable HTTP client is sure to be
listening there, not necessarily on its standalone stream. A client that did not declare the capability is not
asked: the downstream gets an error. A client of the stateless 2026-07-28 era has no channel for server-to-client
requests: when its ``tools/call`` runs as a ``Bridge`` (the server registers it in ``BRIDGES``), the request is
handed to the server instead, which answers the client an input-required result, and the downstream waits, bounded,
for the client's retry to bring the answer (gateway/server.py ``bridged``); otherwise the downstream gets an error.
Cancellation flows through: when the downstream gives up on its request, the relay's task is cancelled and the SDK
sends ``notifications/cancelled`` to the upstream client.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any, get_args

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from pydantic import ValidationError

__all__ = [
    "BRIDGES",
    "UPSTREAM",
    "Bridge",
    "InFlight",
    "Upstream",
    "admits",
    "attribute",
    "client_log_level",
    "connection_of",
    "forwarded_meta",
    "relay_request",
    "set_client_log_level",
]

Upstream = ServerRequestContext[Any, Any]
"""The upstream request a downstream call is made for: its session (the channel back), id, ``_meta``, era."""

UPSTREAM: contextvars.ContextVar[Upstream | None] = contextvars.ContextVar("gateway_upstream", default=None)
"""The upstream request the current task works for (set by the server around each request it serves)."""

LOG_LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
"""Severity-ascending (RFC 5424), the spec's order."""
_LOG_LEVEL_KEY = "mcp-gateway/log-level"

STANDALONE_RELAY_TIMEOUT_S = 60.0
"""Bound on a relay that no call is waiting for (a per-client session's ``roots/list`` at its start)."""


def connection_of(upstream: Upstream) -> Any:
    """The SDK ``Connection`` an upstream request came on (private in the SDK; ``mcp`` is pinned below 3)."""
    return getattr(upstream.session, "_connection", None)


def caller_of(upstream: Upstream | None) -> str | None:
    """The caller (http.py's guard put its name in the request's scope state) an upstream request comes from."""
    request = getattr(upstream, "request", None) if upstream is not None else None
    scope = getattr(request, "scope", None)
    caller = scope.get("state", {}).get("caller") if isinstance(scope, dict) else None
    return caller if isinstance(caller, str) else None


def subject_token_of(upstream: Upstream | None) -> str | None:
    """The OAuth access token an upstream request was authenticated with (for a token exchange), or None when it
    came with a static token or none; never logged, only handed to the token endpoint."""
    request = getattr(upstream, "request", None) if upstream is not None else None
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict) or scope.get("state", {}).get("principal") is None:
        return None
    authorization = request.headers.get("authorization", "")  # type: ignore[union-attr]
    if authorization[:7].lower() != "bearer ":
        return None
    return authorization[7:].strip() or None


_HOP_META_PREFIX = "io.modelcontextprotocol/"


def forwarded_meta(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The part of an upstream request's ``_meta`` that travels on to the downstream: not the progress token (each
    hop has its own, mapped by the SDK) and not the reserved per-hop keys of the 2026-07-28 envelope."""
    if not meta:
        return None
    forwarded = {
        key: value
        for key, value in meta.items()
        if key not in ("progress_token", "progressToken") and not key.startswith(_HOP_META_PREFIX)
    }
    return forwarded or None


def client_log_level(connection: Any) -> types.LoggingLevel | None:
    """The level a client asked for with ``logging/setLevel``; None when it never asked."""
    state = getattr(connection, "state", None)
    return state.get(_LOG_LEVEL_KEY) if isinstance(state, dict) else None


def set_client_log_level(connection: Any, level: types.LoggingLevel) -> None:
    state = getattr(connection, "state", None)
    if isinstance(state, dict):
        state[_LOG_LEVEL_KEY] = level


def admits(minimum: types.LoggingLevel | None, level: types.LoggingLevel) -> bool:
    """Whether a message at ``level`` passes a client's ``minimum`` (no minimum: everything passes)."""
    if minimum is None:
        return True
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(minimum)


class InFlight:
    """The upstream calls one downstream session is serving now (kept for transports without a context link)."""

    __slots__ = ("_calls", "owner")

    def __init__(self, owner: Any = None) -> None:
        self._calls: dict[int, Upstream] = {}
        self.owner = owner
        """For a per-client session: the upstream ``Connection`` it belongs to."""

    def enter(self, upstream: Upstream) -> int:
        """Record a call in flight; pass the returned key to ``leave`` when it is done."""
        key = id(upstream)
        self._calls[key] = upstream
        return key

    def leave(self, key: int) -> None:
        self._calls.pop(key, None)

    def __len__(self) -> int:
        return len(self._calls)

    def sole(self) -> Upstream | None:
        """The one call in flight, if exactly one is."""
        if len(self._calls) != 1:
            return None
        return next(iter(self._calls.values()))

    def any(self) -> Upstream | None:
        """Any call in flight (for a per-client session, where they all belong to the same client)."""
        return next(iter(self._calls.values()), None)


def attribute(inflight: InFlight | None) -> tuple[Upstream | None, str]:
    """The upstream request a downstream's request belongs to, or None and why there is none."""
    upstream = UPSTREAM.get()
    if upstream is not None:
        return upstream, ""
    if inflight is None:
        return None, "it is not part of any client's call"
    if inflight.owner is not None:
        return inflight.any(), ""
    if len(inflight) == 0:
        return None, "it is not part of any client's call"
    sole = inflight.sole()
    if sole is not None:
        return sole, ""
    return None, (
        f"{len(inflight)} calls from clients are in flight on this shared session and nothing says which one it "
        "belongs to (set `session: per_client` on this server to give each client its own session)"
    )


def _required(request: types.ServerRequest) -> types.ClientCapabilities:
    if isinstance(request, types.CreateMessageRequest):
        params = request.params
        sampling = types.SamplingCapability(
            tools=types.SamplingToolsCapability() if params.tools or params.tool_choice else None
        )
        return types.ClientCapabilities(sampling=sampling)
    if isinstance(request, types.ElicitRequest):
        return types.ClientCapabilities(elicitation=types.ElicitationCapability())
    return types.ClientCapabilities(roots=types.RootsCapability())


def _result_type(request: types.ServerRequest) -> type[Any]:
    if isinstance(request, types.CreateMessageRequest):
        params = request.params
        return types.CreateMessageResultWithTools if params.tools or params.tool_choice else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    return types.ListRootsResult


async def relay_request(request: types.ServerRequest, inflight: InFlight | None, backend: str) -> Any:
    """Ask the upstream client that caused ``request`` and return its answer, or an ``ErrorData`` for the downstream.

    Never raises for the client's or the channel's failures: the downstream always gets an answer, at once when
    there is nobody to ask.
    """
    upstream, why = attribute(inflight)
    if upstream is None and inflight is not None and inflight.owner is not None:
        return await _relay_standalone(request, inflight.owner, backend)
    method = request.method
    bridge = BRIDGES.get(id(upstream)) if upstream is not None else None
    if bridge is not None:
        return await bridge.ask(request, backend)
    if upstream is None:
        return types.ErrorData(
            code=types.INVALID_REQUEST, message=f"The gateway cannot relay {method} from {backend!r}: {why}."
        )
    if not upstream.session.check_client_capability(_required(request)):
        return types.ErrorData(
            code=types.INVALID_REQUEST,
            message=f"The client behind the gateway does not support {method} (it did not declare the capability).",
        )
    try:
        return await upstream.session.send_request(
            request,
            _result_type(request),
            metadata=ServerMessageMetadata(related_request_id=upstream.request_id),
        )
    except NoBackChannelError:
        return types.ErrorData(
            code=types.INVALID_REQUEST,
            message=f"The client behind the gateway cannot take {method}: its call has no channel back "
            "(it finished, or the client speaks the stateless 2026-07-28 protocol).",
        )
    except MCPError as exc:
        return exc.error  # the client's own answer, passed through
    except ValidationError:
        return types.ErrorData(code=types.INTERNAL_ERROR, message=f"The client's answer to {method} was malformed.")
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return types.ErrorData(code=types.INVALID_REQUEST, message="The client behind the gateway has gone.")


class Bridge:
    """A stateless (2026-07-28) client's ``tools/call`` whose handshake-era downstream asks for input mid-call.

    The call runs in a task of the gateway's own (the server starts it); a downstream request attributed to it is
    not sent to the client (it has no back-channel) but handed to the server through ``events`` as an ``ask``, and
    the downstream waits, at most ``ttl_s``, for ``answer`` (the client's input response on its retry). The call's
    end comes through ``events`` too (``done``). Registered in ``BRIDGES`` under its upstream request while it runs.
    """

    __slots__ = ("_answer", "_receive", "_send", "caller", "scope", "ttl_s", "waiting")

    def __init__(self, caller: str | None, ttl_s: float) -> None:
        self.caller = caller
        self.ttl_s = ttl_s
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, Any]](2)
        self._answer: anyio.Event | None = None
        self.scope = anyio.CancelScope()
        """The call's task runs in it: the client's cancellation of the request waiting for it reaches it."""
        self.waiting: Any = None
        """The downstream request now waiting for the client's input (None between rounds)."""

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        answered = anyio.Event()
        box: list[Any] = []
        self.waiting, self._answer = (request, box), answered
        try:
            await self._send.send(("ask", (request, backend)))
            with anyio.fail_after(self.ttl_s):
                await answered.wait()
        except TimeoutError:
            return types.ErrorData(
                code=types.REQUEST_TIMEOUT,
                message=f"The client behind the gateway did not answer {request.method} from {backend!r} within "
                f"{self.ttl_s:g} s (gateway.continuation.bridge_ttl_s).",
            )
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return types.ErrorData(code=types.INVALID_REQUEST, message="The client behind the gateway has gone.")
        finally:
            self.waiting, self._answer = None, None
        raw = box[0] if box else None
        if raw is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=f"The client's retry carried no answer to {request.method}."
            )
        try:
            return _result_type(request).model_validate(raw, by_name=False) if isinstance(raw, dict) else raw
        except ValidationError:
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"The client's answer to {request.method} was malformed."
            )

    def answer(self, response: Any) -> bool:
        """Hand the client's input response to the waiting downstream request; False when none is waiting."""
        if self._answer is None or self.waiting is None:
            return False
        self.waiting[1].append(response)
        self._answer.set()
        return True

    async def finish(self, outcome: tuple[str, Any]) -> None:
        """The call's end; dropped when nobody can hear it any more (the bridge was closed)."""
        try:
            await self._send.send(outcome)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        self._send.close()

    async def next_event(self) -> tuple[str, Any]:
        event = await self._receive.receive()
        if event[0] == "done":
            self.close()
        return event

    def close(self) -> None:
        """Nobody will read this call's events any more (it ended, expired, or its client gave up)."""
        self._send.close()
        self._receive.close()


BRIDGES: dict[int, Bridge] = {}
"""The bridged calls running now, by ``id`` of their upstream request (attribution finds the request, then this)."""


async def _relay_standalone(request: types.ServerRequest, connection: Any, backend: str) -> Any:
    """A per-client session's request while no call is in flight: ask its client on the standalone channel."""
    method = request.method
    if not connection.check_capability(_required(request)):
        return types.ErrorData(
            code=types.INVALID_REQUEST,
            message=f"The client behind the gateway does not support {method} (it did not declare the capability).",
        )
    try:
        with anyio.fail_after(STANDALONE_RELAY_TIMEOUT_S):
            data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
            raw = await connection.send_raw_request(method, data.get("params"))
        return _result_type(request).model_validate(raw, by_name=False)
    except TimeoutError:
        return types.ErrorData(code=types.REQUEST_TIMEOUT, message=f"The client did not answer {method} in time.")
    except NoBackChannelError:
        return types.ErrorData(
            code=types.INVALID_REQUEST, message=f"The client behind the gateway has no channel for {method}."
        )
    except MCPError as exc:
        return exc.error
    except ValidationError:
        return types.ErrorData(code=types.INTERNAL_ERROR, message=f"The client's answer to {method} was malformed.")
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return types.ErrorData(code=types.INVALID_REQUEST, message="The client behind the gateway has gone.")
