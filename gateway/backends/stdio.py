"""The stdio transport to a downstream MCP server, owning its process.

The SDK's ``stdio_client`` hides the process, but the gateway must say *why* a server went away ("process exited
with code 1: <last stderr lines>") and count its live children. This transport spawns the server in its own process
group, bridges newline-delimited JSON-RPC between its pipes and the session's streams, keeps stderr in a temporary
file (the tail is read on failure), and on exit follows the spec's shutdown: close stdin, wait, then signal the whole
process group (SIGTERM, then SIGKILL), inside a shielded scope with every wait bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import IO

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

__all__ = ["StdioProcess", "open_stdio"]

EXIT_GRACE_S = 2.0
"""Time for the server to exit on its own after its stdin closes (the spec's first shutdown step)."""
TERM_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL to the process group."""
MAX_LINE_BYTES = 64 * 1024 * 1024
"""A single JSON-RPC message larger than this is treated as a broken server."""
STDERR_TAIL_LINES = 5


@dataclass
class StdioProcess:
    """What the transport knows about its process: used to explain a failure."""

    process: Process
    stderr: IO[bytes]
    eof: anyio.Event = field(default_factory=anyio.Event)

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
    command: str, args: list[str], *, env: Mapping[str, str] | None, cwd: str | None, stderr: IO[bytes]
) -> AsyncIterator[
    tuple[
        anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
        anyio.abc.ObjectSendStream[SessionMessage],
        StdioProcess,
    ]
]:
    """Spawn ``command`` and yield ``(read_stream, write_stream, process)``.

    ``stderr`` is a file the caller owns (it reads the tail after the process is gone).

    Raises:
        OSError: the process could not be spawned (FileNotFoundError for a missing command).
    """
    process = await anyio.open_process(
        [command, *args],
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stderr=stderr,
        start_new_session=True,
    )
    # No await between the spawn and the task group below, or a cancellation would leak the process.
    proc = StdioProcess(process, stderr)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        assert process.stdout is not None
        buffer = b""
        try:
            async with read_send:
                async for chunk in process.stdout:
                    buffer += chunk
                    if b"\n" not in chunk:
                        if len(buffer) > MAX_LINE_BYTES:
                            await read_send.send(ValueError("a message exceeded the line limit"))
                            return
                        continue
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            await read_send.send(_parse(line))
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
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send, proc
        finally:
            with anyio.CancelScope(shield=True):
                await _shutdown(process)
            tg.cancel_scope.cancel()


async def _shutdown(process: Process) -> None:
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    # Poll returncode, not process.wait(): that also waits for pipe EOF, which a grandchild can hold open.
    with anyio.move_on_after(EXIT_GRACE_S):
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    # Even when the leader exited, its group may hold children (npx -> node): always signal the group.
    await terminate_posix_process_tree(process, TERM_GRACE_S)
    with anyio.move_on_after(TERM_GRACE_S):
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    for stream in (process.stdout, process.stdin):
        if stream is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.aclose()
