"""What the gateway's CPU costs for each progress notification it relays to a client that reads them.

    .venv/bin/python bench/bench_progress.py [--steps N] [--rounds R] [--baseline DIR] [--json OUT]

A tool that reports progress as fast as it can is what a flood is made of (bench/soak_hostile.py): while its client
reads, the gateway relays every notification, and that relay is CPU every other caller waits for. Everything runs
on loopback: ``tests/fixtures/fidelity_server.py`` over streamable HTTP (``f``) and, as the gateway's child, over
stdio (``s``), both ``protocol: handshake``; the gateway of this checkout (and with ``--baseline DIR``, that
checkout's, started the same way) in front of both. One handshake-era client session per gateway calls ``progress``
with ``--steps`` steps and a progress token, and reads the whole event stream. Rounds are interleaved: in each, every
gateway relays from ``f`` and from ``s``, and the client calls ``f`` directly (``direct``: what the server's SDK
costs by itself). Reported per target, the median of the rounds: the gateway's CPU per notification (its serving
process, from /proc), the server's, and the wall time of the call. Markdown on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import LOOPBACK, Proc, Procs, cmdline, cpu_s, descendants, free_port, say  # noqa: E402
from bench.run_env import environment, publish  # noqa: E402
from bench.soak_hostile import FIDELITY, PY, STATE_KEY, TOKENS, _headers, _open_session, _tool_call, _wait_ready, config  # noqa: E402


async def _relay(http: httpx2.AsyncClient, url: str, session: str, tool: str, steps: int) -> int:
    """Call ``tool`` with progress and read its whole stream: the progress notifications read."""
    seen = 0
    body = _tool_call(7, tool, {"steps": steps}, progress=True)
    async with http.stream("POST", url, json=body, headers=_headers("tok-bob", session)) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"notifications/progress"' in line:
                seen += 1
    return seen


def _both_ready(status: dict[str, Any]) -> bool:
    """``f`` and ``s`` are ready (so the stdio server is spawned)."""
    return len(status["backends"]) == 2 and all(b["state"] == "ready" for b in status["backends"])


async def run(steps: int, rounds: int, checkouts: dict[str, Path], workdir: Path) -> dict[str, Any]:
    procs = Procs(workdir)
    samples: dict[str, list[dict[str, float]]] = {}
    try:
        f_port = free_port()
        f = procs.start("f", [PY, str(FIDELITY), "--http", str(f_port), "--name", "f"], f_port)
        f_url = f"http://{LOOPBACK}:{f_port}/mcp"
        gateways: dict[str, tuple[Proc, int]] = {}
        for name, checkout in checkouts.items():
            port = free_port()
            (workdir / f"{name}.yaml").write_text(config(None, f_url, timeout_s=120))
            env = {**os.environ, "PYTHONPATH": str(checkout), "GATEWAY_TOKENS": TOKENS, "GATEWAY_STATE_KEY": STATE_KEY}
            argv = [PY, "-m", "gateway", "serve", "-c", str(workdir / f"{name}.yaml"), "--port", str(port)]
            gateways[name] = (procs.start(name, argv, port, env=env, cwd=checkout), port)
        async with httpx2.AsyncClient(timeout=300) as http:
            targets: list[tuple[str, str, str, str, int | None, int]] = []  # label, url, session, tool, gateway, server
            for name, (gateway, port) in gateways.items():
                await _wait_ready(http, port, gateway, "/status", _both_ready)
                url = f"http://{LOOPBACK}:{port}/mcp"
                session = await _open_session(http, url, "tok-bob")
                stdio = next(c for c in descendants(gateway.pid) if "fidelity_server" in cmdline(c))
                targets += [
                    (f"{name}: f (HTTP)", url, session, "f__progress", gateway.serving_pid, f.pid),
                    (f"{name}: s (stdio)", url, session, "s__progress", gateway.serving_pid, stdio),
                ]
            targets.append(("direct: f", f_url, await _open_session(http, f_url, "tok-bob"), "progress", None, f.pid))
            for _, url, session, tool, _, _ in targets:  # warm-up, not measured
                await _relay(http, url, session, tool, 200)
            for n in range(rounds):
                say(f"round {n + 1} of {rounds}")
                for label, url, session, tool, gateway_pid, server_pid in targets:
                    before = (cpu_s(gateway_pid) if gateway_pid else 0.0, cpu_s(server_pid), time.monotonic())
                    seen = await _relay(http, url, session, tool, steps)
                    wall = time.monotonic() - before[2]
                    if seen != steps:
                        raise RuntimeError(f"{label}: {seen} progress notifications read of {steps}")
                    gateway_us = (cpu_s(gateway_pid) - before[0]) / seen * 1e6 if gateway_pid else 0.0
                    server_us = (cpu_s(server_pid) - before[1]) / seen * 1e6
                    samples.setdefault(label, []).append(
                        {"gateway_us": gateway_us, "server_us": server_us, "wall_s": wall}
                    )
    finally:
        procs.stop_all(grace_s=3.0)
    return {"steps": steps, "rounds": rounds, "samples": samples}


def report(result: dict[str, Any], env: dict[str, Any]) -> str:
    lines = [
        "## Progress relayed to a client that reads it",
        "",
        f"Gateway {env['gateway']}, {env['cpus']} CPUs, Python {env['python']}, load {env['load_before']} before. "
        f"{result['rounds']} interleaved rounds of {result['steps']} notifications; medians.",
        "",
        "| target | gateway CPU us / notification | server CPU us / notification | wall s |",
        "|---|---|---|---|",
    ]
    for label, rows in result["samples"].items():
        med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        gateway = f"{med['gateway_us']:.0f}" if not label.startswith("direct") else "-"
        lines.append(f"| {label} | {gateway} | {med['server_us']:.0f} | {med['wall_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, its gateway measured in the same rounds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    checkouts = {"this tree": ROOT}
    if args.baseline is not None:
        checkouts["baseline"] = args.baseline.resolve()
    env = environment()
    with tempfile.TemporaryDirectory(prefix="bench-progress-") as folder:
        result = anyio.run(run, args.steps, args.rounds, checkouts, Path(folder))
    publish(report(result, env), result, env, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
