"""One hostile caller against one bystander: do the bystander's calls on every backend keep their speed?

    .venv/bin/python bench/soak_hostile.py [--quick] [--json OUT] [--keep DIR] [--direct] [--attack PART ...] [--busy N]

Everything runs on loopback and stops by itself. The gateway measured is the one in this checkout (``python -m
gateway serve``, ``PYTHONPATH`` at the project root) in front of three backends, every tool prefixed with its
backend's name: ``h`` (tests/fixtures/faults_server.py over streamable HTTP: echo, sleep), ``f`` and ``s``
(tests/fixtures/fidelity_server.py over streamable HTTP and over stdio: pid, elicit, progress; both serve either
era, so they are declared ``protocol: handshake``: a 2026-07-28 client's call to them is then bridged). Two callers:
``bob`` (the bystander, in this process) and ``alice`` (hostile, in a process of her own, as another client is: her
client's work never waits in bob's event loop, nor his in hers). Markdown goes to stdout, progress to stderr; the
exit status is 0 whatever the figures say, 2 only when the harness itself failed.

  * quiet: bob calls ``h__echo``, ``f__pid`` and ``s__pid`` in turn (``Plan.calls`` each, one call at a time on
    one handshake-era session), each call timed;
  * attack: the same calls by bob, once alice's flood is sent, while alice at once
      - floods ``h`` (issue 22, item 1): ``Plan.flood`` ``h__sleep`` calls, each POSTed on a socket of its own that
        is closed as soon as the response head arrives (the call runs on in its session);
      - abandons bridged calls (item 5): a 2026-07-28 client calls ``f__elicit`` and ``s__elicit`` (handshake-era
        downstreams that ask for input mid-call), takes the input-required result and never retries,
        ``Plan.abandoned`` times on each;
      - never reads (item 6): a handshake-era ``f__progress`` and ``s__progress`` of ``Plan.progress`` steps, each
        with a progress token, POSTed on a socket that is never read from.
``--direct`` runs the same attack with no gateway: each client straight to each server, ``s`` a second fidelity server
over streamable HTTP (each client's own session, as a client's own process would be), alice's abandoned bridges left
out (a 2026-07-28 client cannot call a handshake-era server directly): what the attack costs the bystander by itself.
``--attack`` runs only the parts named (``flood``, ``abandon``, ``progress-f``, ``progress-s``; all by default), to
see what each costs the bystander by itself; ``--busy N`` keeps N other processes spinning on a CPU through both
phases (a machine with other work). Reported: bob's p50 and p99 per backend, quiet and under attack, and his
failed calls (an error, an ``isError`` result, or no answer within ``CALL_TIMEOUT_S``) with their reasons; alice's
flood answers by HTTP status; the gateway's VmRSS (quiet, peak under attack, end) and its garbage collections under
attack (their pauses, written by bench/gc_pauses/ on its PYTHONPATH); every backend's state and last error at the end
(/status).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from anyio.streams.buffered import BufferedByteReceiveStream

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import (  # noqa: E402
    GC_PROBE,
    LOOPBACK,
    Procs,
    cmdline,
    cpu_s,
    descendants,
    free_port,
    gc_pauses,
    say,
    vm_kb,
)
from bench.run_env import cpu_shares, cpu_ticks, environment, load_average, publish  # noqa: E402

FAULTS = ROOT / "tests" / "fixtures" / "faults_server.py"
FIDELITY = ROOT / "tests" / "fixtures" / "fidelity_server.py"
PY = sys.executable
TOKENS = "alice=tok-alice,bob=tok-bob"
STATE_KEY = "soak-hostile-" + "0123456789abcdef" * 3
HANDSHAKE = "2025-06-18"
MODERN = "2026-07-28"
READY_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 30.0
SAMPLE_S = 0.2
BYSTANDER_TOOLS = {"h": ("echo", {"text": "bob"}), "f": ("pid", {}), "s": ("pid", {})}
"""Bob's call on each backend (through the gateway, prefixed with the backend's name)."""


@dataclass(frozen=True)
class Target:
    """Where calls to one backend go: the gateway (``prefix``: the backend's name and the separator) or, with
    ``--direct``, the server itself."""

    port: int
    prefix: str

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/mcp"


PARTS = ("flood", "abandon", "progress-f", "progress-s")
"""The parts of alice's attack (``--attack``)."""


@dataclass(frozen=True)
class Plan:
    calls: int  # bob's calls per backend and phase
    pace_s: float  # bob starts a call at most this often
    flood: int  # alice's dropped h__sleep calls
    flood_sleep_s: float
    abandoned: int  # alice's abandoned bridged calls, per backend (f and s)
    progress: int  # steps of each never-read progress call


FULL = Plan(calls=60, pace_s=0.05, flood=150, flood_sleep_s=20.0, abandoned=50, progress=400_000)
QUICK = Plan(calls=20, pace_s=0.05, flood=60, flood_sleep_s=8.0, abandoned=15, progress=100_000)


class HarnessError(RuntimeError):
    """The soak itself could not run (not a bad figure)."""


def config(h_url: str | None, f_url: str, timeout_s: int = 60) -> str:
    """The gateway's federation.yaml: ``h`` at ``h_url`` (left out when None), ``f`` at ``f_url``, ``s`` spawned."""
    stdio = json.dumps([str(FIDELITY), "--stdio", "--name", "s"])
    h = f'  h: {{transport: streamable_http, url: "{h_url}", timeout_s: {timeout_s}}}\n' if h_url else ""
    return f"""
gateway:
  audit: {{enabled: false}}
  naming: {{mode: always, separator: "__"}}
servers:
{h}  f: {{transport: streamable_http, url: "{f_url}", timeout_s: {timeout_s}, protocol: handshake}}
  s: {{transport: stdio, command: "{PY}", args: {stdio}, timeout_s: {timeout_s}, protocol: handshake}}
"""


def _headers(token: str, session: str | None = None, version: str = HANDSHAKE) -> dict[str, str]:
    out = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    if session is not None:
        out |= {"Mcp-Session-Id": session, "Mcp-Protocol-Version": version}
    return out


def _messages(response: httpx2.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and line[5:]]


async def _open_session(http: httpx2.AsyncClient, url: str, token: str) -> str:
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}},
    }
    response = await http.post(url, json=hello, headers=_headers(token))
    if response.status_code != 200:
        raise HarnessError(f"initialize answered {response.status_code}: {response.text[:200]}")
    session = response.headers["mcp-session-id"]
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await http.post(url, json=done, headers=_headers(token, session))
    return session


def _tool_call(rid: int, name: str, arguments: dict[str, Any], progress: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if progress:
        params["_meta"] = {"progressToken": rid}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def _raw_post(port: int, token: str, session: str, body: dict[str, Any]) -> anyio.abc.SocketStream:
    """POST ``body`` on a socket of its own; the caller reads (or not) and closes it."""
    content = json.dumps(body).encode()
    head = [
        "POST /mcp HTTP/1.1",
        f"Host: {LOOPBACK}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(content)}",
        *(f"{k}: {v}" for k, v in _headers(token, session).items()),
    ]
    stream = await anyio.connect_tcp(LOOPBACK, port)
    await stream.send("\r\n".join(head).encode() + b"\r\n\r\n" + content)
    return stream


# ----------------------------------------------------------------------------------------------- the bystander


@dataclass
class Phase:
    latencies: dict[str, list[float]]
    failures: dict[str, list[str]]
    starts: dict[str, list[float]]  # when each call was sent, seconds after the phase's first call
    # during each call, the gateway's event-loop thread: (ms it ran, ms it was ready but waited for a CPU)
    gateway_ms: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def _sched_ms(pid: int | None) -> tuple[float, float]:
    """The main thread of ``pid`` (the gateway's event loop): ms on a CPU and ms waiting for one, so far
    (``/proc/PID/schedstat``); zeros without a pid or the file."""
    if pid is None:
        return 0.0, 0.0
    try:
        ran, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e6, int(waited) / 1e6


async def bystander(
    http: httpx2.AsyncClient, targets: dict[str, Target], sessions: dict[str, str], plan: Plan, gateway: int | None
) -> Phase:
    """Bob's calls, one backend after another in turn, each timed (with what the gateway's event loop did
    meanwhile: ran, or waited for a CPU)."""
    phase = Phase({b: [] for b in BYSTANDER_TOOLS}, {b: [] for b in BYSTANDER_TOOLS}, {b: [] for b in BYSTANDER_TOOLS})
    phase.gateway_ms = {b: [] for b in BYSTANDER_TOOLS}
    rid = 1000
    begun = time.monotonic()
    for _ in range(plan.calls):
        for backend, (tool, arguments) in BYSTANDER_TOOLS.items():
            target, session = targets[backend], sessions[backend]
            url, tool = target.url, target.prefix + tool
            rid += 1
            ran, waited = _sched_ms(gateway)
            started = time.monotonic()
            failure = None
            try:
                with anyio.fail_after(CALL_TIMEOUT_S):
                    response = await http.post(
                        url, json=_tool_call(rid, tool, arguments), headers=_headers("tok-bob", session)
                    )
                answer = _messages(response)[-1] if response.status_code == 200 else None
                if answer is None:
                    failure = f"HTTP {response.status_code}: {response.text[:160]}"
                elif "error" in answer:
                    failure = f"JSON-RPC error: {answer['error'].get('message', '')[:160]}"
                elif answer["result"].get("isError"):
                    failure = "isError: " + "".join(b.get("text", "") for b in answer["result"]["content"])[:160]
            except TimeoutError:
                failure = f"no answer within {CALL_TIMEOUT_S:g} s"
            except (httpx2.HTTPError, ValueError, KeyError, IndexError) as exc:
                failure = f"{type(exc).__name__}: {exc}"[:160]
            elapsed = time.monotonic() - started
            if gateway is not None:  # directly there is no gateway's loop to read
                ran_after, waited_after = _sched_ms(gateway)
                phase.gateway_ms[backend].append((ran_after - ran, waited_after - waited))
            phase.latencies[backend].append(elapsed)
            phase.starts[backend].append(started - begun)
            if failure is not None:
                phase.failures[backend].append(failure)
            await anyio.sleep(max(0.0, plan.pace_s - elapsed))
    return phase


# ----------------------------------------------------------------------------------------------- the attacker


@dataclass
class Attack:
    flood_statuses: collections.Counter[int]
    abandoned: collections.Counter[str]
    never_read: int = 0


async def flood(target: Target, session: str, plan: Plan, attack: Attack, sent: anyio.Event) -> None:
    """Item 1: h__sleep calls, each on a socket closed after the response head (``sent`` once all are)."""

    async def one(n: int) -> None:
        try:
            with anyio.fail_after(CALL_TIMEOUT_S):
                call = _tool_call(5000 + n, target.prefix + "sleep", {"seconds": plan.flood_sleep_s})
                stream = await _raw_post(target.port, "tok-alice", session, call)
                async with stream:
                    received = b""
                    while b"\r\n\r\n" not in received:
                        received += await stream.receive()
            attack.flood_statuses[int(received.split(b" ", 2)[1])] += 1
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError, IndexError):
            attack.flood_statuses[0] += 1

    async with anyio.create_task_group() as tg:
        for n in range(plan.flood):
            tg.start_soon(one, n)
            await anyio.sleep(0.01)
        sent.set()


async def abandon(url: str, plan: Plan, attack: Attack) -> None:
    """Item 5: a stateless client takes input-required results and never retries them."""
    import mcp_types as types
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}, timeout=CALL_TIMEOUT_S) as http:
        async with Client(
            streamable_http_client(url, http_client=http),
            mode=MODERN,
            elicitation_callback=_never_answered,  # declares elicitation: the gateway bridges the downstream's ask
            cache=None,
        ) as client:
            for n in range(plan.abandoned):
                for tool in ("f__elicit", "s__elicit"):
                    try:
                        with anyio.fail_after(CALL_TIMEOUT_S):
                            first = await client.session.call_tool(
                                tool, {"message": f"abandoned {n}"}, allow_input_required=True
                            )
                        if isinstance(first, types.InputRequiredResult):
                            kind = "input_required"
                        else:
                            kind = "answered: " + "".join(getattr(b, "text", "") for b in first.content)[:80]
                    except Exception as exc:  # the attacker only counts what it got
                        kind = f"{type(exc).__name__}: {str(exc)[:80]}"
                    attack.abandoned[f"{tool}: {kind}"] += 1


async def _never_answered(context: object, params: object) -> Any:
    raise AssertionError("an input-required result is taken raw (allow_input_required), never answered")


async def never_read(targets: list[tuple[Target, str]], plan: Plan, attack: Attack, stop: anyio.Event) -> None:
    """Item 6: progress calls whose answers are never read (on each of ``targets``: where, alice's session)."""
    streams = []
    for n, (target, session) in enumerate(targets):
        body = _tool_call(9000 + n, target.prefix + "progress", {"steps": plan.progress}, progress=True)
        streams.append(await _raw_post(target.port, "tok-alice", session, body))
        attack.never_read += 1
    await stop.wait()
    for stream in streams:
        await stream.aclose()


async def attacker(order: dict[str, Any]) -> None:
    """Alice, in a process of her own (``--alice``), as a hostile client is: her client's work never delays bob's
    in one event loop. Says ``sent`` on stdout once her flood is sent, attacks until a line on stdin, then prints what
    she got (one JSON line)."""
    plan, parts, direct = Plan(**order["plan"]), tuple(order["parts"]), order["direct"]
    targets = {name: Target(**target) for name, target in order["targets"].items()}
    sessions = order["sessions"]
    attack = Attack(collections.Counter(), collections.Counter())
    stop, sent = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        readless = [(targets[n], sessions[n]) for n in ("f", "s") if f"progress-{n}" in parts]
        tg.start_soon(never_read, readless, plan, attack, stop)
        if "flood" in parts:
            tg.start_soon(flood, targets["h"], sessions["h"], plan, attack, sent)
        else:
            sent.set()
        if not direct and "abandon" in parts:  # a bridge is the gateway's: a direct 2026 client cannot
            tg.start_soon(abandon, targets["h"].url, plan, attack)  # call these servers at all
        await sent.wait()
        print("sent", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        stop.set()
    result = {
        "flood_statuses": dict(attack.flood_statuses),
        "abandoned": dict(attack.abandoned),
        "never_read": attack.never_read,
    }
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------------- the run


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


async def run(
    plan: Plan,
    workdir: Path,
    direct: bool = False,
    parts: tuple[str, ...] = PARTS,
    nice: int | None = None,
    busy: int = 0,
) -> dict[str, Any]:
    procs = Procs(workdir)
    try:
        for n in range(busy):  # other work on the machine, through both phases
            procs.start(f"busy-{n}", [PY, "-c", "while True: pass"])
        h_port, f_port, g_port = free_port(), free_port(), free_port()
        procs.start("h", [PY, str(FAULTS), "--http", str(h_port)], h_port)
        procs.start("f", [PY, str(FIDELITY), "--http", str(f_port), "--name", "f"], f_port)
        gateway = None
        if direct:  # each client straight to each server (s over HTTP too: its own sessions, as a client's own)
            s_port = free_port()
            procs.start("s", [PY, str(FIDELITY), "--http", str(s_port), "--name", "s"], s_port)
            targets = {"h": Target(h_port, ""), "f": Target(f_port, ""), "s": Target(s_port, "")}
        else:
            (workdir / "federation.yaml").write_text(
                config(f"http://{LOOPBACK}:{h_port}/mcp", f"http://{LOOPBACK}:{f_port}/mcp")
            )
            # a probe's folder first (the caller's PYTHONPATH), then this checkout and the collections' probe
            path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT), str(GC_PROBE)]))
            env = {**os.environ, "PYTHONPATH": path, "GATEWAY_TOKENS": TOKENS, "GATEWAY_STATE_KEY": STATE_KEY}
            argv = [PY, "-m", "gateway", "serve", "-c", str(workdir / "federation.yaml"), "--port", str(g_port)]
            gateway = procs.start("gateway", argv, g_port, env=env)
            targets = {name: Target(g_port, f"{name}__") for name in BYSTANDER_TOOLS}
        async with httpx2.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
            if gateway is not None:
                await _wait_ready(http, g_port, gateway)
                if nice is not None:  # the gateway's own processes (its stdio server, already spawned, keeps its own)
                    for process in {gateway.pid, gateway.serving_pid}:
                        os.setpriority(os.PRIO_PROCESS, process, nice)
            else:
                for target in targets.values():
                    await _wait_listening(target.port)
            pid = gateway.serving_pid if gateway is not None else None
            bobs = {name: await _open_session(http, t.url, "tok-bob") for name, t in targets.items()}
            alices = {name: await _open_session(http, t.url, "tok-alice") for name, t in targets.items()}
            for name, (tool, arguments) in BYSTANDER_TOOLS.items():  # warm-up, not timed
                call = _tool_call(1, targets[name].prefix + tool, arguments)
                await http.post(targets[name].url, json=call, headers=_headers("tok-bob", bobs[name]))
            say("quiet phase")
            ticks = cpu_ticks()
            quiet = await bystander(http, targets, bobs, plan, pid)
            machine = {"quiet": cpu_shares(ticks, cpu_ticks())}
            rss_quiet = vm_kb(pid).get("VmRSS", 0) if pid is not None else 0
            say("attack phase")
            burners = _burners(procs, pid)
            cpu_before = {name: cpu_s(p) for name, p in burners.items()}
            log_mark = len(_log_bytes(workdir))
            stop = anyio.Event()
            peak = [rss_quiet]

            async def sample() -> None:
                while pid is not None and not stop.is_set():
                    peak[0] = max(peak[0], vm_kb(pid).get("VmRSS", 0))
                    with anyio.move_on_after(SAMPLE_S):
                        await stop.wait()

            order = {
                "plan": asdict(plan),
                "parts": list(parts),
                "direct": direct,
                "targets": {name: asdict(target) for name, target in targets.items()},
                "sessions": alices,
            }
            async with (
                await anyio.open_process([PY, __file__, "--alice", json.dumps(order)], stderr=None) as alice,
                anyio.create_task_group() as tg,
            ):
                assert alice.stdin is not None and alice.stdout is not None
                said = BufferedByteReceiveStream(alice.stdout)
                burners["alice"] = alice.pid
                cpu_before["alice"] = cpu_s(alice.pid)
                tg.start_soon(sample)
                with anyio.fail_after(READY_TIMEOUT_S):  # bob's calls go while every part of the attack is under way
                    if await said.receive_until(b"\n", 64) != b"sent":
                        raise HarnessError("alice's process did not start her attack")
                ticks = cpu_ticks()
                under_attack = await bystander(http, targets, bobs, plan, pid)
                machine["attack"] = cpu_shares(ticks, cpu_ticks())
                cpu_attack = {name: cpu_s(p) - cpu_before[name] for name, p in burners.items()}
                collections = gc_pauses(_log_bytes(workdir)[log_mark:]) if gateway is not None else []
                stop.set()
                await alice.stdin.send(b"stop\n")
                with anyio.fail_after(CALL_TIMEOUT_S * 2):
                    attacker = json.loads(await said.receive_until(b"\n", 1 << 20))
            rss_end = vm_kb(pid).get("VmRSS", 0) if pid is not None else 0
            status = (
                (await http.get(f"http://{LOOPBACK}:{g_port}/status", headers=_headers("tok-bob"))).json()
                if gateway is not None
                else {"backends": []}
            )
    finally:
        procs.stop_all(grace_s=5.0)
    return {
        "plan": asdict(plan),
        "direct": direct,
        "attack_parts": list(parts),
        "busy": busy,
        "quiet": asdict(quiet),
        "attack": asdict(under_attack),
        "attacker": attacker,
        "rss_kb": {"quiet": rss_quiet, "peak_under_attack": peak[0], "end": rss_end},
        "cpu_s_under_attack": cpu_attack,
        "gateway_collections_under_attack": collections,
        "machine": machine,
        "backends": {b["name"]: {"state": b["state"], "last_error": b["last_error"]} for b in status["backends"]},
    }


def _log_bytes(workdir: Path) -> bytes:
    """The gateway's log so far (b"" without one: ``--direct``)."""
    try:
        return (workdir / "gateway.log").read_bytes()
    except FileNotFoundError:
        return b""


def _burners(procs: Procs, gateway: int | None) -> dict[str, int]:
    """The processes whose CPU time the attack costs: the gateway proper, each server by its backend's name (a
    stdio server is the gateway's child), and this process (bob; alice's process is added when it starts)."""
    found = {proc.name: proc.pid for proc in procs.procs if proc.name != "gateway"} | {"harness": os.getpid()}
    if gateway is not None:
        found["gateway"] = gateway
        stdio = [child for child in descendants(gateway) if "fidelity_server" in cmdline(child)]
        if stdio:
            found["s"] = stdio[0]
    return found


async def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            await (await anyio.connect_tcp(LOOPBACK, port)).aclose()
            return
        except OSError:
            await anyio.sleep(0.1)
    raise HarnessError(f"nothing listened on port {port} within {READY_TIMEOUT_S:g} s")


async def _wait_ready(
    http: httpx2.AsyncClient,
    port: int,
    gateway: Any,
    path: str = "/healthz",
    ready: Callable[[Any], bool] = lambda body: body.get("status") == "ok",
) -> None:
    """Wait until the gateway's ``path`` answers a body ``ready`` accepts (by default: it serves)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if gateway.popen.poll() is not None:
            raise HarnessError(f"the gateway exited: {gateway.output()}")
        try:
            if ready((await http.get(f"http://{LOOPBACK}:{port}{path}", headers=_headers("tok-bob"))).json()):
                return
        except (httpx2.HTTPError, ValueError, KeyError):
            pass
        await anyio.sleep(0.2)
    raise HarnessError(f"the gateway was not ready within {READY_TIMEOUT_S:g} s: {gateway.output()}")


def _slow_calls(result: dict[str, Any]) -> list[tuple[float, str, float, tuple[float, float] | None]]:
    """Bob's calls under attack slower than twice his quiet p99: (when sent, backend, ms, what the gateway's event
    loop did meanwhile: ms it ran and ms it waited for a CPU), in the order sent."""
    slow = []
    for backend, latencies in result["attack"]["latencies"].items():
        bound = 2 * _pct(result["quiet"]["latencies"][backend], 0.99)
        starts = result["attack"]["starts"][backend]
        sched = result["attack"].get("gateway_ms", {}).get(backend) or [None] * len(latencies)
        slow += [
            (at, backend, s * 1000, tuple(g) if g else None)
            for at, s, g in zip(starts, latencies, sched, strict=True)
            if s * 1000 > bound
        ]
    return sorted(slow)


def _slow_call(at: float, backend: str, ms: float, gateway: tuple[float, float] | None) -> str:
    text = f"{backend} +{at:.2f} s {ms:.0f}"
    return text if not gateway else f"{text} (the gateway's loop ran {gateway[0]:.1f} ms, waited {gateway[1]:.1f} ms)"


def _collections(collections: list[tuple[int, float]] | None) -> str:
    """The line naming the gateway's garbage collections while bob was timed under attack."""
    if not collections:
        return "The gateway's garbage collections while bob was timed under attack: none over 1 ms (or no gateway)"
    full = [ms for generation, ms in collections if generation == 2]
    return (
        f"The gateway's garbage collections while bob was timed under attack (generation 1 and 2, and 0 over 1 ms): "
        f"{len(collections)}, {sum(ms for _, ms in collections):.0f} ms in all, the longest "
        f"{max(ms for _, ms in collections):.1f} ms; full ones: {len(full)}"
        + (f", the longest {max(full):.1f} ms" if full else "")
    )


def report(result: dict[str, Any], env: dict[str, Any]) -> str:
    lines = [
        "## Hostile caller: the bystander's calls, quiet and under attack"
        + (" (direct: no gateway)" if result.get("direct") else ""),
        "",
        f"Gateway {env['gateway']}, {env['cpus']} CPUs, Python {env['python']}, load {env['load_before']} before and "
        f"{result['load_after']} after. Plan: {result['plan']}. Attack: {', '.join(result['attack_parts'])}."
        + (f" Other processes spinning on a CPU throughout: {result['busy']}." if result.get("busy") else ""),
        "",
        "| backend | quiet p50 ms | quiet p99 ms | attack p50 ms | attack p99 ms | p99 ratio | calls over 2x quiet p99 "
        "| failed quiet | failed under attack |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for backend in BYSTANDER_TOOLS:
        q, a = result["quiet"]["latencies"][backend], result["attack"]["latencies"][backend]
        ratio = _pct(a, 0.99) / _pct(q, 0.99) if q and a else float("nan")
        slow = sum(1 for latency in a if latency * 1000 > 2 * _pct(q, 0.99))
        lines.append(
            f"| {backend} | {_pct(q, 0.5):.1f} | {_pct(q, 0.99):.1f} | {_pct(a, 0.5):.1f} | {_pct(a, 0.99):.1f} | "
            f"{ratio:.2f}x | {slow}/{len(a)} | {len(result['quiet']['failures'][backend])}/{len(q)} | "
            f"{len(result['attack']['failures'][backend])}/{len(a)} |"
        )
    failures = collections.Counter(
        f for phase in ("quiet", "attack") for fs in result[phase]["failures"].values() for f in fs
    )
    lines += ["", "Bob's failures: " + (", ".join(f"{n} x {why}" for why, n in failures.most_common(5)) or "none")]
    lines += [
        f"Alice: flood answers by HTTP status {result['attacker']['flood_statuses']}; abandoned "
        f"{result['attacker']['abandoned']}; {result['attacker']['never_read']} calls never read.",
        f"Gateway VmRSS: quiet {result['rss_kb']['quiet'] / 1024:.0f} MB, peak under attack "
        f"{result['rss_kb']['peak_under_attack'] / 1024:.0f} MB, end {result['rss_kb']['end'] / 1024:.0f} MB.",
        "CPU seconds while bob was timed under attack: "
        + ", ".join(f"{name} {cpu:.1f}" for name, cpu in sorted(result["cpu_s_under_attack"].items())),
        "The gateway's event loop during bob's calls (ms it ran / ms it waited for a CPU, summed): "
        + (
            "; ".join(
                f"{phase} {sum(r for g in result[phase].get('gateway_ms', {}).values() for r, _ in g):.0f} / "
                f"{sum(w for g in result[phase].get('gateway_ms', {}).values() for _, w in g):.0f}"
                for phase in ("quiet", "attack")
            )
            if not result.get("direct")
            else "no gateway"
        ),
        _collections(result.get("gateway_collections_under_attack")),
        "The machine's CPUs while bob was timed: "
        + "; ".join(
            f"{phase} {shares['busy']:.0%} busy, {shares['stolen']:.0%} taken by the host"
            for phase, shares in result["machine"].items()
        ),
        "Bob's calls over twice his quiet p99 under attack (seconds after his first, and ms): "
        + (", ".join(_slow_call(*slow) for slow in _slow_calls(result)) or "none"),
        "Backends at the end: "
        + "; ".join(
            f"{n}: {b['state']}" + (f" ({b['last_error']})" if b["last_error"] else "")
            for n, b in result["backends"].items()
        ),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs, federation.yaml)")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="no gateway: each caller straight to each server (s over HTTP), the same attack but the bridges",
    )
    parser.add_argument(
        "--attack", action="append", choices=PARTS, help="run only this part of the attack (repeatable; default all)"
    )
    parser.add_argument(
        "--gateway-nice",
        type=int,
        metavar="N",
        help="run the gateway at this niceness (its servers and the callers at theirs): -5, as an operator's "
        "Nice=-5 would (a negative value needs the privilege to raise a priority)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="N other processes spinning on a CPU through both phases: a machine with other work",
    )
    parser.add_argument("--alice", help=argparse.SUPPRESS)  # the attacker's own process (JSON: what to attack)
    args = parser.parse_args()
    if args.alice is not None:
        anyio.run(attacker, json.loads(args.alice))
        return 0
    plan = QUICK if args.quick else FULL
    parts = tuple(args.attack or PARTS)
    env = environment()
    try:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            result = anyio.run(run, plan, args.keep, args.direct, parts, args.gateway_nice, args.busy)
        else:
            with tempfile.TemporaryDirectory(prefix="soak-hostile-") as folder:
                result = anyio.run(run, plan, Path(folder), args.direct, parts, args.gateway_nice, args.busy)
    except HarnessError as exc:
        say(f"harness failed: {exc}")
        return 2
    result["load_after"] = load_average()
    publish(report(result, env), result, env, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
