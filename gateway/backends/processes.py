"""The processes the gateway spawns, and every process they spawn: none may outlive its owner (Linux mechanisms).

A process group is not enough: a grandchild that calls ``setsid()`` leaves it, and ``os.killpg`` no longer reaches
it. So, on Linux:

  * ``become_subreaper()`` makes the gateway a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant whose
    parent exits is re-parented to the gateway instead of to init, so it stays findable;
  * ``open_process()`` spawns every child in a session of its own and remembers it, so a sweep can tell the
    gateway's own children (which anyio's child watcher waits for) from adopted orphans. ``call=True`` marks a
    command-line adapter's per-call process: an orphan that started while such a call ran may be that call's helper,
    so it is left alone until every call that ran when it started has ended;
  * ``sweep()`` kills and reaps the *adopted* orphans: a direct child of the gateway that the gateway did not spawn,
    in a session other than the gateway's own (a subprocess some library started in-process keeps the gateway's
    session and is left alone), not in the session of one of the gateway's own children that still runs (that owner
    stops its session itself), and not deferred by a call (above). Each is killed with its whole subtree, then
    reaped with ``waitpid`` on its own pid only, so no exit status anyio waits for is ever taken. The adapter sweeps
    after every call, the runtime every ``SWEEP_INTERVAL_S`` and at shutdown (``everything=True``);
  * ``supervise()`` makes ``gateway serve`` a small supervisor with the gateway as its child: once the gateway is
    dead, even by SIGKILL, its orphans re-parent to the supervisor (the nearest living subreaper), which kills them.
    The gateway is the only one that can do this for them: a dead process adopts nothing, and the kernel clears
    ``PR_SET_PDEATHSIG`` on fork, so a grandchild never inherits a death signal;
  * without the supervisor (``gateway check``/``tools``, ``serve --stdio`` on a terminal, a library user), each
    child gets ``PR_SET_PDEATHSIG`` = SIGKILL in a ``preexec_fn``, so at least the direct children die with the
    gateway (the kernel sends it when the *thread* that forked exits: the gateway spawns only from its event-loop
    thread, the main thread, which lives as long as the process). Under the supervisor that adds nothing and costs
    the fork fast path: a ``preexec_fn`` makes Python fork instead of vfork, measured 1.0 -> 9.5 ms per spawn at
    150 MB resident.

Elsewhere than Linux every function here is a no-op and the process group is the only boundary. The state is
module-level because what it describes is too: one process, one parent of its children.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from subprocess import PIPE
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio._core._eventloop import get_async_backend

__all__ = ["become_subreaper", "descendants", "open_process", "spawn_flags", "supervise", "sweep"]

log = structlog.get_logger("gateway.processes")

SWEEP_INTERVAL_S = 5.0
"""How often the runtime reaps adopted orphans and kills the escaped ones (the adapter also sweeps after each call)."""
_REAP_WAIT_S = 1.0
"""How long a sweep waits for the processes it killed to be reaped; only one stuck in the kernel takes longer."""
_KILL_ROUNDS = 8
"""A killed process's children re-parent and are killed in the next round; this bounds a fork bomb's sweep."""

_LINUX = sys.platform == "linux"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_prctl: Any = None
if _LINUX:
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        _prctl = None

_subreaper = False
_supervised = False
_spawned: weakref.WeakValueDictionary[int, anyio.abc.Process] = weakref.WeakValueDictionary()
"""The gateway's own children by pid (anyio waits for them); everything else found as a child was adopted."""
_calls: dict[int, tuple[anyio.abc.Process, int]] = {}
"""The adapter's per-call processes by pid, with their start times (clock ticks since boot)."""


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux); True if it is one now."""
    global _subreaper
    if _prctl is not None and not _subreaper:
        _subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def _preexec(parent: int) -> Callable[[], None]:
    prctl = _prctl
    kill, getpid, getppid = os.kill, os.getpid, os.getppid

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work, no locks
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if getppid() != parent:  # the gateway died before the flag was set: nobody would send the signal
            kill(getpid(), signal.SIGKILL)

    return preexec


def spawn_flags() -> dict[str, Any]:
    """``open_process`` keywords: a new session, and (Linux, unsupervised) death with the gateway."""
    flags: dict[str, Any] = {"start_new_session": True}
    if _prctl is not None and not _supervised:
        flags["preexec_fn"] = _preexec(os.getpid())
    return flags


async def open_process(command: Sequence[str], *, call: bool = False, **kwargs: Any) -> anyio.abc.Process:
    """``anyio.open_process`` with ``spawn_flags()``, remembered as one of the gateway's own children.

    Args:
        call: a command-line adapter's per-call process (orphans that start while it runs are deferred).

    Raises:
        OSError: the program could not be started.
    """
    kwargs.setdefault("stdin", PIPE)
    kwargs.setdefault("stdout", PIPE)
    kwargs.setdefault("stderr", PIPE)
    # anyio.open_process has no preexec_fn; its event-loop backend passes every keyword on to Popen (asyncio's
    # subprocess_exec, trio's open_process), with the same defaults as the public function.
    backend = get_async_backend()
    process = await backend.open_process(list(command), **spawn_flags(), **kwargs)
    _spawned[process.pid] = process
    if call:
        stat = _stat(process.pid)
        if stat is not None:
            _calls[process.pid] = (process, stat[3])
    return process


# ----------------------------------------------------------------------------------------------- /proc


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session, start time in clock ticks since boot) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), from ``/proc/PID/task/*/children``."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents before their children (bounded by the process table)."""
    out: list[int] = []
    seen = {pid}
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child in children(current):
            if child not in seen:
                seen.add(child)
                out.append(child)
                frontier.append(child)
    return out


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def sweep(*, everything: bool = False) -> int:
    """Kill every adopted orphan that escaped its owner (with its subtree) and reap the adopted ones that exited.

    Args:
        everything: kill every adopted process, whatever its session (the gateway is stopping).

    Returns how many adopted processes were killed. Every wait is bounded (a process stuck in the kernel is left
    as a zombie for the next sweep).
    """
    if not _subreaper:
        return 0  # a process that adopts nothing has only its own children
    me = os.getpid()
    own_session = os.getsid(0)
    killed: set[int] = set()
    for pid, (process, _) in list(_calls.items()):
        if process.returncode is not None:
            del _calls[pid]
    calls = [started for process, started in _calls.values()]
    for _ in range(_KILL_ROUNDS):
        running = {pid for pid, process in list(_spawned.items()) if process.returncode is None}
        victims: list[int] = []
        for child in children(me):
            if child in _spawned:
                continue  # ours: anyio waits for it
            stat = _stat(child)
            if stat is None:
                continue
            state, _, session, started = stat
            if session == own_session:
                continue  # not one of our sessions: a library's own subprocess, whose waiter reaps it
            if state in ("Z", "X"):
                _reap(child)
            elif child in killed:
                continue  # killed in an earlier round, not reaped yet: the wait below reaps it
            elif everything or (session not in running and not any(call <= started for call in calls)):
                victims.append(child)
        if not victims:
            break
        for victim in victims:
            _kill([victim, *descendants(victim)])
            log.info("process.orphan_killed", pid=victim)
        killed.update(victims)
    pending = set(killed)  # reaped pids leave at once: a reused pid could be one of ours
    with anyio.move_on_after(_REAP_WAIT_S):
        while pending:
            pending = {pid for pid in pending if not _reap(pid)}
            if pending:
                await anyio.sleep(0.01)
    return len(killed)


def _reap(pid: int) -> bool:
    """Reap an adopted child (never one of ours: anyio waits for those); True when it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


# ----------------------------------------------------------------------------------------------- supervisor


def supervise() -> None:
    """Split ``gateway serve`` into a supervisor and the gateway itself (Linux; elsewhere this returns at once).

    Returns in the child, which goes on to be the gateway; the parent (the pid everyone sees) never returns. It is a
    subreaper, so when the gateway dies, even by SIGKILL, every process the gateway left re-parents to it, and it
    kills them with their subtrees, reaps them, and exits with the gateway's status (128+N when killed by signal
    N). It forwards SIGTERM, SIGINT and SIGHUP (reload) to the gateway, which runs in a process group of its own
    so that a terminal's Ctrl-C or a signal to the group reaches it once, through the supervisor. When the supervisor
    itself is SIGKILLed, the gateway gets SIGTERM (``PR_SET_PDEATHSIG``) and stops as on any SIGTERM. Call it before
    any thread is started: only the calling thread survives a fork.
    """
    if _prctl is None:
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        global _supervised
        _supervised = True
        os.setpgid(0, 0)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor is already gone
            os.kill(os.getpid(), signal.SIGTERM)
        return
    with contextlib.suppress(OSError):  # the child may have done it already (or exec'd: it never does)
        os.setpgid(child, child)
    os._exit(_supervisor(child))


def _supervisor(child: int) -> int:
    gc.disable()  # it allocates next to nothing; a collection would copy the pages shared with the gateway
    # stdin and stdout are the gateway's (serve --stdio talks over them): a copy held here would delay the EOF a
    # client waits for. stderr stays, for the log line below.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    become_subreaper()

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # reaps the adopted orphans too
        except ChildProcessError:
            break
        if pid == child:
            break
    left = _kill_children()
    if left:
        log.warning("supervisor.orphans_killed", processes=left, message="the gateway left processes behind")
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _kill_children() -> int:
    """Kill every child of this process with its subtree, and reap them (bounded: _REAP_WAIT_S)."""
    me = os.getpid()
    killed: set[int] = set()
    for _ in range(_KILL_ROUNDS):
        found = [pid for pid in children(me) if pid not in killed]
        if not found:
            break
        for pid in found:
            _kill([pid, *descendants(pid)])
        killed.update(found)
        pending = set(found)
        deadline = time.monotonic() + _REAP_WAIT_S
        while pending and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
            pending.discard(pid)
    return len(killed)
