"""The ways back to a client, over the SDK's server session: what ``calls.BackChannel`` and ``calls.ClientLink`` are
for a request of the handshake era (or a stateless request, which has no channel for requests).

A downstream's request (sampling, elicitation, roots) goes on the client request's own stream (``related_request_id``):
a streamable HTTP client is sure to listen there. A client that did not declare the capability is not asked, and the
downstream always gets an answer: the client's, or an ``ErrorData`` saying why there is none. A log message reaches
a client only when its own ``logging/setLevel`` admits it (kept on its connection). A downstream that closes a call's
stream mid-call (SEP-1699 polling) has the client's stream closed too, and waits until that client resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, get_args

import anyio
import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from pydantic import ValidationError

from gateway.calls import ClientLink
from gateway.front.outbox import Outbox, size_of

__all__ = [
    "LOG_LEVELS",
    "ConnectionLink",
    "Resumes",
    "SessionChannel",
    "admits",
    "client_log_level",
    "connection_of",
    "forwarded_meta",
    "required_capabilities",
    "result_type",
    "set_client_log_level",
]

LOG_LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
"""Severity-ascending (RFC 5424), the spec's order."""
_LOG_LEVEL_KEY = "mcp-gateway/log-level"
_LINK_KEY = "mcp-gateway/link"
_HOP_META_PREFIX = "io.modelcontextprotocol/"

STANDALONE_RELAY_TIMEOUT_S = 60.0
"""Bound on a request asked outside any call (a per-client session's ``roots/list`` at its start)."""


def connection_of(ctx: ServerRequestContext[Any]) -> Any:
    """The SDK ``Connection`` a request came on (private in the SDK; ``mcp`` is pinned below 3)."""
    return getattr(ctx.session, "_connection", None)


def forwarded_meta(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The part of a client request's ``_meta`` that travels on to the downstream: not the progress token (each hop
    has its own, mapped by the SDK) and not the reserved per-hop keys of the 2026-07-28 envelope."""
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


def required_capabilities(request: types.ServerRequest) -> types.ClientCapabilities:
    """What a client must have declared to be asked ``request``."""
    if isinstance(request, types.CreateMessageRequest):
        params = request.params
        sampling = types.SamplingCapability(
            tools=types.SamplingToolsCapability() if params.tools or params.tool_choice else None
        )
        return types.ClientCapabilities(sampling=sampling)
    if isinstance(request, types.ElicitRequest):
        return types.ClientCapabilities(elicitation=types.ElicitationCapability())
    return types.ClientCapabilities(roots=types.RootsCapability())


def result_type(request: types.ServerRequest) -> type[Any]:
    """The result model of a server-to-client request."""
    if isinstance(request, types.CreateMessageRequest):
        params = request.params
        return types.CreateMessageResultWithTools if params.tools or params.tool_choice else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    return types.ListRootsResult


def _not_declared(method: str) -> types.ErrorData:
    return types.ErrorData(
        code=types.INVALID_REQUEST,
        message=f"The client behind the gateway does not support {method} (it did not declare the capability).",
    )


def _gone() -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message="The client behind the gateway has gone.")


def _malformed(method: str) -> types.ErrorData:
    return types.ErrorData(code=types.INTERNAL_ERROR, message=f"The client's answer to {method} was malformed.")


class Resumes:
    """Who waits for which client to resume which of its streams: (the client's session id, its stream)."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], set[anyio.Event]] = {}

    def expecting(self, session: str | None, stream: str | None) -> _Expecting:
        """A context whose event is set when the client of ``session`` resumes ``stream`` (never, when either is
        None)."""
        return _Expecting(self._waiting, session, stream)

    def resumed(self, session: str | None, stream: str) -> None:
        """The client of ``session`` resumed ``stream``: whoever waits for it goes on."""
        if session is None:
            return
        for event in self._waiting.pop((session, stream), ()):
            event.set()


class _Expecting:
    __slots__ = ("_event", "_key", "_waiting")

    def __init__(self, waiting: dict[tuple[str, str], set[anyio.Event]], session: str | None, stream: str | None):
        self._waiting = waiting
        self._key = (session, stream) if session is not None and stream is not None else None
        self._event = anyio.Event()

    def __enter__(self) -> anyio.Event:
        if self._key is not None:
            self._waiting.setdefault(self._key, set()).add(self._event)
        return self._event

    def __exit__(self, *exc: object) -> None:
        if self._key is None:
            return
        waiting = self._waiting.get(self._key)
        if waiting is not None:
            waiting.discard(self._event)
            if not waiting:
                self._waiting.pop(self._key, None)


class ConnectionLink:
    """A client's connection (the SDK's ``Connection``) as a ``ClientLink``: one per connection (``of``)."""

    __slots__ = ("__weakref__", "_connection")

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    @classmethod
    def of(cls, connection: Any) -> ConnectionLink | None:
        """The connection's link, made once and kept on the connection (so it keys per-client sessions)."""
        state = getattr(connection, "state", None)
        if not isinstance(state, dict):
            return None
        link = state.get(_LINK_KEY)
        if not isinstance(link, ConnectionLink):
            link = state[_LINK_KEY] = cls(connection)
        return link

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        caps: types.ClientCapabilities | None = self._connection.client_capabilities
        return caps

    def on_close(self, callback: Callable[[], object]) -> None:
        self._connection.exit_stack.callback(callback)

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        method = request.method
        connection = self._connection
        if not connection.check_capability(required_capabilities(request)):
            return _not_declared(method)
        try:
            with anyio.fail_after(STANDALONE_RELAY_TIMEOUT_S):
                data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
                raw = await connection.send_raw_request(method, data.get("params"))
            return result_type(request).model_validate(raw, by_name=False)
        except TimeoutError:
            return types.ErrorData(code=types.REQUEST_TIMEOUT, message=f"The client did not answer {method} in time.")
        except NoBackChannelError:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=f"The client behind the gateway has no channel for {method}."
            )
        except MCPError as exc:
            return exc.error
        except ValidationError:
            return _malformed(method)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return _gone()

    async def log(self, notification: types.LoggingMessageNotification) -> None:
        if admits(client_log_level(self._connection), notification.params.level):
            params = notification.params.model_dump(by_alias=True, mode="json", exclude_none=True)
            await self._connection.notify("notifications/message", params)


class SessionChannel:
    """The way back to the client of one request, over the SDK's server session (a ``BackChannel``); its log
    messages go through the request's ``outbox`` when it has one (front/outbox.py: never waiting for the client)."""

    __slots__ = ("_ctx", "_outbox", "_resumes")

    def __init__(
        self, ctx: ServerRequestContext[Any], resumes: Resumes | None = None, outbox: Outbox | None = None
    ) -> None:
        self._ctx = ctx
        self._resumes = resumes
        self._outbox = outbox

    @property
    def client(self) -> ClientLink | None:
        connection = connection_of(self._ctx)
        return ConnectionLink.of(connection) if connection is not None else None

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        caps: types.ClientCapabilities | None = self._ctx.session.client_capabilities
        return caps

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        ctx, method = self._ctx, request.method
        if not ctx.session.check_client_capability(required_capabilities(request)):
            return _not_declared(method)
        try:
            return await ctx.session.send_request(
                request, result_type(request), metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
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
            return _malformed(method)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return _gone()

    async def log(self, notification: types.LoggingMessageNotification) -> None:
        ctx = self._ctx
        level = notification.params.level
        if admits(client_log_level(connection_of(ctx)), level) and level in allowed_log_levels(
            ctx.protocol_version, ctx.meta
        ):
            send = partial(ctx.session.send_notification, notification, related_request_id=ctx.request_id)
            if self._outbox is None:
                await send()
            else:
                self._outbox.send(send, size_of(notification))

    async def stream_closed(self, retry_ms: int | None) -> None:
        """The downstream closed this call's stream mid-call (SEP-1699) and will be resumed: close the client's
        stream too, and return once the client has resumed it, or after ``retry_ms`` (None: at once)."""
        ctx = self._ctx
        close = ctx.close_sse_stream
        session = stream = None
        if close is not None:
            headers = getattr(ctx.request, "headers", None)
            session = headers.get("mcp-session-id") if headers is not None else None
            stream = None if ctx.request_id is None else str(ctx.request_id)
        expecting = self._resumes.expecting(session, stream) if self._resumes is not None else None
        with expecting if expecting is not None else _Expecting({}, None, None) as resumed:
            if close is not None:
                await close()
            if retry_ms:
                with anyio.move_on_after(retry_ms / 1000):
                    await resumed.wait()
