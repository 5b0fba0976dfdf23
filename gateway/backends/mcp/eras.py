"""How a downstream session speaks its protocol era (``protocol:`` of a server).

By default a session is a handshake-era one: ``open_session`` runs ``initialize`` and ``probe`` pings. With
``protocol: 2026-07-28`` (``MODERN``) it is a stateless one: ``open_session`` runs ``server/discover``, whose answer
stands in for the handshake's, and ``probe`` discovers again (that era has no ping). Such a session reads a result
without ``resultType`` as complete, and each of its requests declares, in its ``_meta`` envelope, the capabilities
of the client whose request it serves (not the gateway's own), so the server asks only for what that client can
answer (SEP-2322). A ``tools/call``, ``prompts/get`` or ``resources/read`` of that era may be answered with an
input-required result: ``completed`` raises it as ``InputRequired``, and ``with_round`` puts a client's retry's
input responses and the downstream's own state back into the request.
"""

from __future__ import annotations

from typing import Any, TypeVar

import mcp_types as types
from mcp.client.session import ClientSession, _later_revision_fields
from mcp_types import methods as _methods
from pydantic import TypeAdapter

from gateway.backends.mcp.relay import SERVING
from gateway.calls import Round
from gateway.errors import InputRequired

__all__ = [
    "CALL_OR_INPUT",
    "MODERN",
    "PROMPT_OR_INPUT",
    "READ_OR_INPUT",
    "call_result",
    "completed",
    "open_session",
    "probe",
    "with_round",
]

MODERN = "2026-07-28"
"""The stateless era's protocol version (``protocol:`` of a server)."""

CALL_OR_INPUT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    types.CallToolResult | types.InputRequiredResult
)
PROMPT_OR_INPUT: TypeAdapter[types.GetPromptResult | types.InputRequiredResult] = TypeAdapter(
    types.GetPromptResult | types.InputRequiredResult
)
READ_OR_INPUT: TypeAdapter[types.ReadResourceResult | types.InputRequiredResult] = TypeAdapter(
    types.ReadResourceResult | types.InputRequiredResult
)
_INPUT_RESPONSES: TypeAdapter[types.InputResponses] = TypeAdapter(types.InputResponses)

_Result = TypeVar("_Result")


async def open_session(session: ClientSession, *, protocol: str, backend: str) -> types.InitializeResult:
    """The handshake, or in the stateless era ``server/discover``, whose answer is told as a handshake's."""
    if protocol != MODERN:
        return await session.initialize()
    _complete_by_default(session)
    found = await session.discover()
    _forward_capabilities(session)
    info = session.server_info or types.Implementation(name=backend, version="")
    return types.InitializeResult(
        protocol_version=session.protocol_version or MODERN,
        capabilities=found.capabilities,
        server_info=info,
        instructions=found.instructions,
    )


async def probe(session: ClientSession, *, protocol: str) -> None:
    """Is the session alive? A ping, or in the stateless era a ``server/discover``."""
    if protocol == MODERN:
        await session.send_discover(session.protocol_version or MODERN)
    else:
        await session.send_ping()


def with_round(params: Any, retry: Round | None) -> Any:
    """``params`` carrying the retry's input responses and the downstream's own state, when this is a retry."""
    if retry is None:
        return params
    responses = retry.input_responses
    return params.model_copy(
        update={
            "input_responses": _INPUT_RESPONSES.validate_python(responses) if responses is not None else None,
            "request_state": retry.request_state,
        }
    )


def completed(result: _Result | types.InputRequiredResult, *, backend: str, local: str) -> _Result:
    """``result``, unless it asks the client for input first.

    Raises:
        InputRequired: naming ``backend`` and its own name (``local``) for the tool, prompt or resource.
    """
    if isinstance(result, types.InputRequiredResult):
        raise InputRequired(result, backend=backend, tool=local)
    return result


def call_result(raw: dict[str, Any], version: str) -> types.CallToolResult:
    """A ``tools/call`` answer read off the wire, checked as the SDK's session checks it (``send_request``)."""
    try:
        _methods.validate_server_result("tools/call", version, raw)
    except KeyError:
        pass
    foreign = _later_revision_fields("tools/call", version)
    if not foreign.isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return types.CallToolResult.model_validate(raw, by_name=False)


def _complete_by_default(session: ClientSession) -> None:
    """Read a stateless-era result without ``resultType`` as ``complete``, as SEP-2322 tells clients to.

    The SDK validates each result against the era's schema, where the field is required, so a server that leaves it
    out (the conformance suite's reference server does, on every tool result) failed every call through the gateway
    although its client must take the result as complete.
    """
    dispatcher = session._dispatcher
    send = dispatcher.send_raw_request

    async def defaulting(method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        raw = await send(method, params, opts)
        if isinstance(raw, dict) and "resultType" not in raw:
            raw["resultType"] = "complete"
        return raw

    dispatcher.send_raw_request = defaulting  # type: ignore[method-assign]


def _forward_capabilities(session: ClientSession) -> None:
    """Make each request of this stateless-era session declare the calling client's capabilities.

    The SDK stamps every request's ``_meta`` envelope with the capabilities of *this* session (all three, since
    the gateway relays sampling, elicitation and roots), and a server uses them to decide which input requests it
    may send. The client behind the gateway is the one that must answer, so its own declaration (none: ``{}``)
    replaces ours, after the SDK's stamp (``ClientSession._stamp``, set by ``discover``).
    """
    stamp = session._stamp

    def forwarding(data: dict[str, Any], opts: Any) -> None:
        stamp(data, opts)
        upstream = SERVING.get()
        if upstream is None or upstream.channel is None or data.get("method") == "server/discover":
            return
        declared = upstream.channel.capabilities
        meta = data.setdefault("params", {}).setdefault("_meta", {})
        meta[types.CLIENT_CAPABILITIES_META_KEY] = (
            declared.model_dump(by_alias=True, mode="json", exclude_none=True) if declared is not None else {}
        )

    session._stamp = forwarding
