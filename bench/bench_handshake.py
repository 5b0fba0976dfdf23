"""How long a client that spawns the gateway waits for its handshake: ``gateway serve --stdio`` started N times, an
``initialize`` written at once, as Claude Code or pydantic-ai (5 s ``init_timeout``) do.

Usage: ``python -m bench.bench_handshake [-c federation.yaml] [-n 5] [--baseline DIR]``

The configuration's relative paths resolve from the current folder: run it from the project root after
``scripts/prepare`` (the default federation: wiki, qmd, graphify, memory). For each spawn it reports, from the spawn:
the gateway's first log line (its imports done), the ``initialize`` answer, and how long after the last MCP server
became ready (``backend.ready`` in the log) the answer came, plus when each adapter reported ready. ``--baseline DIR``
spawns another checkout's gateway (``git worktree add --detach DIR COMMIT``) in alternation, for a before and after
in one run. Medians and ranges go to stdout as markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}


def _wall(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def spawn_once(config: str, checkout: Path | None) -> dict[str, Any]:
    """One spawn: the timings of its handshake, in seconds."""
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-P", "-m", "gateway", "serve", "--stdio", "-c", config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    first: list[float] = []
    events: list[dict[str, Any]] = []

    def read_log() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if not first:
                first.append(time.perf_counter())
            try:
                events.append(json.loads(line))
            except ValueError:
                pass

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    process.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
    process.stdin.flush()
    json.loads(process.stdout.readline())
    answered, answered_wall = time.perf_counter(), time.time()
    process.stdin.close()
    process.wait(timeout=60)
    reader.join(5)
    ready = {e["backend"]: (_wall(e["timestamp"]), e["kind"]) for e in events if e.get("event") == "backend.ready"}
    servers = [at for at, kind in ready.values() if kind in ("stdio", "streamable_http", "sse")]
    last_server = max(servers) if servers else None
    return {
        "first log line": first[0] - started if first else None,
        "initialize": answered - started,
        "initialize after the last MCP server": answered_wall - last_server if last_server is not None else None,
        **{
            f"adapter {name} ready after the last MCP server": at - last_server
            for name, (at, kind) in ready.items()
            if kind == "adapter" and last_server is not None
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default="federation.yaml")
    parser.add_argument("-n", "--spawns", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout of the gateway, spawned in alternation")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    targets: dict[str, Path | None] = {"this checkout": here}
    if args.baseline is not None:
        targets["baseline"] = args.baseline.resolve()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for i in range(args.spawns):
        for name, checkout in targets.items():
            runs[name].append(spawn_once(args.config, checkout))
            print(f"spawn {i + 1}/{args.spawns} {name}: {runs[name][-1]['initialize']:.2f} s", file=sys.stderr)
    keys = list(dict.fromkeys(key for rows in runs.values() for row in rows for key in row))
    print(f"| seconds, median (range) of {args.spawns} spawns | " + " | ".join(targets) + " |")
    print("|---|" + "---|" * len(targets))
    for key in keys:
        cells = []
        for rows in runs.values():
            values = [row[key] for row in rows if row.get(key) is not None]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})" if values else "-")
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
