"""The server processes a benchmark starts, and what /proc says about them: one module for every script in bench/.

``Procs`` starts each server in its own session (so its own process group), with its output in a log file in the
run's work directory (a file, not a pipe, so a chatty server never blocks; a process restarted under the same name
appends to the same log), and stops them all at the end: SIGTERM to each group still running and SIGKILL after a
grace period, or SIGKILL at once. ``Proc.pid`` is the process started; ``Proc.serving_pid`` the one that serves,
which for ``gateway serve`` is the supervisor's forked child, not the supervisor.

``say`` prints progress to stderr with the seconds since this module was imported (the start of the script).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOOPBACK = "127.0.0.1"
GC_PROBE = Path(__file__).resolve().parent / "gc_pauses"
"""A folder whose ``sitecustomize`` makes a Python process write its garbage collections' pauses on stderr (first on
a process's PYTHONPATH; read back with ``gc_pauses``)."""

_T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f} s] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def gc_pauses(log: bytes) -> list[tuple[int, float]]:
    """The collections ``GC_PROBE`` wrote in a process's ``log``: (generation, pause in ms), in order."""
    return [(int(gen), float(ms)) for gen, ms in re.findall(rb"^GC_PAUSE ([0-2]) ([0-9.]+)$", log, re.MULTILINE)]


# ----------------------------------------------------------------------------------------------- /proc


def cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def children_of() -> dict[int, list[int]]:
    """Every process's children, by parent pid, from one pass over /proc (zombies included)."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        out[ppid].append(int(entry))
    return out


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """``pid``'s descendants, nearest first (from ``tree``, or a fresh read of /proc)."""
    tree = children_of() if tree is None else tree
    found: list[int] = []
    todo = list(tree.get(pid, ()))
    for _ in range(10_000):  # bounded: a process tree is finite, this only guards against a loop in a bad read
        if not todo:
            break
        child = todo.pop(0)
        found.append(child)
        todo.extend(tree.get(child, ()))
    return found


def vm_kb(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (peak resident) of one process, in kB; its children are not counted."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (utime + stime from /proc/PID/stat, threads that exited included), in seconds;
    0.0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    port: int | None = None
    health: str | None = None  # a URL answering {"status": "ok"} once ready (the gateway's /healthz)
    backends: int = 0  # for a gateway: how many backends it fronts (for the reports)

    @property
    def pid(self) -> int:
        """The process started (for a server started in its own session, also its session and group id)."""
        return self.popen.pid

    @property
    def serving_pid(self) -> int:
        """The serving process: for ``gateway serve``, the supervisor's forked child (same command line), not the
        supervisor ``pid`` is; for any other server, ``pid``."""
        pid = self.popen.pid
        try:
            own = Path(f"/proc/{pid}/cmdline").read_bytes()
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                if Path(f"/proc/{child}/cmdline").read_bytes() == own:
                    return int(child)
        except OSError:
            pass
        return pid

    def output(self, tail: int = 3000) -> str:
        """The last ``tail`` characters the process wrote to stdout and stderr."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-tail:]


def _signal_group(proc: Proc, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class Procs:
    """Every server process a script starts; each in its own session, all stopped by ``stop_all``."""

    def __init__(self, workdir: Path, *, cwd: Path | None = None) -> None:
        self.workdir = workdir  # the logs go here
        self.cwd = workdir if cwd is None else cwd  # where the processes run
        self.procs: list[Proc] = []

    def start(
        self,
        name: str,
        argv: list[str],
        port: int | None = None,
        *,
        health: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Proc:
        log = open(self.workdir / f"{name}.log", "a+b")  # closed in stop_all
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.cwd if cwd is None else cwd,
            env=env,
        )
        proc = Proc(name, popen, log, port, health)
        self.procs.append(proc)
        return proc

    def stop_all(self, grace_s: float = 0.0) -> None:
        """SIGTERM to the group of every process still running, then SIGKILL to those still running ``grace_s``
        later (all of them together); with ``grace_s`` 0, SIGKILL at once. Every process is reaped, every log
        closed."""
        if grace_s > 0:
            for proc in self.procs:
                if proc.popen.poll() is None:
                    _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()) if grace_s > 0 else 0)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.popen.wait()
            proc.log.close()
