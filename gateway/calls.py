"""The values every layer passes: who is calling, about what, and the way back to them.

A request is attributed to a ``Caller`` once, by the front (the HTTP guard, or the stdio transport), before any
work; the core and the backends get it, and the rest of the request's context, as arguments. ``Upstream`` is what a
backend learns of the client request it serves: the caller, the ``BackChannel`` to that client (a downstream's
sampling, elicitation and roots requests, and its log messages, go there, on the request's own stream), the
request's ``_meta`` to pass on, and for a retry of a multi-round-trip request its ``Round``. ``CallContext`` adds
what the router needs for the ledger, the context gate and the caller's policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import mcp_types as types

__all__ = [
    "ANONYMOUS",
    "NO_CONTEXT",
    "NO_UPSTREAM",
    "BackChannel",
    "CallContext",
    "Caller",
    "ClientLink",
    "Declared",
    "Origin",
    "Round",
    "Upstream",
]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from: a static token's name, or a verified OAuth access token's caller (``issuer`` and
    ``subject`` set, its scopes and claims for policies); ``name`` None for nobody in particular (stdio, or a
    gateway without tokens). ``token`` is the access token itself, kept only to be exchanged for a downstream token
    (RFC 8693): never shown, never compared."""

    name: str | None = None
    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict, repr=False)
    issuer: str | None = None
    subject: str | None = None
    token: str | None = field(default=None, repr=False, compare=False)


ANONYMOUS = Caller()


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a published item comes from: the backend and the item's own name (or URI) there."""

    backend: str
    local: str


@dataclass(frozen=True, slots=True)
class Round:
    """A client's retry of a multi-round-trip request: its answers to the input requests, and the downstream's own
    ``requestState`` from the round before (as the downstream minted it; the gateway's token is already opened)."""

    input_responses: Mapping[str, Any] | None
    request_state: str | None


class ClientLink(Protocol):
    """One client's connection, as a backend sees it: what a per-client downstream session belongs to."""

    @property
    def capabilities(self) -> types.ClientCapabilities | None: ...

    def on_close(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the connection ends."""
        ...

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        """Ask the client on its connection, outside any request; the answer, or an ``ErrorData`` (never raises)."""
        ...

    async def log(self, notification: types.LoggingMessageNotification) -> None:
        """Pass on a log message, if the client's level admits it."""
        ...


class BackChannel(Protocol):
    """The way back to the client whose request a backend serves."""

    @property
    def client(self) -> ClientLink | None:
        """The client's connection (None when it has none the gateway keeps, e.g. a stateless request)."""
        ...

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        """What the client declared it can answer (sampling, elicitation, roots)."""
        ...

    async def ask(self, request: types.ServerRequest, backend: str) -> Any:
        """Relay ``backend``'s own request to the client; the client's answer, or an ``ErrorData`` for the backend
        (never raises for the client's or the channel's failures)."""
        ...

    async def log(self, notification: types.LoggingMessageNotification) -> None:
        """Pass on a backend's log message about this request, if the client's level admits it."""
        ...

    async def stream_closed(self, retry_ms: int | None) -> None:
        """The backend closed this request's stream mid-call and will resume it (SEP-1699 polling): close the
        client's too; return once the client resumed it, or after ``retry_ms``."""
        ...


@dataclass(frozen=True, slots=True)
class Upstream:
    """What a backend learns of the client request it serves (see the module docstring)."""

    caller: Caller = ANONYMOUS
    channel: BackChannel | None = None
    meta: Mapping[str, Any] | None = None
    """The client request's ``_meta`` that travels on (no progress token, no per-hop keys)."""
    round: Round | None = None
    modern: bool = False
    """The client speaks the stateless 2026-07-28 era (a downstream that speaks it too serves it in that era)."""
    log_level: str | None = None
    """The least severe log level the client wants from this request (a handshake-era client's ``logging/setLevel``,
    every level until it sets one; a stateless client's own ``_meta``): what a 2026-07-28 downstream is asked for."""


NO_UPSTREAM = Upstream()


@dataclass(frozen=True, slots=True)
class Declared:
    """A client's declared context window and where the figure came from."""

    tokens: int | None
    source: Literal["header", "clientInfo", "unknown"]

    def describe(self) -> str:
        if self.tokens is None:
            return "no context size declared"
        return f"{self.tokens:,} tokens (from {self.source})"


@dataclass(frozen=True, slots=True)
class CallContext:
    """A request as the router needs it: the upstream request, and what the ledger, the log and the gate say of it."""

    upstream: Upstream = NO_UPSTREAM
    session_id: str | None = None
    """A digest of the client's session id (never the id itself)."""
    client_name: str | None = None
    client_version: str | None = None
    declared: Declared = Declared(None, "unknown")
    """The client's declared context window; large-context-only tools are refused below the gate."""
    withheld: tuple[str, str] | None = None
    """(argument path, reason): what the transport's edge found in the arguments and did not pass on."""
    visible: frozenset[str] | None = None
    """The tools the caller's policy lets it call; None: every tool."""

    @property
    def caller(self) -> Caller:
        return self.upstream.caller

    def for_round(self, retry: Round | None, channel: BackChannel | None = None) -> CallContext:
        """This request for one round of it (its ``Round``, and another back-channel when it runs bridged)."""
        if retry is None and channel is None:
            return self
        upstream = replace(
            self.upstream, round=retry, channel=channel if channel is not None else self.upstream.channel
        )
        return replace(self, upstream=upstream)


NO_CONTEXT = CallContext()
