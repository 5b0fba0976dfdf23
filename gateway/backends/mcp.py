"""One supervised session to one downstream MCP server (stdio, streamable HTTP or SSE).

``McpBackend.run`` is the only owner of the session: it opens the transport and the ``ClientSession`` in nested
``async with`` blocks inside its own task, initializes with protocol negotiation, lists the tools, marks itself
ready, and then waits until the connection ends (the process exits, the HTTP stream breaks, a ping fails). It then
marks itself failed with the reason in plain words and reconnects with exponential backoff and jitter (tenacity);
after a session that worked, the backoff starts again from the first step. A backend that never connects still calls
``task_status.started()`` after its first failure, so it never blocks startup.

Foreign errors (``OSError``, ``httpx2``, ``anyio``, ``MCPError``) are translated here into the gateway's
``BackendError`` tree (``classify_failure`` for connection failures, ``map_call_errors`` for calls); nothing above
``backends/`` sees them.
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import IO, Any

import anyio
import httpx2
import mcp_types as types
import structlog
from anyio.abc import TaskStatus
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from gateway.backends.base import BackendState, BackendStatus, ChangeListener, ProgressFn
from gateway.backends.stdio import StdioProcess, open_stdio
from gateway.config import HttpServer, ServerConfig, SseServer, StdioServer
from gateway.errors import (
    BackendProtocolError,
    BackendRpcError,
    BackendTimeout,
    BackendUnavailable,
)

__all__ = ["HttpPool", "McpBackend", "classify_failure"]

log = structlog.get_logger("gateway.backend")

SHUTDOWN_GRACE_S = 5.0
"""Bound on closing one session (the SDK's stdio shutdown closes stdin, waits, then kills the process tree)."""
JSONRPC_REQUEST_TIMEOUT = -32001
JSONRPC_CONNECTION_CLOSED = -32000


# ----------------------------------------------------------------------------------------------- shared HTTP


class _SharedTransport(httpx2.AsyncBaseTransport):
    """One connection pool for every HTTP backend; closing a client that borrows it leaves it open."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:  # borrowed by per-backend clients; closed by HttpPool only
        pass

    async def close_pool(self) -> None:
        await self._inner.aclose()


class HttpPool:
    """The gateway's one HTTP connection pool (creating an httpx2 transport costs ~50 ms: done once).

    Each HTTP backend gets a cheap client view with its own headers and a response hook that remembers the last
    non-2xx answer, so a failed handshake can be classified ("HTTP 502 with an HTML page").
    """

    def __init__(self) -> None:
        self._transport = _SharedTransport()

    def client(self, headers: Mapping[str, str], timeout_s: float, recorder: _ResponseRecorder) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            transport=self._transport,
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout_s, read=300.0),
            trust_env=False,
            event_hooks={"response": [recorder]},
        )

    async def aclose(self) -> None:
        await self._transport.close_pool()


class _ResponseRecorder:
    """An httpx2 response hook keeping the last error response's status, content type and body head."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.content_type: str = ""
        self.body_head: str = ""

    def clear(self) -> None:
        self.status, self.content_type, self.body_head = None, "", ""

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code < 400:
            return
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "")
        try:
            body = await response.aread()
        except httpx2.HTTPError:
            body = b""
        self.body_head = body[:300].decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------- classification


def _http_reason(recorder: _ResponseRecorder) -> str | None:
    status = recorder.status
    if status is None:
        return None
    if status in (401, 403):
        return f"the backend refused our credentials (HTTP {status}); check the server's `headers`"
    ctype = recorder.content_type.split(";")[0].strip() or "no content type"
    head = recorder.body_head.lstrip().lower()
    if "html" in ctype or head.startswith(("<!doctype html", "<html")):
        return f"the handshake answered HTTP {status} with an HTML page, not MCP (is the URL right?)"
    if status == 404:
        return f"the handshake answered HTTP 404 ({ctype}): no MCP endpoint at this URL"
    return f"the handshake answered HTTP {status} with a non-MCP body ({ctype})"


def _flatten(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _flatten(inner)
    else:
        yield exc


def classify_failure(
    exc: BaseException,
    *,
    config: ServerConfig,
    stderr_tail: str = "",
    exit_code: int | None = None,
    http: _ResponseRecorder | None = None,
) -> str:
    """Describe why a connection attempt or a session failed, in plain words."""
    leaves = list(_flatten(exc))
    http_reason = _http_reason(http) if http is not None else None
    for leaf in leaves:
        if isinstance(leaf, TimeoutError):
            return f"handshake timed out after {config.connect_timeout_s:g} s (the server did not answer initialize)"
        if isinstance(leaf, FileNotFoundError) and isinstance(config, StdioServer):
            return f"command not found: {config.command}"
        if isinstance(leaf, PermissionError) and isinstance(config, StdioServer):
            return f"command is not executable: {config.command}"
        if isinstance(leaf, httpx2.ConnectError):
            url = config.url if isinstance(config, HttpServer | SseServer) else ""
            return f"connection refused at {url}"
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
            if status in (401, 403):
                return f"the backend refused our credentials (HTTP {status}); check the server's `headers`"
            return http_reason or f"the handshake answered HTTP {status}"
        if isinstance(leaf, httpx2.TimeoutException):
            return "the HTTP request timed out"
        if isinstance(leaf, httpx2.HTTPError):
            return http_reason or f"HTTP transport error: {leaf}"
        text = str(leaf)
        if "protocol version" in text.lower():
            return f"unsupported protocol version: {text}"
    if http_reason is not None:
        return http_reason
    if isinstance(config, StdioServer):
        return _exit_detail(exit_code, stderr_tail)
    leaf = leaves[0] if leaves else exc
    return f"{type(leaf).__name__}: {leaf}" if str(leaf) else f"connection failed ({type(leaf).__name__})"


def _exit_detail(exit_code: int | None, stderr_tail: str) -> str:
    tail = f": {stderr_tail}" if stderr_tail else " (nothing on stderr)"
    if exit_code is None:
        return f"the process closed its output{tail}"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"process was killed by {name}{tail}"
    return f"process exited with code {exit_code}{tail}"


# ----------------------------------------------------------------------------------------------- the stream watch


class _WatchedReceiveStream:
    """Wraps the transport's receive stream and fires ``on_eof`` when the connection ends (zero-copy)."""

    def __init__(self, inner: Any, on_eof: Callable[[], None]) -> None:
        self._inner = inner
        self._on_eof = on_eof

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_eof()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReceiveStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReceiveStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


# ----------------------------------------------------------------------------------------------- the backend


class _ConnectFailed(Exception):
    """A connection attempt failed; ``reason`` is already in plain words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


NotificationHook = Callable[["McpBackend", types.ServerNotification], None]


class McpBackend:
    """A downstream MCP server behind one long-lived, supervised client session."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        *,
        http: HttpPool | None = None,
        client_info: types.Implementation | None = None,
        on_notification: NotificationHook | None = None,
    ) -> None:
        self._name = name
        self._config = config
        self._http = http
        self._client_info = client_info or types.Implementation(name="mcp-gateway", version="0.1.0")
        self._on_notification = on_notification
        self._listeners: list[ChangeListener] = []
        self._session: ClientSession | None = None
        self._tools: tuple[types.Tool, ...] = ()
        self._init: types.InitializeResult | None = None
        self._lost: anyio.Event = anyio.Event()
        self._probe_now: anyio.Event = anyio.Event()
        self._lost_reason: str | None = None
        self._status = (
            BackendStatus(BackendState.DISABLED, config.disabled_reason or "disabled in federation.yaml", declared=True)
            if not config.enabled
            else BackendStatus(BackendState.STARTING, "connecting")
        )
        self._proc: StdioProcess | None = None
        self.connects = 0

    # -- the Backend protocol ------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> str:
        return self._config.transport

    @property
    def config(self) -> ServerConfig:
        return self._config

    @property
    def status(self) -> BackendStatus:
        return self._status

    @property
    def initialize_result(self) -> types.InitializeResult | None:
        return self._init

    @property
    def session(self) -> ClientSession | None:
        return self._session

    def tools(self) -> Sequence[types.Tool]:
        return self._tools

    def ladder(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str | None]:
        return (None,)

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        session = self._require_session()
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool, arguments=arguments, _meta=meta or None)  # type: ignore[arg-type]
        )
        with self.map_call_errors():
            return await session.send_request(
                request,
                types.CallToolResult,
                request_read_timeout_seconds=self._config.timeout_s,
                progress_callback=progress,
            )

    async def request(self, request: Any, result_type: Any, *, progress: ProgressFn | None = None) -> Any:
        """Forward any client request (resources, prompts, completion, ...) to this backend."""
        session = self._require_session()
        with self.map_call_errors():
            return await session.send_request(
                request,
                result_type,
                request_read_timeout_seconds=self._config.timeout_s,
                progress_callback=progress,
            )

    def _require_session(self) -> ClientSession:
        session = self._session
        if session is None or self._status.state is not BackendState.READY:
            raise BackendUnavailable(self._name, self._status.reason or f"not ready ({self._status.state})")
        return session

    @contextmanager
    def map_call_errors(self) -> Iterator[None]:
        """Translate a call's foreign errors into BackendError, naming this backend."""
        try:
            yield
        except MCPError as exc:
            if exc.error.code == JSONRPC_REQUEST_TIMEOUT:
                raise BackendTimeout(
                    self._name, f"timed out after {self._config.timeout_s:g} s (cancellation sent downstream)"
                ) from exc
            if exc.error.code == JSONRPC_CONNECTION_CLOSED:
                self._mark_lost("the connection closed during a call")
                raise BackendUnavailable(self._name, "the connection closed during the call (server crashed?)") from exc
            raise BackendRpcError(self._name, exc.error.code, exc.error.message, exc.error.data) from exc
        except (httpx2.HTTPError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._mark_lost(f"transport error: {exc or type(exc).__name__}")
            raise BackendUnavailable(self._name, f"transport error: {exc or type(exc).__name__}") from exc
        except RuntimeError as exc:  # the SDK raises RuntimeError for unexpected result shapes
            raise BackendProtocolError(self._name, str(exc)) from exc

    # -- supervision ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a session to the downstream alive until cancelled. See the module docstring."""
        if not self._config.enabled:
            self._set_status(self._status)
            task_status.started()
            await anyio.sleep_forever()

        started = False

        def first_outcome() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(_ConnectFailed),
                wait=wait_exponential_jitter(initial=0.5, max=30.0, jitter=0.5),
                sleep=anyio.sleep,
                before_sleep=lambda state: first_outcome(),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    await self._session_lifetime(first_outcome)

    async def _session_lifetime(self, on_first_outcome: Callable[[], None]) -> None:
        """One connection: open, initialize, serve until lost. Raises _ConnectFailed when it could not connect."""
        self.connects += 1
        recorder = _ResponseRecorder()
        self._lost = anyio.Event()
        self._lost_reason = None
        self._proc = None
        connected = False
        failure: Exception | None = None
        with tempfile.TemporaryFile() as stderr:
            try:
                async with self._transport(recorder, stderr) as (read, write):
                    watched = _WatchedReceiveStream(read, lambda: self._mark_lost("the connection closed"))
                    async with ClientSession(
                        watched,
                        write,
                        client_info=self._client_info,
                        message_handler=self._on_message,
                    ) as session:
                        with anyio.fail_after(self._config.connect_timeout_s):
                            self._init = await session.initialize()
                            tools = await self._list_tools(session)
                        connected = True
                        self._session = session
                        self._tools = tools
                        self._set_status(
                            BackendStatus(
                                BackendState.READY, None, tool_count=len(tools), last_error=self._status.last_error
                            )
                        )
                        on_first_outcome()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._ping_loop, session)
                            await self._lost.wait()
                            tg.cancel_scope.cancel()
            except anyio.get_cancelled_exc_class():
                self._session = None
                raise
            except Exception as exc:  # translated into a reason below; nothing foreign escapes
                failure = exc
            self._session = None
            self._tools = ()
            proc = self._proc
            exit_code = proc.returncode if proc is not None else None
            stderr_tail = proc.stderr_tail() if proc is not None else ""
        if connected:
            detail = _exit_detail(exit_code, stderr_tail) if proc is not None else ""
            if failure is not None and not detail:
                detail = classify_failure(failure, config=self._config, http=recorder)
            reason = self._lost_reason or "the connection closed"
            self._fail(f"{reason}; {detail}" if detail else reason)
            return
        reason = classify_failure(
            failure or RuntimeError("the session ended during the handshake"),
            config=self._config,
            stderr_tail=stderr_tail,
            exit_code=exit_code,
            http=recorder,
        )
        self._fail(reason)
        raise _ConnectFailed(reason) from failure

    @asynccontextmanager
    async def _transport(self, recorder: _ResponseRecorder, stderr: IO[bytes]) -> AsyncIterator[Any]:
        config = self._config
        if isinstance(config, StdioServer):
            env = get_default_environment() | dict(config.env)
            async with open_stdio(config.command, list(config.args), env=env, cwd=config.cwd, stderr=stderr) as (
                read,
                write,
                proc,
            ):
                self._proc = proc
                yield read, write
            return
        http = self._http or HttpPool()
        if isinstance(config, HttpServer):
            client = http.client(config.headers, config.connect_timeout_s, recorder)
            async with streamable_http_client(config.url, http_client=client) as streams:
                yield streams
            return

        def factory(
            headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None, auth: Any = None
        ) -> httpx2.AsyncClient:
            merged = {**config.headers, **(headers or {})}
            client = http.client(merged, config.connect_timeout_s, recorder)
            if timeout is not None:
                client.timeout = timeout
            return client

        async with sse_client(
            config.url,
            headers=dict(config.headers),
            timeout=config.connect_timeout_s,
            httpx_client_factory=factory,
        ) as streams:
            yield streams

    async def _list_tools(self, session: ClientSession) -> tuple[types.Tool, ...]:
        caps = self._init.capabilities if self._init is not None else None
        if caps is not None and caps.tools is None:
            return ()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            result = await session.list_tools(params=params)
            tools.extend(result.tools)
            cursor = result.next_cursor
            if not cursor:
                return tuple(tools)

    async def _ping_loop(self, session: ClientSession) -> None:
        """Ping every ``ping_interval_s``, or at once when the transport reports an error (e.g. its stream broke)."""
        while True:
            with anyio.move_on_after(self._config.ping_interval_s):
                await self._probe_now.wait()
            self._probe_now = anyio.Event()
            try:
                with anyio.fail_after(self._config.connect_timeout_s):
                    await session.send_ping()
            except (MCPError, TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._mark_lost(f"ping failed: {exc or type(exc).__name__}")
                return
            except httpx2.HTTPError as exc:
                self._mark_lost(f"ping failed: {exc or type(exc).__name__}")
                return

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.debug("backend.transport_error", backend=self._name, error=str(message) or type(message).__name__)
            self._probe_now.set()  # is the session still alive? ping now rather than at the next interval
            return
        if isinstance(message, types.ToolListChangedNotification) and self._session is not None:
            session = self._session
            try:
                with anyio.fail_after(self._config.connect_timeout_s):
                    tools = await self._list_tools(session)
            except (MCPError, TimeoutError, httpx2.HTTPError, anyio.BrokenResourceError, OSError) as exc:
                log.warning("backend.relist_failed", backend=self._name, error=str(exc))
                return
            self._tools = tools
            self._set_status(
                BackendStatus(
                    BackendState.READY,
                    None,
                    since=self._status.since,
                    tool_count=len(tools),
                    last_error=self._status.last_error,
                )
            )
            return
        if self._on_notification is not None:
            self._on_notification(self, message)

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason
        self._lost.set()

    def _fail(self, reason: str) -> None:
        self._set_status(BackendStatus(BackendState.FAILED, reason, last_error=reason))

    def _set_status(self, status: BackendStatus) -> None:
        previous = self._status
        self._status = status
        if status.state is not previous.state or status.reason != previous.reason:
            event = "backend.ready" if status.state is BackendState.READY else "backend.state"
            log_fn = log.info if status.state in (BackendState.READY, BackendState.DISABLED) else log.warning
            log_fn(
                event,
                backend=self._name,
                kind=self.kind,
                state=str(status.state),
                reason=status.reason,
                tools=status.tool_count,
            )
        for listener in self._listeners:
            listener()
