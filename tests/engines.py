"""Real engines for the tests, started on loopback by the tests themselves: PostgreSQL, Redis and HAProxy.

Each engine runs from a temporary folder of its own, listens on 127.0.0.1 on a free port and is stopped (and its
whole process group killed if it lingers) when its fixture ends, so no process outlives the test session. Engines
that refuse to run as root (PostgreSQL's initdb and postgres) run as an unprivileged user when the tests run as root
(CI): the Debian package's ``postgres`` user when it exists, else ``nobody``; the temporary folder is handed to that
user. Readiness is the engine's own "ready" log line (or, for HAProxy, its port answering), waited for with a
bound, never a sleep. Each engine is an ``Engine``; fixtures, tests/replicas.py and the benchmarks hold one with
``with started(...)``.

Binaries are looked for where the Debian packages put them (``pg_config --bindir``, ``/usr/lib/postgresql/N/bin``).
When they are missing, the tests that need them skip with the reason, unless ``GATEWAY_REQUIRE_ENGINES=1`` (set by
``.ci/run``, whose ``scripts/install`` installs the packages): then they fail, so CI never passes by skipping.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

READY_TIMEOUT_S = 60.0  # initdb + first start on a loaded 2-core machine; a restart after a crash replays WAL
STOP_TIMEOUT_S = 30.0
INSTALL_HINT = "scripts/install --tests installs the Debian packages postgresql, redis-server and haproxy as root"


def engines_required() -> bool:
    return os.environ.get("GATEWAY_REQUIRE_ENGINES") == "1"


def missing(what: str) -> NoReturn:
    """Skip (or, when engines are required, fail) the test that needs ``what``."""
    reason = f"{what} is not installed ({INSTALL_HINT}, GATEWAY_INSTALL_ENGINES=1)"
    if engines_required():
        pytest.fail(f"{reason}; GATEWAY_REQUIRE_ENGINES=1 says the tests must run here")
    pytest.skip(reason)


def required(found: Path | None, what: str) -> Path:
    """``found`` (a binary or folder looked for), or the test that needs ``what`` skips or fails (``missing``)."""
    if found is None:
        missing(what)
    return found


def find_binary(name: str, *, folders: Sequence[Path] = ()) -> Path | None:
    """``name`` in ``folders`` (first match), else on PATH."""
    for folder in folders:
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def postgres_bindir() -> Path | None:
    """Where PostgreSQL's server programs are: ``pg_config --bindir`` if it has ``postgres``, else the newest
    ``/usr/lib/postgresql/N/bin`` (Debian keeps them off PATH)."""
    folders: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            folders.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    versioned = Path("/usr/lib/postgresql")
    if versioned.is_dir():
        numbered = [p for p in versioned.iterdir() if p.name.isdigit()]
        folders += [p / "bin" for p in sorted(numbered, key=lambda p: int(p.name), reverse=True)]
    for folder in folders:
        if (folder / "postgres").is_file() and (folder / "initdb").is_file():
            return folder
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class RunAs:
    """Who an engine runs as: ourselves, or (as root) an unprivileged user."""

    uid: int | None = None
    gid: int | None = None

    @classmethod
    def unprivileged(cls) -> RunAs:
        if os.geteuid() != 0:
            return cls()
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            return cls(entry.pw_uid, entry.pw_gid)
        raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run engines as")

    def own(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def popen_kwargs(self) -> dict[str, object]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class EngineProcess:
    """One engine process: started in its own session (so the children that stay in it can be killed as a group),
    its stderr read by a thread into ``log`` (and into ``ready`` once a line matches ``ready_pattern``, if given)."""

    def __init__(
        self, argv: Sequence[str], *, run_as: RunAs, cwd: Path, ready_pattern: str | None, env: dict[str, str]
    ) -> None:
        self.argv = list(argv)
        self.log: list[str] = []
        self.ready = threading.Event()
        self._pattern = None if ready_pattern is None else re.compile(ready_pattern)
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            **run_as.popen_kwargs(),  # type: ignore[arg-type]
        )
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"engine-log:{Path(argv[0]).name}")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip("\n"))
            if self._pattern is not None and self._pattern.search(line):
                self.ready.set()
        self.ready.set()  # the process ended: whoever waits finds it dead

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            self.kill()
            tail = "\n".join(self.log[-30:])
            raise RuntimeError(f"{self.argv[0]} did not become ready within {timeout:.0f} s:\n{tail}")

    def kill(self) -> None:
        """Kill the whole process group and reap the leader (idempotent)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return None if fields is None else fields[19]  # field 22 of stat: the start time, in clock ticks since boot


def _children(parent: int) -> list[tuple[int, str]]:
    """The (pid, start time) of ``parent``'s children."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None and int(fields[1]) == parent:
            found.append((int(entry.name), fields[19]))
    return found


def _signal(processes: Sequence[tuple[int, str]], sig: signal.Signals) -> None:
    """Send ``sig`` to each (pid, start time) still running as that process: a backend that exits between the
    listing and the signal (a connection closing) is skipped, and a pid reused since is never signalled."""
    for pid, started in processes:
        if _start_time(pid) != started:
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_listening(port: int, process: EngineProcess, timeout: float = READY_TIMEOUT_S) -> None:
    """Until something accepts TCP connections on 127.0.0.1:``port`` (for engines with no "ready" line of their own);
    bounded, and failing at once when ``process`` died."""
    deadline = time.monotonic() + timeout
    while True:
        if process.proc.poll() is not None:
            raise RuntimeError(f"{process.argv[0]} exited {process.proc.returncode}:\n" + "\n".join(process.log[-30:]))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{process.argv[0]} did not listen on port {port} within {timeout:.0f} s") from None
            threading.Event().wait(0.05)  # polling a port: the engine says nothing when it listens


class Engine:
    """What every engine shares: a temporary folder of its own, a free port on 127.0.0.1, at most one process at a
    time (``start`` launches it and waits until it is ready), SIGSTOP/SIGCONT as a hang and its end, and a ``close``
    that stops it however it is (running, paused or dead) and leaves no process and no folder behind."""

    def __init__(self, name: str, *, run_as: RunAs | None = None) -> None:
        self.run_as = run_as or RunAs()
        self.root = Path(tempfile.mkdtemp(prefix=f"gateway-{name}-"))
        self.run_as.own(self.root)
        self.port = free_port()
        self._env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self._process: EngineProcess | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.proc.poll() is None

    def start(self) -> None:
        """Launch the engine (``_launch``) and wait until it is ready."""
        raise NotImplementedError

    def _launch(self, argv: Sequence[str], *, ready_line: str | None) -> None:
        """Run ``argv`` in the engine's folder and wait until it is ready: its log says ``ready_line``, or, for an
        engine with no such line (None), its port accepts connections."""
        assert not self.running
        self._process = EngineProcess(argv, run_as=self.run_as, cwd=self.root, ready_pattern=ready_line, env=self._env)
        if ready_line is None:
            wait_listening(self.port, self._process)
        else:
            self._process.wait_ready()

    def _processes(self) -> list[tuple[int, str]]:
        """The (pid, start time) of what a pause stops: the engine's process."""
        assert self._process is not None
        leader = self._process.proc.pid
        return [(leader, _start_time(leader) or "")]

    def pause(self) -> None:
        """SIGSTOP the engine: connections stay open and nothing answers (a hung engine)."""
        _signal(self._processes(), signal.SIGSTOP)

    def resume(self) -> None:
        _signal(self._processes(), signal.SIGCONT)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """``pause`` for the block, then ``resume`` (also when the block fails)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def kill(self) -> None:
        """SIGKILL the engine's process group (a crash: connections refused from then on)."""
        if self._process is not None:
            self._process.kill()

    def _shut_down(self) -> None:
        """What ``close`` does before the kill: nothing, by default (the kill is the stop)."""

    def close(self) -> None:
        try:
            if self._process is not None:
                self.resume()  # a paused engine cannot stop
            self._shut_down()
        finally:
            self.kill()
            shutil.rmtree(self.root, ignore_errors=True)


E = TypeVar("E", bound=Engine)


@contextmanager
def started(engine: E) -> Iterator[E]:
    """``engine`` started, and closed afterwards (also when it failed to start)."""
    try:
        engine.start()
        yield engine
    finally:
        engine.close()


class PostgresServer(Engine):
    """A throwaway PostgreSQL cluster on 127.0.0.1: a superuser ``gateway`` with a random password (password auth
    over TCP, so the tests see a DSN with a password), data and unix socket in a temporary folder.

    ``durable=False`` (the tests' default) runs it with ``fsync=off``: a commit is still a commit (the tests crash the
    server, never the machine, and the WAL in the page cache survives that), but a shared disk is spared the fsyncs.
    Measurements want ``durable=True``.
    """

    USER = "gateway"

    def __init__(self, bindir: Path, *, durable: bool = False) -> None:
        super().__init__("pg", run_as=RunAs.unprivileged())
        self.bindir = bindir
        self.durable = durable
        self.data = self.root / "data"
        self.password = "pw-" + secrets.token_hex(12)
        self._env.update(LC_ALL="C", TZ="UTC")
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        self.run_as.own(pwfile)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        pwfile.unlink()

    def _run(self, program: str, *args: str) -> str:
        kwargs = self.run_as.popen_kwargs()
        out = subprocess.run(
            [str(self.bindir / program), *args],
            cwd=self.root,
            env=self._env,
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
            **kwargs,  # type: ignore[arg-type]
        )
        if out.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} exited {out.returncode}: {out.stdout}{out.stderr}")
        return out.stdout

    def start(self) -> None:
        """Start the server (after a crash it replays its WAL first) and wait until it accepts connections."""
        argv = [
            str(self.bindir / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.root}",
            "-c",
            "logging_collector=off",
            "-c",
            "max_connections=50",
            "-c",
            f"fsync={'on' if self.durable else 'off'}",
        ]
        self._launch(argv, ready_line="ready to accept connections")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE`` (``immediate`` is a crash: no shutdown checkpoint, clients cut off)."""
        if not self.running:
            return
        assert self._process is not None
        children = _children(self._process.proc.pid)
        try:
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", str(int(STOP_TIMEOUT_S)))
        finally:
            self._process.kill()  # the postmaster has exited; this reaps it
            self._process = None
            _signal(children, signal.SIGKILL)  # backends run in sessions of their own; they exit with the postmaster

    def _processes(self) -> list[tuple[int, str]]:
        """The postmaster and its children (each backend is in a session of its own, so no process group has all)."""
        leader = super()._processes()
        return [*leader, *_children(leader[0][0])]

    def _shut_down(self) -> None:
        self.stop("immediate")  # its data is thrown away: no shutdown checkpoint to wait for

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.USER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]  # a test's own identifier
        return self.dsn(name)

    def log(self) -> str:
        return "" if self._process is None else "\n".join(self._process.log)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session; each test takes a database of its own (``pg_url``)."""
    with started(PostgresServer(postgres_binaries())) as server:
        yield server


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, for tests that stop, pause or crash it."""
    with started(PostgresServer(postgres_binaries())) as server:
        yield server


@pytest.fixture
def pg_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """A fresh database on the session's server, named after the test; its URL (with the password)."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    return postgres_server.create_database(name)


class RedisServer(Engine):
    """A throwaway Redis on 127.0.0.1 with a random password, no persistence, in a temporary folder."""

    def __init__(self, binary: Path) -> None:
        super().__init__("redis")
        self.binary = binary
        self.password = "pw-" + secrets.token_hex(12)

    def start(self) -> None:
        argv = [str(self.binary), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.root), "--requirepass", self.password, "--daemonize", "no"]
        self._launch(argv, ready_line="Ready to accept connections")

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of the test's own (tests kill or pause it)."""
    with started(RedisServer(redis_binary())) as server:
        yield server


HAPROXY_CONFIG = """\
global
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # an SSE stream may sit silent between events
    timeout tunnel 60s
    retries 2
    # a request that found its server dead (connect refused) goes to another one; never one that was sent
    option redispatch 1
    # a fresh connection to a replica per request: one kept from an earlier request may lead to a replica that just
    # died, and a request sent on it is lost (HAProxy closes the client's connection and never resends it)
    option http-server-close
frontend mcp
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    # by default round-robin without affinity: any replica serves any request, sessions included
    {balance}
    option httpchk
    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    # which replica answered (the tests check that the load really was spread)
    http-response set-header X-Replica %s
{servers}
"""


class HAProxy(Engine):
    """A real HAProxy on 127.0.0.1 balancing over ``backends`` (ports on loopback): round robin, no affinity, unless
    ``balance`` (its config lines) says otherwise."""

    def __init__(
        self, binary: Path, backends: Sequence[int], *, check_ms: int = 500, balance: str = "balance roundrobin"
    ) -> None:
        super().__init__("haproxy")
        self.binary = binary
        servers = "\n".join(
            f"    server r{i} 127.0.0.1:{port} check inter {check_ms} fall 1 rise 1" for i, port in enumerate(backends)
        )
        self.config = self.root / "haproxy.cfg"
        self.config.write_text(HAPROXY_CONFIG.format(port=self.port, servers=servers, balance=balance))

    def start(self) -> None:
        self._launch([str(self.binary), "-db", "-f", str(self.config)], ready_line=None)  # no "ready" line of its own

    def url(self, path: str = "/mcp") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def postgres_binaries() -> Path:
    """The folder of PostgreSQL's server programs (``postgres_bindir``), or the test skips or fails (``missing``)."""
    return required(postgres_bindir(), "PostgreSQL (the Debian package postgresql)")


def redis_binary() -> Path:
    return required(find_binary("redis-server", folders=[Path("/usr/bin")]), "Redis (the Debian package redis-server)")


def haproxy_binary() -> Path:
    return required(find_binary("haproxy", folders=[Path("/usr/sbin")]), "HAProxy (the Debian package haproxy)")
