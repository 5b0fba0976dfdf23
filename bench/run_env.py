"""What a benchmark report says about the run it measured: the machine, the load, and the commit of the gateway.

``environment()`` is taken before the run, ``load_average()`` again after it (a busy machine moves every figure).
"""

from __future__ import annotations

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


def environment() -> dict[str, Any]:
    """The CPUs, platform, Python, load before the run, and the gateway's commit."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "load_before": load_average(),
        "gateway": git_state(),
    }
