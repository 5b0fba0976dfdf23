"""A client that reads each answer to its end, on one kept-alive connection: the gateway against the server direct.

The SDK's client (bench_gateway.py) hands a call's result over as soon as its SSE event arrives and sends the next
request on another pooled connection while the first answer's end is still on its way, so it does not see a delay
in the *end* of an answer. Most HTTP clients (fetch, a JSON answer, a proxy in between) wait for the end before they
send the next request on the connection. This one does: each request in one write (TCP_NODELAY), the response read
to its last byte (Content-Length, or the chunked terminator), then the next request on the same connection.

    .venv/bin/python bench/bench_keepalive.py [-n CALLS] [--baseline DIR]

Targets: ``tests/fixtures/echo_server.py`` over streamable HTTP (direct), ``gateway serve`` in front of it (audit
ledger on, the default), and with ``--baseline DIR`` another checkout's ``gateway serve``, interleaved call by call.
Markdown to stdout: p50 and p90 per target and method (``ping``, a ``tools/call`` of ``echo``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import LOOPBACK, Procs, free_port, say  # noqa: E402
from bench.run_env import environment  # noqa: E402

PY = sys.executable
ECHO = ROOT / "tests" / "fixtures" / "echo_server.py"
TOKEN = "tok-bench"
VERSION = "2025-06-18"
READY_S = 60.0


class Connection:
    """One kept-alive HTTP/1.1 connection to an MCP endpoint, with its MCP session."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection((LOOPBACK, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.session: str | None = None
        self.buffer = b""
        hello = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
        head, _ = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"mcp-session-id:"):
                self.session = line.split(b":", 1)[1].strip().decode()
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message: dict[str, object]) -> tuple[bytes, bytes]:
        body = json.dumps(message).encode()
        session = f"Mcp-Session-Id: {self.session}\r\n" if self.session else ""
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: {LOOPBACK}:{self.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
            f"Mcp-Protocol-Version: {VERSION}\r\n{session}Content-Length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)
        return self._response()

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def _response(self) -> tuple[bytes, bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in head.split(b"\r\n")[1:])}
        if b"content-length" in fields:
            size = int(fields[b"content-length"])
            while len(self.buffer) < size:
                self._read()
            body, self.buffer = self.buffer[:size], self.buffer[size:]
            return head, body
        while b"\r\n0\r\n\r\n" not in self.buffer and not self.buffer.startswith(b"0\r\n\r\n"):
            self._read()
        end = self.buffer.index(b"0\r\n\r\n") + 5 if self.buffer.startswith(b"0\r\n") else None
        if end is None:
            end = self.buffer.index(b"\r\n0\r\n\r\n") + 7
        body, self.buffer = self.buffer[:end], self.buffer[end:]
        return head, body


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {READY_S:g} s")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="calls per target and method")
    parser.add_argument("--baseline", type=Path, help="another checkout of the gateway, measured in the same rounds")
    args = parser.parse_args()
    env = environment()
    with tempfile.TemporaryDirectory(prefix="bench-keepalive-") as folder:
        procs = Procs(Path(folder))
        try:
            echo_port = free_port()
            procs.start("echo", [PY, str(ECHO), "--http", str(echo_port)])
            config = Path(folder) / "federation.yaml"
            config.write_text(
                f'servers:\n  echo: {{transport: streamable_http, url: "http://{LOOPBACK}:{echo_port}/mcp"}}\n'
            )
            targets = {"direct": echo_port}
            checkouts = {"gateway": ROOT} | ({"gateway, baseline": args.baseline.resolve()} if args.baseline else {})
            for name, checkout in checkouts.items():
                port = free_port()
                gateway_env = {**os.environ, "PYTHONPATH": str(checkout), "GATEWAY_TOKENS": f"bench={TOKEN}"}
                argv = [PY, "-m", "gateway", "--log-level", "warning", "serve", "-c", str(config), "--port", str(port)]
                procs.start(name, argv, env=gateway_env, cwd=Path(folder))
                targets[name] = port
            for port in targets.values():
                _wait_port(port)
            say(f"targets up: {', '.join(targets)}")
            connections = {name: Connection(port) for name, port in targets.items()}
            tool = {"name": "echo", "arguments": {"text": "bench"}}
            methods = {"ping": ("ping", None), "tools/call echo": ("tools/call", tool)}
            samples: dict[tuple[str, str], list[float]] = {(t, m): [] for t in targets for m in methods}
            for i in range(args.n):
                for label, (method, params) in methods.items():
                    for name, connection in connections.items():
                        message: dict[str, object] = {"jsonrpc": "2.0", "id": i + 1, "method": method}
                        if params is not None:
                            message["params"] = params
                        started = time.perf_counter()
                        connection.post(message)
                        samples[(name, label)].append(time.perf_counter() - started)
        finally:
            procs.stop_all(grace_s=5.0)
    print(f"Gateway {env['gateway']}, {env['cpus']} CPUs, load {env['load_before']} before; {args.n} calls each.\n")
    print("| target | method | p50 ms | p90 ms |\n|---|---|---|---|")
    for (name, label), values in samples.items():
        print(f"| {name} | {label} | {_pct(values, 0.5):.2f} | {_pct(values, 0.9):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
