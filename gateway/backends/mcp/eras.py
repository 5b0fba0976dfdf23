"""How a downstream session speaks its protocol era, and which eras a downstream speaks (``protocol:`` of a server).

By default (``auto``) ``open_session`` learns the eras at connect, without configuration: over streamable HTTP it
asks ``server/discover`` (a stateless POST); a downstream that answers it gets a stateless shared session, and its
handshake session is opened only when a handshake-era client needs one (``lazy``, twin.py). Where the server's
callers have sessions of their own (opened in the shared session's era), or it signs in (OAuth: its challenges are
read off the shared session), the handshake is asked at connect too and
each that was answered is recorded; the shared session is then a handshake-era one when the handshake was answered as
a handshake-era server answers it (not, say, naming 2026-07-28), else a stateless one. Over stdio and SSE a
connection speaks one era, chosen by its first request: the handshake is tried, and a server that refuses it is
reconnected in the stateless era (``HandshakeRefused``). ``protocol: handshake`` or ``2026-07-28`` (``MODERN``)
declares the one era to speak. A handshake-era session runs ``initialize`` and ``probe`` pings; a stateless one runs
``server/discover``, whose answer stands in for the handshake's, and ``probe`` discovers again (that era has no
ping); ``stateless`` makes any session a stateless one from a discover answer already had (the second lane of a
downstream that speaks both eras, for the clients of the 2026-07-28 era). Such a session reads a result
without ``resultType`` as complete, and each of its requests declares, in its ``_meta`` envelope, the capabilities
of the client whose request it serves (not the gateway's own), so the server asks only for what that client can
answer (SEP-2322). A ``tools/call``, ``prompts/get`` or ``resources/read`` of that era may be answered with an
input-required result: ``completed`` raises it as ``InputRequired``, and ``with_round`` puts a client's retry's
input responses and the downstream's own state back into the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, cast

import anyio
import mcp_types as types
from mcp.client.session import ClientSession, _later_revision_fields
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from gateway.backends.mcp.relay import SERVING
from gateway.calls import Round
from gateway.errors import InputRequired, TaskCreated

__all__ = [
    "CALL_OR_INPUT",
    "CreatedTask",
    "HANDSHAKE",
    "MODERN",
    "HandshakeRefused",
    "Opened",
    "PROMPT_OR_INPUT",
    "READ_OR_INPUT",
    "call_result",
    "completed",
    "open_session",
    "probe",
    "stateless",
    "with_round",
]

MODERN = "2026-07-28"
"""The stateless era's protocol version (``protocol:`` of a server)."""
HANDSHAKE = "handshake"
"""The ``initialize`` era (2025-11-25 and older)."""


class CreatedTask(types.Result):
    """A ``tools/call`` answered with a task (``resultType: "task"``, the tasks extension, SEP-2663): a flat
    ``CreateTaskResult``, every field of it kept as it came."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")


CALL_OR_INPUT: TypeAdapter[types.CallToolResult | types.InputRequiredResult | CreatedTask] = TypeAdapter(
    Annotated[types.CallToolResult | types.InputRequiredResult | CreatedTask, Field(union_mode="left_to_right")]
)
PROMPT_OR_INPUT: TypeAdapter[types.GetPromptResult | types.InputRequiredResult] = TypeAdapter(
    types.GetPromptResult | types.InputRequiredResult
)
READ_OR_INPUT: TypeAdapter[types.ReadResourceResult | types.InputRequiredResult] = TypeAdapter(
    types.ReadResourceResult | types.InputRequiredResult
)
_INPUT_RESPONSES: TypeAdapter[types.InputResponses] = TypeAdapter(types.InputResponses)

_Result = TypeVar("_Result")


class HandshakeRefused(Exception):
    """A stdio or SSE server refused the handshake: its next connection speaks the stateless era."""


@dataclass(frozen=True, slots=True)
class Opened:
    """What a session's opening learnt: ``init``, the server's offer told as a handshake's answer; ``era``, the one
    this session speaks (``HANDSHAKE`` or ``MODERN``); ``eras``, every era the downstream answered in; ``discovered``,
    its ``server/discover`` answer when it gave one (what a stateless lane beside a handshake session adopts);
    ``deferred``, the handshake was not asked (``lazy``)."""

    init: types.InitializeResult
    era: str
    eras: tuple[str, ...]
    discovered: types.DiscoverResult | None = None
    deferred: bool = False


async def open_session(
    session: ClientSession,
    *,
    protocol: str,
    backend: str,
    both: bool = False,
    probe_s: float = 5.0,
    lazy: bool = False,
) -> Opened:
    """Open ``session`` in the era ``protocol`` names (``auto``: learn it; see the module docstring). ``both``: the
    transport carries each request on its own (streamable HTTP), so both eras may be asked on this one session, the
    ``server/discover`` probe for at most ``probe_s`` (a server that leaves it unanswered keeps time for the handshake).
    ``lazy``: a downstream that answers the probe is not asked the handshake here (its handshake session, if any, is
    opened when a client of that era needs it: twin.py).

    Raises:
        HandshakeRefused: ``auto`` over a one-era connection whose server refused the handshake.
    """
    if protocol == MODERN:
        return Opened(await _discovered(session, backend), MODERN, (MODERN,), session.discover_result)
    if protocol == HANDSHAKE:
        return Opened(await session.initialize(), HANDSHAKE, (HANDSHAKE,))
    found = None
    if both:
        with anyio.move_on_after(probe_s):
            found = await _discover_or_none(session)
    if found is not None and lazy:
        session.adopt(found)
        return Opened(await _discovered(session, backend), MODERN, (MODERN,), found, deferred=True)
    try:
        init = await session.initialize()
    except (MCPError, RuntimeError, ValidationError) as exc:  # refused, or answered as no handshake-era server does
        if found is None:
            if not both and isinstance(exc, MCPError):
                raise HandshakeRefused(f"it refused the handshake ({exc.error.message})") from exc
            raise
        session.adopt(found)
        return Opened(await _discovered(session, backend), MODERN, (MODERN,), found)
    return Opened(_extended(init, found), HANDSHAKE, (HANDSHAKE, MODERN) if found is not None else (HANDSHAKE,), found)


def _extended(init: types.InitializeResult, found: types.DiscoverResult | None) -> types.InitializeResult:
    """The handshake's answer with the extensions ``server/discover`` offered (the handshake era carries none): a
    2026-07-28 client reaches them on the stateless lane (a task's requests among them)."""
    extensions = found.capabilities.extensions if found is not None else None
    if not extensions:
        return init
    caps = init.capabilities.model_copy(update={"extensions": {**extensions, **(init.capabilities.extensions or {})}})
    return init.model_copy(update={"capabilities": caps})


def stateless(session: ClientSession, found: types.DiscoverResult) -> None:
    """Make ``session`` a stateless-era one from the downstream's ``server/discover`` answer ``found`` (no wire
    traffic)."""
    session.adopt(found)
    _complete_by_default(session)
    _forward_capabilities(session)


async def _discover_or_none(session: ClientSession) -> types.DiscoverResult | None:
    """The downstream's ``server/discover`` answer when it speaks the stateless era, else None (any JSON-RPC error,
    or an answer naming no 2026 version, says it does not; a transport failure is raised). A -32022 naming the
    stateless versions it supports is asked once more in the newest of them, as the SDK's ``discover`` does."""
    try:
        try:
            raw = await session.send_discover(MODERN)
        except MCPError as exc:
            if exc.error.code != types.UNSUPPORTED_PROTOCOL_VERSION:
                raise
            supported = types.UnsupportedProtocolVersionErrorData.model_validate(exc.error.data).supported
            mutual = [version for version in MODERN_PROTOCOL_VERSIONS if version in supported]
            if not mutual:
                raise
            raw = await session.send_discover(mutual[-1])
        found = types.DiscoverResult.model_validate(raw)
    except (MCPError, ValidationError):
        return None
    return found if any(v in found.supported_versions for v in MODERN_PROTOCOL_VERSIONS) else None


async def _discovered(session: ClientSession, backend: str) -> types.InitializeResult:
    """``server/discover`` (once: an answer the session adopted already stands), told as a handshake's answer."""
    _complete_by_default(session)
    found = session.discover_result or await session.discover()
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
    if protocol == MODERN:  # the era the session speaks (``Opened.era``)
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


def completed(result: _Result | types.InputRequiredResult | CreatedTask, *, backend: str, local: str) -> _Result:
    """``result``, unless it asks the client for input first, or is a task the backend runs the call on.

    Raises:
        InputRequired: naming ``backend`` and its own name (``local``) for the tool, prompt or resource.
        TaskCreated: a ``tools/call`` answered with a task (its ``CreateTaskResult`` as it came).
    """
    if isinstance(result, types.InputRequiredResult):
        raise InputRequired(result, backend=backend, tool=local)
    if isinstance(result, CreatedTask):
        created = result.model_dump(by_alias=True, mode="json", exclude={"meta"} if result.meta is None else None)
        raise TaskCreated(created, backend=backend, tool=local)
    return result


_CALL_RESULTS: dict[str, TypeAdapter[Any]] = {
    version: TypeAdapter(cast(Any, shape))
    for (method, version), shape in _methods.SERVER_RESULTS.items()
    if method == "tools/call"
}
"""The ``tools/call`` result's schema in each protocol version (what ``mcp_types.methods.validate_server_result``
checks)."""


def call_result(raw: dict[str, Any], version: str) -> types.CallToolResult:
    """A ``tools/call`` answer read off the wire, checked as the SDK's session checks it (``send_request``: against
    the era's schema, then read as the version-free model), without the dump of the first check it throws away."""
    surface = _CALL_RESULTS.get(version)
    if surface is not None:
        surface.validate_python(raw, by_name=False)
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
    """Make each request of this stateless-era session declare the calling client's capabilities and the log level
    it wants (``Upstream.log_level``: that era sends log messages only at a level the request asks for).

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
        if upstream.log_level is not None:
            meta[types.LOG_LEVEL_META_KEY] = upstream.log_level

    session._stamp = forwarding
