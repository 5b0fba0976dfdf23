"""A downstream's requests to its client (sampling, elicitation, roots), relayed to the client whose request caused
them, through that request's ``BackChannel`` (gateway/calls.py).

``back_channel`` gives a ``ClientSession`` the callbacks that relay; ``serving`` wraps each request a backend sends
for a client. Attribution, in order of precedence:
  * ``SERVING``: the request a backend's own task is sending for (set by ``serving`` from the explicit ``Upstream``
    argument around each send). The SDK carries a sender's context with each message, so a downstream's request
    that arrives on the stream of the POST that carried a call (streamable HTTP) sees the very call that caused it,
    however many run.
  * Otherwise nothing links a downstream's request to a call (stdio, SSE, a standalone HTTP stream): each session
    keeps the calls it serves in an ``InFlight`` registry; with exactly one in flight, that one caused it; with none
    or several there is nobody to ask, and the downstream gets a JSON-RPC error at once. A call whose own request
    to its client is still unanswered (a bridged call waiting for a stateless client's retry, for minutes) is taken
    not to be the one asking again (a server asks one thing at a time within a call): among several, the one call
    not waiting is. A server that asks several things at once within one call, beside other callers' calls, needs
    ``session: per_client``. A ``session: per_client`` session belongs to one client (``InFlight.owner``), which is
    asked even outside any call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext

from gateway.calls import ClientLink, Upstream

__all__ = ["SERVING", "InFlight", "attribute", "back_channel", "relay_request", "serving"]

SERVING: contextvars.ContextVar[Upstream | None] = contextvars.ContextVar("gateway_serving", default=None)
"""The client request a backend's send works for, for the SDK callbacks it causes (set by ``serving`` only)."""

_EVERY_CHANNEL = types.ClientCapabilities(
    sampling=types.SamplingCapability(), elicitation=types.ElicitationCapability(), roots=types.RootsCapability()
)
"""What a session that relays for any client offers its downstream (the shared session and a per-caller one)."""


class InFlight:
    """The client requests one downstream session is serving now."""

    __slots__ = ("_asking", "_calls", "owner")

    def __init__(self, owner: ClientLink | None = None) -> None:
        self._calls: dict[int, Upstream] = {}
        self._asking: dict[int, int] = {}  # id(upstream) -> its requests to its client not answered yet
        self.owner = owner
        """For a per-client session: the client it belongs to."""

    def enter(self, upstream: Upstream) -> int:
        """Record a request in flight; pass the returned key to ``leave`` when it is done."""
        key = id(upstream)
        self._calls[key] = upstream
        return key

    def leave(self, key: int) -> None:
        self._calls.pop(key, None)

    def __len__(self) -> int:
        return len(self._calls)

    def sole(self) -> Upstream | None:
        """The one request in flight, if exactly one is; else the one not waiting for its client's answer to an
        earlier request of the downstream's, if exactly one is not."""
        if len(self._calls) == 1:
            return next(iter(self._calls.values()))
        free = [upstream for key, upstream in self._calls.items() if key not in self._asking]
        return free[0] if len(free) == 1 else None

    @contextmanager
    def asking(self, upstream: Upstream) -> Iterator[None]:
        """While a downstream's request waits for ``upstream``'s client to answer it."""
        key = id(upstream)
        self._asking[key] = self._asking.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._asking.pop(key) - 1
            if left:
                self._asking[key] = left

    def any(self) -> Upstream | None:
        """Any request in flight (for a per-client session, where they all belong to the same client)."""
        return next(iter(self._calls.values()), None)


def attribute(inflight: InFlight | None) -> tuple[Upstream | None, str]:
    """The client request a downstream's request belongs to, or None and why there is none."""
    upstream = SERVING.get()
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


async def relay_request(request: types.ServerRequest, inflight: InFlight | None, backend: str) -> object:
    """Ask the client that caused ``request``: its answer, or an ``ErrorData`` for the downstream (at once when
    there is nobody to ask). Never raises for the client's or the channel's failures."""
    upstream, why = attribute(inflight)
    if upstream is None and inflight is not None and inflight.owner is not None:
        return await inflight.owner.ask(request, backend)
    channel = upstream.channel if upstream is not None else None
    if channel is None or upstream is None:
        why = why or "its client has no channel"
        return types.ErrorData(
            code=types.INVALID_REQUEST, message=f"The gateway cannot relay {request.method} from {backend!r}: {why}."
        )
    if inflight is None:
        return await channel.ask(request, backend)
    with inflight.asking(upstream):
        return await channel.ask(request, backend)


@contextmanager
def serving(inflight: InFlight, upstream: Upstream) -> Iterator[None]:
    """While a request is sent for ``upstream``'s client: counted in flight on the session, and the one the SDK
    callbacks it causes are attributed to. A request no client's channel stands behind is neither."""
    if upstream.channel is None:
        yield
        return
    key = inflight.enter(upstream)
    token = SERVING.set(upstream)
    try:
        yield
    finally:
        SERVING.reset(token)
        inflight.leave(key)


def back_channel(inflight: InFlight | None, offered: types.ClientCapabilities | None, backend: str) -> dict[str, Any]:
    """The ``ClientSession`` callbacks that relay a downstream's requests to the upstream client (keyword arguments).

    ``offered`` narrows what the downstream is told the gateway can answer (a per-client session mirrors its
    client); None offers all three.
    """

    async def sampling(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> Any:
        return await relay_request(types.CreateMessageRequest(params=params), inflight, backend)

    async def elicitation(context: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
        return await relay_request(types.ElicitRequest(params=params), inflight, backend)

    async def roots(context: ClientRequestContext) -> Any:
        return await relay_request(types.ListRootsRequest(), inflight, backend)

    caps = offered or _EVERY_CHANNEL
    callbacks: dict[str, Any] = {}
    if caps.sampling is not None:
        callbacks["sampling_callback"] = sampling
        callbacks["sampling_capabilities"] = caps.sampling
    if caps.elicitation is not None:
        callbacks["elicitation_callback"] = elicitation
    if caps.roots is not None:
        callbacks["list_roots_callback"] = roots
    return callbacks
