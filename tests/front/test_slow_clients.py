"""A client that stops reading its call's stream costs the gateway a bounded amount and nobody else anything. Over
stdio, a downstream flooding that call with progress is read as fast as it writes (the shared session is never held
up), the progress is coalesced to the latest while the client does not take it, and the call is given up for that
client alone once it has taken nothing while more than ``gateway.edge.client_buffer_bytes`` of progress went unread
(seconds, not ``client_stall_s``). Over streamable HTTP the call goes on a session of the caller's own, which is held
back while the client does not read, as its own connection to the server would be: nothing is coalesced, a client
that reads again gets every notification, and one that never does is given up after ``client_stall_s``. The stream
left unread holds up none of its session's other answers either. Over a real gateway process, a real downstream over a
stdio pipe and over loopback HTTP, and a raw socket that never reads."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.front.http.transport import UNSENT_BYTES
from gateway.front.outbox import SLOW_S
from tests.fixtures import FIXTURES
from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import PYTHON, first_text, mcp_session, run_gateway
from tests.fixtures.procs import LOOPBACK, RunningServer
from tests.fixtures.raw_http import ACCEPT, headers, open_session
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKENS = "mallory=tok-mallory-0123,bob=tok-bob-4567"
STALL_S = 6
"""``gateway.edge.client_stall_s`` here (30 s by default)."""
FLOOD = {"count": 60_000, "size": 2_000, "then_s": 30}
"""120 MB of progress, far more than every buffer between the downstream and the client holds, then more for half
a minute: long past ``client_stall_s``."""


def rss_mb(server: RunningServer) -> float:
    """The VmRSS of the gateway proper (``gateway serve`` forks it under a supervisor: the child with its command)."""
    pid = server.process.pid
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    serving = next((int(c) for c in children if Path(f"/proc/{c}/cmdline").read_bytes() == own), pid)
    for line in Path(f"/proc/{serving}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


MODERN = "2026-07-28"


@contextmanager
def never_reading(
    port: int, session: str | None, arguments: dict[str, int], receive_buffer: int | None = 4096
) -> Iterator[socket.socket]:
    """A raw connection to ``port`` that POSTs a ``flood`` call with a progress token, then never reads a byte of its
    answer; its kernel receive buffer is ``receive_buffer`` (None: the kernel's default). On ``session`` (a
    handshake-era client's), or with no session as a 2026-07-28 client."""
    meta: dict[str, object] = {"progressToken": "p"}
    if session is None:
        meta |= {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
        era = f"Mcp-Protocol-Version: {MODERN}\r\nMcp-Method: tools/call\r\nMcp-Name: flood\r\n"
    else:
        era = f"Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-06-18\r\n"
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {"name": "flood", "arguments": arguments, "_meta": meta},
        }
    ).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nAuthorization: Bearer tok-mallory-0123\r\n"
        f"Accept: {ACCEPT}\r\nContent-Type: application/json\r\n{era}Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    try:
        sock.connect((LOOPBACK, port))
        sock.sendall(head + body)
        yield sock
    finally:
        sock.close()


def over(notes: Path) -> bool:
    """The flood is over: the downstream said all of it, or was told to stop."""
    text = notes.read_text()
    return "flood done" in text or "flood stopped" in text


def config(transport: str, notes: Path, downstream: Downstreams) -> str:
    if transport == "stdio":
        server = {
            "transport": "stdio",
            "command": PYTHON,
            "args": [str(FIXTURES / "faults_server.py"), "--stdio"],
            "env": {"FIXTURE_NOTES": str(notes)},
        }
    else:
        served = downstream("faults", "streamable_http", env={"FIXTURE_NOTES": str(notes)}, own=True)
        server = served.settings()
    return f"""
gateway:
  audit: {{enabled: false}}
  edge: {{client_stall_s: {STALL_S}}}
servers:
  f: {json.dumps(server)}
"""


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
async def test_a_client_that_stops_reading_a_flood_of_progress_costs_nobody_else_and_bounded_memory(
    tmp_path: Path, downstream: Downstreams, transport: str
) -> None:
    notes = tmp_path / "notes"
    with run_gateway(config(transport, notes, downstream), tmp_path, tokens=TOKENS) as gateway:
        async with mcp_session(gateway.url(), token="tok-bob-4567") as bob:
            with anyio.fail_after(20):
                assert first_text(await bob.call_tool("echo", {"text": "warm"})) == "warm"
            before = rss_mb(gateway)
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, gateway.url(), "tok-mallory-0123")
            with never_reading(gateway.port, session, FLOOD):
                await eventually(lambda: notes.exists() and "flood started" in notes.read_text(), within=20)
                flooded, ended = time.monotonic(), 0.0
                slowest, index = 0.0, 0
                with anyio.fail_after(120):  # another caller's calls on the same backend, until the flood is over
                    while index < 20 or not over(notes):
                        started = time.monotonic()
                        with anyio.fail_after(10):
                            assert first_text(await bob.call_tool("echo", {"text": f"b{index}"})) == f"b{index}"
                        slowest, index = max(slowest, time.monotonic() - started), index + 1
                        ended = ended or (time.monotonic() if over(notes) else 0.0)
                grown = rss_mb(gateway) - before
                assert slowest < 5, f"another caller's call took {slowest:.1f} s"
                assert grown < 60, f"the gateway grew {grown:.0f} MB while a client did not read"
                assert "flood stopped" in notes.read_text()  # the gateway gave the call up, and told the downstream
                # within seconds: over stdio as soon as it is clear the client takes nothing (the flood is work for no
                # one, on the CPUs everyone shares), over HTTP after client_stall_s (the flood was held back)
                lasted = (ended or time.monotonic()) - flooded
                assert lasted < STALL_S + 9, f"the flood went on {lasted:.1f} s"
            with anyio.fail_after(10):  # and the backend serves on
                assert first_text(await bob.call_tool("echo", {"text": "after"})) == "after"
        log = gateway.output()
    shed = next(json.loads(line) for line in log.splitlines() if '"client.shed"' in line)
    assert shed["caller"] == "mallory"
    if transport == "stdio":
        assert "of its progress went unread while it took nothing" in shed["reason"]
    else:
        assert "it took no progress for more than gateway.edge.client_stall_s (6 s)" in shed["reason"]


async def test_over_http_a_client_that_pauses_holds_back_its_own_session_and_then_gets_every_notification(
    tmp_path: Path, downstream: Downstreams
) -> None:
    """Its call's downstream waits for it, not the other callers: nothing is coalesced or given up."""
    notes, count = tmp_path / "notes", 20_000  # about 5 MB of progress: far more than the buffers on the way hold
    with run_gateway(config("streamable_http", notes, downstream), tmp_path, tokens=TOKENS) as gateway:
        async with mcp_session(gateway.url(), token="tok-bob-4567") as bob, httpx2.AsyncClient(timeout=60) as http:
            session = await open_session(http, gateway.url(), "tok-mallory-0123")
            call = {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "tools/call",
                "params": {"name": "flood", "arguments": {"count": count}, "_meta": {"progressToken": "p"}},
            }
            before = rss_mb(gateway)
            async with http.stream(
                "POST", gateway.url(), json=call, headers=headers("tok-mallory-0123", session)
            ) as reply:
                assert reply.status_code == 200
                await eventually(lambda: notes.exists() and "flood started" in notes.read_text(), within=20)
                paused, index = time.monotonic(), 0
                while time.monotonic() - paused < 3 * SLOW_S:  # she reads nothing; bob's calls go on meanwhile
                    with anyio.fail_after(5):
                        assert first_text(await bob.call_tool("echo", {"text": f"b{index}"})) == f"b{index}"
                    index += 1
                grown = rss_mb(gateway) - before
                with anyio.fail_after(60):
                    body = await reply.aread()
        assert grown < 30, f"the gateway grew {grown:.0f} MB while a client paused"
        said = [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:") and line[5:]]
        progress = [m["params"]["progress"] for m in said if m.get("method") == "notifications/progress"]
        assert progress == list(range(1, count + 1))  # every one, in order: nothing coalesced
        assert said[-1]["result"]["content"][0]["text"] == f"flooded {count}"
        assert "flood done" in notes.read_text()
        log = gateway.output()
    assert '"client.shed"' not in log


async def held(server: Downstream) -> int:
    """How many progress notifications ``server``'s floods have sent once it is held back: the count no longer grows
    (the same over three readings 0.4 s apart)."""
    readings: list[int] = []
    async with mcp_session(server.url()) as direct:
        with anyio.fail_after(60):
            while len(readings) < 3 or len(set(readings[-3:])) > 1:
                readings.append(int(first_text(await direct.call_tool("flood_sent", {}))))
                await anyio.sleep(0.4)  # the count is another process's: read it again a moment later
    return readings[-1]


async def test_over_http_a_server_flooding_a_client_that_never_reads_is_held_back_as_soon_as_by_the_client_itself(
    tmp_path: Path, downstream: Downstreams
) -> None:
    """The gateway's connection to a loopback server keeps the kernel's default receive buffer, as a client's own
    connection does. Grown (the kernel grows the buffer of a connection read fast, as the gateway reads while the
    client's buffers fill), the server filled it too before it was held back: up to 1.45 times what it sends a client
    that never reads, where the gateway's own buffers towards the client (64 KiB here) add little."""
    # About 330 bytes each: 13 MB, about three times what the buffers on the way hold; what is left of it once a
    # reader goes away is sent into the closed stream (the server's handler is not cancelled), in a second or two.
    flood = {"count": 40_000, "size": 200}
    direct, through = (downstream("faults", "streamable_http", own=True) for _ in range(2))
    cfg = f"""
gateway:
  audit: {{enabled: false}}
  edge: {{client_stall_s: 60, send_buffer_bytes: 65536}}
servers:
  f: {json.dumps(through.settings())}
"""
    with run_gateway(cfg, tmp_path, tokens=TOKENS) as gateway:
        async with httpx2.AsyncClient(timeout=10) as http:
            alone = await open_session(http, direct.url(), "tok-mallory-0123")
            session = await open_session(http, gateway.url(), "tok-mallory-0123")
        with never_reading(direct.port, alone, flood, receive_buffer=None):
            sent_direct = await held(direct)
        with never_reading(gateway.port, session, flood, receive_buffer=None):
            sent_through = await held(through)
    assert sent_direct > 1000  # the flood filled the buffers on the way, and was held there
    assert sent_through <= 1.3 * sent_direct, f"{sent_through} sent through the gateway, {sent_direct} direct"


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
async def test_a_stream_its_client_stopped_reading_holds_up_nothing_else_of_its_session(
    tmp_path: Path, downstream: Downstreams, transport: str
) -> None:
    """Every message a session sends passed one router task, which waited with it for room in its request's stream:
    once a stream its client stopped reading was full, the session's other answers waited behind it, for as long as
    that connection stayed open."""
    notes = tmp_path / "notes"
    with run_gateway(config(transport, notes, downstream), tmp_path, tokens=TOKENS) as gateway:
        async with httpx2.AsyncClient(timeout=30) as http:
            session = await open_session(http, gateway.url(), "tok-mallory-0123")
            with never_reading(gateway.port, session, FLOOD):
                await eventually(lambda: notes.exists() and "flood started" in notes.read_text(), within=20)
                for index in range(5):  # the same client's other calls, on the same session, while it holds the flood
                    call = {
                        "jsonrpc": "2.0",
                        "id": 100 + index,
                        "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"text": f"m{index}"}},
                    }
                    with anyio.fail_after(10):
                        answered = await http.post(
                            gateway.url(), json=call, headers=headers("tok-mallory-0123", session)
                        )
                    assert answered.status_code == 200 and f'"m{index}"' in answered.text, answered.text


def read_to_the_answer(sock: socket.socket, within_s: float) -> bytes:
    """What ``sock`` is sent, read until its call's answer (id 9) and the end of its stream (blocking)."""
    sock.settimeout(within_s)
    received = b""
    deadline = time.monotonic() + within_s
    while not (b'"id":9' in received and received.endswith(b"0\r\n\r\n")) and time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


@pytest.mark.parametrize(
    ("transport", "era"), [("stdio", "handshake"), ("streamable_http", "handshake"), ("stdio", MODERN)]
)
async def test_a_client_that_never_reads_is_sent_little_more_than_its_kernel_takes(
    tmp_path: Path, downstream: Downstreams, transport: str, era: str
) -> None:
    """An event stream is not sent on while its connection holds ``UNSENT_BYTES`` unsent: a client that never reads
    costs the gateway that much relaying (about 30 of these 2 KB notifications) beyond what its own kernel took, not
    everything the gateway's send buffer holds (512 KiB here, the default) before anything noticed. Only then does the
    request's outbox see its client not taking (coalescing, then giving it up over stdio; holding the downstream back
    over HTTP, then giving it up after ``client_stall_s``)."""
    notes = tmp_path / "notes"
    with run_gateway(config(transport, notes, downstream), tmp_path, tokens=TOKENS) as gateway:
        session = None
        if era == "handshake":
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, gateway.url(), "tok-mallory-0123")
        with never_reading(gateway.port, session, FLOOD) as sock:
            await eventually(lambda: notes.exists() and "flood stopped" in notes.read_text(), within=STALL_S + 20)
            received = await anyio.to_thread.run_sync(read_to_the_answer, sock, 20.0)
    lines = received.decode(errors="replace").split("\r\n")
    progress = sum(len(line) for line in lines if line.startswith("data:") and '"notifications/progress"' in line)
    answer = next(json.loads(line[5:]) for line in lines if line.startswith("data:") and '"id":9' in line)
    assert "gave this request up" in answer["error"]["message"]
    # what the client's kernel took (4 KiB asked), UNSENT_BYTES, the 16 events its request's stream holds
    assert 0 < progress < UNSENT_BYTES + 64 * 1024, f"{progress:,} bytes of progress sent to a client that never read"
