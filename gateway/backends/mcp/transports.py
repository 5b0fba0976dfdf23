"""The transport under one downstream session: stdio, streamable HTTP or SSE, by the server's config.

``open_transport`` is an async context manager that yields a ``Transport``: the read and write streams a
``ClientSession`` runs over, and, when asked for (``direct``), the direct lane that sends a call straight on the
same session (fastpath.py). A stdio transport owns its process (stdio.py: its exit and stderr tail explain a
failure; ``on_failure`` is told when the server stops reading its stdin). The HTTP transports borrow a client view
of the backend's pools (pool.py) carrying the given headers and the server's answer limit (``max_answer_bytes``,
applied in the byte stream by answers.py); the ``ResponseRecorder`` keeps the last error response, so a failed
handshake can be told in plain words.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO, Any

import anyio
import httpx2
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from gateway.backends.mcp.eras import HANDSHAKE
from gateway.backends.mcp.failures import ResponseRecorder
from gateway.backends.mcp.fastpath import DirectLane
from gateway.backends.mcp.own import SessionLane
from gateway.backends.mcp.pool import BackendPool
from gateway.backends.mcp.stdio import StdioProcess, open_stdio
from gateway.config import HttpServer, ServerConfig, SseServer, StdioServer, passed_environment

__all__ = ["SSE_EVENT_CAP", "SSE_EVENT_MARGIN", "Transport", "open_transport"]

SSE_EVENT_CAP = 1024 * 1024 - 1024
"""The SDK's legacy SSE client takes no event larger than 1 MiB (not configurable): over SSE the answer limit is at
most this, so an oversized answer is replaced before the SDK would end the session on it."""
SSE_EVENT_MARGIN = 64 * 1024
"""What the SDK's own SSE event limit allows beyond ``max_answer_bytes`` (a backstop behind answers.py)."""


@dataclass(frozen=True, slots=True)
class Transport:
    """An open transport: its streams, its process (stdio) and its direct lane (when one was asked for)."""

    read: Any
    write: Any
    process: StdioProcess | None = None
    lane: DirectLane | None = None


@asynccontextmanager
async def open_transport(
    config: ServerConfig,
    *,
    http: BackendPool | None,
    headers: Mapping[str, str] | None,
    recorder: ResponseRecorder,
    stderr: IO[bytes],
    on_failure: Callable[[str], None],
    direct: bool = False,
) -> AsyncIterator[Transport]:
    """Open the transport ``config`` names, for one session.

    Args:
        http: the backend's connection pools (pools of this session's own when None); unused over stdio.
        headers: sent with every HTTP request (None: the server's own ``headers``); unused over stdio.
        recorder: keeps the last error response of the HTTP transports.
        stderr: a file the caller owns, for a stdio server's stderr (read after the process is gone).
        on_failure: told why, when a stdio transport gives up on a live session.
        direct: also open a direct lane on the session (stdio and streamable HTTP).

    Raises:
        OSError: a stdio server could not be spawned. Connection failures of the HTTP transports surface when the
            session over it first sends.
    """
    if isinstance(config, StdioServer):
        async with _stdio(config, stderr, on_failure) as transport:
            yield transport
    elif isinstance(config, HttpServer):
        sent = config.headers if headers is None else headers
        async with _streamable_http(
            config, http or BackendPool(config.url, config), sent, recorder, direct
        ) as transport:
            yield transport
    else:
        sent = config.headers if headers is None else headers
        async with _sse(config, http or BackendPool(config.url, config), sent, recorder) as transport:
            yield transport


@asynccontextmanager
async def _stdio(config: StdioServer, stderr: IO[bytes], on_failure: Callable[[str], None]) -> AsyncIterator[Transport]:
    env = passed_environment(config.pass_env, config.env)
    async with open_stdio(
        config.command,
        list(config.args),
        env=env,
        cwd=config.cwd,
        stderr=stderr,
        max_line_bytes=config.max_answer_bytes,
        write_timeout_s=config.timeout_s,
        on_failure=on_failure,
    ) as (read, write, proc):
        yield Transport(read, write, proc, proc.lane)


@asynccontextmanager
async def _streamable_http(
    config: HttpServer, http: BackendPool, headers: Mapping[str, str], recorder: ResponseRecorder, direct: bool
) -> AsyncIterator[Transport]:
    # A response stream may stay open as long as the longest call: never cut it before the call's timeout.
    limit = config.max_answer_bytes
    read_s = max(300.0, config.timeout_s + 30)
    client = http.client(
        headers,
        config.connect_timeout_s,
        recorder,
        read_s,
        max_answer_bytes=limit,
        json_lines=config.protocol != HANDSHAKE,  # the stateless era's servers stream JSON lines too
        allow_private=config.allow_private,
    )
    # Every session has a lane, which learns its id and ends it (own.py: the SDK's DELETE would not leave when the
    # gateway stops); only the shared session and the twin send requests on theirs (``direct``).
    lane = SessionLane(client, config.url, max_event_size=limit + SSE_EVENT_MARGIN)
    client.event_hooks["response"].append(lane.see)
    async with (
        streamable_http_client(
            config.url, http_client=client, terminate_on_close=False, max_sse_event_size=limit + SSE_EVENT_MARGIN
        ) as streams,
        anyio.create_task_group() as closer,
    ):
        lane.closer = closer
        try:
            yield Transport(streams[0], streams[1], lane=lane if direct else None)
        finally:
            await lane.aclose()
            closer.cancel_scope.cancel()


@asynccontextmanager
async def _sse(
    config: SseServer, http: BackendPool, headers: Mapping[str, str], recorder: ResponseRecorder
) -> AsyncIterator[Transport]:
    sent = dict(headers)

    def factory(
        headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None, auth: Any = None
    ) -> httpx2.AsyncClient:
        merged = {**sent, **(headers or {})}
        limit = min(config.max_answer_bytes, SSE_EVENT_CAP)
        client = http.client(
            merged, config.connect_timeout_s, recorder, max_answer_bytes=limit, allow_private=config.allow_private
        )
        if timeout is not None:
            client.timeout = timeout
        return client

    async with sse_client(
        config.url, headers=dict(sent), timeout=config.connect_timeout_s, httpx_client_factory=factory
    ) as streams:
        yield Transport(streams[0], streams[1])
