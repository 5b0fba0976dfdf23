"""One run of an adapter's program, from spawn to reap, leaving no process behind.

``Spawner`` is the seam (``spawn_process`` starts a real program; tests inject a fake ``ChildProcess``). ``Runs``
spawns ``[command, *argv]`` in a session of its own with the adapter's environment allow-list (``environment``),
stdin from ``/dev/null``, reads stdout (capped) and stderr (its tail), and reaps it. Whatever ends a run (exit,
output overflow, the caller's cancellation or timeout, shutdown) the whole process group is signalled (SIGTERM, a
short grace, then SIGKILL; at shutdown SIGKILL at once) and the leader reaped, shielded, every wait bounded; a
descendant that left the group is reached through the leader's tree, or swept once orphaned (``processes.sweep``).
Foreign errors leave as ``BackendError`` classes.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from subprocess import DEVNULL, PIPE
from typing import Protocol

import anyio
import anyio.abc

from gateway.backends import processes
from gateway.config import Adapter, passed_environment
from gateway.errors import BackendError, BackendUnavailable

__all__ = ["ChildProcess", "Outcome", "Runs", "Spawner", "environment", "spawn_process"]

_TERM_GRACE_S = 0.5
"""After SIGTERM to the group, how long the leader may take to exit before everything gets SIGKILL."""
_REAP_TIMEOUT_S = 2.0
"""How long to wait for a SIGKILLed leader to be reaped; only a process stuck in the kernel takes longer."""
_READ_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)


class ChildProcess(Protocol):
    """What the adapter needs from a spawned program: the seam unit tests replace with a fake."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream: ...

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream: ...

    async def wait(self) -> int:
        """Wait for the leader to exit and reap it; its exit code (``-N`` when killed by signal N)."""
        ...

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the process's whole group; silent when the group is gone."""
        ...

    async def aclose(self) -> None:
        """Close the pipes (the leader has been reaped or given up on)."""
        ...


class Spawner(Protocol):
    async def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> ChildProcess: ...


class _OsProcess:
    def __init__(self, process: anyio.abc.Process) -> None:
        self._process = process
        assert process.stdout is not None and process.stderr is not None
        self._stdout = process.stdout
        self._stderr = process.stderr

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def wait(self) -> int:
        return await self._process.wait()

    def signal_group(self, signum: int) -> None:
        # The process was started with start_new_session=True, so its group id is its pid. The kernel keeps that
        # id reserved while any member lives, so this reaches grandchildren even after the leader was reaped.
        # A descendant that left the group (setsid) is still in the leader's tree while its parent lives, so the
        # tree is signalled too; one whose parent is gone was re-parented to the gateway: processes.sweep() ends it.
        members = processes.descendants(self._process.pid) if self._process.returncode is None else []
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):  # gone (EPERM: only zombies left, on some systems)
            pass
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    async def aclose(self) -> None:
        await self._process.aclose()


async def spawn_process(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> ChildProcess:
    """Start ``argv`` (a list, never a shell string) in a new session, stdin from /dev/null, stdout/stderr piped
    (``processes.open_process``: it cannot outlive the gateway).

    Raises:
        OSError: the program could not be started (translated by the caller).
    """
    process = await processes.open_process(
        argv, call=True, stdin=DEVNULL, stdout=PIPE, stderr=PIPE, env=dict(env), cwd=cwd
    )
    return _OsProcess(process)


def environment(config: Adapter) -> dict[str, str]:
    """What the program's environment holds: the ``pass_env`` variables the gateway has, then ``env``."""
    return passed_environment(config.pass_env, config.env)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: the exit code (``-N`` when killed by signal N), stdout, and the tail of stderr."""

    code: int
    stdout: bytes
    stderr: bytes


@dataclass(eq=False, slots=True)
class _Run:
    process: ChildProcess
    reaped: anyio.Event = field(default_factory=anyio.Event)
    shutdown: bool = False


class Runs:
    """The runs of one adapter's program: each spawned, read and reaped by ``run``, all killed by ``close``.

    Args:
        backend: the adapter's name, for errors.
        config: its configuration (command, folder, environment, caps).
        spawn: the seam that starts a process.
        on_spawn_failure: told why a spawn failed (the adapter keeps it as its last error).
    """

    def __init__(self, backend: str, config: Adapter, spawn: Spawner, on_spawn_failure: Callable[[str], None]) -> None:
        self._backend = backend
        self._config = config
        self._spawn = spawn
        self._on_spawn_failure = on_spawn_failure
        self._live: set[_Run] = set()
        self.spawned_total = 0
        self.closed = False

    @property
    def live(self) -> int:
        """Spawned and not yet reaped."""
        return len(self._live)

    async def run(self, argv: Sequence[str]) -> Outcome:
        """Spawn ``[command, *argv]``, read it to the end, reap it. Cancelling this kills the process group.

        Raises:
            BackendUnavailable: the program could not be started, or shutdown killed it.
            BackendError: its stdout went over ``max_output_bytes``, or reading it failed.
        """
        with anyio.CancelScope(shield=True):
            # Shielded: a cancellation landing inside the spawn could leave a started process that nobody owns.
            process = await self._start([self._config.command, *argv])
        # No await between the spawn and the try block below, which owns the process from here on.
        run = _Run(process)
        self._live.add(run)
        self.spawned_total += 1
        if self.closed:  # shutdown began while the spawn was in flight
            run.shutdown = True
            process.signal_group(signal.SIGKILL)
        exited = False
        try:
            stdout, stderr = await self._communicate(process)
            code = await process.wait()
            exited = True
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, exited=exited)
            self._live.discard(run)
            run.reaped.set()
        if run.shutdown:
            raise BackendUnavailable(self._backend, "the gateway is shutting down; process group killed")
        return Outcome(code, stdout, stderr)

    async def close(self) -> None:
        """Refuse new runs, SIGKILL every live process group and wait (bounded) for the leaders to be reaped."""
        self.closed = True
        runs = list(self._live)
        for run in runs:
            run.shutdown = True
            run.process.signal_group(signal.SIGKILL)
        with anyio.move_on_after(_REAP_TIMEOUT_S):
            for run in runs:
                await run.reaped.wait()

    async def _start(self, command: list[str]) -> ChildProcess:
        cwd = self._config.cwd
        try:
            return await self._spawn(command, env=environment(self._config), cwd=cwd)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and cwd is not None and exc.filename == cwd:
                problem = f"working directory not found: {cwd}"
            elif isinstance(exc, FileNotFoundError):
                problem = f"command not found: {command[0]}"
            elif isinstance(exc, PermissionError):
                problem = f"permission denied: {command[0]}"
            else:
                problem = f"cannot start {command[0]}: {exc.strerror or exc}"
            self._on_spawn_failure(problem)
            raise BackendUnavailable(self._backend, problem) from exc

    async def _communicate(self, process: ChildProcess) -> tuple[bytes, bytes]:
        """Read stdout (to the cap) and stderr (its tail) to their ends."""
        stdout = bytearray()
        stderr = bytearray()
        max_output, stderr_cap = self._config.max_output_bytes, self._config.max_stderr_bytes
        overflow = False
        failures: list[BaseException] = []

        async def drain_stderr() -> None:
            try:
                async for chunk in process.stderr:
                    stderr.extend(chunk)
                    if len(stderr) > stderr_cap:
                        del stderr[: len(stderr) - stderr_cap]
            except _READ_ERRORS as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_stderr)
            try:
                async for chunk in process.stdout:
                    if len(stdout) + len(chunk) > max_output:
                        overflow = True
                        tg.cancel_scope.cancel()
                        break
                    stdout.extend(chunk)
            except _READ_ERRORS as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()
        if failures:
            raise BackendError(self._backend, f"reading the program's output failed: {failures[0]!r}")
        if overflow:
            raise BackendError(self._backend, f"output exceeded {max_output} bytes; process group killed")
        return bytes(stdout), bytes(stderr)


async def _stop(process: ChildProcess, *, exited: bool) -> None:
    """Leave no member of the process group alive. Runs shielded; every wait is bounded."""
    if not exited:
        process.signal_group(signal.SIGTERM)
        with anyio.move_on_after(_TERM_GRACE_S):
            await process.wait()
    # Also after a normal exit: a grandchild may outlive the leader (pid reuse cannot hit us here: the group
    # id stays reserved while any member lives, and a new process never starts as leader of an old group).
    process.signal_group(signal.SIGKILL)
    with anyio.move_on_after(_REAP_TIMEOUT_S):
        await process.wait()
        await process.aclose()
    # A descendant that left the group and outlived the leader was re-parented to the gateway: end it too.
    await processes.sweep()
