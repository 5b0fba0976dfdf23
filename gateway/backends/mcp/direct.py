"""A handshake-era ``tools/call`` sent straight on the shared session's direct lane (fastpath.py; over stdio,
stdio.py's ``StdioLane``): the same request, errors and back-channel as a call through the SDK session
(session.py ``_send``), without the SDK session's round trip. Over streamable HTTP, a caller's call whose client
asked for progress goes on that caller's own session beside it (own.py). ``caller_of`` says whose call takes a
connection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types

from gateway.backends.base import ProgressFn, paced
from gateway.backends.mcp.eras import call_result
from gateway.backends.mcp.failures import Life, map_call_errors
from gateway.backends.mcp.fastpath import DirectLane
from gateway.backends.mcp.own import SessionLane
from gateway.backends.mcp.pool import calls_for
from gateway.backends.mcp.relay import InFlight, relay_request, serving
from gateway.calls import NO_UPSTREAM, Upstream

__all__ = ["call_direct", "caller_of"]


async def call_direct(
    lane: DirectLane,
    tool: str,
    arguments: dict[str, Any],
    meta: dict[str, Any] | None,
    *,
    progress: ProgressFn | None,
    upstream: Upstream,
    backend: str,
    life: Life,
    inflight: InFlight,
    timeout_s: float,
    notify: Callable[[Any], Awaitable[None]],
) -> types.CallToolResult:
    """``tool`` of ``backend`` called on ``lane``; the downstream's own requests relayed for ``inflight``, its
    notifications to ``notify``; failures mapped as every call's (failures.py), losses carrying ``life``."""
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if meta:
        params["_meta"] = meta

    async def answer(request: Any) -> Any:
        return await relay_request(request, inflight, backend)

    caller, held = caller_of(upstream), paced(progress)
    with serving(inflight, upstream), calls_for(caller), map_call_errors(backend, timeout_s, life):
        if held is not None and progress is not None and caller is not None and isinstance(lane, SessionLane):
            raw = await lane.own.request(
                caller,
                "tools/call",
                params,
                backend=backend,
                timeout_s=timeout_s,
                progress=held,
                relay=progress,
                answer=answer,
                notify=notify,
            )
        else:
            raw = await lane.request(
                "tools/call", params, timeout_s=timeout_s, progress=progress, answer=answer, notify=notify
            )
    return call_result(raw, lane.version or "")


def caller_of(upstream: Upstream) -> str | None:
    """Whose call a request carries, for the fair share of connections (pool.py); None: the gateway's own."""
    return None if upstream is NO_UPSTREAM else upstream.caller.name or ""
