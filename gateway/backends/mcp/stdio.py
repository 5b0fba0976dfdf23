"""The stdio transport to a downstream MCP server, owning its process.

The SDK's ``stdio_client`` hides the process, but the gateway must say *why* a server went away ("process exited
with code 1: <last stderr lines>") and count its live children. This transport spawns the server in its own process
group, bridges newline-delimited JSON-RPC between its pipes and the session's streams, keeps stderr in a temporary
file (the tail is read on failure), and on exit follows the spec's shutdown: close stdin, wait, then signal the whole
process group (SIGTERM, then SIGKILL), inside a shielded scope with every wait bounded.

Two faults stay with their cause. A line over ``max_line_bytes`` (the server's ``max_answer_bytes``) is read to its
end without being kept and replaced by an error answer to its request (backends/mcp/answers.py): that call fails, the
session goes on. A write that the server does not take within ``write_timeout_s`` (its stdin is not being read, the
pipe is full) ends the session at once with that reason (``on_failure``), so the calls queued behind the write fail
within their timeout instead of waiting for a health ping, and the supervisor restarts the server.

The pipes carry two kinds of traffic. The SDK session's goes through the read and write streams; a request sent
straight on the session (``StdioLane``, backends/mcp/fastpath.py) is written onto stdin by its caller, and the reader
hands the lines that belong to it (the answer to its ``gw-N`` id, progress for that token, which the SDK session
never knew) to the waiting caller instead of the read stream. Every other line reaches the SDK session as before,
so the server's own requests during such a call (elicitation, sampling, roots, ping), its cancellations of them and
its notifications are handled by the session's own handlers, exactly as during one of the session's calls. A line
is only looked at when it holds ``"gw-``; the others are parsed as before. What the server still says for a
direct call that has ended (progress already in the pipe when it was cancelled, a late answer) is dropped: it is no
one's, and the session, which never knew those ids, would spend a validation and a task on each. The writer task
and direct callers write whole lines onto the same pipe: on asyncio a write is handed to the pipe's transport at
once, so lines never interleave, and a direct write that the server does not take within ``write_timeout_s`` ends
the session as the writer's does.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import IO, Any

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.abc import Process
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from gateway.backends import processes
from gateway.backends.mcp.answers import LineLimit, replace_line
from gateway.backends.mcp.fastpath import (
    CONNECTION_CLOSED,
    LANE_ID_PREFIX,
    AnswerFn,
    DirectCall,
    DirectLane,
    NotifyFn,
    ProgressFn,
    Turns,
    answer_of,
    progress_of,
)

__all__ = ["StdioLane", "StdioProcess", "open_stdio", "stderr_tail"]

_LANE_MARK = f'"{LANE_ID_PREFIX}'.encode()
"""What a line holds when it may be a direct call's (its id or token as a JSON string)."""

EXIT_GRACE_S = 2.0
"""Time for the server to exit on its own after its stdin closes (the spec's first shutdown step)."""
TERM_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL to the process group."""
STDERR_TAIL_LINES = 5
STRAY_CHARS = 200
"""Characters kept of a line on stdout that is not JSON-RPC (a banner, a log line): shown when the handshake fails."""


_CLOSED: dict[str, Any] = {}
"""What a direct call waiting for its answer is handed when the pipes closed (matched by identity)."""


class StdioLane(DirectLane):
    """The child's pipes, for requests written straight onto its stdin (``open_stdio`` wires its reader and writer).

    ``answer`` and ``notify`` of ``request`` are not used: on stdio nothing ties the server's requests and
    notifications to a call, so they reach the SDK session's own handlers (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[str, _Waiter] = {}
        self.closed = False
        self._write: Callable[[bytes], Awaitable[bool]] | None = None

    @property
    def ready(self) -> bool:
        return self.version is not None and not self.closed and self._write is not None

    def _begin(self, rid: str, progress: ProgressFn | None, answer: AnswerFn, notify: NotifyFn) -> DirectCall:
        return _Waiter(self, rid, progress)

    async def _notice(self, message: Mapping[str, Any]) -> None:
        if self.closed or self._write is None:
            return
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await self._write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def put(self, line: bytes) -> None:
        """Write one request line (with its newline).

        Raises:
            MCPError: ``CONNECTION_CLOSED``: the pipes are closed, or the server did not take the line in time.
        """
        if self.closed or self._write is None:
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        try:
            taken = await self._write(line)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            taken = False
        if not taken:
            raise MCPError(CONNECTION_CLOSED, "Connection closed")

    def claim(self, line: bytes) -> tuple[_Waiter | None, dict[str, Any]] | None:
        """The direct call ``line`` belongs to, with the message: the call is None when the line is a direct call's
        (its answer, or progress for its token) but that call has ended (what the server still says for a call that
        was cancelled or shed is dropped: the session never knew its id, and on the one read of the shared pipe each
        such line would cost it a validation and a task). None when the line is not a direct call's (it goes to the
        session)."""
        if _LANE_MARK not in line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        if "method" in message:
            params = message.get("params")
            if message["method"] != "notifications/progress" or not isinstance(params, dict):
                return None
            key = params.get("progressToken")
        else:
            key = message.get("id")
        if not isinstance(key, str) or not key.startswith(LANE_ID_PREFIX):
            return None
        return self.waiting.get(key), message

    def close(self) -> None:
        """The pipes are gone: every direct call waiting for its answer fails with ``CONNECTION_CLOSED``."""
        self.closed = True
        for waiter in list(self.waiting.values()):
            waiter.deliver(_CLOSED)
        self.waiting.clear()


INBOX_BYTES = 256 * 1024
"""Progress a direct call's inbox holds for a caller that does not keep up; beyond it, only the latest is kept."""


class _Waiter(DirectCall):
    """One direct call on the pipes: its line written by its caller, its messages handed over by the reader. The
    reader never waits for the caller, and the caller may fall behind (its client does not read): past
    ``INBOX_BYTES`` of waiting progress, a new progress notification replaces the last one waiting, so the inbox
    holds at most that, one more, and the answer, however much the server says."""

    def __init__(self, lane: StdioLane, rid: str, progress: ProgressFn | None) -> None:
        super().__init__(rid, progress)
        self.lane = lane
        self.inbox: deque[list[Any]] = deque()  # [message, its size in bytes]
        self.held = 0
        self.latest: list[Any] | None = None  # the last progress waiting in the inbox
        self.arrived = anyio.Event()

    def deliver(self, message: dict[str, Any], size: int = 0) -> None:
        if "method" in message:  # progress (the only notification a direct call is handed)
            if self.latest is not None and self.held > INBOX_BYTES:
                self.latest[0] = message  # the caller does not keep up: only the latest progress will do
                self.arrived.set()
                return
            entry = self.latest = [message, size]
        else:
            entry = [message, size]
        self.inbox.append(entry)
        self.held += size
        self.arrived.set()

    async def send(self, body: bytes) -> None:
        self.lane.waiting[self.rid] = self  # before the write: the answer may come before the caller runs again
        self.sent = True  # a write interrupted by cancellation may still have reached the server
        try:
            await self.lane.put(body + b"\n")
        except BaseException:
            self.lane.waiting.pop(self.rid, None)
            raise

    async def outcome(self) -> dict[str, Any]:
        turns = Turns()
        try:
            while True:
                while self.inbox:
                    await turns.taken()
                    entry = self.inbox.popleft()
                    message, size = entry
                    self.held -= size
                    if entry is self.latest:
                        self.latest = None
                    if message is _CLOSED:
                        raise MCPError(CONNECTION_CLOSED, "Connection closed")
                    if "method" in message:
                        if self.progress is not None:
                            await self.progress(*progress_of(message["params"]))
                        continue
                    found = answer_of(message, self.rid)
                    if found is not None:
                        return found
                if self.arrived.is_set():  # no await since the inbox was found empty: nothing slips past
                    self.arrived = anyio.Event()
                await self.arrived.wait()
        finally:
            self.lane.waiting.pop(self.rid, None)


@dataclass
class StdioProcess:
    """What the transport knows about its process: used to explain a failure."""

    process: Process
    stderr: IO[bytes]
    eof: anyio.Event = field(default_factory=anyio.Event)
    failure: str | None = None
    """Why the transport gave up on a live process (its stdin stopped taking messages), if it did."""
    lane: StdioLane = field(default_factory=StdioLane)
    """The process's pipes for requests sent straight on them (see the module docstring)."""
    stray: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    """The last lines it printed on stdout that were not JSON-RPC (MCP's stdout carries nothing else)."""

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def stderr_tail(self) -> str:
        return stderr_tail(self.stderr)

    def stray_tail(self) -> str:
        """The last lines on stdout that were not JSON-RPC, as ``stderr_tail`` gives stderr's."""
        return " | ".join(self.stray)


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


class _Pipes:
    """The child's pipes bridged to the session's streams: ``read`` feeds stdout's lines to the session (or to the
    direct call a line belongs to), ``pump`` writes the session's messages onto stdin, ``write`` is the one way onto
    stdin (the direct lane's too)."""

    def __init__(
        self,
        proc: StdioProcess,
        read_send: anyio.abc.ObjectSendStream[SessionMessage | Exception],
        write_recv: anyio.abc.ObjectReceiveStream[SessionMessage],
        *,
        max_line_bytes: int,
        write_timeout_s: float,
        on_failure: Callable[[str], None] | None,
    ) -> None:
        self._proc = proc
        self._lane = proc.lane
        self._read_send = read_send
        self._write_recv = write_recv
        self._max_line_bytes = max_line_bytes
        self._write_timeout_s = write_timeout_s
        self._on_failure = on_failure
        self._passed = False  # a line went to the session since the last one handed to a direct call

    async def write(self, data: bytes) -> bool:
        """Write one line onto stdin; False when the server did not take it in time (the session is then over)."""
        stdin = self._proc.process.stdin
        assert stdin is not None
        with anyio.move_on_after(self._write_timeout_s) as stalled:
            await stdin.send(data)
        if not stalled.cancelled_caught:
            return True
        reason = (
            f"the server stopped reading its stdin (a message of {len(data):,} bytes was not taken "
            f"within {self._write_timeout_s:g} s)"
        )
        if self._proc.failure is None:
            self._proc.failure = reason
            if self._on_failure is not None:
                self._on_failure(reason)
        self._lane.close()
        await self._read_send.aclose()
        return False

    async def _route(self, line: bytes) -> None:
        claimed = self._lane.claim(line)
        if claimed is None:
            parsed = _parse(line)
            if isinstance(parsed, Exception):
                self._proc.stray.append(line.decode("utf-8", errors="replace").strip()[:STRAY_CHARS])
            await self._read_send.send(parsed)
            self._passed = True
            return
        if claimed[0] is None:
            return  # a direct call's, and that call has ended
        if self._passed:
            # The session dispatches what came before first, as its own receive loop would: a log message is
            # attributed to the call in flight, a cancelled request of the server's is cancelled, before the call's
            # caller can run on with its answer.
            await anyio.lowlevel.checkpoint()
            self._passed = False
        claimed[0].deliver(claimed[1], len(line))

    async def read(self) -> None:
        """Until stdout ends: each line to its reader, an oversized one replaced (see the module docstring)."""
        stdout = self._proc.process.stdout
        assert stdout is not None
        lines, turns = LineLimit(self._max_line_bytes), Turns()
        try:
            async with self._read_send:
                async for chunk in stdout:
                    for item in lines.feed(chunk):
                        if isinstance(item, bytes):
                            for line in item.split(b"\n"):
                                if line.strip():
                                    await self._route(line)
                                    await turns.taken()
                            continue
                        replacement = replace_line(item, self._max_line_bytes, sse=False)
                        if replacement is not None:
                            await self._route(replacement)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            pass
        finally:
            self._lane.close()
            self._proc.eof.set()

    async def pump(self) -> None:
        """Until the session's write stream closes: each of its messages onto stdin, one line each."""
        try:
            async with self._write_recv:
                async for message in self._write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    if not await self.write(data):
                        return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            self._lane.close()
            await self._read_send.aclose()


@asynccontextmanager
async def open_stdio(
    command: str,
    args: list[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stderr: IO[bytes],
    max_line_bytes: int = 64 * 1024 * 1024,
    write_timeout_s: float = math.inf,
    on_failure: Callable[[str], None] | None = None,
) -> AsyncIterator[
    tuple[
        anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
        anyio.abc.ObjectSendStream[SessionMessage],
        StdioProcess,
    ]
]:
    """Spawn ``command`` and yield ``(read_stream, write_stream, process)``.

    ``stderr`` is a file the caller owns (it reads the tail after the process is gone). ``max_line_bytes`` bounds
    one message from the server; ``write_timeout_s`` bounds one message to it, after which ``on_failure`` is told
    why and the read stream ends (see the module docstring).

    Raises:
        OSError: the process could not be spawned (FileNotFoundError for a missing command).
    """
    process = await processes.open_process(  # a session of its own; on Linux, dies with the gateway
        [command, *args], env=dict(env) if env is not None else None, cwd=cwd, stderr=stderr
    )
    # No await between the spawn and the task group below, or a cancellation would leak the process.
    proc = StdioProcess(process, stderr)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    pipes = _Pipes(
        proc,
        read_send,
        write_recv,
        max_line_bytes=max_line_bytes,
        write_timeout_s=write_timeout_s,
        on_failure=on_failure,
    )
    proc.lane._write = pipes.write

    async with anyio.create_task_group() as tg:
        tg.start_soon(pipes.read)
        tg.start_soon(pipes.pump)
        try:
            yield read_recv, write_send, proc
        finally:
            proc.lane.close()
            with anyio.CancelScope(shield=True):
                await _shutdown(process, graceful=proc.failure is None)
            tg.cancel_scope.cancel()


async def _shutdown(process: Process, *, graceful: bool) -> None:
    # One budget for closing stdin and exiting: closing waits for unwritten data, which a server that stopped
    # reading never takes (so for a server that stopped reading there is no grace).
    with anyio.move_on_after(EXIT_GRACE_S if graceful else 0):
        if process.stdin is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.stdin.aclose()
        # Poll returncode, not process.wait(): that also waits for pipe EOF, which a grandchild can hold open.
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    # Even when the leader exited, its group may hold children (npx -> node): always signal the group.
    await terminate_posix_process_tree(process, TERM_GRACE_S)
    with anyio.move_on_after(TERM_GRACE_S):
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    with anyio.move_on_after(TERM_GRACE_S):
        for stream in (process.stdout, process.stdin):
            if stream is not None:
                with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await stream.aclose()


def stderr_tail(stderr: IO[bytes]) -> str:
    """The last lines a process wrote to ``stderr`` (a file it shares with us), joined by `` | ``."""
    try:
        stderr.flush()
        stderr.seek(0, 2)
        size = stderr.tell()
        stderr.seek(max(0, size - 4096))
        text = stderr.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_TAIL_LINES:])
