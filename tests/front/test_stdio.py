"""``gateway serve --stdio`` over gateway/stdio_edge.py: the client-facing stdio transport on the event loop.

Real processes: the gateway (``python -m gateway serve --stdio``) in front of tests/fixtures/echo_server.py over
stdio, spawned by the SDK's stdio client or over raw pipes, so that partial lines, a huge line, invalid UTF-8 and an
end of file in the middle of a message are sent byte for byte. Each case checks the answers, and that the gateway
and its downstream are gone once stdin ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.fixtures.gateway_proc import echo_argv
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

PYTHON = echo_argv()[0]
WAIT = 20  # seconds: the bound on every exchange with the gateway process
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}


def config(tmp_path: Path) -> Path:
    argv = echo_argv("--stdio")
    path = tmp_path / "federation.yaml"
    path.write_text(f"servers:\n  e:\n    transport: stdio\n    command: {argv[0]}\n    args: {json.dumps(argv[1:])}\n")
    return path


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[1]) == pid:
                found.add(int(entry.name))
    for child in list(found):
        found |= descendants(child)
    return found


def all_gone(pids: set[int]) -> bool:
    """Each of ``pids`` has exited (and been reaped, or is a zombie about to be)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return False
    return True


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def echo_call(id_: int, text: str) -> bytes:
    return line(
        {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": text}}}
    )


class Raw:
    """The gateway over raw pipes: bytes in, JSON-RPC messages out."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process, self.stdin, self.stdout = process, process.stdin, process.stdout
        self.buffer = b""

    async def receive(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            self.buffer += await self.stdout.receive()
        first, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(first)
        return message

    async def answer(self, id_: int) -> dict[str, Any]:
        while (message := await self.receive()).get("id") != id_:
            pass
        return message

    async def handshake(self) -> None:
        await self.stdin.send(line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        assert (await self.answer(1))["result"]["serverInfo"]
        await self.stdin.send(line({"jsonrpc": "2.0", "method": "notifications/initialized"}))


@contextlib.asynccontextmanager
async def raw_gateway(tmp_path: Path, env: dict[str, str] | None = None) -> Any:
    process = await anyio.open_process(
        [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(config(tmp_path))],
        cwd=tmp_path,
        start_new_session=True,
        env=None if env is None else os.environ | env,
    )
    try:
        yield Raw(process)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.aclose()


def read_line(fd: int) -> bytes:
    with open(fd, "rb", buffering=0, closefd=False) as wire:
        return wire.readline()


def text_of(answer: dict[str, Any]) -> str:
    text: str = answer["result"]["content"][0]["text"]
    return text


async def test_the_sdk_client_is_answered_and_the_gateway_exits_with_its_stdin(tmp_path: Path) -> None:
    before = echo_servers()  # the session's shared fixture servers and gateways may have theirs: not this test's
    params = StdioServerParameters(
        command=PYTHON, args=["-m", "gateway", "serve", "--stdio", "-c", str(config(tmp_path))], cwd=str(tmp_path)
    )
    with anyio.fail_after(WAIT):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert "echo" in names
            results = []
            for i in range(20):
                result = await session.call_tool("echo", {"text": f"hello {i}"})
                results.append(result.content[0].text)  # type: ignore[union-attr]
            assert results == [f"hello {i}" for i in range(20)]
    # the client closed the gateway's stdin and waited for it: no echo server of this test is left running
    await eventually(lambda: echo_servers() <= before, within=WAIT)


def echo_servers() -> set[int]:
    """The echo servers running under this test process (a gateway's stdio downstreams among them)."""
    return {pid for pid in descendants(os.getpid()) if "echo_server.py" in cmdline(pid)}


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_partial_lines_invalid_utf8_and_a_huge_line_are_read_as_before(tmp_path: Path, loop: str) -> None:
    async with raw_gateway(tmp_path, {"GATEWAY_UVLOOP": "1" if loop == "uvloop" else "0"}) as gw:
        with anyio.fail_after(WAIT):
            await gw.handshake()
            # one message in three writes, the newline in the last one
            call = echo_call(2, "split")
            for piece in (call[:7], call[7:30], call[30:]):
                await gw.stdin.send(piece)
                await anyio.lowlevel.checkpoint()
            assert text_of(await gw.answer(2)) == "split"
            # two messages and half a third in one write
            third = echo_call(5, "third")
            await gw.stdin.send(echo_call(3, "one") + echo_call(4, "two") + third[:10])
            assert text_of(await gw.answer(3)) == "one"
            assert text_of(await gw.answer(4)) == "two"
            await gw.stdin.send(third[10:])
            assert text_of(await gw.answer(5)) == "third"
            # invalid UTF-8 inside a string is replaced (U+FFFD), as the SDK's text layer does
            await gw.stdin.send(echo_call(6, "AB").replace(b"AB", b"A\xff\xfeB"))
            assert text_of(await gw.answer(6)) == "A\ufffd\ufffdB"
            # a line that is not JSON is skipped; the session goes on
            await gw.stdin.send(b"{not json\n" + echo_call(7, "after"))
            assert text_of(await gw.answer(7)) == "after"
            # a 4 MiB line (far over any read buffer), in pieces
            big = "x" * (4 * 1024 * 1024)
            call = echo_call(8, big)
            for start in range(0, len(call), 1 << 20):
                await gw.stdin.send(call[start : start + (1 << 20)])
            assert text_of(await gw.answer(8)) == big
            # crlf framing
            await gw.stdin.send(echo_call(9, "crlf")[:-1] + b"\r\n")
            assert text_of(await gw.answer(9)) == "crlf"


async def test_eof_in_the_middle_of_a_message_ends_the_gateway_and_its_downstream(tmp_path: Path) -> None:
    async with raw_gateway(tmp_path) as gw:
        with anyio.fail_after(WAIT):
            await gw.handshake()
            await gw.stdin.send(echo_call(2, "before"))
            assert text_of(await gw.answer(2)) == "before"
            children = descendants(gw.process.pid)
            assert children  # the downstream echo server (and the serving child)
            await gw.stdin.send(echo_call(3, "cut")[:20])
            await gw.stdin.aclose()
            assert await gw.process.wait() == 0
            rest = b""
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    rest += await gw.stdout.receive()
            assert b'"id":3' not in rest  # half a message is not a call
        assert all_gone(children)


async def test_a_client_that_closes_its_end_of_stdout_ends_the_gateway_cleanly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()  # our own pipe: anyio's aclose() of a process's stdout leaves its fd open
    try:
        process = await anyio.open_process(
            [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(config(tmp_path))],
            stdout=write_end,
            cwd=tmp_path,
            start_new_session=True,
        )
    finally:
        os.close(write_end)
    assert process.stdin is not None
    try:
        with anyio.fail_after(WAIT):
            await process.stdin.send(line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
            first = await anyio.to_thread.run_sync(read_line, read_end)
            assert json.loads(first)["id"] == 1
            children = descendants(process.pid)
            os.close(read_end)  # the gateway's stdout is now a broken pipe
            read_end = -1
            assert await process.wait() == 0
    finally:
        if read_end >= 0:
            os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.aclose()
    assert all_gone(children)


async def test_a_regular_file_as_stdout_falls_back_to_the_sdk_transport(tmp_path: Path) -> None:
    answers = tmp_path / "answers.jsonl"
    with answers.open("wb") as stdout:
        process = await anyio.open_process(
            [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(config(tmp_path))],
            stdout=stdout,
            cwd=tmp_path,
            start_new_session=True,
        )
    assert process.stdin is not None
    try:
        with anyio.fail_after(WAIT):
            await process.stdin.send(line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
            await process.stdin.send(line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            await process.stdin.send(line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            await eventually(lambda: b'"id":2' in answers.read_bytes(), within=WAIT)
            await process.stdin.aclose()
            assert await process.wait() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.aclose()
    found = {m.get("id"): m for m in map(json.loads, answers.read_bytes().splitlines())}
    assert "echo" in {tool["name"] for tool in found[2]["result"]["tools"]}


STARTS_IN_S = 3  # the backend's shell sleeps this long first: the client's requests arrive during the startup wait


def slow_start_config(tmp_path: Path, drain_s: float = 5.0) -> Path:
    argv = ["-c", f"sleep {STARTS_IN_S} && exec {shlex.join(echo_argv('--stdio'))}"]
    path = tmp_path / "federation.yaml"
    path.write_text(
        f"gateway:\n  drain_s: {drain_s}\n  audit: {{path: {json.dumps(str(tmp_path / 'audit.db'))}}}\n"
        f"servers:\n  e:\n    transport: stdio\n    command: sh\n    args: {json.dumps(argv)}\n"
    )
    return path


def ledger(tmp_path: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(tmp_path / "audit.db")) as db:
        return [(tool, status) for tool, status in db.execute("SELECT tool, status FROM calls ORDER BY id")]


def answers_in(data: bytes) -> dict[Any, dict[str, Any]]:
    return {m.get("id"): m for m in map(json.loads, data.splitlines()) if "id" in m}


@pytest.mark.parametrize("stdout", ["pipe", "file"])  # the edge's own transport, and the SDK's it falls back to
async def test_requests_read_before_stdin_closes_during_startup_are_all_answered(tmp_path: Path, stdout: str) -> None:
    # `(printf INIT INITIALIZED tools/list; sleep 3) | gateway serve --stdio`: the list waited for the backend,
    # stdin's end cancelled it, and the client got no answer at all.
    answers_file = tmp_path / "answers.jsonl"
    with answers_file.open("wb") as file:
        process = await anyio.open_process(
            [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(slow_start_config(tmp_path))],
            stdout=subprocess.PIPE if stdout == "pipe" else file,
            cwd=tmp_path,
            start_new_session=True,
        )
    assert process.stdin is not None
    try:
        with anyio.fail_after(WAIT):
            await process.stdin.send(
                line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})
                + line({"jsonrpc": "2.0", "method": "notifications/initialized"})
                + line({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
                + echo_call(4, "asked while starting")
            )
            await process.stdin.aclose()
            data = b""
            if process.stdout is not None:
                with contextlib.suppress(anyio.EndOfStream):
                    while True:
                        data += await process.stdout.receive()
            assert await process.wait() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.aclose()
    found = answers_in(data or answers_file.read_bytes())
    assert sorted(found) == [1, 3, 4], found
    assert "echo" in {tool["name"] for tool in found[3]["result"]["tools"]}
    assert text_of(found[4]) == "asked while starting"
    assert ledger(tmp_path) == [("echo", "ok")]


async def test_a_call_still_running_when_stdin_closes_gets_drain_s_then_a_shutdown_answer_and_its_row(
    tmp_path: Path,
) -> None:
    process = await anyio.open_process(
        [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(slow_start_config(tmp_path, drain_s=1))],
        cwd=tmp_path,
        start_new_session=True,
    )
    gw = Raw(process)
    try:
        with anyio.fail_after(WAIT):
            await gw.handshake()
            await gw.stdin.send(
                line({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sleep", "arguments": {}}})
                + line(
                    {
                        "jsonrpc": "2.0",
                        "id": 3,
                        "method": "tools/call",
                        "params": {"name": "sleep", "arguments": {"seconds": 0.2}},
                    }
                )
            )
            await gw.stdin.aclose()
            data = gw.buffer
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    data += await gw.stdout.receive()
            assert await process.wait() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.aclose()
    found = answers_in(data)
    assert sorted(found) == [2, 3], found
    assert text_of(found[3]) == "slept"
    assert found[2]["result"]["isError"] is True
    assert "the gateway is shutting down: its stdin closed (calls had 1 s to finish)" in text_of(found[2])
    assert sorted(ledger(tmp_path)) == [("sleep", "cancelled"), ("sleep", "ok")]


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


async def test_a_handshake_era_connection_refuses_an_enveloped_request_and_keeps_serving(tmp_path: Path) -> None:
    """The first request decides the era (front/server.py ``opening_request``); lines before it that are not
    requests (here ten that do not parse, and a notification) are no request, and a request of the other era is
    refused on its own."""
    async with raw_gateway(tmp_path) as gateway:
        with anyio.fail_after(WAIT):
            await gateway.stdin.send(b"not json\n" * 10)
            await gateway.stdin.send(line({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
            await gateway.handshake()
            enveloped = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": MODERN_META}}
            await gateway.stdin.send(line(enveloped))
            refused = await gateway.answer(2)
            assert refused["error"]["code"] == -32600
            assert "handshake protocol era" in refused["error"]["message"]
            await gateway.stdin.send(echo_call(3, "still served"))
            assert text_of(await gateway.answer(3)) == "still served"


async def test_a_connection_opened_by_an_enveloped_request_is_served_statelessly_and_refuses_initialize(
    tmp_path: Path,
) -> None:
    async with raw_gateway(tmp_path) as gateway:
        with anyio.fail_after(WAIT):
            listed = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": MODERN_META}}
            await gateway.stdin.send(line(listed))
            assert "echo" in [tool["name"] for tool in (await gateway.answer(1))["result"]["tools"]]
            call = {"name": "echo", "arguments": {"text": "stateless"}, "_meta": MODERN_META}
            await gateway.stdin.send(line({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}))
            assert text_of(await gateway.answer(2)) == "stateless"
            await gateway.stdin.send(line({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": INIT}))
            refused = await gateway.answer(3)
            assert refused["error"]["code"] == -32022
            assert "2026-07-28" in refused["error"]["data"]["supported"]
