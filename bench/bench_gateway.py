"""What the gateway costs per call, against calling the downstream directly and against FastMCP's proxy.

    .venv/bin/python bench/bench_gateway.py [--quick] [--only NAME]... [--json OUT] [--profile-dir DIR] [--baseline DIR]

Everything runs on loopback in one invocation, with every target up at the same time and measured in interleaved
rounds (round r runs a block of calls against each target in turn, in an order rotated by r), so the noise of a
busy machine falls on all targets alike and the ratios stay meaningful even when the absolute numbers move. Besides
wall-clock latency it reads every process's CPU time (utime + stime, /proc/PID/stat) around each block, which the
machine's other load hardly moves: CPU per call, split into client, front (gateway or proxy) and downstream.

Sections (``--only`` takes a section name or part of a target key, repeatable or comma-separated; a target name alone
runs ``calls`` and ``throughput`` for the matching targets, plus their direct floors and, for a ``-ledger`` target,
its ledger-off twin):

  calls       one session x 500 sequential ``echo`` calls per target (5 rounds x 100): p50 / p99 and the ratio to
              direct; CPU per call
  throughput  8 concurrent sessions x 200 calls per target (4 rounds x 50): calls/s and the ratio to direct (not
              for gateway-stdio-stdio-ledger: the sequential rows measure the ledger)
  list        ``tools/list`` through the gateway fronting 1, 10 and 50 HTTP backends x 50 tools (``multi_echo.py``:
              the 50 backends live in one process), against one server listing the same number of tools; the
              gateway's resident memory (VmRSS, its own process only) with 1, 10 and 50 backends
  profile     py-spy (``--gil``: samples of the thread holding the GIL) on the gateway process during
              sequential calls (ledger off, then on; then ``serve --stdio``, ledger off) and during ``tools/list``
              with 50 backends: stages (inclusive), self time by package and by function, gateway functions
              inclusive; CPU per request by thread.
              Skipped, with a note, when py-spy is not installed.

``--quick`` (about a minute on an idle machine): 3 x 30 sequential calls, 3 sessions x 40 calls, tools/list with 1
and 50 backends, one 2 s profile; FastMCP rows always get fewer calls (one backend session per call makes them slow).

Targets, for an HTTP downstream (``tests/fixtures/echo_server.py --http``) and a stdio one (``--stdio``):

  direct-http, direct-stdio   the benchmark's client talks to the echo server itself (for stdio it spawns it)
  relay-http                  ``bare_relay.py``: a bare ASGI relay on uvicorn (parse, rename, forward over one
                              pooled httpx2 client, stream back): the floor of a Python gateway; every HTTP row is
                              also read as a ratio to it
  gateway-http                ``gateway serve`` (HTTP) in front of the HTTP downstream, audit ledger off
  gateway-http-ledger         the same with the audit ledger on (a SQLite file in a temporary directory)
  gateway-http-ledger-uvloop  the same on uvloop (GATEWAY_UVLOOP=1); only when an --only name contains "uvloop"
  gateway-http-ledger-baseline
                              with --baseline DIR: that checkout's gateway, ledger on (before / after in one run)
  gateway-http-ledger-modern  the same gateway (ledger on) called by a 2026-07-28 client (stateless requests, the
                              SDK's ``Client(mode="2026-07-28")``); ``-baseline``: with --baseline DIR, that checkout's
  relay-stdio                 ``bare_stdio_relay.py``, spawned by the client, spawning the echo server (parse,
                              rename, write on; the answers passed back as they come): the floor of a Python
                              gateway over stdio; the ``gateway-stdio-stdio`` rows are also read as a ratio to it
  gateway-http-stdio          ``gateway serve`` (HTTP in) fronting a stdio downstream it spawns
  gateway-stdio-stdio         ``gateway serve --stdio`` spawned by the client, fronting a stdio downstream: the
                              apples-to-apples stdio comparison (stdio in, stdio out); ``-ledger``: ledger on;
                              ``-baseline``: with --baseline DIR, that checkout's (ledger off)
  fastmcp-http, fastmcp-http-stdio
                              ``fastmcp.server.create_proxy`` served over streamable HTTP (``fastmcp_proxy.py``),
                              run with ``.tools/bin/fastmcp-python`` (made by ``scripts/install``); skipped with a
                              note when that launcher is missing or cannot import fastmcp

The client is the MCP SDK's (``streamable_http_client`` / ``stdio_client`` + ``ClientSession``) in this process; its
own CPU time is part of every number, for every target alike. For stdio, "8 sessions" means 8 client sessions that
each spawn their own process (the echo server, or a gateway and its echo server), which is what 8 stdio clients do.
Output: Markdown on stdout, progress on stderr, every number (and the raw latency samples) with ``--json OUT``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import LOOPBACK, Proc, children_of, cmdline, descendants, free_port, say, vm_kb  # noqa: E402
from bench.procs import Procs as ProcsBase  # noqa: E402
from bench.run_env import environment, load_average  # noqa: E402

ECHO = ROOT / "tests" / "fixtures" / "echo_server.py"
MULTI_ECHO = ROOT / "bench" / "multi_echo.py"
FASTMCP_PROXY = ROOT / "bench" / "fastmcp_proxy.py"
BARE_RELAY = ROOT / "bench" / "bare_relay.py"
BARE_STDIO_RELAY = ROOT / "bench" / "bare_stdio_relay.py"
FASTMCP_PYTHON = ROOT / ".tools" / "bin" / "fastmcp-python"
PY = sys.executable
SECTIONS = ("calls", "throughput", "list", "profile")
ECHO_BUILTIN_TOOLS = 8  # the fixture's own tools; --tools N adds N more
STARTUP_TIMEOUT_S = 60.0  # many Python servers importing the SDK at once on 2 cores
STOP_GRACE_S = 3.0  # how long the servers have to exit on SIGTERM before they are SIGKILLed
ARGS = {"text": "hello"}
THROUGHPUT_SKIP = ("gateway-stdio-stdio-ledger",)  # the sequential rows measure the ledger over stdio
HTTP_KEYS = (
    "direct-http",
    "relay-http",
    "gateway-http",
    "gateway-http-ledger",
    "gateway-http-ledger-uvloop",
    "gateway-http-ledger-baseline",
    "gateway-http-ledger-modern",
    "gateway-http-ledger-modern-baseline",
    "fastmcp-http",
)
FRONT_CPU_BEFORE_MS = {"gateway-http": 5.01, "gateway-http-ledger": 6.05}  # docs/benchmarks.md before issue 17
RELAY = "relay-http"  # the bare relay (bare_relay.py): the floor of a Python gateway, beside the direct floor
STDIO_RELAY = "relay-stdio"  # bare_stdio_relay.py, spawned by the client: the floor of a Python gateway over stdio
STDIO_KEYS = (
    "direct-stdio",
    "relay-stdio",
    "gateway-http-stdio",
    "gateway-stdio-stdio",
    "gateway-stdio-stdio-ledger",
    "gateway-stdio-stdio-baseline",
    "fastmcp-http-stdio",
)


@dataclass(frozen=True)
class Plan:
    seq_rounds: int
    seq_calls: int  # per round per target
    tp_rounds: int
    tp_calls: int  # per session per round
    tp_sessions: int
    list_rounds: int
    list_calls: int
    warmup: int
    slow_divisor: int  # FastMCP targets (one backend session per call) get this many times fewer calls
    profile_s: float


FULL = Plan(
    seq_rounds=5,
    seq_calls=100,
    tp_rounds=4,
    tp_calls=50,
    tp_sessions=8,
    list_rounds=5,
    list_calls=6,
    warmup=30,
    slow_divisor=5,
    profile_s=6.0,
)
QUICK = Plan(
    seq_rounds=3,
    seq_calls=30,
    tp_rounds=2,
    tp_calls=20,
    tp_sessions=3,
    list_rounds=3,
    list_calls=3,
    warmup=10,
    slow_divisor=3,
    profile_s=2.0,
)


# ----------------------------------------------------------------------------------------------- processes


def gateway_argv() -> list[str]:
    """``python -m gateway``, run in the project root: the checkout's own code, whichever checkout the venv's
    editable install points at (its ``gateway`` console script would import that one)."""
    return [PY, "-m", "gateway"]


class Procs(ProcsBase):
    """Every server process the benchmark starts (bench/procs.py), run in the project root."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, cwd=ROOT)

    def wait_ready(self, procs: Iterable[Proc]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for proc in procs:
            while True:
                if proc.popen.poll() is not None:
                    raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()}")
                if self._ready(proc):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} not ready after {STARTUP_TIMEOUT_S:g} s:\n{proc.output()}")
                time.sleep(0.1)

    @staticmethod
    def _ready(proc: Proc) -> bool:
        if proc.health is not None:
            try:
                with urllib.request.urlopen(proc.health, timeout=2) as response:
                    return bool(json.loads(response.read()).get("status") == "ok")
            except (OSError, ValueError):
                return False
        if proc.port is None:
            return True
        try:
            with socket.create_connection((LOOPBACK, proc.port), timeout=0.5):
                return True
        except OSError:
            return False


def write_federation(path: Path, servers: dict[str, dict[str, Any]], *, ledger: Path | None) -> Path:
    """A federation.yaml (JSON is YAML) with the given servers, and the audit ledger on (at ``ledger``) or off."""
    audit: dict[str, Any] = {"enabled": False} if ledger is None else {"enabled": True, "path": str(ledger)}
    doc = {"version": 1, "gateway": {"name": "bench-gateway", "audit": audit}, "servers": servers}
    path.write_text(json.dumps(doc, indent=2))
    return path


def rss_mb(pid: int) -> dict[str, float]:
    """VmRSS (resident now) and VmHWM (peak resident) of one process, in MB; the children are not counted."""
    return {key: kb / 1024.0 for key, kb in vm_kb(pid).items()}


# ----------------------------------------------------------------------------------------------- targets


@dataclass
class Target:
    key: str
    label: str
    downstream: str  # "http" | "stdio"
    url: str | None = None  # a streamable HTTP endpoint ...
    argv: list[str] | None = None  # ... or a command the client spawns over stdio
    cwd: Path = ROOT  # where that command runs (--baseline: the other checkout)
    floor: str | None = None  # the direct target this one is compared with
    proc: Proc | None = None  # the process whose memory / profile we take (None: spawned by the client)
    slow: bool = False  # FastMCP: fewer calls
    modern: bool = False  # the client speaks the 2026-07-28 era (stateless requests), not the handshake one
    measured: bool = True  # False: started only for the profile
    down_pids: list[int] = field(default_factory=list)  # an HTTP downstream's process
    spawned: list[int] = field(default_factory=list)  # processes the client spawned for this target's sessions
    results: dict[str, Any] = field(default_factory=dict)

    def roles(self) -> dict[str, list[int]]:
        """Whose CPU to count, by role: the client (this process), the front (gateway / proxy), the downstream."""
        if self.proc is not None:  # ``gateway serve`` is a supervisor and its forked child: count both
            front = sorted({self.proc.pid, self.proc.serving_pid})
        elif self.key.startswith("direct-"):
            front = []
        else:  # gateway --stdio, spawned by the client: the supervisor and its serving child (same command line)
            tree = children_of()
            front = [*self.spawned]
            front += [c for pid in self.spawned for c in tree.get(pid, ()) if cmdline(c) == cmdline(pid)]
        if self.downstream == "http":
            down = list(self.down_pids)
        elif self.key.startswith("direct-"):
            down = list(self.spawned)
        else:  # the processes the front spawned (the gateway's child's children), each counted once
            tree = children_of()
            roots = self.spawned if self.proc is None else front
            down = sorted({d for pid in roots for d in descendants(pid, tree)} - set(front))
        return {"client": [os.getpid()], "front": front, "downstream": down}


# ----------------------------------------------------------------------------------------------- CPU accounting


CLOCK_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def cpu_ns(pids: Iterable[int]) -> tuple[int, int]:
    """(time on CPU, time runnable but waiting for a CPU) in ns, summed over ``pids``.

    CPU time is utime + stime from /proc/PID/stat: the whole process, threads that have already exited included (a
    sum over /proc/PID/task/* would lose a worker thread's time once it exits), in clock ticks (10 ms; a block of
    calls is hundreds of ms). The wait column is from /proc/PID/task/TID/schedstat (live threads): how much the
    machine's other load held these processes back."""
    run = wait = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            run += (int(fields[11]) + int(fields[12])) * CLOCK_TICK_NS
            tasks = os.listdir(f"/proc/{pid}/task")
        except (OSError, ValueError, IndexError):
            continue
        for tid in tasks:
            try:
                wait += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return run, wait


class CpuMeter:
    """CPU time per role (client / front / downstream) accumulated over a target's measured blocks."""

    def __init__(self, targets: list[Target]) -> None:
        self.roles = {t.key: t.roles() for t in targets}
        self.run: dict[str, collections.Counter[str]] = {t.key: collections.Counter() for t in targets}
        self.wait: dict[str, collections.Counter[str]] = {t.key: collections.Counter() for t in targets}

    def snapshot(self, key: str) -> dict[str, tuple[int, int]]:
        return {role: cpu_ns(pids) for role, pids in self.roles[key].items()}

    def add(self, key: str, before: dict[str, tuple[int, int]]) -> None:
        after = self.snapshot(key)
        for role, (run, wait) in after.items():
            self.run[key][role] += run - before[role][0]
            self.wait[key][role] += wait - before[role][1]

    def per_call(self, key: str, calls: int) -> dict[str, float]:
        out = {f"{role}_ms": ns / 1e6 / calls for role, ns in self.run[key].items()}
        out["total_ms"] = sum(self.run[key].values()) / 1e6 / calls
        out["runqueue_wait_ms"] = sum(self.wait[key].values()) / 1e6 / calls
        return out


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    rank = max(1, -(-int(pct * len(ordered)) // 100))  # nearest-rank
    return ordered[min(rank, len(ordered)) - 1]


class Client:
    """Opens MCP client sessions to targets; all of them close when the benchmark ends."""

    def __init__(self, stack: AsyncExitStack, errlog: TextIO) -> None:
        self.stack = stack
        self.errlog = errlog
        self._http: Any = None

    async def open(self, target: Target) -> Any:
        from mcp.client.session import ClientSession

        if target.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            if self._http is None:  # creating an httpx2 client costs ~40 ms: one, shared by every session
                self._http = await self.stack.enter_async_context(
                    httpx2.AsyncClient(
                        timeout=httpx2.Timeout(30.0, read=300.0),
                        trust_env=False,
                        limits=httpx2.Limits(max_connections=500, max_keepalive_connections=500),
                    )
                )
            if target.modern:
                from mcp.client import Client

                transport = streamable_http_client(target.url, http_client=self._http)
                client = Client(transport, mode="2026-07-28", cache=None)
                return (await self.stack.enter_async_context(client)).session
            read, write = await self.stack.enter_async_context(
                streamable_http_client(target.url, http_client=self._http)
            )
        else:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            assert target.argv is not None
            params = StdioServerParameters(command=target.argv[0], args=target.argv[1:], cwd=str(target.cwd))
            before = set(children_of().get(os.getpid(), ()))
            read, write = await self.stack.enter_async_context(stdio_client(params, errlog=self.errlog))
            target.spawned += [pid for pid in children_of().get(os.getpid(), ()) if pid not in before]
        session = await self.stack.enter_async_context(ClientSession(read, write, read_timeout_seconds=60))
        await session.initialize()
        return session


async def echo(session: Any) -> None:
    result = await session.call_tool("echo", ARGS)
    if result.is_error or not result.content or getattr(result.content[0], "text", None) != ARGS["text"]:
        raise RuntimeError(f"unexpected echo result: {result}")


async def warm(session: Any, calls: int) -> None:
    for _ in range(calls):
        await echo(session)


def rotated(items: list[Target], r: int) -> list[Target]:
    if not items:
        return items
    k = r % len(items)
    return items[k:] + items[:k]


# ----------------------------------------------------------------------------------------------- sections


async def bench_calls(targets: list[Target], client: Client, plan: Plan) -> None:
    say(f"calls: opening {len(targets)} sessions")
    sessions = {t.key: await client.open(t) for t in targets}
    for t in targets:
        await warm(sessions[t.key], max(3, plan.warmup // (plan.slow_divisor if t.slow else 1)))
    meter = CpuMeter(targets)
    samples: dict[str, list[float]] = {t.key: [] for t in targets}
    for r in range(plan.seq_rounds):
        for t in rotated(targets, r):
            n = max(5, plan.seq_calls // plan.slow_divisor) if t.slow else plan.seq_calls
            session, out = sessions[t.key], samples[t.key]
            before = meter.snapshot(t.key)
            for _ in range(n):
                t0 = time.perf_counter()
                await echo(session)
                out.append(time.perf_counter() - t0)
            meter.add(t.key, before)
        say(f"calls: round {r + 1}/{plan.seq_rounds} done")
    for t in targets:
        ms = [s * 1000 for s in samples[t.key]]
        t.results["seq"] = {
            "n": len(ms),
            "p50_ms": statistics.median(ms),
            "p99_ms": percentile(ms, 99),
            "mean_ms": statistics.fmean(ms),
            "cpu_per_call": meter.per_call(t.key, len(ms)),
            "samples_ms": [round(v, 4) for v in ms],
        }
        if t.proc is not None:
            t.results["rss_after_calls_mb"] = rss_mb(t.proc.serving_pid)


async def bench_throughput(targets: list[Target], client: Client, plan: Plan) -> None:
    say(f"throughput: opening {plan.tp_sessions} sessions for each of {len(targets)} targets")
    pools: dict[str, list[Any]] = {}
    targets = [t for t in targets if t.key not in THROUGHPUT_SKIP]
    for t in targets:
        pools[t.key] = [await client.open(t) for _ in range(plan.tp_sessions)]
        say(f"throughput: {t.key}: {plan.tp_sessions} sessions open")
        async with anyio.create_task_group() as tg:
            for session in pools[t.key]:
                tg.start_soon(warm, session, 3)
    totals: dict[str, list[float]] = {t.key: [0.0, 0.0] for t in targets}  # calls, seconds
    meter = CpuMeter(targets)

    async def worker(session: Any, n: int) -> None:
        for _ in range(n):
            await echo(session)

    for r in range(plan.tp_rounds):
        for t in rotated(targets, r):
            n = max(2, plan.tp_calls // (2 * plan.slow_divisor)) if t.slow else plan.tp_calls
            before = meter.snapshot(t.key)
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for session in pools[t.key]:
                    tg.start_soon(worker, session, n)
            totals[t.key][0] += n * len(pools[t.key])
            totals[t.key][1] += time.perf_counter() - t0
            meter.add(t.key, before)
        say(f"throughput: round {r + 1}/{plan.tp_rounds} done")
    for t in targets:
        calls, seconds = totals[t.key]
        t.results["throughput"] = {
            "sessions": plan.tp_sessions,
            "calls": int(calls),
            "calls_per_s": calls / seconds,
            "cpu_per_call": meter.per_call(t.key, int(calls)),
        }


async def bench_list(targets: list[Target], client: Client, plan: Plan) -> None:
    say(f"list: opening {len(targets)} sessions")
    sessions = {t.key: await client.open(t) for t in targets}
    expected = {t.key: t.results["tools"] for t in targets}
    for t in targets:
        for _ in range(3):
            got = len((await sessions[t.key].list_tools()).tools)
            if got != expected[t.key]:
                raise RuntimeError(f"{t.key}: tools/list returned {got} tools, expected {expected[t.key]}")
    samples: dict[str, list[float]] = {t.key: [] for t in targets}
    for r in range(plan.list_rounds):
        for t in rotated(targets, r):
            for _ in range(plan.list_calls):
                t0 = time.perf_counter()
                await sessions[t.key].list_tools()
                samples[t.key].append(time.perf_counter() - t0)
        say(f"list: round {r + 1}/{plan.list_rounds} done")
    for t in targets:
        ms = [s * 1000 for s in samples[t.key]]
        t.results["list"] = {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 99)}
        if t.proc is not None:
            t.results["rss_mb"] = rss_mb(t.proc.serving_pid)


# ----------------------------------------------------------------------------------------------- profile


def find_py_spy() -> str | None:
    local = Path(PY).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


async def profile(
    name: str, pid: int, load: Callable[[], Awaitable[int]], seconds: float, outdir: Path, py_spy: str
) -> dict[str, Any]:
    """Sample process ``pid`` with py-spy (on-CPU samples only, all threads) while ``load`` runs; summarise the
    stacks."""
    raw = outdir / f"profile-{name}.txt"
    rate = 250
    cmd = [py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(int(seconds) + 1)]
    cmd += ["--format", "raw", "--output", str(raw), "--threads", "--gil"]
    log = outdir / f"profile-{name}.log"
    with open(log, "wb") as stderr:  # noqa: ASYNC230 - a log file, opened once
        spy = await anyio.open_process(cmd, stdout=stderr, stderr=stderr)
        await anyio.sleep(0.5)  # let it attach before the load starts
        threads_before = thread_cpu(pid)
        t0 = time.perf_counter()
        calls = 0
        while time.perf_counter() - t0 < seconds:  # the load stays inside py-spy's window (seconds + 1)
            calls += await load()
        elapsed = time.perf_counter() - t0
        threads_after = thread_cpu(pid)
        with anyio.fail_after(30):
            await spy.wait()
    if not raw.exists():
        return {"error": f"py-spy wrote nothing (exit {spy.returncode}): {log.read_text(errors='replace')[-500:]}"}
    summary = summarise_stacks(raw.read_text(), rate)
    per_thread = collections.Counter[str]()
    for tid, (thread, ns) in threads_after.items():
        per_thread[thread] += ns - threads_before.get(tid, (thread, 0))[1]
    summary.update(name=name, calls=calls, load_seconds=elapsed, raw=raw.name)
    if calls:
        summary["cpu_ms_per_call"] = sum(per_thread.values()) / 1e6 / calls
        summary["thread_cpu_ms_per_call"] = {k: round(v / 1e6 / calls, 3) for k, v in per_thread.most_common() if v}
    return summary


def thread_cpu(pid: int) -> dict[str, tuple[str, int]]:
    """tid -> (thread name, ns on CPU so far)."""
    out: dict[str, tuple[str, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            out[tid] = (name, int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return out


PACKAGES = (
    # (bucket, substrings of a frame's file path), first match wins
    ("gateway (router, catalog, backends, server)", ("/gateway/",)),
    ("audit ledger (sqlite thread)", ("sqlite3",)),
    ("mcp SDK: server session / streamable HTTP server", ("mcp/server/",)),
    ("mcp SDK: client session / streamable HTTP client", ("mcp/client/",)),
    ("mcp SDK: shared session, JSON-RPC messages", ("mcp/shared/", "mcp_types/")),
    ("pydantic (validation / serialisation)", ("pydantic",)),
    ("starlette", ("starlette/",)),
    ("uvicorn + h11 (HTTP server)", ("uvicorn/", "h11/", "httptools")),
    ("httpx2 / httpcore2 (HTTP client to the downstream)", ("httpx", "httpcore")),
    ("anyio", ("anyio/",)),
    ("asyncio event loop", ("asyncio/", "selectors.py", "uvloop")),
    ("structlog", ("structlog/",)),
    ("json", ("json/",)),
    ("logging", ("logging/",)),
)


STAGES = (
    # (label, function): the share of samples with this function anywhere on the stack (self + callees)
    ("downstream leg: the SDK client's POST and SSE read", "StreamableHTTPTransport._handle_post_request"),
    ("  of which opening a new TCP connection", "AsyncHTTPConnection._connect"),
    ("upstream leg: uvicorn running the ASGI app for a request", "RequestResponseCycle.run_asgi"),
    ("  of which the SDK's streamable HTTP server transport", "StreamableHTTPServerTransport.handle_request"),
    ("upstream: writing the SSE response", "SessionTransport._stream"),
    ("upstream: HTTP parsing (h11 / uvicorn data_received)", "H11Protocol.data_received"),
    ("the SDK server's request dispatch (validation, handler, result sieve)", "ServerRunner._on_request"),
    ("  of which the result sieve (validate + dump per protocol version)", "serialize_server_result"),
    ("  of which the gateway's router (Router.call)", "Router.call"),
    ("    of which the audit ledger's record()", "Ledger.record"),
    ("    of which finishing the call (log line, audit row)", "Router._finish"),
    ("the audit ledger's writer thread", "Ledger._work"),
)


def _bucket(frame: str) -> str:
    for bucket, needles in PACKAGES:
        if any(n in frame for n in needles):
            return bucket
    return "other (stdlib, threads, C)"


def _short(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (pkg/file.py)`` (line numbers merged)."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :]
    elif "gateway" in parts:
        parts = parts[len(parts) - 1 - parts[::-1].index("gateway") :]
    else:
        parts = parts[-2:]
    return f"{func} ({'/'.join(parts)})"


def summarise_stacks(text: str, rate: int) -> dict[str, Any]:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    buckets: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    stage_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = ""
        if frames and frames[0].startswith("thread ("):  # "thread (TID): NAME" or "thread (TID)"
            head = frames.pop(0)
            thread = head.partition("): ")[2] or head
        if not frames:
            continue
        total += count
        threads[thread] += count
        leaf = frames[-1]
        self_time[_short(leaf)] += count
        buckets[_bucket(leaf)] += count
        for f in {_short(f) for f in frames}:
            inclusive[f] += count
        functions = {f.partition(" (")[0] for f in frames}
        for label, function in STAGES:
            if function in functions:
                stage_counts[label] += count
    pct = (lambda c: 100.0 * c / total) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "cpu_seconds": total / rate,
        "threads": {k or "?": round(pct(v), 1) for k, v in threads.most_common()},
        "self_top": [(f, round(pct(c), 1)) for f, c in self_time.most_common(25)],
        "by_package": [(b, round(pct(c), 1)) for b, c in buckets.most_common()],
        "inclusive_gateway": [
            (f, round(pct(c), 1)) for f, c in inclusive.most_common() if "gateway/" in f and pct(c) >= 0.5
        ][:15],
        "inclusive_top": [(f, round(pct(c), 1)) for f, c in inclusive.most_common(40)],
        "stages": [(label, round(pct(stage_counts[label]), 1)) for label, _ in STAGES if stage_counts[label]],
    }


# ----------------------------------------------------------------------------------------------- report


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def verdicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each read off this run: what, the measured ratio or size, the aim, met or not."""
    calls = {t["key"]: t for t in doc["targets"]}
    lists = {t["key"]: t for t in doc["list_targets"]}
    rows: list[dict[str, Any]] = []

    def ratio_of(key: str, floor: str, section: str, field: str) -> float | None:
        a = calls.get(key, {}).get(section, {}).get(field)
        b = calls.get(floor, {}).get(section, {}).get(field)
        return a / b if a is not None and b else None

    def add(what: str, value: float | None, aim: str, ok: Callable[[float], bool], unit: str = "x") -> None:
        if value is not None:
            shown = round(value, 3 if unit == "x" else 2 if unit == " ms" else 1)
            rows.append({"what": what, "value": shown, "unit": unit, "aim": aim, "met": ok(value)})

    add(
        "p50, HTTP downstream, ledger on (gateway / bare relay)",
        ratio_of("gateway-http-ledger", RELAY, "seq", "p50_ms"),
        "<= 1.15x",
        lambda v: v <= 1.15,
    )
    add(
        f"{doc['plan']['tp_sessions']}-session throughput, HTTP, ledger on (gateway / bare relay)",
        ratio_of("gateway-http-ledger", RELAY, "throughput", "calls_per_s"),
        ">= 0.9x",
        lambda v: v >= 0.9,
    )
    for key in ("gateway-http", "gateway-http-ledger"):
        front = calls.get(key, {}).get("seq", {}).get("cpu_per_call", {}).get("front_ms")
        before = FRONT_CPU_BEFORE_MS[key]
        add(
            f"gateway CPU per call, {key} (ms; {before} before issue 17)",
            front,
            f"<= {before / 2:.2f} ms",
            lambda v, b=before: v <= b / 2,
            unit=" ms",
        )
    add(
        "p50, stdio like-for-like (gateway --stdio / direct stdio), issue 17",
        ratio_of("gateway-stdio-stdio", "direct-stdio", "seq", "p50_ms"),
        "<= 1.3x",
        lambda v: v <= 1.3,
    )
    add(
        "p50, stdio like-for-like (gateway --stdio / bare stdio relay)",
        ratio_of("gateway-stdio-stdio", STDIO_RELAY, "seq", "p50_ms"),
        "(reference)",
        lambda v: True,
    )
    add(
        "p50, stdio like-for-like (bare stdio relay / direct stdio): the floor of a Python relay",
        ratio_of(STDIO_RELAY, "direct-stdio", "seq", "p50_ms"),
        "(reference)",
        lambda v: True,
    )
    add(
        "p50, HTTP downstream (gateway / direct)",
        ratio_of("gateway-http", "direct-http", "seq", "p50_ms"),
        "<= 1.3x",
        lambda v: v <= 1.3,
    )
    add(
        "p50, stdio downstream (gateway --stdio / direct stdio)",
        ratio_of("gateway-stdio-stdio", "direct-stdio", "seq", "p50_ms"),
        "<= 1.15x",
        lambda v: v <= 1.15,
    )
    add(
        "p50, stdio downstream (gateway over HTTP / direct stdio)",
        ratio_of("gateway-http-stdio", "direct-stdio", "seq", "p50_ms"),
        "<= 1.15x",
        lambda v: v <= 1.15,
    )
    for key, floor, what in (
        ("gateway-http", "direct-http", "HTTP downstream"),
        ("gateway-stdio-stdio", "direct-stdio", "stdio, gateway --stdio"),
        ("gateway-http-stdio", "direct-stdio", "stdio, gateway over HTTP"),
    ):
        add(
            f"{doc['plan']['tp_sessions']}-session throughput, {what} (gateway / direct)",
            ratio_of(key, floor, "throughput", "calls_per_s"),
            ">= 0.7x",
            lambda v: v >= 0.7,
        )
    g50, one = lists.get("gateway-50", {}).get("list", {}), lists.get("single-2500", {}).get("list", {})
    if g50 and one:
        add(
            "tools/list p50, 50 backends x 50 tools / one server with 2,500 tools",
            g50["p50_ms"] / one["p50_ms"],
            "<= 1.0x",
            lambda v: v <= 1.0,
        )
    for backends, key in ((1, "gateway-1"), (50, "gateway-50")):
        rss = lists.get(key, {}).get("rss_mb", {}).get("VmRSS")
        add(
            f"gateway resident memory, {backends} backend{'s' if backends > 1 else ''}",
            rss,
            "< 150 MB" if backends == 50 else "(reference)",
            lambda v: v < 150,
            unit=" MB",
        )
    return rows


def relay_of(key: str) -> str | None:
    """The bare relay a target is read against: HTTP in and out, or stdio in and out (None: no like-for-like)."""
    if key in HTTP_KEYS:
        return RELAY
    return STDIO_RELAY if key.startswith("gateway-stdio-stdio") else None


def report(doc: dict[str, Any]) -> str:
    out: list[str] = []
    env = doc["environment"]
    out.append(f"# Gateway benchmark ({'quick' if doc['quick'] else 'full'})\n")
    out.append(
        f"{env['cpus']} CPUs, {env['platform']}, Python {env['python']}, loopback; gateway at "
        f"{env.get('gateway', '?')}; load average before: {env['load_before']}, after: "
        f"{env.get('load_after', '?')}; wall time {doc.get('wall_s', 0):.0f} s\n"
    )
    for note in doc["notes"]:
        out.append(f"- {note}")
    if doc["notes"]:
        out.append("")
    if doc.get("verdicts"):
        out.append("## Against the targets\n")
        out.append("| measure | this run | aim | met |\n|---|---|---|---|")
        for v in doc["verdicts"]:
            met = "-" if v["aim"] == "(reference)" else ("yes" if v["met"] else "**no**")
            out.append(f"| {v['what']} | {v['value']}{v['unit']} | {v['aim']} | {met} |")
        out.append("")
    calls = [t for t in doc["targets"] if "seq" in t or "throughput" in t]
    if calls:
        by_key = {t["key"]: t for t in doc["targets"]}
        out.append("## Calls (echo tool)\n")

        def vs_relay(t: dict[str, Any], section: str, field: str, sub: str | None = None) -> str:
            relay = by_key.get(relay_of(t["key"]) or "", {})
            if not relay or t["key"] in (RELAY, STDIO_RELAY):
                return "-"
            a, b = t.get(section, {}), relay.get(section, {})
            if sub is not None:
                a, b = a.get(sub, {}), b.get(sub, {})
            return ratio(a.get(field), b.get(field)) if a.get(field) else "-"

        out.append(
            "| downstream | target | n | p50 ms | p99 ms | p50 vs direct | p99 vs direct | p50 vs relay | "
            f"p99 vs relay | {doc['plan']['tp_sessions']}-session calls/s | vs direct | vs relay |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for t in calls:
            floor = by_key.get(t["floor"] or t["key"], {})
            seq, fseq = t.get("seq", {}), floor.get("seq", {})
            tp, ftp = t.get("throughput", {}), floor.get("throughput", {})
            out.append(
                f"| {t['downstream']} | {t['label']} | {seq.get('n', '-')} | {fmt(seq.get('p50_ms'))} | "
                f"{fmt(seq.get('p99_ms'))} | {ratio(seq.get('p50_ms'), fseq.get('p50_ms'))} | "
                f"{ratio(seq.get('p99_ms'), fseq.get('p99_ms'))} | {vs_relay(t, 'seq', 'p50_ms')} | "
                f"{vs_relay(t, 'seq', 'p99_ms')} | {fmt(tp.get('calls_per_s'), 0)} | "
                f"{ratio(tp.get('calls_per_s'), ftp.get('calls_per_s'))} | "
                f"{vs_relay(t, 'throughput', 'calls_per_s')} |"
            )
        out.append("")
        out.append(
            "CPU time per call (ms, utime + stime from /proc/PID/stat): the client (this process), the front "
            "(the gateway's supervisor and serving child, the relay or the proxy) and the downstream; sequential "
            'calls, then the throughput run. "runq" is time these processes were ready but waiting for a CPU (the '
            "machine's other load).\n"
        )
        out.append(
            "| downstream | target | client | front | downstream | total | vs direct | front vs relay | "
            f"total vs relay | runq | {doc['plan']['tp_sessions']}-session front | "
            f"{doc['plan']['tp_sessions']}-session total | vs direct |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for t in calls:
            floor = by_key.get(t["floor"] or t["key"], {})
            c = t.get("seq", {}).get("cpu_per_call", {})
            fc = floor.get("seq", {}).get("cpu_per_call", {})
            tc = t.get("throughput", {}).get("cpu_per_call", {})
            ftc = floor.get("throughput", {}).get("cpu_per_call", {})
            out.append(
                f"| {t['downstream']} | {t['label']} | {fmt(c.get('client_ms'))} | "
                f"{fmt(c.get('front_ms')) if c.get('front_ms') else '-'} | {fmt(c.get('downstream_ms'))} | "
                f"{fmt(c.get('total_ms'))} | {ratio(c.get('total_ms'), fc.get('total_ms'))} | "
                f"{vs_relay(t, 'seq', 'front_ms', 'cpu_per_call')} | "
                f"{vs_relay(t, 'seq', 'total_ms', 'cpu_per_call')} | "
                f"{fmt(c.get('runqueue_wait_ms'))} | {fmt(tc.get('front_ms')) if tc.get('front_ms') else '-'} | "
                f"{fmt(tc.get('total_ms'))} | {ratio(tc.get('total_ms'), ftc.get('total_ms'))} |"
            )
        out.append("")
    ledger_rows = [t for t in calls if t["key"].endswith("-ledger") and "seq" in t]
    if ledger_rows:
        by_key = {t["key"]: t for t in doc["targets"]}
        out.append("## Audit ledger: on vs off (same run, same downstream)\n")
        out.append("| front | p50 off / on ms | p50 added | p99 off / on ms | front CPU per call off / on ms | added |")
        out.append("|---|---|---|---|---|---|")
        for t in ledger_rows:
            off = by_key.get(t["key"].removesuffix("-ledger"), {}).get("seq")
            on = t["seq"]
            if not off:
                continue
            c_off, c_on = off["cpu_per_call"].get("front_ms"), on["cpu_per_call"].get("front_ms")
            out.append(
                f"| {t['label'].replace(' (ledger on)', '')} ({t['downstream']} downstream) | "
                f"{fmt(off['p50_ms'])} / {fmt(on['p50_ms'])} | {on['p50_ms'] - off['p50_ms']:+.2f} ms "
                f"({ratio(on['p50_ms'], off['p50_ms'])}) | {fmt(off['p99_ms'])} / {fmt(on['p99_ms'])} | "
                f"{fmt(c_off)} / {fmt(c_on)} | "
                f"{(c_on - c_off) if c_on is not None and c_off is not None else 0:+.2f} ms |"
            )
        out.append("")
    lists = [t for t in doc["list_targets"] if "list" in t]
    if lists:
        by_key = {t["key"]: t for t in lists}
        out.append("## tools/list\n")
        out.append("| target | backends | tools | n | p50 ms | p99 ms | vs one server, same tools | RSS MB |")
        out.append("|---|---|---|---|---|---|---|---|")
        for t in lists:
            floor = by_key.get(t["floor"] or "", {}).get("list", {})
            rss = t.get("rss_mb", {}).get("VmRSS")
            out.append(
                f"| {t['label']} | {t.get('backends', '-')} | {t['tools']} | {t['list']['n']} | "
                f"{fmt(t['list']['p50_ms'])} | {fmt(t['list']['p99_ms'])} | "
                f"{ratio(t['list']['p50_ms'], floor.get('p50_ms')) if floor else '(floor)'} | {fmt(rss, 1)} |"
            )
        out.append("")
    mem = doc.get("memory", [])
    if mem:
        out.append("## Resident memory (the process itself; backends' processes not counted)\n")
        out.append("| process | backends | when | VmRSS MB | VmHWM (peak) MB |")
        out.append("|---|---|---|---|---|")
        for m in mem:
            out.append(
                f"| {m['process']} | {m['backends']} | {m['when']} | {fmt(m.get('VmRSS'), 1)} | "
                f"{fmt(m.get('VmHWM'), 1)} |"
            )
        out.append("")
    for p in doc.get("profiles", []):
        if "error" in p:
            out.append(f"## Profile: {p['name']}\n\n{p['error']}\n")
            continue
        out.append(f"## Profile: {p['name']}\n")
        per_call = p.get("cpu_ms_per_call")
        threads = ", ".join(f"{k} {v:.2f}" for k, v in p.get("thread_cpu_ms_per_call", {}).items())
        out.append(
            f"{p['load_seconds']:.1f} s of load, {p['calls']} requests. CPU per request (schedstat): "
            f"{fmt(per_call)} ms ({threads}). py-spy: {p['samples']} samples of the thread holding the GIL "
            f"({p['cpu_seconds']:.2f} s of {p['load_seconds']:.1f} s).\n"
        )
        out.append("| self time by package | % |\n|---|---|")
        out += [f"| {b} | {v} |" for b, v in p["by_package"]]
        out.append("\n| top frames by self time | % |\n|---|---|")
        out += [f"| `{f}` | {v} |" for f, v in p["self_top"][:15]]
        if p.get("stages"):
            out.append("\n| where the time goes (inclusive: the function and its callees) | % |\n|---|---|")
            out += [f"| {label} | {v} |" for label, v in p["stages"]]
        if p["inclusive_gateway"]:
            out.append("\n| gateway functions, inclusive (self + callees) | % |\n|---|---|")
            out += [f"| `{f}` | {v} |" for f, v in p["inclusive_gateway"]]
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- main


def selected(only: list[str]) -> tuple[set[str], list[str]]:
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    sections = {n for n in names if n in SECTIONS}
    filters = [n for n in names if n not in SECTIONS]
    if not sections:  # a target filter alone runs the call sections for those targets
        sections = {"calls", "throughput"} if filters else set(SECTIONS)
    return sections, filters


def wanted(key: str, filters: list[str]) -> bool:
    return not filters or any(f in key for f in filters)


async def run(args: argparse.Namespace, workdir: Path, procs: Procs) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    sections, filters = selected(args.only)
    notes: list[str] = []
    doc: dict[str, Any] = {
        "quick": args.quick,
        "plan": plan.__dict__,
        "notes": notes,
        "targets": [],
        "list_targets": [],
        "memory": [],
        "profiles": [],
    }
    fastmcp = args.fastmcp_version is not None
    if not fastmcp:
        notes.append(f"FastMCP rows skipped: {args.fastmcp_problem} (run scripts/install).")
    else:
        doc["fastmcp_version"] = args.fastmcp_version
    py_spy = find_py_spy()
    if "profile" in sections and py_spy is None:
        notes.append("Profile skipped: py-spy is not installed (`.venv/bin/pip install py-spy`).")
        sections.discard("profile")

    echo_stdio = [PY, str(ECHO), "--stdio"]
    targets: list[Target] = []
    started: list[Proc] = []

    def gateway(
        name: str,
        servers: dict[str, dict[str, Any]],
        ledger: bool,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Proc:
        port = free_port()
        db = workdir / f"{name}-audit.db" if ledger else None
        cfg = write_federation(workdir / f"{name}.yaml", servers, ledger=db)
        argv = [*gateway_argv(), "--log-level", "warning", "serve", "-c", str(cfg), "--port", str(port)]
        proc = procs.start(
            name,
            argv,
            port,
            health=f"http://{LOOPBACK}:{port}/healthz",
            env=None if env is None else os.environ | env,
            cwd=cwd,
        )
        proc.backends = len(servers)
        started.append(proc)
        return proc

    def bare_relay(name: str, url: str) -> Proc:
        port = free_port()
        argv = [PY, str(BARE_RELAY), "--port", str(port), "--url", url]
        if os.environ.get("BENCH_RELAY_UVLOOP"):
            argv.append("--uvloop")
        proc = procs.start(name, argv, port)
        started.append(proc)
        return proc

    def fastmcp_proxy(name: str, target: list[str]) -> Proc:
        port = free_port()
        proc = procs.start(name, [str(FASTMCP_PYTHON), str(FASTMCP_PROXY), "--port", str(port), *target], port)
        started.append(proc)
        return proc

    def stdio_gateway(name: str, servers: dict[str, dict[str, Any]], ledger: bool) -> list[str]:
        db = workdir / f"{name}-audit.db" if ledger else None
        cfg = write_federation(workdir / f"{name}.yaml", servers, ledger=db)
        return [*gateway_argv(), "--log-level", "warning", "serve", "--stdio", "-c", str(cfg)]

    # Which call targets run: those --only names, their direct floors, and what the profile needs.
    floors = {k: ("direct-http" if k in HTTP_KEYS else "direct-stdio") for k in (*HTTP_KEYS, *STDIO_KEYS)}
    measured = {k for k in floors if wanted(k, filters)} if sections & {"calls", "throughput"} else set()
    if not any("uvloop" in f for f in filters):  # uvloop: measured only when an --only name asks for it
        measured.discard("gateway-http-ledger-uvloop")
    if args.baseline is None:
        measured -= {
            "gateway-http-ledger-baseline",
            "gateway-http-ledger-modern-baseline",
            "gateway-stdio-stdio-baseline",
        }
    if not fastmcp:
        measured -= {"fastmcp-http", "fastmcp-http-stdio"}
    if args.quick:
        measured -= {"gateway-stdio-stdio-ledger"}
    measured |= {
        k.removesuffix("-ledger") for k in measured if k.endswith("-ledger")
    }  # a ledger row is read against its ledger-off twin
    measured |= {floors[k] for k in measured}
    if measured & set(HTTP_KEYS):
        measured.add(RELAY)  # every HTTP row is read against the bare relay too
    if any(k.startswith("gateway-stdio-stdio") for k in measured):
        measured.add(STDIO_RELAY)  # and stdio in, stdio out against the bare stdio relay
    need = set(measured)
    if "profile" in sections:
        need |= {"gateway-http", "gateway-http-ledger"} | (set() if args.quick else {"gateway-stdio-stdio"})

    if need:
        echo_port = free_port()
        echo_http = procs.start("echo-http", [PY, str(ECHO), "--http", str(echo_port)], echo_port)
        started.append(echo_http)
        echo_url = f"http://{LOOPBACK}:{echo_port}/mcp"
        http_down = {"echo": {"transport": "streamable_http", "url": echo_url}}
        stdio_down = {"echo": {"transport": "stdio", "command": PY, "args": [str(ECHO), "--stdio"]}}
        fm = f"FastMCP {doc.get('fastmcp_version', '')} create_proxy"

        def endpoint(proc: Proc) -> str:
            return f"http://{LOOPBACK}:{proc.port}/mcp"

        makers: dict[str, Callable[[], Target]] = {
            "direct-http": lambda: Target("direct-http", "direct", "http", url=echo_url),
            "relay-http": lambda: _t(
                "relay-http", "bare relay (uvicorn + httpx2)", "http", bare_relay("relay", echo_url)
            ),
            "gateway-http": lambda: _t(
                "gateway-http", "gateway (ledger off)", "http", gateway("gateway-http", http_down, ledger=False)
            ),
            "gateway-http-ledger": lambda: _t(
                "gateway-http-ledger",
                "gateway (ledger on)",
                "http",
                gateway("gateway-http-ledger", http_down, ledger=True),
            ),
            "gateway-http-ledger-uvloop": lambda: _t(
                "gateway-http-ledger-uvloop",
                "gateway (ledger on, uvloop)",
                "http",
                gateway("gateway-http-ledger-uvloop", http_down, ledger=True, env={"GATEWAY_UVLOOP": "1"}),
            ),
            "gateway-http-ledger-baseline": lambda: _t(
                "gateway-http-ledger-baseline",
                f"gateway (ledger on), baseline {args.baseline_name}",
                "http",
                gateway("gateway-http-ledger-baseline", http_down, ledger=True, cwd=args.baseline),
            ),
            "gateway-http-ledger-modern": lambda: _t(
                "gateway-http-ledger-modern",
                "gateway (ledger on), a 2026-07-28 client",
                "http",
                gateway("gateway-http-ledger-modern", http_down, ledger=True),
                modern=True,
            ),
            "gateway-http-ledger-modern-baseline": lambda: _t(
                "gateway-http-ledger-modern-baseline",
                f"gateway (ledger on), a 2026-07-28 client, baseline {args.baseline_name}",
                "http",
                gateway("gateway-http-ledger-modern-baseline", http_down, ledger=True, cwd=args.baseline),
                modern=True,
            ),
            "fastmcp-http": lambda: _t(
                "fastmcp-http", fm, "http", fastmcp_proxy("fastmcp-http", ["--url", echo_url]), slow=True
            ),
            "direct-stdio": lambda: Target(
                "direct-stdio", "direct (client spawns the server)", "stdio", argv=echo_stdio
            ),
            "relay-stdio": lambda: Target(
                "relay-stdio",
                "bare relay (client spawns it, it spawns the server)",
                "stdio",
                argv=[PY, str(BARE_STDIO_RELAY), "--", *echo_stdio],
            ),
            "gateway-http-stdio": lambda: _t(
                "gateway-http-stdio",
                "gateway, HTTP in (ledger off)",
                "stdio",
                gateway("gateway-http-stdio", stdio_down, ledger=False),
            ),
            "gateway-stdio-stdio": lambda: Target(
                "gateway-stdio-stdio",
                "gateway --stdio (ledger off)",
                "stdio",
                argv=stdio_gateway("gateway-stdio", stdio_down, ledger=False),
            ),
            "gateway-stdio-stdio-ledger": lambda: Target(
                "gateway-stdio-stdio-ledger",
                "gateway --stdio (ledger on)",
                "stdio",
                argv=stdio_gateway("gateway-stdio-ledger", stdio_down, ledger=True),
            ),
            "gateway-stdio-stdio-baseline": lambda: Target(
                "gateway-stdio-stdio-baseline",
                f"gateway --stdio (ledger off), baseline {args.baseline_name}",
                "stdio",
                argv=stdio_gateway("gateway-stdio-baseline", stdio_down, ledger=False),
                cwd=args.baseline,
            ),
            "fastmcp-http-stdio": lambda: _t(
                "fastmcp-http-stdio",
                f"{fm}, HTTP in",
                "stdio",
                fastmcp_proxy("fastmcp-http-stdio", ["--stdio", "--", *echo_stdio]),
                slow=True,
            ),
        }

        def _t(key: str, label: str, downstream: str, proc: Proc, slow: bool = False, modern: bool = False) -> Target:
            return Target(key, label, downstream, url=endpoint(proc), proc=proc, slow=slow, modern=modern)

        for key in (*HTTP_KEYS, *STDIO_KEYS):
            if key in need:
                t = makers[key]()
                t.floor = None if key.startswith("direct-") else floors[key]
                t.measured = key in measured
                if t.downstream == "http":
                    t.down_pids = [echo_http.serving_pid]
                targets.append(t)

    list_targets: list[Target] = []
    if "list" in sections or "profile" in sections:
        per = 50
        multi_port = free_port()
        multi = procs.start(
            "multi-echo",
            [PY, str(MULTI_ECHO), "--port", str(multi_port), "--backends", "50", "--tools", str(per)],
            multi_port,
        )
        started.append(multi)
        singles = {}
        sizes = (1, 50) if args.quick else (1, 10, 50)
        for n in sizes:
            if n == 1:
                url = f"http://{LOOPBACK}:{multi_port}/b0/mcp"  # one of the 50 backends, 50 tools
            else:
                port = free_port()
                extra = n * per - ECHO_BUILTIN_TOOLS
                singles[n] = procs.start(
                    f"echo-{n * per}", [PY, str(ECHO), "--http", str(port), "--tools", str(extra)], port
                )
                started.append(singles[n])
                url = f"http://{LOOPBACK}:{port}/mcp"
            t = Target(f"single-{n * per}", f"one server, {n * per} tools", "http", url=url)
            t.results["tools"] = n * per
            list_targets.append(t)
        for n in sizes:
            servers = {
                f"b{k}": {"transport": "streamable_http", "url": f"http://{LOOPBACK}:{multi_port}/b{k}/mcp"}
                for k in range(n)
            }
            g = gateway(f"gateway-{n}-backends", servers, ledger=False)
            t = Target(
                f"gateway-{n}",
                f"gateway, {n} backends x {per} tools",
                "http",
                url=f"http://{LOOPBACK}:{g.port}/mcp",
                floor=f"single-{n * per}",
                proc=g,
            )
            t.results["tools"] = n * per
            list_targets.append(t)
        # interleave: single-50, gateway-1, single-500, gateway-10, ...
        half = len(sizes)
        list_targets = [t for pair in zip(list_targets[:half], list_targets[half:], strict=True) for t in pair]

    say(f"starting {len(started)} server processes")
    t0 = time.monotonic()
    procs.wait_ready(started)
    say(f"all ready in {time.monotonic() - t0:.1f} s")
    for p in started:
        if p.health is not None:
            memory = rss_mb(p.serving_pid)
            doc["memory"].append({"process": p.name, "backends": p.backends, "when": "ready, idle", **memory})

    errlog = open(workdir / "stdio-servers.log", "w")  # noqa: ASYNC230 - closed by the stack
    async with AsyncExitStack() as stack:
        stack.callback(errlog.close)
        client = Client(stack, errlog)
        call_targets = [t for t in targets if t.measured]
        if "calls" in sections:
            await bench_calls(call_targets, client, plan)
        if "throughput" in sections:
            await bench_throughput(call_targets, client, plan)
        if "list" in sections:
            await bench_list(list_targets, client, plan)
        for t in [*call_targets, *list_targets]:
            if t.proc is not None and t.proc.health is not None:
                for key, when in (("rss_after_calls_mb", "after the call benchmarks"), ("rss_mb", "after tools/list")):
                    if key in t.results:
                        doc["memory"].append(
                            {"process": t.proc.name, "backends": t.proc.backends, "when": when, **t.results[key]}
                        )
        if "profile" in sections and py_spy is not None:
            outdir = Path(args.profile_dir) if args.profile_dir else workdir
            outdir.mkdir(parents=True, exist_ok=True)
            by_key = {t.key: t for t in [*targets, *list_targets]}
            profiles = [("gateway-http", "sequential echo calls, ledger off")]
            if not args.quick:
                profiles.append(("gateway-http-ledger", "sequential echo calls, ledger on"))
            for key, name in profiles:
                found = by_key.get(key)
                if found is None or found.proc is None:
                    continue
                t, gw = found, found.proc
                session = await client.open(t)
                await warm(session, plan.warmup)

                async def load(session: Any = session) -> int:
                    for _ in range(20):
                        await echo(session)
                    return 20

                say(f"profile: {name} ({plan.profile_s:g} s)")
                doc["profiles"].append(await profile(key, gw.serving_pid, load, plan.profile_s, outdir, py_spy))
                doc["profiles"][-1]["name"] = f"{t.label}, {name}"
            stdio = by_key.get("gateway-stdio-stdio")
            if stdio is not None and not args.quick:
                before = set(stdio.spawned)
                session = await client.open(stdio)
                await warm(session, plan.warmup)
                opened = [pid for pid in stdio.spawned if pid not in before]
                tree = children_of()  # ``gateway serve --stdio`` is a supervisor and its serving child
                serving = [c for pid in opened for c in tree.get(pid, ()) if cmdline(c) == cmdline(pid)] or opened

                async def load_stdio(session: Any = session) -> int:
                    for _ in range(20):
                        await echo(session)
                    return 20

                name = "sequential echo calls, stdio in and out"
                say(f"profile: gateway --stdio, {name} ({plan.profile_s:g} s)")
                doc["profiles"].append(
                    await profile("gateway-stdio-stdio", serving[0], load_stdio, plan.profile_s, outdir, py_spy)
                )
                doc["profiles"][-1]["name"] = f"{stdio.label}, {name}"
            g50 = by_key.get("gateway-50")
            if g50 is not None and not args.quick and g50.proc is not None:
                t, gw = g50, g50.proc
                session = await client.open(t)
                await session.list_tools()

                async def load_list(session: Any = session) -> int:
                    await session.list_tools()
                    return 1

                say(f"profile: tools/list, 50 backends ({plan.profile_s:g} s)")
                doc["profiles"].append(
                    await profile("gateway-50-list", gw.serving_pid, load_list, plan.profile_s, outdir, py_spy)
                )
                doc["profiles"][-1]["name"] = "gateway, tools/list with 50 backends x 50 tools"
            if args.profile_dir:
                notes.append(f"py-spy raw stacks (collapsed) written to {args.profile_dir}")
        say("closing sessions")
        for t in targets:  # stdio servers the client spawned: stop them now rather than one by one at close
            for pid in t.spawned:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    say("sessions closed")
    doc["targets"] = [_public(t) for t in targets if t.measured]
    doc["list_targets"] = [_public(t) for t in list_targets]
    return doc


def _public(t: Target) -> dict[str, Any]:
    d = {"key": t.key, "label": t.label, "downstream": t.downstream, "floor": t.floor, **t.results}
    if t.proc is not None:
        d["process"] = t.proc.name
        d["backends"] = t.proc.backends
    return d


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (under a minute)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"a section ({', '.join(SECTIONS)}) or part of a target key; repeatable",
    )
    parser.add_argument("--json", metavar="OUT", help="write every number (and the raw samples) as JSON")
    parser.add_argument("--profile-dir", metavar="DIR", help="keep py-spy's raw stacks here")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        type=Path,
        help="another checkout of the gateway (e.g. `git archive COMMIT | tar -x -C DIR`): its `gateway serve` is "
        "one more HTTP target (ledger on), measured in the same rounds",
    )
    args = parser.parse_args()
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
        if not (args.baseline / "gateway" / "__main__.py").exists():
            parser.error(f"--baseline {args.baseline}: no gateway/__main__.py there")
        args.baseline_name = args.baseline.name
    args.fastmcp_version, args.fastmcp_problem = None, f"{FASTMCP_PYTHON.relative_to(ROOT)} is missing"
    if FASTMCP_PYTHON.exists():
        probe = subprocess.run(
            [str(FASTMCP_PYTHON), "-c", "import fastmcp; print(fastmcp.__version__)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0:
            args.fastmcp_version = probe.stdout.strip()
        else:
            args.fastmcp_problem = f"{FASTMCP_PYTHON.relative_to(ROOT)} cannot import fastmcp"
    env = {
        **environment(),
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        procs = Procs(Path(tmp))
        try:
            doc = anyio.run(run, args, Path(tmp), procs)
        finally:
            procs.stop_all(grace_s=STOP_GRACE_S)
            say("servers stopped")
    doc["environment"] = env | {"load_after": load_average()}
    doc["wall_s"] = time.monotonic() - started
    doc["verdicts"] = verdicts(doc)
    print(report(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
