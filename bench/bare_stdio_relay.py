"""The floor of a Python gateway over stdio: a bare relay in front of one stdio MCP server (a benchmark target).

    .venv/bin/python bench/bare_stdio_relay.py [--prefix echo__] [--uvloop] -- COMMAND [ARG...]

Spawned by a client as it would spawn the server, it spawns ``COMMAND`` and relays between the two over pipes on the
event loop (as ``gateway serve --stdio`` serves its client): each line from the client is parsed as a JSON-RPC
message, a ``tools/call``'s tool renamed (``--prefix`` stripped from the name, as a gateway maps a published name to
the downstream's) and written to the server; each line from the server is written to the client as it came. Nothing
else: no MCP session of its own, no validation, no audit, no limits; it costs what any Python relay over stdio must
(two pipes each way, a JSON parse and dump), which is what ``gateway serve --stdio`` is measured against, beside the
server spawned by the client itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from bare_relay import renamed  # the HTTP relay's parse, rename and dump (this script's folder is on the path)


class _Lines(asyncio.Protocol):
    """Splits what a pipe delivers into lines and hands each to ``on_line``; ``done`` is set at its end."""

    def __init__(self, on_line: object) -> None:
        self.on_line = on_line
        self.partial = b""
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.on_line(line)  # type: ignore[operator]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def relay(argv: list[str], prefix: str) -> int:
    loop = asyncio.get_running_loop()
    child = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    to_child = child.stdin
    out_transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", buffering=0))

    def from_client(line: bytes) -> None:
        if line.strip():
            to_child.write(renamed(line, prefix) + b"\n")

    client_in = _Lines(from_client)
    await loop.connect_read_pipe(lambda: client_in, os.fdopen(0, "rb", buffering=0))

    async def back() -> None:
        while line := await child.stdout.readline():  # type: ignore[union-attr]
            out_transport.write(line)

    answers = asyncio.ensure_future(back())
    await client_in.done
    to_child.close()
    await answers
    return await child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--prefix", default="", help="stripped from a tools/call's tool name")
    parser.add_argument("--uvloop", action="store_true", help="uvloop instead of asyncio")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]: the stdio server")
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        parser.error("the server's command is missing (after --)")
    if args.uvloop:
        import uvloop

        sys.exit(uvloop.run(relay(argv, args.prefix)))
    sys.exit(asyncio.run(relay(argv, args.prefix)))


if __name__ == "__main__":
    main()
