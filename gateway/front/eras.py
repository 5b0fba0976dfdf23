"""Multi-round-trip requests (MCP 2026-07-28, SEP-2322) across the two protocol eras.

A downstream that answers ``tools/call``, ``prompts/get`` or ``resources/read`` with an input-required result has its
input requests passed to the client as they are, with the gateway's own ``requestState`` in place of the
downstream's: a token sealed by front/continuation.py saying which backend asked, its own name for the thing, for
which caller, until when, with the downstream's state inside. The retry is opened here (``reopen``) and sent to that
backend with the client's answers, whichever gateway process gets it; a token that does not open is refused with the
SDK's -32602. An input request for a capability the client did not declare is refused with -32021. A handshake-era
client cannot take an input-required result: it is asked each input request on its call's own stream and the gateway
retries for it, within that call (``answer_here``). The other direction, a stateless client and a handshake-era
downstream that asks mid-call, is bridged (front/bridges.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import mcp_types as types
import structlog
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.calls import Origin, Round
from gateway.config import environ
from gateway.core.runtime import Gateway
from gateway.errors import InputRequired
from gateway.front.bridges import Bridges, require_capabilities
from gateway.front.channels import result_type
from gateway.front.continuation import Continuation, Continuations, invalid_state, load_key

__all__ = ["MAX_ROUNDS", "Eras", "ahead"]

log = structlog.get_logger("gateway.server")

MAX_ROUNDS = 10
"""The most rounds the gateway answers for a handshake-era client (the SDK client's own default cap)."""

Again = Callable[[Origin, Round], Awaitable[Any]]
"""Send the request again to ``origin`` with the client's answers (the next round)."""


def ahead(responses: Mapping[str, Any] | None) -> Round | None:
    """Input responses sent without a state (a client answering ahead, or a stateless server's own flow) go to the
    backend as they are: the server decides what they are worth (SEP-2322: re-ask, or ignore what it does not know)."""
    return Round(responses, None) if responses is not None else None


class Eras:
    """The sealer of this gateway's ``requestState`` and its bridged requests (see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self.continuations = _continuations(gateway)
        self.bridges = Bridges(gateway, self.continuations)

    async def asked(
        self,
        ctx: ServerRequestContext[Any],
        method: str,
        name: str,
        arguments: Mapping[str, Any] | None,
        caller: str | None,
        exc: InputRequired,
        again: Again,
    ) -> Any:
        """The client's view of a backend's input-required answer: its requests as they are, our sealed state; for
        a handshake-era client, the rounds answered here on the call's own stream."""
        downstream = exc.result
        assert isinstance(downstream, types.InputRequiredResult)
        require_capabilities(ctx.session.client_capabilities, downstream.input_requests or {})
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await answer_here(ctx, exc, lambda r: again(Origin(exc.backend, exc.tool), r))
        state = self.continuations.seal(
            method=method,
            name=name,
            arguments=arguments,
            backend=exc.backend,
            local=exc.tool,
            caller=caller,
            state=downstream.request_state,
        )
        return downstream.model_copy(update={"request_state": state})

    def reopen(
        self, method: str, name: str, arguments: Mapping[str, Any] | None, caller: str | None, token: object
    ) -> Continuation:
        """A retry's state, verified, naming a backend the gateway still has (refused as the spec says when not)."""
        found = self.continuations.open(token, method=method, name=name, arguments=arguments, caller=caller)
        backend = self._gateway.backends.get(found.backend)
        if backend is None or not backend.serves_requests:
            invalid_state(method, "the backend that asked is no longer configured")
        return found

    def opened(
        self, method: str, name: str, arguments: Mapping[str, Any] | None, caller: str | None, token: object
    ) -> Continuation:
        """A retry's state, verified, whatever it names (a bridge's, or a backend's)."""
        return self.continuations.open(token, method=method, name=name, arguments=arguments, caller=caller)


async def answer_here(
    ctx: ServerRequestContext[Any], exc: InputRequired, again: Callable[[Round], Awaitable[Any]]
) -> Any:
    """Drive a multi-round-trip request for a handshake-era client: each input request goes to it as a request of
    its own on this call's stream, one after the other; the answers go back to the backend with its state."""
    for _ in range(MAX_ROUNDS):
        downstream = exc.result
        assert isinstance(downstream, types.InputRequiredResult)
        requests = downstream.input_requests or {}
        require_capabilities(ctx.session.client_capabilities, requests)
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            try:
                responses[key] = await ctx.session.send_request(
                    request,
                    result_type(request),
                    metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
                )
            except NoBackChannelError:
                raise MCPError(
                    types.INVALID_REQUEST,
                    f"The server behind this request needs input ({request.method}) and this call has no channel "
                    "back to the client to ask for it.",
                ) from None
        try:
            return await again(Round(responses, downstream.request_state))
        except InputRequired as more:
            exc = more
    raise MCPError(
        types.INTERNAL_ERROR, f"The server behind this request still asked for input after {MAX_ROUNDS} rounds."
    )


def _continuations(gateway: Gateway) -> Continuations:
    """The sealer of this gateway's ``requestState``, under a key replicas and restarts share (continuation.py)."""
    settings = gateway.config.gateway.continuation
    audit = gateway.config.gateway.audit
    ledger = audit.path if audit.enabled else None
    keys, source = load_key(settings.key_env, environ(settings.key_env), ledger, file=str(gateway.config.source or ""))
    if source == "this process only":
        log.warning(
            "request_state.ephemeral_key",
            note=f"{settings.key_env} is not set and the audit ledger is off: a multi-round-trip request whose client "
            "retries after a restart of this gateway, or at another replica, is refused",
        )
    else:
        log.info("request_state.key", source=source)
    return Continuations(keys, settings.ttl_s)
