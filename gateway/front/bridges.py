"""Bridged requests: a stateless (2026-07-28) client's request served by a handshake-era downstream that asks for
input mid-request (``elicitation/create``, ``sampling/createMessage``, ``roots/list``), which a stateless client has
no channel for.

The request runs in a task of the gateway's own (``Bridges.start``), whose ``BackChannel`` is a ``Bridge``: the
downstream's request is handed over, the client is answered an input-required result carrying it (key ``input``)
under a sealed state naming a key of the ``pending`` table, and the downstream waits, bounded, for the client's retry
to bring the answer (``Bridges.next``). The waiting request lives in this process only, bounded by
``gateway.continuation.bridge_ttl_s``, ``bridge_max_pending`` and ``bridge_max_per_caller``; a retry that finds no
such request here (expired, another replica, a restart) or comes from another caller is refused with the SDK's -32602.
The request's client, as a backend sees it (``Bridge.client``, what a ``session: per_client`` downstream session
belongs to), lasts as long as the request's work, not as long as the POST that started it.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.backends.base import Backend
from gateway.calls import BackChannel, ClientLink
from gateway.core.runtime import Gateway
from gateway.errors import quote
from gateway.front.channels import result_type
from gateway.front.continuation import Continuation, Continuations, invalid_state

__all__ = ["BRIDGE_STATE", "Bridge", "Bridges", "may_ask", "require_capabilities"]

BRIDGE_STATE = "mcp-gateway/bridge:"
"""Marks a sealed state whose request waits in this process (a handshake-era downstream's request for input)."""

OnRound = Callable[[str, str], Awaitable[None]]
"""Told of each round that asked: ``(backend, the input request's method)`` (the tool calls' ledger rows)."""


def may_ask(backends: Mapping[str, Backend], names: Iterable[str]) -> bool:
    """Whether any of the backends ``names`` may ask its client for input mid-request (so it must be bridged)."""
    return any((backend := backends.get(name)) is not None and backend.asks_mid_call for name in names)


class Bridge:
    """One bridged request's ``BackChannel``: a downstream's request is handed to the server as an ``ask`` event and
    waits, at most ``ttl_s``, for ``answer`` (the client's input response on its retry); the request's end comes
    through the events too (``done``). Log messages and stream closes go to the request's own channel."""

    __slots__ = ("_answer", "_inner", "_link", "_receive", "_send", "caller", "scope", "ttl_s", "unanswered", "waiting")

    def __init__(self, inner: BackChannel, caller: str | None, ttl_s: float) -> None:
        self._inner = inner
        self.caller = caller
        self.ttl_s = ttl_s
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, Any]](2)
        self._answer: anyio.Event | None = None
        self._link = _BridgeLink(self) if inner.client is not None else None
        self.scope = anyio.CancelScope()
        """The request's task runs in it: the client's cancellation of the request waiting for it reaches it."""
        self.waiting: Any = None
        """The downstream request now waiting for the client's input (None between rounds)."""
        self.unanswered = False
        """A downstream request was handed to the client and its answer never came (yet): while this holds, whatever
        becomes of the call is the caller's doing, never the backend's health (core/router.py reads it)."""

    @property
    def client(self) -> ClientLink | None:
        """The client as long as this request's work runs (its first POST's connection ends with the first round)."""
        return self._link

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self._inner.capabilities

    @property
    def declared(self) -> types.ClientCapabilities | None:
        """What the client's connection declared (a per-client downstream session offers the same)."""
        inner = self._inner.client
        return inner.capabilities if inner is not None else self._inner.capabilities

    async def log(self, notification: types.LoggingMessageNotification) -> None:
        await self._inner.log(notification)

    async def stream_closed(self, retry_ms: int | None) -> None:
        await self._inner.stream_closed(retry_ms)

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        answered = anyio.Event()
        box: list[Any] = []
        self.waiting, self._answer = (request, box), answered
        self.unanswered = True
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
        self.unanswered = False  # the client answered (its answer may still be malformed: that is the client's)
        raw = box[0] if box else None
        if raw is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=f"The client's retry carried no answer to {request.method}."
            )
        try:
            return result_type(request).model_validate(raw, by_name=False) if isinstance(raw, dict) else raw
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
        """The request's end; dropped when nobody can hear it any more (the bridge was closed)."""
        if self._link is not None:
            self._link.close()
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
        """Nobody will read this request's events any more (it ended, expired, or its client gave up)."""
        self._send.close()
        self._receive.close()


class _BridgeLink:
    """A bridged request's client as a ``ClientLink``: closed when the request's work ends. Asking it outside any
    call asks through the request's bridge, its one channel to that client."""

    __slots__ = ("__weakref__", "_bridge", "_closing")

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._closing: list[Callable[[], object]] | None = []

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self._bridge.declared

    def on_close(self, callback: Callable[[], object]) -> None:
        if self._closing is None:
            callback()
        else:
            self._closing.append(callback)

    def close(self) -> None:
        closing, self._closing = self._closing, None
        for callback in closing or ():
            callback()

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        return await self._bridge.ask(request, backend)

    async def log(self, notification: types.LoggingMessageNotification) -> None:
        await self._bridge.log(notification)


class Bridges:
    """The bridged requests of one server, and the table of those waiting for their client's retry."""

    def __init__(self, gateway: Gateway, continuations: Continuations) -> None:
        self._gateway = gateway
        self._continuations = continuations
        self._pending: dict[str, tuple[Bridge, float]] = {}

    def start(self, channel: BackChannel, caller: str | None, work: Callable[[Bridge], Awaitable[Any]]) -> Bridge:
        """Run ``work`` (what serves the request, given the bridge as its back-channel) in the gateway's own task."""
        bridge = Bridge(channel, caller, self._gateway.config.gateway.continuation.bridge_ttl_s)

        async def run() -> None:
            outcome: Any = None
            try:
                with bridge.scope:
                    outcome = await work(bridge)
            except Exception as exc:
                outcome = exc
            with anyio.CancelScope(shield=True):
                await bridge.finish(("done", outcome))

        self._gateway.start_soon(run, name="bridged-request")
        return bridge

    def reopened(self, found: Continuation, method: str, caller: str | None, responses: Any) -> Bridge | None:
        """The waiting request a retry's verified state names, given the client's answer; None when the state is
        not a bridge's (it names a backend that answered input-required itself)."""
        if found.backend != "" or not (found.state or "").startswith(BRIDGE_STATE):
            return None
        bridge = self._held((found.state or "")[len(BRIDGE_STATE) :], method, caller)
        bridge.answer((responses or {}).get("input"))
        return bridge

    def _held(self, key: str, method: str, caller: str | None) -> Bridge:
        self._expire()
        entry = self._pending.get(key)
        if entry is None:
            invalid_state(
                method,
                "the waiting downstream call is not held by this process (expired, or another process or a restart)",
            )
        bridge = entry[0]
        if bridge.caller != caller:  # the sealed principal already says so; never let another caller end it
            invalid_state(method, "the waiting downstream call is another caller's")
        self._pending.pop(key, None)
        if bridge.waiting is None:
            invalid_state(method, "the downstream call is no longer waiting")
        return bridge

    def _expire(self) -> None:
        now = anyio.current_time()
        for stale in [k for k, (_, until) in self._pending.items() if until <= now]:
            self._pending.pop(stale)[0].close()

    async def next(
        self,
        declared: types.ClientCapabilities | None,
        bridge: Bridge,
        *,
        method: str,
        name: str,
        arguments: Mapping[str, Any] | None,
        caller: str | None,
        on_round: OnRound | None = None,
    ) -> Any:
        """The next thing a bridged request has to say: its end (result, or the error it raised), or its
        downstream's request for input as an input-required result, the request kept waiting under a key sealed
        into the state. ``declared``: what the client declared it can answer."""
        try:
            event, payload = await bridge.next_event()
        except anyio.get_cancelled_exc_class():
            bridge.scope.cancel()  # the client gave up on the request (or the gateway stops): so does its downstream
            bridge.close()
            raise
        except anyio.EndOfStream:
            raise MCPError(
                types.INTERNAL_ERROR, "The request ended without an answer (the gateway is stopping)."
            ) from None
        if event == "done":
            if isinstance(payload, BaseException):
                raise payload
            return payload
        request, backend = payload
        settings = self._gateway.config.gateway.continuation
        try:
            require_capabilities(declared, {"input": request})
        except MCPError:
            bridge.answer(None)  # the downstream hears at once that nobody can answer
            raise
        self._expire()
        held = sum(1 for other, _ in self._pending.values() if other.caller == caller)
        full = None
        if held >= settings.bridge_max_per_caller:
            full = f"this caller already has {held} waiting requests (gateway.continuation.bridge_max_per_caller)"
        elif len(self._pending) >= settings.bridge_max_pending:
            full = (
                f"this gateway already holds {len(self._pending)} waiting requests "
                "(gateway.continuation.bridge_max_pending)"
            )
        if full is not None:
            bridge.answer(None)
            raise MCPError(
                types.INTERNAL_ERROR, f"The server behind {quote(name)} needs input ({request.method}) and {full}."
            )
        key = secrets.token_urlsafe(16)
        self._pending[key] = (bridge, anyio.current_time() + settings.bridge_ttl_s)
        state = self._continuations.seal(
            method=method, name=name, arguments=arguments, backend="", local=name, caller=caller,
            state=BRIDGE_STATE + key,
        )  # fmt: skip
        if on_round is not None:
            await on_round(backend, request.method)
        return types.InputRequiredResult(input_requests={"input": request}, request_state=state)


def require_capabilities(declared: types.ClientCapabilities | None, requests: Mapping[str, Any]) -> None:
    """Refuse (-32021, with ``requiredCapabilities``) input requests the client did not declare it can answer."""
    required: dict[str, Any] = {}
    for request in requests.values():
        if isinstance(request, types.ElicitRequest):
            elicitation = declared.elicitation if declared is not None else None
            if isinstance(request.params, types.ElicitRequestURLParams):
                if elicitation is None or elicitation.url is None:
                    required.setdefault("elicitation", {})["url"] = {}
            elif elicitation is None or (elicitation.form is None and elicitation.url is not None):
                required.setdefault("elicitation", {})["form"] = {}
        elif isinstance(request, types.CreateMessageRequest):
            sampling = declared.sampling if declared is not None else None
            wants_tools = bool(request.params.tools)
            if sampling is None or (wants_tools and sampling.tools is None):
                required["sampling"] = {"tools": {}} if wants_tools else {}
        elif isinstance(request, types.ListRootsRequest):
            if declared is None or declared.roots is None:
                required["roots"] = {}
    if required:
        names = ", ".join(sorted(required))
        raise MCPError(
            types.MISSING_REQUIRED_CLIENT_CAPABILITY,
            f"The server behind this request needs input the client did not declare it can give: {names}",
            {"requiredCapabilities": required},
        )
