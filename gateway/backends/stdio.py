"""The stdio transport to a downstream MCP server, owning its process.

The SDK's ``stdio_client`` hides the process, but the gateway must say *why* a server went away ("process exited
with code 1: <last stderr lines>") and count its live children. This transport spawns the server in its own process
group, bridges newline-delimited JSON-RPC between its pipes and the session's streams, keeps stderr in a temporary
file (the tail is read on failure), and on exit follows the spec's shutdown: close stdin, wait, then signal the whole
process group (SIGTERM, then SIGKILL), inside a shielded scope with every wait bounded.

Two faults stay with their cause. A line over ``max_line_bytes`` (the server's ``max_answer_bytes``) is read to its
end without being kept and replaced by an error answer to its request (backends/answers.py): that call fails, the
session goes on. A write that the server does not take within ``write_timeout_s`` (its stdin is not being read, the
pipe is full) ends the session at once with that reason (``on_failure``), so the calls queued behind the write fail
within their timeout instead of waiting for a health ping, and the supervisor restarts the server.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import IO

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from gateway.backends import processes
from gateway.backends.answers import LineLimit, replace_line

__all__ = ["StdioProcess", "open_stdio"]

EXIT_GRACE_S = 2.0
"""Time for the server to exit on its own after its stdin closes (the spec's first shutdown step)."""
TERM_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL to the process group."""
STDERR_TAIL_LINES = 5


@dataclass
class StdioProcess:
    """What the transport knows about its process: used to explain a failure."""

    process: Process
    stderr: IO[bytes]
    eof: anyio.Event = field(default_factory=anyio.Event)
    failure: str | None = None
    """Why the transport gave up on a live process (its stdin stopped taking messages), if it did."""

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def stderr_tail(self) -> str:
        try:
            self.stderr.flush()
            self.stderr.seek(0, 2)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - 4096))
            text = self.stderr.read().decode("utf-8", errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-STDERR_TAIL_LINES:])


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


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

    async def reader() -> None:
        assert process.stdout is not None
        lines = LineLimit(max_line_bytes)
        try:
            async with read_send:
                async for chunk in process.stdout:
                    for item in lines.feed(chunk):
                        if isinstance(item, bytes):
                            for line in item.split(b"\n"):
                                if line.strip():
                                    await read_send.send(_parse(line))
                            continue
                        replacement = replace_line(item, max_line_bytes, sse=False)
                        if replacement is not None:
                            await read_send.send(_parse(replacement))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            pass
        finally:
            proc.eof.set()

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    with anyio.move_on_after(write_timeout_s) as stalled:
                        await process.stdin.send(data)
                    if stalled.cancelled_caught:
                        reason = (
                            f"the server stopped reading its stdin (a message of {len(data):,} bytes was not taken "
                            f"within {write_timeout_s:g} s)"
                        )
                        proc.failure = reason
                        if on_failure is not None:
                            on_failure(reason)
                        await read_send.aclose()
                        return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send, proc
        finally:
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
