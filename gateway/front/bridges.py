"""Bridged requests: a stateless (2026-07-28) client's request to a handshake-era downstream that asks for input.

A handshake-era downstream asks mid-request, with its own request to the client (``elicitation/create``,
``sampling/createMessage``, ``roots/list``); a stateless client has no channel for it. So the request runs in a task
of the gateway's own (``Bridges.start``, a ``Bridge`` of backends/relay.py), where the downstream's request can wait:
the client is answered an input-required result carrying that request (key ``input``) and a sealed state naming a
key of the ``pending`` table; its retry hands ``inputResponses.input`` to the waiting request and is answered with
what the request says next (``Bridges.next``). The same for ``tools/call``, ``prompts/get`` and ``resources/read``:
each hands ``start`` the work that serves it. The waiting request lives in this process only, bounded by
``gateway.continuation.bridge_ttl_s`` and ``bridge_max_pending``; a retry that finds no such request here (expired,
another replica, a restart) or comes from another caller is refused with the SDK's -32602.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from gateway.backends.base import Backend
from gateway.backends.mcp.relay import BRIDGES, Bridge
from gateway.core.runtime import Gateway
from gateway.errors import quote
from gateway.front.continuation import Continuation, Continuations, invalid_state

__all__ = ["BRIDGE_STATE", "Bridges", "may_ask", "require_capabilities"]

BRIDGE_STATE = "mcp-gateway/bridge:"
"""Marks a sealed state whose request waits in this process (a handshake-era downstream's request for input)."""

OnRound = Callable[[str, str], Awaitable[None]]
"""Told of each round that asked: ``(backend, the input request's method)`` (the tool calls' ledger rows)."""


_INSIDE: ContextVar[bool] = ContextVar("gateway_inside_bridge", default=False)


def may_ask(backends: Mapping[str, Backend], names: Iterable[str]) -> bool:
    """Whether any of the backends ``names`` may ask its client for input mid-request (so it must be bridged)."""
    return any((backend := backends.get(name)) is not None and backend.asks_mid_call for name in names)


class Bridges:
    """The bridged requests of one server, and the table of those waiting for their client's retry."""

    def __init__(self, gateway: Gateway, continuations: Continuations) -> None:
        self._gateway = gateway
        self._continuations = continuations
        self._pending: dict[str, tuple[Bridge, float]] = {}

    def start(self, ctx: ServerRequestContext[Any], caller: str | None, work: Callable[[], Awaitable[Any]]) -> Bridge:
        """Run ``work`` (what serves the request) in the gateway's own task, bridged."""
        bridge = Bridge(caller, self._gateway.config.gateway.continuation.bridge_ttl_s)

        async def run() -> None:
            _INSIDE.set(True)  # this task's own context: the work serves the request, it does not bridge it again
            BRIDGES[id(ctx)] = bridge
            outcome: Any = None
            try:
                with bridge.scope:
                    outcome = await work()
            except Exception as exc:
                outcome = exc
            finally:
                BRIDGES.pop(id(ctx), None)
            with anyio.CancelScope(shield=True):
                await bridge.finish(("done", outcome))

        self._gateway.start_soon(run, name="bridged-request")
        return bridge

    @staticmethod
    def inside() -> bool:
        """Whether this is a bridged request's own task."""
        return _INSIDE.get()

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
        ctx: ServerRequestContext[Any],
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
        into the state."""
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
            require_capabilities(ctx.session.client_capabilities, {"input": request})
        except MCPError:
            bridge.answer(None)  # the downstream hears at once that nobody can answer
            raise
        self._expire()
        if len(self._pending) >= settings.bridge_max_pending:
            bridge.answer(None)
            raise MCPError(
                types.INTERNAL_ERROR,
                f"The server behind {quote(name)} needs input ({request.method}) and this gateway already holds "
                f"{len(self._pending)} waiting requests (gateway.continuation.bridge_max_pending).",
            )
        key = secrets.token_urlsafe(16)
        self._pending[key] = (bridge, anyio.current_time() + settings.bridge_ttl_s)
        state = self._continuations.seal(
            method=method,
            name=name,
            arguments=arguments,
            backend="",
            local=name,
            caller=caller,
            state=BRIDGE_STATE + key,
        )
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
