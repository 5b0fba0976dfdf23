"""Several real gateway replicas behind a real HAProxy, sharing a real PostgreSQL ledger and a real Redis, and the
clients that load them: session-era (2025-11-25) clients that initialize once and never again, and stateless
(2026-07-28) clients. Used by tests/test_replicas.py and bench/bench_replicas.py."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

from gateway.backends.processes import children
from tests.engines import HAProxy, haproxy_binary, started
from tests.fixtures.gateway_proc import FIDELITY, PYTHON, echo_argv, run_gateway
from tests.fixtures.procs import RunningServer

SESSION_ERA = "2025-11-25"
MODERN = "2026-07-28"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
TOKENS = "alice=tok-alice,bob=tok-bob"
STATE_KEY = "replicas-" + "d" * 40
CALL_TIMEOUT_S = 15.0


def replica_config(pg_url: str | None, redis_url: str | None, *, fidelity: bool = False) -> str:
    audit = f"{{path: audit.db, url: '{pg_url}'}}" if pg_url else "{path: audit.db}"
    shared = f"{{redis_url: '{redis_url}'}}" if redis_url else "{}"
    return f"""
gateway:
  audit: {audit}
  shared: {shared}
  auth:
    caller_limits: [{{callers: ["*"], requests_per_s: 100000, burst: 100000}}]
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
""" + (
        f"""  f:
    transport: stdio
    command: {PYTHON}
    args: [{json.dumps(FIDELITY)}, --stdio, --name, f]
"""
        if fidelity
        else ""
    )


@contextmanager
def deployment(
    root: Path,
    replicas: int,
    *,
    pg_url: str | None,
    redis_url: str | None,
    fidelity: bool = False,
    balance: str = "balance roundrobin",
) -> Iterator[tuple[list[RunningServer], HAProxy]]:
    """``replicas`` gateway processes (each in its own folder: its spool and logs) behind one HAProxy."""
    with ExitStack() as stack:
        servers = []
        for index in range(replicas):
            folder = root / f"replica{index}"
            folder.mkdir()
            env = {"GATEWAY_STATE_KEY": STATE_KEY}
            config = replica_config(pg_url, redis_url, fidelity=fidelity)
            servers.append(stack.enter_context(run_gateway(config, folder, tokens=TOKENS, env=env)))
        ports = [int(server.url().split(":")[2].split("/")[0]) for server in servers]
        yield servers, stack.enter_context(started(HAProxy(haproxy_binary(), ports, balance=balance)))


@dataclass
class Outcome:
    kind: str
    client: int
    text: str
    started: float
    ended: float
    ok: bool
    detail: str = ""
    replica: str = ""


@dataclass
class Load:
    """Clients calling ``echo`` in a loop through ``url`` until ``stop`` is set; every call's outcome."""

    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: anyio.Event = field(default_factory=anyio.Event)
    initializes: int = 0
    _waiters: list[tuple[int, anyio.Event]] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(1 for o in self.outcomes if o.ok)

    async def wait_answered(self, more: int) -> None:
        target = self.answered + more
        event = anyio.Event()
        self._waiters.append((target, event))
        await event.wait()

    def _record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        answered = self.answered
        for target, event in list(self._waiters):
            if answered >= target:
                event.set()
                self._waiters.remove((target, event))

    async def _post(self, http: httpx2.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> httpx2.Response:
        with anyio.fail_after(CALL_TIMEOUT_S):
            return await http.post(self.url, json=body, headers=headers)

    async def session_client(self, index: int) -> None:
        base = {"Authorization": "Bearer tok-alice", "Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": SESSION_ERA,
                    "capabilities": {},
                    "clientInfo": {"name": f"session-{index}", "version": "1"},
                },
            }
            opened = await self._post(http, init, base)
            assert opened.status_code == 200, opened.text
            self.initializes += 1
            headers = {**base, "Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": SESSION_ERA}
            done = await self._post(http, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
            assert done.status_code == 202, done.text
            await self._loop(http, "session", index, headers, {})

    async def stateless_client(self, index: int) -> None:
        headers = {
            "Authorization": "Bearer tok-bob",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": "echo",
        }
        async with httpx2.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
            await self._loop(http, "stateless", index, headers, {"_meta": MODERN_META})

    async def _loop(
        self, http: httpx2.AsyncClient, kind: str, index: int, headers: dict[str, str], extra: dict[str, Any]
    ) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            text = f"{kind}-{index}-{n}"
            body = {
                "jsonrpc": "2.0",
                "id": n,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": text}, **extra},
            }
            started = time.monotonic()
            try:
                response = await self._post(http, body, headers)
            except (httpx2.HTTPError, TimeoutError) as exc:
                self._record(Outcome(kind, index, text, started, time.monotonic(), False, type(exc).__name__))
                continue
            ended = time.monotonic()
            replica = response.headers.get("x-replica", "")
            got = _echoed(response, n)
            ok = got == text
            detail = "" if ok else f"HTTP {response.status_code}: {response.text[:2000]}"
            self._record(Outcome(kind, index, text, started, ended, ok, detail, replica))


def _echoed(response: httpx2.Response, request_id: int) -> str | None:
    """The text of the echo result for ``request_id`` in a JSON or SSE answer; None for anything else."""
    if response.status_code != 200:
        return None
    if response.headers.get("content-type", "").startswith("application/json"):
        messages = [response.json()]
    else:
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        messages = [json.loads(item) for item in data if item]
    for message in messages:
        if message.get("id") == request_id and "result" in message:
            content = message["result"].get("content") or [{}]
            text = content[0].get("text")
            return text if isinstance(text, str) else None
    return None


def kill_replica(server: RunningServer) -> None:
    """SIGKILL a replica's gateway, as a crash would, and wait until its supervisor has cleaned up and exited.

    ``gateway serve`` is a supervisor and the gateway, its child (backends/processes.py): the gateway is the one
    killed (a SIGKILL of the supervisor alone would reach the gateway as a SIGTERM, and it would drain gracefully);
    the supervisor then kills what the gateway left (its downstream servers) and exits 137."""
    for pid in children(server.process.pid):
        os.kill(pid, signal.SIGKILL)
    assert server.process.wait(timeout=30) == 128 + signal.SIGKILL
