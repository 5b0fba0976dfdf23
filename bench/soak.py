"""Soak the real gateway with faults: does one failure stay one failure, and does every call leave exactly one row?

    .venv/bin/python bench/soak.py [--quick] [--json OUT] [--only fault|ledger] [--no-http] [--gateway-breaker]
                                   [--keep DIR]

Everything runs on loopback and stops by itself: every loop is bounded in count and in time, every process the soak
starts is stopped at the end (and any process it finds left behind is reported, then killed). Markdown goes to stdout,
progress to stderr. The exit status is 0 whatever the figures say (the figures are the result); it is 2 only when
the harness itself failed (a gateway that never became ready, a scenario past its time limit, a bug here).

The gateway measured is the one in this checkout: ``python -m gateway serve`` with ``PYTHONPATH`` set to the project
root, a ``federation.yaml`` written into a temporary directory, ``GATEWAY_TOKENS`` giving every client its own
caller name, and the audit ledger on (``ledger.db`` in that directory). The downstreams are the test fixtures:
``tests/fixtures/echo_server.py`` (stdio, or streamable HTTP) and ``tests/fixtures/fake_cli.py`` (a CLI adapter).
Every process the gateway spawns carries ``SOAK_MARKER=<unique>`` in its environment (set through the config's
``env``), so processes left behind are found in /proc even after they were re-parented.

Scenario ``fault`` (isolation), once with a stdio downstream and once with a streamable-HTTP one:
  * 8 bystander sessions x 300 ``echo`` calls (``--quick``: 4 x 80), the SDK's client over streamable HTTP, each
    call's text unique (``b<session>-<index>``) so its ledger row is found by ``args_hash``. Each session starts a
    call at most every ``Plan.pace_s`` (30 ms; quick 40 ms): a failing call answers in a millisecond, and unpaced
    clients would spend all their calls inside the first crash window. The circuit breaker's cooldown is 1 s
    (``SOAK_BREAKER``; ``--gateway-breaker`` keeps the 30 s default), so a window measures the restart;
  * the downstream is SIGKILLed at 1/3 and at 2/3 of the calls (the second kill waits until the first crash window
    has closed). stdio: the process is found as the gateway's child in /proc and the gateway restarts it itself;
    HTTP: the soak kills its own echo server and starts it again on the same port at once;
  * one client sends bad input throughout, as raw bytes over httpx2 on a session of its own: a lone surrogate as a
    JSON escape (``"\\ud800"``) and as raw bytes (ED A0 80, invalid UTF-8), a 900-deep nested argument, a 1 MB tool
    name, and a ``tools/call`` whose id is 1.5;
  * one client opens sessions (``initialize``) and never closes them.
  Reported: calls made and answers received, counted per JSON-RPC request id and session on the HTTP wire (a
  transport wrapped around the client's httpx2 connection reads every POST and every JSON or SSE answer; every
  request must get exactly one answer; errors the SDK client makes up itself are not answers); bystander error rates
  outside and inside the crash windows (a window runs from a kill to the end of the first successful call started
  after it, plus ``WINDOW_MARGIN_S``) and what the errors were; the gateway's VmRSS at the start (after 20 warm-up
  calls), peak (sampled every 0.1 s) and end, and VmHWM; the downstream restarts the gateway went through (distinct
  downstream pids, and ready-again transitions on ``/status``); the client sessions the gateway holds (``/status``
  ``connections``); the backend's state at the end; the ledger's rows against the calls made (a call answered with a
  JSON-RPC error, e.g. "Unknown tool" while the backend restarts, is told apart from one answered with a result);
  processes left after the gateway's shutdown (one SIGTERM). ``--no-http`` skips the run with the HTTP downstream.

Scenario ``ledger`` (durability):
  * phase A: 4 sessions of continuous calls alternating the stdio ``echo`` tool and a CLI adapter tool, plus two
    sessions that keep a long call in flight (the adapter's ``hang`` and the echo server's ``sleep``); the downstream
    is SIGKILLed twice; then the gateway gets SIGTERM and, 1 s later, a second SIGTERM, with calls in flight;
  * the processes still alive afterwards that the gateway started (by marker, and by its session id) are listed;
  * phase B: a new gateway on the same ledger file, the 4 sessions make 100 calls each (quick: 25), then one
    SIGTERM while the two long calls are in flight (the graceful path, for comparison).
  A call still waiting for its answer 3 s after the gateway stopped is abandoned and counted as unanswered
  ("pending" or "transport" in the outcomes).
  Reported per phase: calls sent (every ``call_tool``, answered or not), answers, the rows in the ledger, rows
  missing for answered calls (the ledger's guarantee: an answer implies its row), rows missing for unanswered calls,
  duplicate rows (by ``args_hash``, each call's arguments being unique, and by ``correlation_id``), rows no call
  explains, how the gateway exited, and leftover processes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import socket
import sqlite3
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import LOOPBACK, Proc, cmdline, descendants, free_port, say, vm_kb  # noqa: E402
from bench.procs import Procs as ProcsBase  # noqa: E402
from bench.run_env import environment, load_average  # noqa: E402
from gateway.ledger.records import args_hash  # noqa: E402  (the ledger's own definition of a call's identity)

ECHO = ROOT / "tests" / "fixtures" / "echo_server.py"
FAKE_CLI = ROOT / "tests" / "fixtures" / "fake_cli.py"
PY = sys.executable
META_KEY = "mcp-gateway/call"  # gateway/router.py: the correlation id travels in the result's _meta under this key
READY_TIMEOUT_S = 60.0  # a gateway importing the SDK and starting its downstream on a busy 2-core machine
STOP_TIMEOUT_S = 20.0  # how long a stopping gateway may take before the soak SIGKILLs it (and says so)
CALL_TIMEOUT_S = 30.0  # a call with no answer after this long counts as unanswered
WINDOW_MARGIN_S = 0.5
SAMPLE_S = 0.1  # how often RSS, downstream pids and /status are sampled
SCENARIO_LIMIT_S = 900.0


@dataclass(frozen=True)
class Plan:
    sessions: int
    calls: int
    bad_interval_s: float
    opener_interval_s: float
    opener_max: int
    ledger_sessions: int
    ledger_phase_a_s: float  # load before the first kill; each later step waits for recovery plus this / 2
    ledger_phase_b_calls: int
    pace_s: float  # each client starts a call at most this often (see drive())


FULL = Plan(
    sessions=8,
    calls=300,
    bad_interval_s=0.05,
    opener_interval_s=0.05,
    opener_max=2000,
    ledger_sessions=4,
    ledger_phase_a_s=4.0,
    ledger_phase_b_calls=100,
    pace_s=0.03,
)
QUICK = Plan(
    sessions=4,
    calls=80,
    bad_interval_s=0.05,
    opener_interval_s=0.1,
    opener_max=300,
    ledger_sessions=4,
    ledger_phase_a_s=2.0,
    ledger_phase_b_calls=25,
    pace_s=0.04,
)


class HarnessError(RuntimeError):
    """The soak itself could not run (not a bad figure)."""


# ----------------------------------------------------------------------------------------------- /proc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session id) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[1]), int(fields[3])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def has_marker(pid: int, marker: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"SOAK_MARKER={marker}".encode() in env.split(b"\0")


def leftovers(marker: str, sid: int | None) -> list[dict[str, Any]]:
    """Live processes carrying ``marker`` in their environment or in session ``sid`` (the gateway's), not ours."""
    found = []
    for p in _pids():
        if p == os.getpid():
            continue
        st = _stat(p)
        if st is None:
            continue
        by = []
        if has_marker(p, marker):
            by.append("marker")
        if sid is not None and st[2] == sid:
            by.append("session")
        if by:
            found.append({"pid": p, "state": st[0], "ppid": st[1], "found_by": by, "cmd": cmdline(p)[-120:]})
    return found


def kill_all(found: list[dict[str, Any]]) -> None:
    for p in found:
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


# ----------------------------------------------------------------------------------------------- processes


class Procs(ProcsBase):
    """Every process the soak starts (bench/procs.py), and the markers of the processes its gateways start: at the
    end all are killed, and so is any process found carrying one of the markers."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.markers: list[str] = []

    def marker(self, label: str) -> str:
        m = f"soak-{os.getpid()}-{label}-{uuid.uuid4().hex[:8]}"
        self.markers.append(m)
        return m

    def stop_all_and_sweep(self) -> list[dict[str, Any]]:
        """SIGKILL every process started, then every live process carrying a marker; those are returned."""
        self.stop_all()
        stray = [p for m in self.markers for p in leftovers(m, None)]
        kill_all(stray)
        return stray


def gateway_env(tokens: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # the gateway of this checkout, whatever the venv's editable install points at
        "GATEWAY_TOKENS": ",".join(f"{name}={token}" for name, token in tokens.items()),
    }


SOAK_BREAKER: dict[str, float] = {"cooldown_s": 1.0, "max_cooldown_s": 2.0}
"""The soak's circuit breaker (failure_threshold stays the default 5): with the gateway's 30 s cooldown, a breaker
that opens when the calls in flight at a kill fail (it does, depending on timing) keeps the backend out for longer
than the whole run, and the crash windows would measure the cooldown, not the restart. ``--gateway-breaker`` keeps
the gateway's defaults instead."""
BREAKER: dict[str, float] | None = SOAK_BREAKER


def write_config(path: Path, servers: dict[str, Any], adapters: dict[str, Any] | None = None) -> Path:
    doc: dict[str, Any] = {
        "version": 1,
        "gateway": {
            "name": "soak",
            "audit": {"enabled": True, "path": str(path.parent / "ledger.db")},
            "naming": {"mode": "always"},
        },
        "servers": servers,
    }
    if BREAKER is not None:
        doc["gateway"]["circuit_breaker"] = BREAKER
    if adapters:
        doc["adapters"] = adapters
    path.write_text(json.dumps(doc, indent=2))  # JSON is YAML
    return path


class Gateway:
    def __init__(self, procs: Procs, name: str, config: Path, tokens: dict[str, str], watch_token: str) -> None:
        self.procs, self.name, self.config, self.tokens = procs, name, config, tokens
        self.watch_token = watch_token
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        assert self.proc is not None
        return f"http://{LOOPBACK}:{self.proc.port}/mcp"

    def base(self, path: str) -> str:
        assert self.proc is not None
        return f"http://{LOOPBACK}:{self.proc.port}{path}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def serving_pid(self) -> int:
        """The gateway proper (``gateway serve`` forks it under a small supervisor, whose memory never moves)."""
        assert self.proc is not None
        return self.proc.serving_pid

    async def start(self, http: httpx2.AsyncClient, backends: int) -> None:
        port = free_port()
        argv = [PY, "-m", "gateway", "--log-level", "info", "serve", "-c", str(self.config), "--port", str(port)]
        self.proc = self.procs.start(self.name, argv, port, env=gateway_env(self.tokens))
        with anyio.move_on_after(READY_TIMEOUT_S):
            while True:
                if self.proc.popen.poll() is not None:
                    raise HarnessError(f"{self.name} exited with {self.proc.popen.returncode}:\n{self.proc.output()}")
                doc = await self.status(http)
                ready = [b for b in (doc or {}).get("backends", []) if b.get("state") == "ready"]
                if doc is not None and len(ready) >= backends:
                    return
                await anyio.sleep(0.1)
        raise HarnessError(f"{self.name}: not ready after {READY_TIMEOUT_S:g} s:\n{self.proc.output()}")

    async def status(self, http: httpx2.AsyncClient) -> dict[str, Any] | None:
        try:
            r = await http.get(
                self.base("/status"), headers={"Authorization": f"Bearer {self.watch_token}"}, timeout=5.0
            )
            return dict(r.json()) if r.status_code == 200 else None
        except (httpx2.HTTPError, ValueError):
            return None

    def downstream_pids(self, needle: str) -> list[int]:
        """The gateway's descendants whose command line holds ``needle`` (a launcher in between is looked through)."""
        return [p for p in descendants(self.pid) if needle in cmdline(p)]

    async def stop(self, *, second_term_after: float | None = None) -> dict[str, Any]:
        """SIGTERM (and a second one after ``second_term_after`` s); SIGKILL if still alive after STOP_TIMEOUT_S."""
        assert self.proc is not None
        popen = self.proc.popen
        t0 = time.monotonic()
        out: dict[str, Any] = {"signals": ["SIGTERM"]}
        popen.send_signal(signal.SIGTERM)
        if second_term_after is not None:
            await anyio.sleep(second_term_after)
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
                out["signals"].append(f"SIGTERM after {second_term_after:g} s")
            else:
                out["signals"].append("(second SIGTERM not needed: already exited)")
        with anyio.move_on_after(STOP_TIMEOUT_S):
            while popen.poll() is None:  # noqa: ASYNC110 - another process
                await anyio.sleep(0.05)
        if popen.poll() is None:
            popen.kill()
            out["signals"].append(f"SIGKILL (still alive after {STOP_TIMEOUT_S:g} s)")
            await anyio.to_thread.run_sync(popen.wait)
        out["exit_code"] = popen.returncode
        out["exit_s"] = round(time.monotonic() - t0, 2)
        return out


# ----------------------------------------------------------------------------------------------- the wire


class Wire:
    """Every JSON-RPC request a session wrote and every answer it received, by request id."""

    def __init__(self) -> None:
        self.requests: dict[tuple[int, Any], str] = {}  # (session number, request id) -> method
        self.answers: collections.Counter[tuple[int, Any]] = collections.Counter()
        self.exceptions = 0  # transport errors the SDK put into the read stream
        self.sessions = 0  # request ids restart in every session: they are counted per session
        self.http = HttpWire()

    def summary(self) -> dict[str, int]:
        calls = [key for key, method in self.requests.items() if method == "tools/call"]
        return {
            "requests": len(self.requests),
            "tools_call_requests": len(calls),
            "answered_once": sum(1 for i in self.requests if self.answers[i] == 1),
            "unanswered": sum(1 for i in self.requests if self.answers[i] == 0),
            "answered_more_than_once": sum(1 for i in self.requests if self.answers[i] > 1),
            "answers_to_unknown_ids": sum(n for i, n in self.answers.items() if i not in self.requests),
            "tools_call_answered_once": sum(1 for key in calls if self.answers[key] == 1),
            "tools_call_unanswered": sum(1 for key in calls if self.answers[key] == 0),
            "tools_call_answered_more_than_once": sum(1 for key in calls if self.answers[key] > 1),
            "transport_exceptions": self.exceptions,
        } | self.http.summary()


class HttpWire:
    """What crossed the HTTP connection: JSON-RPC requests POSTed to the gateway and the answers the gateway sent
    back (a JSON body or SSE events, on the POST's stream or a GET stream), by (Mcp-Session-Id, request id).

    This is the exact count: the SDK's client also puts errors of its own making into the session (e.g. "SSE stream
    ended and reconnection attempts were exhausted" for a request whose stream broke), which are not answers."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, Any], str] = {}
        self.answers: collections.Counter[tuple[str, Any]] = collections.Counter()
        self.http_status: collections.Counter[int] = collections.Counter()
        self.unreached = 0  # POSTs that got no HTTP response at all

    def summary(self) -> dict[str, int]:
        calls = [key for key, method in self.requests.items() if method == "tools/call"]
        return {
            "http_requests_with_id": len(self.requests),
            "http_tools_call": len(calls),
            "http_tools_call_answered_once": sum(1 for key in calls if self.answers[key] == 1),
            "http_tools_call_unanswered": sum(1 for key in calls if self.answers[key] == 0),
            "http_tools_call_answered_more_than_once": sum(1 for key in calls if self.answers[key] > 1),
            "http_requests_unanswered": sum(1 for key in self.requests if self.answers[key] == 0),
            "http_answers_to_unknown_ids": sum(n for key, n in self.answers.items() if key not in self.requests),
        }


def _messages(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [m for m in (value if isinstance(value, list) else [value]) if isinstance(m, dict)]


class _TeeStream(httpx2.AsyncByteStream):
    """A response body passed through unchanged while its JSON-RPC answers are counted."""

    def __init__(self, inner: Any, wire: HttpWire, key: str, sse: bool) -> None:
        self._inner, self._wire, self._key, self._sse = inner, wire, key, sse
        self._buffer = ""

    def _count(self, text: str) -> None:
        for m in _messages(text):
            if "id" in m and "method" not in m and ("result" in m or "error" in m):
                self._wire.answers[(self._key, m["id"])] += 1

    def _events(self, final: bool) -> None:
        self._buffer = self._buffer.replace("\r\n", "\n")
        *events, self._buffer = self._buffer.split("\n\n")
        if final:
            events.append(self._buffer)
            self._buffer = ""
        for event in events:
            data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
            if data:
                self._count(data)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._buffer += chunk.decode(errors="replace")
            if self._sse:
                self._events(final=False)
            yield chunk

    async def aclose(self) -> None:
        if self._sse:
            self._events(final=True)
        elif self._buffer.strip():
            self._count(self._buffer)
        self._buffer = ""
        await self._inner.aclose()


class CountingTransport(httpx2.AsyncBaseTransport):
    def __init__(self, wire: HttpWire) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self._wire = wire

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            body = request.content
        except Exception:  # a streamed request body: not ours to read
            body = b""
        sent = [m for m in _messages(body.decode(errors="replace"))] if request.method == "POST" and body else []
        sent = [m for m in sent if "id" in m and "method" in m]
        key = request.headers.get("mcp-session-id")
        try:
            response = await self._inner.handle_async_request(request)
        except BaseException:  # sent, and no HTTP answer at all (connection refused or reset)
            self._wire.unreached += 1
            for m in sent:
                self._wire.requests[(key or f"-{self._wire.unreached}", m["id"])] = str(m["method"])
            raise
        self._wire.http_status[response.status_code] += 1
        key = key or response.headers.get("mcp-session-id") or f"-{id(response)}"
        for m in sent:
            self._wire.requests[(key, m["id"])] = str(m["method"])
        sse = "text/event-stream" in response.headers.get("content-type", "")
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, self._wire, key, sse),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CountingRead:
    """A read stream that counts answers (responses and errors) by id before the session sees them."""

    def __init__(self, inner: Any, wire: Wire, session: int) -> None:
        self._inner, self._wire, self._session = inner, wire, session

    def _see(self, item: Any) -> Any:
        message = getattr(getattr(item, "message", None), "root", getattr(item, "message", None))
        if isinstance(item, Exception):
            self._wire.exceptions += 1
        elif message is not None and hasattr(message, "id") and not hasattr(message, "method"):
            self._wire.answers[(self._session, message.id)] += 1
        return item

    async def receive(self) -> Any:
        return self._see(await self._inner.receive())

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _CountingRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _CountingRead:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:  # last_context and friends
        return getattr(self._inner, name)


class _CountingWrite:
    def __init__(self, inner: Any, wire: Wire, session: int) -> None:
        self._inner, self._wire, self._session = inner, wire, session

    async def send(self, item: Any, /) -> None:
        message = getattr(getattr(item, "message", None), "root", getattr(item, "message", None))
        if message is not None and hasattr(message, "method") and hasattr(message, "id"):
            self._wire.requests[(self._session, message.id)] = message.method
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _CountingWrite:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@asynccontextmanager
async def sdk_session(url: str, token: str, wire: Wire, name: str) -> AsyncIterator[Any]:
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30, read=300),
        trust_env=False,
        transport=CountingTransport(wire.http),
    ) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            wire.sessions += 1
            async with ClientSession(
                _CountingRead(read, wire, wire.sessions),
                _CountingWrite(write, wire, wire.sessions),
                read_timeout_seconds=CALL_TIMEOUT_S,
                client_info=types.Implementation(name=name, version="1.0"),
            ) as session:
                with anyio.fail_after(CALL_TIMEOUT_S):
                    await session.initialize()
                yield session


CLIENT_MADE = (
    "SSE stream ended",
    "Server returned an error response",
    "Session terminated",
    "Unexpected content type",
    "Failed to parse",
)
"""Error messages the SDK's streamable-HTTP client makes up itself (mcp/client/streamable_http.py) when a request's
stream broke or the HTTP answer was not JSON-RPC: no answer from the gateway."""


@dataclass
class Call:
    client: str
    index: int
    tool: str
    arguments: dict[str, Any]
    start: float
    end: float = 0.0
    outcome: str = "pending"  # ok | is_error | rpc_error | timeout | no_answer | transport | not_sent
    correlation_id: str | None = None
    detail: str = ""

    @property
    def tag(self) -> str:
        return str(self.arguments.get("text", self.arguments.get("tag", "")))

    @property
    def answered(self) -> bool:
        return self.outcome in ("ok", "is_error", "rpc_error")


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what actually broke."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def do_call(session: Any, call: Call, expect_text: str | None, limit_s: float = CALL_TIMEOUT_S) -> None:
    from mcp.shared.exceptions import MCPError

    try:
        result = await session.call_tool(call.tool, call.arguments, read_timeout_seconds=limit_s)
    except MCPError as exc:
        code = exc.error.code
        if code == -32001:
            call.outcome = "timeout"
        elif exc.error.message.startswith(CLIENT_MADE):
            call.outcome = "no_answer"  # the SDK's client gave up on the request: the gateway never answered
        else:
            call.outcome = "rpc_error"
        call.detail = f"{code}: {exc.error.message[:120]}"
    except Exception as exc:  # the transport broke: no answer
        call.outcome = "transport"
        call.detail = f"{type(exc).__name__}: {str(exc)[:120]}"
    else:
        meta = result.meta or {}
        call.correlation_id = (meta.get(META_KEY) or {}).get("id")
        texts = [getattr(b, "text", None) for b in result.content]
        if result.is_error:
            call.outcome, call.detail = "is_error", str(texts[:1])[:160]
        elif expect_text is not None and not any(expect_text in t for t in texts if isinstance(t, str)):
            call.outcome, call.detail = "is_error", f"unexpected answer {str(texts[:1])[:100]}"
        else:
            call.outcome = "ok"
    call.end = time.monotonic()


@dataclass
class ClientStats:
    opened: int = 0  # sessions opened (the first, and one more each time the transport broke)
    open_failures: int = 0


MAX_SESSIONS = 50  # a client gives up after opening this many sessions


async def drive(
    url: Callable[[], str],
    token: str,
    name: str,
    wire: Wire,
    calls: list[Call],
    make: Callable[[int], tuple[Call, str | None] | None],
    stats: ClientStats,
    *,
    stop: anyio.Event | None = None,
    call_timeout: float = CALL_TIMEOUT_S,
    made: list[int] | None = None,
    pace_s: float = 0.0,
) -> None:
    """One client: ``make(i)`` gives call ``i`` (and the text its answer must hold) until it returns None.

    A session whose transport broke is left (its ``async with`` exits, in this task) and a new one is opened; a call
    in flight when the session's own task group failed is counted as a transport failure (no answer)."""
    i = 0
    for _ in range(MAX_SESSIONS):
        if (stop is not None and stop.is_set()) or make(i) is None:
            return
        current: Call | None = None
        try:
            async with sdk_session(url(), token, wire, name) as session:
                stats.opened += 1
                while True:
                    nxt = make(i)
                    if nxt is None or (stop is not None and stop.is_set()):
                        return
                    current, expect = nxt
                    started = time.monotonic()
                    calls.append(current)
                    if made is not None:
                        made[0] += 1
                    await do_call(session, current, expect, call_timeout)
                    i += 1
                    if current.outcome == "transport":
                        break
                    current = None
                    # Pacing: a failing call answers fast; without it a crash window would eat the whole run.
                    await anyio.sleep(max(0.0, pace_s - (time.monotonic() - started)))
        except Exception as exc:
            if current is not None and current.outcome == "pending":
                current.outcome, current.end = "transport", time.monotonic()
                cause = _leaf(exc)
                current.detail = f"session failed: {type(cause).__name__}: {str(cause)[:100]}"
                i += 1
            elif current is None:
                stats.open_failures += 1
                await anyio.sleep(0.2)


# ----------------------------------------------------------------------------------------------- raw clients


def _answers(body: bytes, content_type: str) -> list[dict[str, Any]]:
    """The JSON-RPC answers in an HTTP response body (plain JSON or SSE events)."""
    texts: list[str] = []
    if "text/event-stream" in content_type:
        for event in body.decode(errors="replace").replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
            if data:
                texts.append(data)
    elif body.strip():
        texts.append(body.decode(errors="replace"))
    out: list[dict[str, Any]] = []
    for text in texts:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and ("result" in item or "error" in item):
                out.append(item)
    return out


def _rpc(method: str, params: dict[str, Any], rid: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()


def _init_body(rid: Any, name: str) -> bytes:
    return _rpc(
        "initialize",
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": name, "version": "1.0"}},
        rid,
    )


BAD_KINDS = ("surrogate_escape", "surrogate_raw_bytes", "nested_900", "tool_name_1mb", "id_1_5")


def bad_body(kind: str, rid: int, echo_tool: str) -> tuple[bytes, Any]:
    """The raw body for one bad request and the id its answer must carry."""
    if kind == "surrogate_escape":  # valid JSON text; the string holds a lone surrogate
        return _rpc("tools/call", {"name": echo_tool, "arguments": {"text": "\ud800"}}, rid), rid
    if kind == "surrogate_raw_bytes":  # the surrogate's UTF-8-style bytes: not valid UTF-8
        body = _rpc("tools/call", {"name": echo_tool, "arguments": {"text": "SURR"}}, rid)
        return body.replace(b"SURR", b"\xed\xa0\x80"), rid
    if kind == "nested_900":
        deep = '{"a":' * 900 + "1" + "}" * 900
        body = _rpc("tools/call", {"name": echo_tool, "arguments": {"text": "deep", "deep": "DEEP"}}, rid)
        return body.replace(b'"DEEP"', deep.encode()), rid
    if kind == "tool_name_1mb":
        return _rpc("tools/call", {"name": "x" * 1_000_000, "arguments": {}}, rid), rid
    if kind == "id_1_5":
        return _rpc("tools/call", {"name": echo_tool, "arguments": {"text": "id-1.5"}}, 1.5), 1.5
    raise ValueError(kind)


@dataclass
class BadTally:
    sent: collections.Counter[str] = field(default_factory=collections.Counter)
    with_id: collections.Counter[str] = field(default_factory=collections.Counter)  # one answer, carrying the id
    null_id: collections.Counter[str] = field(default_factory=collections.Counter)  # one answer, id null
    unanswered: collections.Counter[str] = field(default_factory=collections.Counter)
    answered_twice: collections.Counter[str] = field(default_factory=collections.Counter)
    http_status: dict[str, collections.Counter[int]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    transport_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    largest_answer: collections.Counter[str] = field(default_factory=collections.Counter)  # bytes
    sessions: int = 0
    samples: dict[str, str] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "by_kind": {
                k: {
                    "sent": self.sent[k],
                    "answered_with_its_id": self.with_id[k],
                    "answered_with_id_null": self.null_id[k],
                    "unanswered": self.unanswered[k],
                    "answered_more_than_once": self.answered_twice[k],
                    "transport_errors": self.transport_errors[k],
                    "largest_answer_bytes": self.largest_answer[k],
                    "http_status": dict(self.http_status[k]),
                    "sample_answer": self.samples.get(k, ""),
                }
                for k in BAD_KINDS
            },
        }


async def raw_initialize(http: httpx2.AsyncClient, url: str, name: str) -> str | None:
    r = await http.post(url, content=_init_body(0, name))
    session = r.headers.get("mcp-session-id")
    if r.status_code != 200 or not session:
        return None
    await http.post(
        url,
        content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
        headers={"mcp-session-id": session},
    )
    return session


def raw_client(token: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2025-11-25",
        },
        timeout=httpx2.Timeout(CALL_TIMEOUT_S),
        trust_env=False,
    )


async def bad_client(url: str, token: str, echo_tool: str, stop: anyio.Event, plan: Plan, tally: BadTally) -> None:
    async with raw_client(token) as http:
        session: str | None = None
        rid = 100
        for n in range(100_000):  # bounded; stops with the bystanders
            if stop.is_set():
                return
            kind = BAD_KINDS[n % len(BAD_KINDS)]
            try:
                if session is None:
                    session = await raw_initialize(http, url, "bad-input")
                    if session is None:
                        await anyio.sleep(plan.bad_interval_s)
                        continue
                    tally.sessions += 1
                rid += 1
                body, expect = bad_body(kind, rid, echo_tool)
                tally.sent[kind] += 1
                r = await http.post(url, content=body, headers={"mcp-session-id": session})
                tally.http_status[kind][r.status_code] += 1
                tally.largest_answer[kind] = max(tally.largest_answer[kind], len(r.content))
                answers = _answers(r.content, r.headers.get("content-type", ""))
                mine = [a for a in answers if a.get("id") == expect and type(a.get("id")) is type(expect)]
                nulls = [a for a in answers if a.get("id") is None]
                # A body the server could not parse can only be answered with id null (JSON-RPC 2.0, section 5).
                if len(mine) + len(nulls) > 1:
                    tally.answered_twice[kind] += 1
                elif mine:
                    tally.with_id[kind] += 1
                elif nulls:
                    tally.null_id[kind] += 1
                else:
                    tally.unanswered[kind] += 1
                if kind not in tally.samples and (mine or answers):
                    tally.samples[kind] = json.dumps((mine or answers)[0])[:200]
                elif kind not in tally.samples:
                    tally.samples[kind] = f"HTTP {r.status_code}: {r.text[:150]}"
                if r.status_code == 404:
                    session = None  # the gateway forgot the session: start another
            except httpx2.HTTPError as exc:
                tally.transport_errors[kind] += 1
                tally.samples.setdefault(kind, f"{type(exc).__name__}: {exc}"[:200])
                session = None
            await anyio.sleep(plan.bad_interval_s)


@dataclass
class OpenerTally:
    opened: int = 0
    failed: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


async def session_opener(url: str, token: str, stop: anyio.Event, plan: Plan, tally: OpenerTally) -> None:
    async with raw_client(token) as http:
        for n in range(plan.opener_max):
            if stop.is_set():
                return
            try:
                r = await http.post(url, content=_init_body(n, f"opener-{n}"))
                if r.status_code == 200 and r.headers.get("mcp-session-id"):
                    tally.opened += 1
                else:
                    tally.failed += 1
                    tally.errors[f"HTTP {r.status_code}"] += 1
            except httpx2.HTTPError as exc:
                tally.failed += 1
                tally.errors[type(exc).__name__] += 1
            await anyio.sleep(plan.opener_interval_s)


# ----------------------------------------------------------------------------------------------- the watcher


@dataclass
class Watch:
    rss_kb: list[tuple[float, int]] = field(default_factory=list)
    downstream_pids: dict[int, float] = field(default_factory=dict)  # pid -> first seen
    states: list[tuple[float, str]] = field(default_factory=list)  # changes of the backend's state on /status
    ready_again: int = 0
    connections: list[int] = field(default_factory=list)  # /status "connections": client sessions the gateway holds


async def watcher(gw: Gateway, http: httpx2.AsyncClient, needle: str, stop: anyio.Event, watch: Watch) -> None:
    last_state: str | None = None
    seen_not_ready = False
    for _ in range(int(SCENARIO_LIMIT_S / SAMPLE_S)):
        if stop.is_set() or gw.proc is None or gw.proc.popen.poll() is not None:
            return
        now = time.monotonic()
        rss = vm_kb(gw.serving_pid).get("VmRSS")
        if rss is not None:
            watch.rss_kb.append((now, rss))
        if needle:
            for pid in gw.downstream_pids(needle):
                watch.downstream_pids.setdefault(pid, now)
        doc = await gw.status(http)
        if doc is not None and isinstance(doc.get("connections"), int):
            watch.connections.append(doc["connections"])
        if doc is not None and doc.get("backends"):
            state = str(doc["backends"][0].get("state"))
            if state != last_state:
                watch.states.append((now, state))
                if state == "ready" and seen_not_ready:
                    watch.ready_again += 1
                seen_not_ready = seen_not_ready or state != "ready"
                if state == "ready":
                    seen_not_ready = False
                last_state = state
        await anyio.sleep(SAMPLE_S)


# ----------------------------------------------------------------------------------------------- ledger reading


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=10)
    try:
        cur = conn.execute("SELECT id, correlation_id, caller, tool, status, args_hash FROM calls ORDER BY id")
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    finally:
        conn.close()


def match_ledger(calls: list[Call], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls against rows by args_hash (every call's arguments are unique) and by correlation id."""
    by_hash: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        by_hash[row["args_hash"]].append(row)
    cids = collections.Counter(row["correlation_id"] for row in rows)
    sent = [c for c in calls if c.outcome != "not_sent"]
    hashes = {args_hash(c.arguments): c for c in sent}
    missing_answered = [c for c in sent if c.outcome in ("ok", "is_error") and not by_hash.get(args_hash(c.arguments))]
    missing_rpc = [c for c in sent if c.outcome == "rpc_error" and not by_hash.get(args_hash(c.arguments))]
    missing_unanswered = [c for c in sent if not c.answered and not by_hash.get(args_hash(c.arguments))]
    answered_cid_missing = [c for c in sent if c.correlation_id and c.correlation_id not in cids]
    return {
        "calls_sent": len(sent),
        "answered": sum(1 for c in sent if c.answered),
        "rows": len(rows),
        "rows_matching_a_call": sum(len(v) for h, v in by_hash.items() if h in hashes),
        "missing_rows_answered_calls": len(missing_answered),
        "missing_rows_rpc_error_calls": len(missing_rpc),
        "missing_rows_unanswered_calls": len(missing_unanswered),
        "answered_with_cid_not_in_ledger": len(answered_cid_missing),
        "duplicate_rows_by_args_hash": sum(len(v) - 1 for h, v in by_hash.items() if h in hashes and len(v) > 1),
        "duplicate_correlation_ids": sum(n - 1 for n in cids.values() if n > 1),
        "rows_without_a_call": sum(len(v) for h, v in by_hash.items() if h not in hashes),
        "examples_missing_answered": [f"{c.client}#{c.index} {c.tool} {c.outcome}" for c in missing_answered[:5]],
        "rows_by_status": dict(collections.Counter(r["status"] for r in rows if r["args_hash"] in hashes)),
        "unanswered_outcomes": dict(collections.Counter(c.outcome for c in sent if not c.answered)),
        # why they got no answer: a refused connection means the call never reached the gateway (no row is due)
        "unanswered_details": dict(
            collections.Counter((c.detail or "")[:80] for c in sent if not c.answered).most_common(4)
        ),
        "rpc_errors_without_row": dict(collections.Counter(c.detail[:60] for c in missing_rpc).most_common(4)),
    }


def error_kinds(calls: list[Call], top: int = 5) -> list[tuple[str, int]]:
    """The commonest failure texts (digits folded, so per-call tags and pids do not split them), with counts."""
    counts = collections.Counter(f"{c.outcome}: {re.sub(r'[0-9]+', '#', c.detail)[:150]}" for c in calls)
    return counts.most_common(top)


def rss_summary(watch: Watch, start_kb: int, end: dict[str, int]) -> dict[str, float]:
    peak = max([kb for _, kb in watch.rss_kb] + [start_kb, end.get("VmRSS", 0)])
    return {
        "start_mb": round(start_kb / 1024, 1),
        "peak_sampled_mb": round(peak / 1024, 1),
        "end_mb": round(end.get("VmRSS", 0) / 1024, 1),
        "hwm_mb": round(end.get("VmHWM", 0) / 1024, 1),
    }


# ----------------------------------------------------------------------------------------------- scenario: fault


async def fault_soak(procs: Procs, workdir: Path, plan: Plan, downstream: str) -> dict[str, Any]:
    name = f"fault-{downstream}"
    folder = workdir / name
    folder.mkdir()
    procs.workdir = folder
    marker = procs.marker(name)
    tokens = {f"c{i}": f"tok-c{i}-{uuid.uuid4().hex[:12]}" for i in range(plan.sessions)}
    tokens |= {n: f"tok-{n}-{uuid.uuid4().hex[:12]}" for n in ("bad", "opener", "watch")}
    echo_http: Proc | None = None
    if downstream == "stdio":
        server = {
            "transport": "stdio",
            "command": PY,
            "args": [str(ECHO), "--stdio"],
            "env": {"SOAK_MARKER": marker},
            "timeout_s": CALL_TIMEOUT_S,
        }
        needle = "echo_server.py"
    else:
        echo_port = free_port()
        echo_argv = [PY, str(ECHO), "--http", str(echo_port)]
        echo_http = procs.start("echo-http", echo_argv, echo_port, env={**os.environ, "SOAK_MARKER": marker})
        server = {"transport": "streamable_http", "url": f"http://{LOOPBACK}:{echo_port}/mcp", "timeout_s": 30}
        needle = ""
    config = write_config(folder / "federation.yaml", {"echo": server})
    gw = Gateway(procs, f"gateway-{name}", config, tokens, tokens["watch"])
    doc: dict[str, Any] = {"scenario": "fault", "downstream": downstream, "sessions": plan.sessions}
    async with httpx2.AsyncClient(trust_env=False) as http:
        if echo_http is not None:
            await wait_port(echo_http, READY_TIMEOUT_S)
        say(f"{name}: starting the gateway")
        await gw.start(http, backends=1)
        tool = "echo__echo"
        # Warm-up, so the start RSS is a gateway that has served calls, not a fresh import.
        warm_wire = Wire()
        async with sdk_session(gw.url, tokens["c0"], warm_wire, "warm") as s:
            for i in range(20):
                await do_call(s, Call("warm", i, tool, {"text": f"warm-{i}"}, time.monotonic()), f"warm-{i}")
        start_kb = vm_kb(gw.serving_pid).get("VmRSS", 0)
        first_downstream = gw.downstream_pids(needle) if needle else []

        calls: list[Call] = []
        wires = {c: Wire() for c in tokens if c.startswith("c")}
        stats = {c: ClientStats() for c in wires}
        total = plan.sessions * plan.calls
        stop_side = anyio.Event()
        stop_watch = anyio.Event()
        watch = Watch()
        bad = BadTally()
        opener = OpenerTally()
        kills: list[dict[str, Any]] = []
        made = [0]
        finished = [0]  # bystanders done

        def load_over() -> bool:
            return made[0] >= total or finished[0] >= plan.sessions

        async def bystander(client: str) -> None:
            s = int(client[1:])

            def make(i: int) -> tuple[Call, str | None] | None:
                if i >= plan.calls:
                    return None
                text = f"b{s}-{i}"
                return Call(client, i, tool, {"text": text}, time.monotonic()), text

            try:
                await drive(
                    lambda: gw.url,
                    tokens[client],
                    client,
                    wires[client],
                    calls,
                    make,
                    stats[client],
                    made=made,
                    pace_s=plan.pace_s,
                )
            finally:
                finished[0] += 1

        def first_success_after(t: float) -> float | None:
            ends = [c.end for c in calls if c.outcome == "ok" and c.start > t and c.end]
            return min(ends) if ends else None

        async def killer() -> None:
            for k, fraction in enumerate((1 / 3, 2 / 3)):
                with anyio.move_on_after(SCENARIO_LIMIT_S / 3):
                    while made[0] < total * fraction and not load_over():  # noqa: ASYNC110 - polling counters
                        await anyio.sleep(0.01)
                    if kills:  # the previous window must have closed first
                        while first_success_after(kills[-1]["t"]) is None and not load_over():  # noqa: ASYNC110
                            await anyio.sleep(0.01)
                if load_over():
                    return
                if downstream == "stdio":
                    pids = gw.downstream_pids(needle)
                    if not pids:
                        kills.append({"t": time.monotonic(), "pid": None, "note": "no downstream process found"})
                        continue
                    os.kill(pids[0], signal.SIGKILL)
                    kills.append({"t": time.monotonic(), "pid": pids[0], "at_call": made[0]})
                else:
                    assert echo_http is not None
                    old = echo_http.pid
                    echo_http.popen.kill()
                    t = time.monotonic()
                    await anyio.to_thread.run_sync(echo_http.popen.wait)
                    kills.append({"t": t, "pid": old, "at_call": made[0]})
                    restarted = procs.start(
                        f"echo-http-{k + 1}", echo_argv, echo_port, env={**os.environ, "SOAK_MARKER": marker}
                    )
                    echo_http.popen, echo_http.log = restarted.popen, restarted.log
                say(f"{name}: killed the downstream (pid {kills[-1]['pid']}) at call {made[0]}/{total}")

        say(f"{name}: {plan.sessions} sessions x {plan.calls} calls, with kills, bad input and unclosed sessions")
        t_run = time.monotonic()
        with anyio.fail_after(SCENARIO_LIMIT_S):
            async with anyio.create_task_group() as side:
                side.start_soon(watcher, gw, http, needle, stop_watch, watch)
                side.start_soon(bad_client, gw.url, tokens["bad"], tool, stop_side, plan, bad)
                side.start_soon(session_opener, gw.url, tokens["opener"], stop_side, plan, opener)
                async with anyio.create_task_group() as load:
                    load.start_soon(killer)
                    for client in wires:
                        load.start_soon(bystander, client)
                stop_side.set()
                await anyio.sleep(1.0)  # a last sample after the load
                end_vm = vm_kb(gw.serving_pid)
                stop_watch.set()
        run_s = time.monotonic() - t_run
        say(f"{name}: load done in {run_s:.1f} s; stopping the gateway")
        final = (await gw.status(http)) or {}
        doc["status_at_end"] = [{k: b.get(k) for k in ("name", "state", "reason")} for b in final.get("backends", [])]
        doc["connections"] = {
            "start": watch.connections[0] if watch.connections else None,
            "peak": max(watch.connections, default=None),
            "end": final.get("connections"),
        }
        gw_sid = gw.pid
        doc["stop"] = await gw.stop()
        await anyio.sleep(0.5)
        left = leftovers(marker, gw_sid)
        if echo_http is not None:
            left = [p for p in left if p["pid"] != echo_http.pid]  # the soak's own HTTP downstream
        kill_all(left)
        doc["leftovers_after_stop"] = left

    # windows
    windows = []
    for kill in kills:
        closed = first_success_after(kill["t"])
        end = (closed if closed is not None else time.monotonic()) + WINDOW_MARGIN_S
        windows.append((kill["t"], end))
        kill["window_s"] = round(end - kill["t"], 2)
        kill["closed"] = closed is not None
    sent = [c for c in calls if c.outcome != "not_sent"]

    def inside(c: Call) -> bool:
        return any(c.start <= b and c.end >= a for a, b in windows)

    ins = [c for c in sent if inside(c)]
    outs = [c for c in sent if not inside(c)]

    def rate(group: list[Call]) -> dict[str, Any]:
        bad_ = [c for c in group if c.outcome != "ok"]
        return {
            "calls": len(group),
            "errors": len(bad_),
            "error_rate": round(len(bad_) / len(group), 4) if group else None,
            "outcomes": dict(collections.Counter(c.outcome for c in bad_)),
            "kinds": error_kinds(bad_),
        }

    wire_totals: collections.Counter[str] = collections.Counter()
    for w in wires.values():
        wire_totals.update(w.summary())
    rows = ledger_rows(folder / "ledger.db")
    by_caller = collections.Counter(r["caller"] for r in rows)
    distinct_pids = sorted(watch.downstream_pids)
    doc.update(
        {
            "calls_planned": total,
            "calls_made": len(sent),
            "calls_not_sent": len(calls) - len(sent),
            "answers": sum(1 for c in sent if c.answered),
            "outcomes": dict(collections.Counter(c.outcome for c in sent)),
            "wire": dict(wire_totals),
            "session_reopens": sum(max(0, s.opened - 1) for s in stats.values()),
            "session_open_failures": sum(s.open_failures for s in stats.values()),
            "run_s": round(run_s, 1),
            "kills": [{k: v for k, v in kill.items() if k != "t"} for kill in kills],
            "circuit_open_answers": sum(1 for c in sent if "circuit_open" in c.detail),
            "outside_windows": rate(outs),
            "inside_windows": rate(ins),
            "rss": rss_summary(watch, start_kb, end_vm),
            "restarts_observed": {
                "downstream_pids": max(0, len(set(distinct_pids) | set(first_downstream)) - 1) if needle else None,
                "ready_again_on_status": watch.ready_again,
                "state_changes": [s for _, s in watch.states],
            },
            "bad_input": bad.public(),
            "unclosed_sessions": {"opened": opener.opened, "failed": opener.failed, "errors": dict(opener.errors)},
            "ledger": {
                "rows": len(rows),
                "rows_by_caller": dict(sorted((str(k), v) for k, v in by_caller.items())),
                "bystanders": match_ledger(calls, [r for r in rows if str(r["caller"]).startswith("c")]),
                "bad_input_tools_call_sent": sum(bad.sent.values()),
            },
        }
    )
    return doc


async def wait_port(proc: Proc, limit_s: float) -> None:
    with anyio.move_on_after(limit_s):
        while True:
            if proc.popen.poll() is not None:
                raise HarnessError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()}")
            try:
                with socket.create_connection((LOOPBACK, proc.port), timeout=0.5):
                    return
            except OSError:
                await anyio.sleep(0.1)
    raise HarnessError(f"{proc.name} did not listen within {limit_s:g} s:\n{proc.output()}")


# ----------------------------------------------------------------------------------------------- scenario: ledger


async def ledger_soak(procs: Procs, workdir: Path, plan: Plan) -> dict[str, Any]:
    folder = workdir / "ledger"
    folder.mkdir()
    procs.workdir = folder
    workers = [f"w{i}" for i in range(plan.ledger_sessions)]
    hangers = ["hang_cli", "hang_echo"]
    tokens = {n: f"tok-{n}-{uuid.uuid4().hex[:12]}" for n in [*workers, *hangers, "watch"]}
    doc: dict[str, Any] = {"scenario": "ledger", "sessions": len(workers), "long_call_sessions": len(hangers)}
    calls: list[Call] = []
    wires = {n: Wire() for n in [*workers, *hangers]}
    phases: dict[str, dict[str, Any]] = {}

    def config(marker: str) -> Path:
        text_schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return write_config(
            folder / "federation.yaml",
            {
                "echo": {
                    "transport": "stdio",
                    "command": PY,
                    "args": [str(ECHO), "--stdio"],
                    "env": {"SOAK_MARKER": marker},
                    "timeout_s": 300,
                }
            },
            {
                "cli": {
                    "command": PY,
                    "env": {"SOAK_MARKER": marker},
                    "concurrency": 8,
                    "tools": {
                        "say": {"argv": [str(FAKE_CLI), "echo", "{text}"], "input_schema": text_schema},
                        "hang": {"argv": [str(FAKE_CLI), "sleep"], "timeout_s": 300, "input_schema": text_schema},
                    },
                }
            },
        )

    async def run_phase(phase: str, gw: Gateway, marker: str, http: httpx2.AsyncClient) -> None:
        stop = anyio.Event()
        stats = {n: ClientStats() for n in [*workers, *hangers]}
        info: dict[str, Any] = phases.setdefault(phase, {})
        kills: list[dict[str, Any]] = []
        per_worker = plan.ledger_phase_b_calls if phase == "B" else 100_000  # A runs until the shutdown

        async def worker(n: str) -> None:
            def make(i: int) -> tuple[Call, str | None] | None:
                if i >= per_worker:
                    return None
                text = f"{phase}-{n}-{i}"
                if i % 2 == 0:
                    return Call(n, i, "echo__echo", {"text": text}, time.monotonic()), text
                return Call(n, i, "cli__say", {"text": text}, time.monotonic()), text

            await drive(lambda: gw.url, tokens[n], n, wires[n], calls, make, stats[n], stop=stop, pace_s=plan.pace_s)

        async def hanger(n: str) -> None:
            def make(i: int) -> tuple[Call, str | None] | None:
                if i >= 1000:
                    return None
                tag = f"{phase}-{n}-{i}"
                if n == "hang_cli":
                    return Call(n, i, "cli__hang", {"text": tag}, time.monotonic()), None
                return Call(n, i, "echo__sleep", {"seconds": 600, "tag": tag}, time.monotonic()), None

            await drive(
                lambda: gw.url, tokens[n], n, wires[n], calls, make, stats[n], stop=stop, call_timeout=600, pace_s=0.25
            )

        def success_after(t: float) -> bool:
            return any(c.outcome == "ok" and c.start > t for c in calls)

        async def shutdown(second_term_after: float | None) -> None:
            sid = gw.pid
            info["processes_before_shutdown"] = len(leftovers(marker, sid))
            info["in_flight_at_shutdown"] = sum(1 for c in calls if c.outcome == "pending")
            info["stop"] = await gw.stop(second_term_after=second_term_after)
            await anyio.sleep(0.5)
            left = leftovers(marker, sid)
            info["leftovers_after_stop"] = left
            kill_all(left)
            stop.set()

        async def director() -> None:
            await anyio.sleep(plan.ledger_phase_a_s)
            for _ in range(2):
                pids = gw.downstream_pids("echo_server.py")
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                t = time.monotonic()
                kills.append({"pid": pids[0] if pids else None})
                say(f"ledger A: killed the downstream (pid {kills[-1]['pid']})")
                with anyio.move_on_after(60):
                    while not success_after(t):  # noqa: ASYNC110 - polling what the clients saw
                        await anyio.sleep(0.02)
                await anyio.sleep(plan.ledger_phase_a_s / 2)
            say("ledger A: SIGTERM, and a second SIGTERM 1 s later, with calls in flight")
            await shutdown(1.0)

        async with anyio.create_task_group() as load:
            for n in hangers:  # a long call in flight whenever the gateway is stopped
                load.start_soon(hanger, n)
            async with anyio.create_task_group() as work:
                for n in workers:
                    work.start_soon(worker, n)
                if phase == "A":
                    await director()
            if phase == "B":
                say("ledger B: one SIGTERM, with the long calls in flight")
                await shutdown(None)
            # Calls still waiting for an answer from the stopped gateway stay "pending": cut, no answer.
            await anyio.sleep(3.0)
            load.cancel_scope.cancel()
        info["kills"] = kills
        info["sessions_opened"] = sum(st.opened for st in stats.values())
        info["session_open_failures"] = sum(st.open_failures for st in stats.values())

    async with httpx2.AsyncClient(trust_env=False) as http:
        with anyio.fail_after(SCENARIO_LIMIT_S):
            for phase in ("A", "B"):
                marker = procs.marker(f"ledger-{phase}")
                gw = Gateway(procs, f"gateway-ledger-{phase}", config(marker), tokens, tokens["watch"])
                say(f"ledger {phase}: starting the gateway" + (" on the same ledger" if phase == "B" else ""))
                await gw.start(http, backends=2)
                t0 = time.monotonic()
                await run_phase(phase, gw, marker, http)
                phases[phase]["run_s"] = round(time.monotonic() - t0, 1)
                rows = ledger_rows(folder / "ledger.db")
                phase_calls = [c for c in calls if c.tag.startswith(f"{phase}-")]
                phase_hashes = {args_hash(c.arguments) for c in phase_calls}
                other = {args_hash(c.arguments) for c in calls} - phase_hashes
                phase_rows = [r for r in rows if r["args_hash"] not in other]
                phases[phase]["ledger"] = match_ledger(phase_calls, phase_rows)
                phases[phase]["ledger"]["rows_in_file"] = len(rows)
                phases[phase]["outcomes"] = dict(collections.Counter(c.outcome for c in phase_calls))
                say(f"ledger {phase}: {len(phase_calls)} calls, {len(rows)} rows in the file")
    wire_totals: collections.Counter[str] = collections.Counter()
    for w in wires.values():
        wire_totals.update(w.summary())
    doc["phases"] = phases
    doc["wire"] = dict(wire_totals)
    doc["total"] = match_ledger(calls, ledger_rows(folder / "ledger.db"))
    return doc


# ----------------------------------------------------------------------------------------------- report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _left(items: list[dict[str, Any]]) -> str:
    if not items:
        return "none"
    return "; ".join(f"pid {p['pid']} ({p['state']}, by {'+'.join(p['found_by'])}): `{p['cmd'][-60:]}`" for p in items)


def report(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    out = [
        "# Soak: faults and ledger integrity",
        "",
        f"Gateway: {env['gateway']}; {env['cpus']} CPUs, {env['platform']}, Python {env['python']}; load average "
        f"before {env['load_before']}, after {env['load_after']}; {'quick' if doc['quick'] else 'full'} run, "
        f"{doc['wall_s']:.0f} s; circuit breaker: {env['circuit_breaker']}.",
        "",
    ]
    for f in doc.get("fault", []):
        kind = f["downstream"]
        windows = ", ".join(f"{k['window_s']} s" + ("" if k["closed"] else " (never closed)") for k in f["kills"])
        restarts, by, w = f["restarts_observed"], f["ledger"]["bystanders"], f["wire"]
        new_pids = "-" if restarts["downstream_pids"] is None else restarts["downstream_pids"]
        out += [f"## Fault soak, {kind} downstream", ""]
        out += [
            f"{f['sessions']} bystander sessions x {f['calls_planned'] // f['sessions']} `echo` calls in "
            f"{f['run_s']} s; downstream SIGKILLed {len(f['kills'])} times; bad input and unclosed sessions "
            "throughout.",
            "",
            "| figure | value |",
            "|---|---|",
            f"| calls made / planned | {f['calls_made']} / {f['calls_planned']} (not sent: {f['calls_not_sent']}) |",
            f"| answers received (calls answered) | {f['answers']} |",
            f"| outcomes | {json.dumps(f['outcomes'])} |",
            f"| HTTP wire, tools/call: sent / answered exactly once / unanswered / answered twice+ | "
            f"{w.get('http_tools_call', 0)} / {w.get('http_tools_call_answered_once', 0)} / "
            f"{w.get('http_tools_call_unanswered', 0)} / {w.get('http_tools_call_answered_more_than_once', 0)} |",
            f"| HTTP wire, every request with an id: sent / unanswered / answers to unknown ids | "
            f"{w.get('http_requests_with_id', 0)} / {w.get('http_requests_unanswered', 0)} / "
            f"{w.get('http_answers_to_unknown_ids', 0)} |",
            f"| SDK session, tools/call: answered once / unanswered / twice+ (includes errors the client made up) | "
            f"{w.get('tools_call_answered_once', 0)} / {w.get('tools_call_unanswered', 0)} / "
            f"{w.get('tools_call_answered_more_than_once', 0)} |",
            f"| bystander sessions reopened (transport broke) | {f['session_reopens']} "
            f"(open failures {f['session_open_failures']}) |",
            f"| bystander error rate outside crash windows | {_pct(f['outside_windows']['error_rate'])} "
            f"({f['outside_windows']['errors']} of {f['outside_windows']['calls']}) |",
            f"| bystander error rate inside crash windows | {_pct(f['inside_windows']['error_rate'])} "
            f"({f['inside_windows']['errors']} of {f['inside_windows']['calls']}) |",
            f"| crash windows (kill -> first success after it + {WINDOW_MARGIN_S:g} s) | {windows or '-'} |",
            f"| bystander answers refused by the open circuit breaker | {f['circuit_open_answers']} |",
            f"| downstream restarts observed (new pids / ready again on /status) | "
            f"{new_pids} / {restarts['ready_again_on_status']} |",
            f"| gateway RSS start / peak (sampled) / end / VmHWM | {f['rss']['start_mb']} / "
            f"{f['rss']['peak_sampled_mb']} / {f['rss']['end_mb']} / {f['rss']['hwm_mb']} MB |",
            f"| unclosed sessions opened (failed) | {f['unclosed_sessions']['opened']} "
            f"({f['unclosed_sessions']['failed']}) |",
            f"| client sessions the gateway holds (/status connections) start / peak / end | "
            f"{f['connections']['start']} / {f['connections']['peak']} / {f['connections']['end']} |",
            "| backend at the end (/status) | "
            + "; ".join(
                f"{b['name']}: {b['state']}" + (f" ({b['reason']})" if b["reason"] else "") for b in f["status_at_end"]
            )
            + " |",
            f"| ledger rows (all callers) | {f['ledger']['rows']} {json.dumps(f['ledger']['rows_by_caller'])} |",
            f"| bystander calls made vs their rows | {f['ledger']['bystanders']['calls_sent']} vs "
            f"{f['ledger']['bystanders']['rows_matching_a_call']} |",
            f"| rows missing: calls answered with a result / with a JSON-RPC error / unanswered | "
            f"{f['ledger']['bystanders']['missing_rows_answered_calls']} / "
            f"{f['ledger']['bystanders']['missing_rows_rpc_error_calls']} / "
            f"{f['ledger']['bystanders']['missing_rows_unanswered_calls']} |",
            f"| duplicate rows (args hash / correlation id) | {by['duplicate_rows_by_args_hash']}"
            f" / {by['duplicate_correlation_ids']} |",
            f"| gateway stop (one SIGTERM) | exit {f['stop']['exit_code']} in {f['stop']['exit_s']} s; "
            f"{', '.join(f['stop']['signals'])} |",
            f"| processes left after the stop | {_left(f['leftovers_after_stop'])} |",
            "",
        ]
        for label, key in (("outside", "outside_windows"), ("inside", "inside_windows")):
            if f[key]["kinds"]:
                out.append(
                    f"Bystander errors {label} the windows: "
                    + "; ".join(f"{n} x `{text.replace('`', '')}`" for text, n in f[key]["kinds"])
                )
                out.append("")
        out += [
            "Bad input (one session of its own, raw bytes):",
            "",
            "| request | sent | answered (its id) | answered (id null) | no answer | answered twice+ "
            "| transport errors | HTTP status | largest answer | first answer |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for k, v in f["bad_input"]["by_kind"].items():
            out.append(
                f"| {k} | {v['sent']} | {v['answered_with_its_id']} | {v['answered_with_id_null']} | "
                f"{v['unanswered']} | {v['answered_more_than_once']} | {v['transport_errors']} | "
                f"{json.dumps(v['http_status'])} | {v['largest_answer_bytes']:,} B | "
                f"`{v['sample_answer'][:110].replace('|', '/')}` |"
            )
        out += [f"\nBad-input sessions opened: {f['bad_input']['sessions']}.", ""]
    led = doc.get("ledger")
    if led:
        w = led["wire"]
        out += ["## Ledger integrity", ""]
        out += [
            f"{led['sessions']} sessions alternating `echo__echo` (stdio) and `cli__say` (CLI adapter), plus "
            f"{led['long_call_sessions']} sessions holding a long call (`cli__hang`, `echo__sleep`). Phase A: two "
            "downstream SIGKILLs, then SIGTERM + SIGTERM 1 s later with calls in flight. Phase B: a new gateway on "
            "the same ledger, then one SIGTERM with the long calls in flight.",
            "",
            "| figure | phase A | phase B |",
            "|---|---|---|",
        ]
        a, b = led["phases"].get("A", {}), led["phases"].get("B", {})

        def row(label: str, get: Callable[[dict[str, Any]], Any]) -> str:
            def one(p: dict[str, Any]) -> str:
                try:
                    return str(get(p))
                except (KeyError, TypeError):
                    return "-"

            return f"| {label} | {one(a)} | {one(b)} |"

        out += [
            row("run (s)", lambda p: p["run_s"]),
            row("calls sent", lambda p: p["ledger"]["calls_sent"]),
            row("answered", lambda p: p["ledger"]["answered"]),
            row("outcomes", lambda p: json.dumps(p["outcomes"])),
            row("calls in flight at the first SIGTERM", lambda p: p["in_flight_at_shutdown"]),
            row("rows for this phase's calls", lambda p: p["ledger"]["rows_matching_a_call"]),
            row("rows missing for calls answered with a result", lambda p: p["ledger"]["missing_rows_answered_calls"]),
            row(
                "rows missing for calls answered with a JSON-RPC error",
                lambda p: (
                    f"{p['ledger']['missing_rows_rpc_error_calls']} {json.dumps(p['ledger']['rpc_errors_without_row'])}"
                ),
            ),
            row("rows missing for unanswered calls", lambda p: p["ledger"]["missing_rows_unanswered_calls"]),
            row("why the unanswered calls got no answer", lambda p: json.dumps(p["ledger"]["unanswered_details"])),
            row("answered, correlation id not in ledger", lambda p: p["ledger"]["answered_with_cid_not_in_ledger"]),
            row("duplicate rows (args hash)", lambda p: p["ledger"]["duplicate_rows_by_args_hash"]),
            row("duplicate correlation ids", lambda p: p["ledger"]["duplicate_correlation_ids"]),
            row("rows with no call", lambda p: p["ledger"]["rows_without_a_call"]),
            row("rows by status", lambda p: json.dumps(p["ledger"]["rows_by_status"])),
            row("rows in the file after the phase", lambda p: p["ledger"]["rows_in_file"]),
            row(
                "gateway stop",
                lambda p: (
                    f"exit {p['stop']['exit_code']} in {p['stop']['exit_s']} s; {', '.join(p['stop']['signals'])}"
                ),
            ),
            row("processes before the shutdown (marker / session)", lambda p: p["processes_before_shutdown"]),
            row("processes left after the stop", lambda p: _left(p["leftovers_after_stop"])),
            "",
            f"Whole run: {led['total']['calls_sent']} calls sent, {led['total']['answered']} answered, "
            f"{led['total']['rows']} rows; missing for answered calls {led['total']['missing_rows_answered_calls']}, "
            f"duplicates {led['total']['duplicate_rows_by_args_hash']}. HTTP wire, tools/call (answers counted per "
            f"request id and session): {w.get('http_tools_call', 0)} sent, {w.get('http_tools_call_answered_once', 0)}"
            f" answered exactly once, {w.get('http_tools_call_unanswered', 0)} unanswered, "
            f"{w.get('http_tools_call_answered_more_than_once', 0)} answered twice or more.",
            "",
        ]
    if doc.get("stray_killed_at_exit"):
        out += [f"Processes still alive at the very end (killed by the soak): {_left(doc['stray_killed_at_exit'])}", ""]
    for note in doc.get("notes", []):
        out.append(f"- {note}")
    return "\n".join(out)


async def run(args: argparse.Namespace, workdir: Path, procs: Procs) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    doc: dict[str, Any] = {"quick": args.quick, "plan": plan.__dict__, "fault": [], "notes": []}
    only = set(args.only or ["fault", "ledger"])
    if "fault" in only:
        doc["fault"].append(await fault_soak(procs, workdir, plan, "stdio"))
        if not args.no_http:
            doc["fault"].append(await fault_soak(procs, workdir, plan, "http"))
    if "ledger" in only:
        doc["ledger"] = await ledger_soak(procs, workdir, plan)
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions and calls (about a minute)")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON")
    parser.add_argument("--only", action="append", choices=("fault", "ledger"), help="one scenario; repeatable")
    parser.add_argument("--no-http", action="store_true", help="fault soak with the stdio downstream only")
    parser.add_argument(
        "--gateway-breaker",
        action="store_true",
        help="keep the gateway's circuit-breaker defaults (30 s cooldown) instead of the soak's 1 s",
    )
    parser.add_argument(
        "--keep", metavar="DIR", help="work in DIR (kept: logs, configs, ledgers) instead of a temp dir"
    )
    args = parser.parse_args()
    global BREAKER
    BREAKER = None if args.gateway_breaker else SOAK_BREAKER
    env = {
        **environment(),
        "circuit_breaker": "gateway defaults" if BREAKER is None else json.dumps(BREAKER),
    }
    started = time.monotonic()
    tmp = tempfile.TemporaryDirectory(prefix="soak-") if args.keep is None else None
    workdir = Path(args.keep) if args.keep else Path(tmp.name)  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Procs(workdir)
    doc: dict[str, Any] | None = None
    try:
        doc = anyio.run(run, args, workdir, procs)
    except Exception:
        traceback.print_exc()
        say("harness error: see above")
        return 2
    finally:
        stray = procs.stop_all_and_sweep()
        if doc is not None:
            doc["stray_killed_at_exit"] = stray
        say("all processes stopped")
        if tmp is not None:
            tmp.cleanup()
    doc["environment"] = env | {"load_after": load_average()}
    doc["wall_s"] = time.monotonic() - started
    print(report(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
