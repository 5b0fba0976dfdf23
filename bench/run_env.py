"""What a benchmark report says about the run it measured: the machine, the load, and the commit of the gateway.

``environment()`` is taken before the run, ``load_average()`` again after it (a busy machine moves every figure);
``cpu_ticks()`` around a phase says how busy the CPUs were in it, and how much of their time the host took;
``publish`` prints a report and writes its figures, with the environment, as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def git_state() -> str:
    """The commit measured, and whether gateway/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "gateway"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head}{' + uncommitted changes in gateway/' if dirty else ''}"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as "0.12 0.34 0.56"."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_ticks() -> tuple[int, int, int]:
    """The machine's CPU time so far, in clock ticks summed over its CPUs: (busy, stolen, total). *Stolen* is time a
    virtual machine's CPU was ready to run and the host ran something else (``steal`` in /proc/stat): a process there
    waits for the CPU with nothing on the machine itself using it. (0, 0, 0) where /proc/stat cannot be read."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    return total - idle - steal, steal, total


def cpu_shares(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, float]:
    """Between two ``cpu_ticks()``: the share of the machine's CPU time that was busy and the share stolen."""
    total = max(after[2] - before[2], 1)
    return {"busy": (after[0] - before[0]) / total, "stolen": (after[1] - before[1]) / total}


def environment() -> dict[str, Any]:
    """The CPUs, platform, Python, load before the run, and the gateway's commit."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "load_before": load_average(),
        "gateway": git_state(),
    }


def publish(report: str, result: dict[str, Any], env: dict[str, Any], json_path: Path | None) -> None:
    """Print ``report`` (Markdown, to stdout) and write ``result`` with ``env`` to ``json_path`` (when given)."""
    print(report)
    if json_path is not None:
        json_path.write_text(json.dumps({"environment": env, **result}, indent=1))
