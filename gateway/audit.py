"""The audit ledger: one durable SQLite row per ``tools/call``, written by one thread and read by ``gateway audit``.

Guarantee: ``await Ledger.record(row)`` returns only after the transaction holding the row has committed. The ledger
runs SQLite in WAL mode; with the default ``synchronous="NORMAL"`` a commit has written the row into the WAL file
(the OS page cache) but has not fsynced it, so a row whose ``record()`` returned survives the gateway being killed
(SIGKILL, OOM, a crash); it can be lost only if the *machine* loses power or its kernel crashes before the OS has
written the WAL out (its dirty-page flush, typically within 30 s, or the ledger's next checkpoint, which fsyncs).
``synchronous="FULL"`` fsyncs the WAL on every commit and survives power loss too. NORMAL is the default because its
cost does not depend on the disk: ``bench/bench_audit.py`` on the development VM (2 CPUs, ext4 on a virtual disk)
puts an uncontended ``record()`` at a p50 of 0.13-0.27 ms with NORMAL, and at 0.31-0.38 ms with FULL while the disk
is idle but 2-3 ms while other processes keep it busy. The router awaits ``record()`` before it answers, so a caller
never sees a response whose row is not on disk in that sense.

Writing: one dedicated thread owns the write connection and takes rows from a queue. Rows that arrive while a commit
is under way are committed together in the next transaction (group commit, up to ``MAX_BATCH`` rows), so throughput
grows with load while an idle ledger commits each row at once. At most ``max_pending`` rows wait for their commit; a
further ``record()`` waits for room (back-pressure), and no row is ever dropped. ``record()`` is shielded from
cancellation: the row of a cancelled call is itself a row the ledger must keep.

Schema: ``PRAGMA user_version`` is the schema version; ``MIGRATIONS[i]`` takes a database from version ``i`` to
``i + 1`` and each runs in its own transaction, so a database of any older version is brought up to date in order
when a ``Ledger`` opens it. Row ids are ``AUTOINCREMENT`` and never reused, which is what ``tail`` follows.

Reading (``query``, ``tail``, ``stats``) is synchronous, opens the file read-only and never blocks the writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Self

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import structlog

from gateway.errors import AuditError

_log = structlog.get_logger(__name__)

STATUSES: Final = ("ok", "error", "degraded", "refused", "cancelled", "timeout")
ERROR_STATUSES: Final = frozenset({"error", "timeout"})
"""The statuses ``stats`` counts as errors: the tool did not answer. ``refused`` is policy, ``cancelled`` the client."""

DEFAULT_MAX_PENDING: Final = 1024  # rows accepted but not yet committed; beyond this record() waits
MAX_BATCH: Final = 512  # rows per transaction: bounds how long one commit holds the file's write lock
PRUNE_INTERVAL_S: Final = 3600.0  # retention runs at open and then this often
PRUNE_CHUNK: Final = 5000  # rows deleted per transaction, so a large prune does not stall queued rows
BUSY_TIMEOUT_S: Final = 5.0  # another process (a second gateway, a manual VACUUM) may hold the write lock briefly

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # v0 -> v1: the calls table.
    (
        """CREATE TABLE calls (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            ts REAL NOT NULL,
            correlation_id TEXT NOT NULL,
            session_id TEXT,
            client_name TEXT,
            client_version TEXT,
            caller TEXT,
            tool TEXT NOT NULL,
            chain TEXT NOT NULL,
            status TEXT NOT NULL,
            duration_ms REAL NOT NULL,
            result_bytes INTEGER NOT NULL,
            arg_preview TEXT NOT NULL,
            args_hash TEXT NOT NULL
        )""",
        "CREATE INDEX calls_ts ON calls (ts)",
        "CREATE INDEX calls_tool ON calls (tool, ts)",
        "CREATE INDEX calls_status ON calls (status, ts)",
    ),
)

_COLUMNS: Final = (
    "ts, correlation_id, session_id, client_name, client_version, caller, tool, chain, status, duration_ms,"
    " result_bytes, arg_preview, args_hash"
)
_INSERT: Final = f"INSERT INTO calls ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


@dataclass(frozen=True, slots=True)
class AuditStep:
    """One rung of a call's provider chain: who was asked, in which variant, and how it went."""

    provider: str
    variant: str | None
    outcome: str  # "ok", or a BackendError.outcome: "timeout", "unavailable", "thin", ...
    reason: str | None
    duration_ms: float


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One ``tools/call`` as the ledger keeps it. ``caller`` names the token (a name or a hash), never the token."""

    ts: float  # unix time the call arrived
    correlation_id: str  # one id for every step of the fallback chain
    session_id: str | None
    client_name: str | None
    client_version: str | None
    caller: str | None
    tool: str
    chain: tuple[AuditStep, ...]
    status: str  # one of STATUSES
    duration_ms: float
    result_bytes: int
    arg_preview: Mapping[str, str]
    args_hash: str


@dataclass(frozen=True, slots=True)
class ToolStats:
    """Per-tool figures over a time range. Rates are fractions of ``calls``; latencies are nearest-rank, in ms."""

    tool: str
    calls: int
    by_status: Mapping[str, int]
    error_rate: float  # share of calls whose status is in ERROR_STATUSES
    degraded_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p50_result_bytes: float = 0.0  # the typical answer's size (what a call costs a model's context)


@dataclass(frozen=True, slots=True)
class LedgerStatistics:
    pending: int  # rows accepted and not yet committed
    peak_pending: int  # the most rows ever pending at once (max_pending means callers have waited)
    max_pending: int
    rows_written: int
    commits: int
    largest_commit: int  # rows in the largest group commit
    rows_pruned: int


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_hash(arguments: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of the arguments' canonical JSON (sorted keys, no spaces, UTF-8).

    Equal arguments hash equally whatever their key order, so repeated calls can be matched without storing them.
    """
    return hashlib.sha256(_canonical_json(dict(arguments)).encode("utf-8")).hexdigest()[:16]


def arg_previews(arguments: Mapping[str, Any], spec: Mapping[str, int]) -> dict[str, str]:
    """Previews of the arguments ``spec`` lists (``{name: max_chars}``), in ``spec`` order; all others are left out.

    A string is kept as is, any other value as its canonical JSON. A value longer than ``max_chars`` keeps its first
    ``max_chars`` characters followed by "…" so a reader can tell it was cut; ``0`` means no limit (the config's
    ``mode: 0`` keeps a short enum whole). Arguments the call did not pass have no preview.

    Raises:
        ValueError: a limit is negative.
    """
    previews: dict[str, str] = {}
    for name, limit in spec.items():
        if limit < 0:
            raise ValueError(f"The preview length of argument {name!r} must be 0 (no limit) or more, not {limit}.")
        if name not in arguments:
            continue
        value = arguments[name]
        text = value if isinstance(value, str) else _canonical_json(value)
        previews[name] = text[:limit] + "…" if 0 < limit < len(text) else text
    return previews


def _encode(rec: AuditRecord) -> tuple[Any, ...]:
    if rec.status not in STATUSES:
        raise AuditError(f"Audit status {rec.status!r} is not one of {', '.join(STATUSES)}.")
    chain = [
        {"provider": s.provider, "variant": s.variant, "outcome": s.outcome, "reason": s.reason, "ms": s.duration_ms}
        for s in rec.chain
    ]
    return (
        rec.ts,
        rec.correlation_id,
        rec.session_id,
        rec.client_name,
        rec.client_version,
        rec.caller,
        rec.tool,
        json.dumps(chain, ensure_ascii=False, separators=(",", ":")),
        rec.status,
        rec.duration_ms,
        rec.result_bytes,
        json.dumps(dict(rec.arg_preview), ensure_ascii=False, separators=(",", ":")),
        rec.args_hash,
    )


def _decode(row: Sequence[Any]) -> AuditRecord:
    chain = tuple(
        AuditStep(
            provider=s["provider"], variant=s["variant"], outcome=s["outcome"], reason=s["reason"], duration_ms=s["ms"]
        )
        for s in json.loads(row[7])
    )
    return AuditRecord(
        ts=row[0],
        correlation_id=row[1],
        session_id=row[2],
        client_name=row[3],
        client_version=row[4],
        caller=row[5],
        tool=row[6],
        chain=chain,
        status=row[8],
        duration_ms=row[9],
        result_bytes=row[10],
        arg_preview=json.loads(row[11]),
        args_hash=row[12],
    )


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations the database lacks, one transaction each, re-reading the version under the write lock
    so two processes opening the same new file do not both migrate it."""
    latest = len(MIGRATIONS)
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > latest:
                raise AuditError(
                    f"The audit ledger at {path} has schema version {version}, newer than this gateway's {latest}; "
                    "upgrade the gateway or point audit.path at another file."
                )
            if version == latest:
                conn.execute("COMMIT")
                return
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


@dataclass(slots=True, eq=False)
class _Job:
    row: tuple[Any, ...] | None  # None: a prune request
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None
    pruned: int = 0


class Ledger(anyio.AsyncContextManagerMixin):
    """The write side of the audit ledger; see the module docstring for its guarantee.

    Use it as ``async with Ledger(path, retention_days=30) as ledger: ... await ledger.record(rec)``. A ledger is
    single-use. ``Ledger(None)`` is disabled: it opens nothing and ``record()`` returns at once, for measuring the
    gateway with the ledger off.

    Args:
        path: the SQLite file (created, with its directory, if missing; mode 0600), or None to disable the ledger.
        retention_days: rows older than this are deleted at open and every ``prune_interval_s``; None keeps all.
        synchronous: "NORMAL" survives a process crash, "FULL" also survives power loss (slower; see module doc).
        max_pending: how many rows may await their commit before ``record()`` makes callers wait.
        prune_interval_s: how often retention runs while open.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        retention_days: float | None = None,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        max_pending: int = DEFAULT_MAX_PENDING,
        prune_interval_s: float = PRUNE_INTERVAL_S,
    ) -> None:
        if retention_days is not None and retention_days <= 0:
            raise ValueError(
                f"audit.retention_days must be more than 0 (or unset to keep every row), not {retention_days}."
            )
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}.")
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}.")
        if prune_interval_s <= 0:
            raise ValueError(f"prune_interval_s must be more than 0, not {prune_interval_s}.")
        self._path = None if path is None else Path(path)
        self._retention_s = None if retention_days is None else retention_days * 86400.0
        self._synchronous = synchronous
        self._max_pending = max_pending
        self._prune_interval_s = prune_interval_s
        self._state: Literal["new", "open", "closing", "closed"] = "new"
        self._failure: str | None = None  # set (on the event loop) if the writer thread died
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: drain and stop
        self._slots: anyio.Semaphore | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._pending = self._peak_pending = 0
        self._rows_written = self._commits = self._largest_commit = self._rows_pruned = 0

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def disabled(self) -> bool:
        return self._path is None

    def statistics(self) -> LedgerStatistics:
        return LedgerStatistics(
            pending=self._pending,
            peak_pending=self._peak_pending,
            max_pending=self._max_pending,
            rows_written=self._rows_written,
            commits=self._commits,
            largest_commit=self._largest_commit,
            rows_pruned=self._rows_pruned,
        )

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        if self._state != "new":
            raise RuntimeError("A Ledger cannot be reopened once closed; create a new one.")
        if self._path is None:
            self._state = "open"
            try:
                yield self
            finally:
                self._state = "closed"
            return
        self._slots = anyio.Semaphore(self._max_pending)
        self._token = anyio.lowlevel.current_token()
        conn = await anyio.to_thread.run_sync(self._open, self._path)
        writer = threading.Thread(target=self._work, args=(conn,), name=f"audit-ledger:{self._path.name}", daemon=True)
        writer.start()
        self._state = "open"
        try:
            yield self
        finally:
            # Queued rows were promised to their callers: drain them all, even while being cancelled. No timeout:
            # the writer cannot be interrupted mid-commit, and a row is never abandoned.
            self._state = "closing"
            self._queue.put(None)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(writer.join)
            self._state = "closed"

    async def record(self, rec: AuditRecord) -> None:
        """Write one row; return once its transaction has committed.

        Raises:
            AuditError: the ledger is not open, the row is invalid, or SQLite could not write it.
        """
        if self._state != "open":
            raise AuditError(f"The audit ledger is {self._state}; rows can be recorded only while it is open.")
        if self._slots is None:  # disabled
            return
        job = _Job(row=_encode(rec))
        with anyio.CancelScope(shield=True):
            await self._slots.acquire()
            # No await between this check and the put: the closing STOP or a writer failure cannot slip in between.
            if self._state != "open" or self._failure is not None:
                self._slots.release()
                raise AuditError(self._failure or "The audit ledger closed before the row could be recorded.")
            self._pending += 1
            self._peak_pending = max(self._peak_pending, self._pending)
            self._queue.put(job)
            await job.done.wait()
        if job.error is not None:
            raise AuditError(job.error)

    async def prune(self) -> int:
        """Apply retention now (in the writer, between commits); return how many rows were deleted."""
        if self._state != "open":
            raise AuditError(f"The audit ledger is {self._state}; it can be pruned only while it is open.")
        if self._slots is None or self._retention_s is None:
            return 0
        job = _Job(row=None)
        with anyio.CancelScope(shield=True):
            self._queue.put(job)
            await job.done.wait()
        if job.error is not None:
            raise AuditError(job.error)
        return job.pruned

    # --- the writer thread ------------------------------------------------------------------------------------

    def _open(self, path: Path) -> sqlite3.Connection:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # previews may be sensitive
            # Handed to the writer thread once opened; never used by two threads at once.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        except (OSError, sqlite3.Error) as exc:
            raise AuditError(f"Cannot open the audit ledger at {path}: {exc}.") from exc
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise AuditError(f"The audit ledger at {path} cannot use WAL (journal mode is {mode!r}).")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            _migrate(conn, path)
            while self._prune_chunk(conn) == PRUNE_CHUNK:
                pass
        except sqlite3.Error as exc:
            conn.close()
            raise AuditError(f"Cannot open the audit ledger at {path}: {exc}.") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _prune_chunk(self, conn: sqlite3.Connection) -> int:
        if self._retention_s is None:
            return 0
        cutoff = time.time() - self._retention_s
        cursor = conn.execute(
            "DELETE FROM calls WHERE id IN (SELECT id FROM calls WHERE ts < ? ORDER BY ts LIMIT ?)",
            (cutoff, PRUNE_CHUNK),
        )
        self._rows_pruned += cursor.rowcount
        return cursor.rowcount

    def _work(self, conn: sqlite3.Connection) -> None:
        held: list[_Job | None] = []
        try:
            self._serve(conn, held)
        except BaseException as exc:
            # A bug, not a write error (those fail their batch and the writer carries on). Fail every row still
            # waiting, then let the thread's excepthook report the exception.
            self._notify(self._fail_all, held, f"The audit ledger's writer stopped: {exc!r}.")
            raise
        finally:
            conn.close()

    def _serve(self, conn: sqlite3.Connection, held: list[_Job | None]) -> None:
        next_prune = time.monotonic() + self._prune_interval_s
        while True:
            timeout = None if self._retention_s is None else max(0.0, next_prune - time.monotonic())
            try:
                held.append(self._queue.get(timeout=timeout))
            except queue.Empty:  # time to prune; a full chunk means more is due, after the rows queued meanwhile
                try:
                    full = self._prune_chunk(conn) == PRUNE_CHUNK
                except sqlite3.Error as exc:
                    _log.warning("audit.prune_failed", path=str(self._path), error=str(exc))
                    full = False
                next_prune = time.monotonic() + (0.0 if full else self._prune_interval_s)
                continue
            while len(held) < MAX_BATCH:
                try:
                    held.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = held[-1] is None  # nothing follows the stop: record() refuses rows once closing
            jobs = [job for job in held if job is not None]
            self._write(conn, [job for job in jobs if job.row is not None])
            for job in jobs:
                if job.row is None:
                    self._prune_job(conn, job)
            self._notify(self._complete, jobs)
            held.clear()
            if stop:
                return

    def _write(self, conn: sqlite3.Connection, jobs: list[_Job]) -> None:
        if not jobs:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT, [job.row for job in jobs if job.row is not None])
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            message = f"Could not write {len(jobs)} row(s) to the audit ledger at {self._path}: {exc}."
            for job in jobs:
                job.error = message
            return
        self._rows_written += len(jobs)
        self._commits += 1
        self._largest_commit = max(self._largest_commit, len(jobs))

    def _prune_job(self, conn: sqlite3.Connection, job: _Job) -> None:
        try:
            while (n := self._prune_chunk(conn)) > 0:
                job.pruned += n
        except sqlite3.Error as exc:
            job.error = f"Could not prune the audit ledger at {self._path}: {exc}."

    def _notify(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            anyio.from_thread.run_sync(callback, *args, token=self._token)
        except anyio.RunFinishedError:  # the event loop is gone, and nobody is waiting any more
            pass

    # --- on the event loop ------------------------------------------------------------------------------------

    def _complete(self, jobs: list[_Job]) -> None:
        assert self._slots is not None
        for job in jobs:
            if job.row is not None:
                self._pending -= 1
                self._slots.release()
            job.done.set()

    def _fail_all(self, held: list[_Job | None], message: str) -> None:
        self._failure = message
        jobs = [job for job in held if job is not None]
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                jobs.append(job)
        for job in jobs:
            job.error = message
        self._complete(jobs)


# --- the read side ----------------------------------------------------------------------------------------------


def _connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    file = Path(path)
    if not file.is_file():
        raise AuditError(f"There is no audit ledger at {file}.")
    try:
        conn = sqlite3.connect(file.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise AuditError(f"Cannot read the audit ledger at {file}: {exc}.") from exc
    try:
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        conn.close()
        raise AuditError(f"Cannot read the audit ledger at {file}: {exc}.") from exc
    latest = len(MIGRATIONS)
    if version != latest:
        conn.close()
        if version == 0:
            raise AuditError(f"{file} is not an audit ledger (it has no schema version).")
        raise AuditError(
            f"The audit ledger at {file} has schema version {version} and this gateway reads version {latest}; "
            + ("upgrade the gateway." if version > latest else "the gateway migrates it the next time it opens it.")
        )
    return conn


def _where(
    *, tool: str | None, status: str | None, client: str | None, since: float | None, until: float | None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("tool", tool), ("status", status), ("client_name", client)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if since is not None:
        clauses.append("ts >= ?")
        params.append(since)
    if until is not None:
        clauses.append("ts < ?")
        params.append(until)
    return (" AND ".join(clauses) or "1"), params


def query(
    path: str | os.PathLike[str],
    *,
    tool: str | None = None,
    status: str | None = None,
    client: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = 100,
) -> list[AuditRecord]:
    """The most recent ``limit`` rows matching every given filter, oldest first.

    Args:
        path: the ledger file.
        tool, status, client: exact matches on the tool name, the status and the client's name.
        since, until: unix times; ``since <= ts < until``.
        limit: the most rows to return (the newest ones), or None for all.

    Raises:
        AuditError: the file is missing, is not a ledger, or has another schema version.
    """
    where, params = _where(tool=tool, status=status, client=client, since=since, until=until)
    sql = f"SELECT {_COLUMNS} FROM calls WHERE {where} ORDER BY ts DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    conn = _connect_readonly(path)
    try:
        rows = conn.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        raise AuditError(f"Cannot read the audit ledger at {path}: {exc}.") from exc
    finally:
        conn.close()
    return [_decode(row) for row in reversed(rows)]


def tail(
    path: str | os.PathLike[str],
    *,
    tool: str | None = None,
    status: str | None = None,
    client: str | None = None,
    last: int = 10,
    follow: bool = True,
    poll_interval: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> Generator[AuditRecord]:
    """Yield the ``last`` matching rows, then (with ``follow``) every new matching row as it is committed.

    New rows are found by polling for ids above the highest seen every ``poll_interval`` seconds (ids are never
    reused, so pruning cannot hide a row). The generator runs until closed; ``sleep`` is the wait between polls.

    Raises:
        AuditError: as ``query``.
    """
    where, params = _where(tool=tool, status=status, client=client, since=None, until=None)
    conn = _connect_readonly(path)
    try:
        seen: int = conn.execute("SELECT coalesce(max(id), 0) FROM calls").fetchone()[0]
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM calls WHERE id <= ? AND {where} ORDER BY id DESC LIMIT ?", [seen, *params, last]
        ).fetchall()
        yield from (_decode(row) for row in reversed(rows))
        while follow:
            sleep(poll_interval)
            top: int = conn.execute("SELECT coalesce(max(id), 0) FROM calls").fetchone()[0]
            if top <= seen:
                continue
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM calls WHERE id > ? AND id <= ? AND {where} ORDER BY id", [seen, top, *params]
            ).fetchall()
            seen = top
            yield from (_decode(row) for row in rows)
    except sqlite3.Error as exc:
        raise AuditError(f"Cannot read the audit ledger at {path}: {exc}.") from exc
    finally:
        conn.close()


def _nearest_rank(ordered: Sequence[float], pct: int) -> float:
    """The nearest-rank percentile of an ascending, non-empty sequence: the value at rank ceil(pct/100 * n)."""
    rank = max(1, (pct * len(ordered) + 99) // 100)  # integer ceil: no float rounding at exact ranks
    return ordered[rank - 1]


def stats(
    path: str | os.PathLike[str],
    *,
    since: float | None = None,
    until: float | None = None,
    tool: str | None = None,
    client: str | None = None,
    status: str | None = None,
) -> list[ToolStats]:
    """Per-tool figures for the rows in ``since <= ts < until``, sorted by tool name. Latencies cover every status.

    Percentiles are computed here, so every row in range is read (three columns of it): bound a large ledger with
    ``since``.

    Raises:
        AuditError: as ``query``.
    """
    where, params = _where(tool=tool, status=status, client=client, since=since, until=until)
    conn = _connect_readonly(path)
    try:
        rows = conn.execute(
            f"SELECT tool, status, duration_ms, result_bytes FROM calls WHERE {where}", params
        ).fetchall()
    except sqlite3.Error as exc:
        raise AuditError(f"Cannot read the audit ledger at {path}: {exc}.") from exc
    finally:
        conn.close()
    durations: dict[str, list[float]] = {}
    sizes: dict[str, list[float]] = {}
    statuses: dict[str, dict[str, int]] = {}
    for name, row_status, duration, size in rows:
        durations.setdefault(name, []).append(duration)
        sizes.setdefault(name, []).append(float(size or 0))
        counts = statuses.setdefault(name, {})
        counts[row_status] = counts.get(row_status, 0) + 1
    result: list[ToolStats] = []
    for name in sorted(durations):
        ordered = sorted(durations[name])
        counts = statuses[name]
        calls = len(ordered)
        result.append(
            ToolStats(
                tool=name,
                calls=calls,
                by_status=dict(sorted(counts.items())),
                error_rate=sum(counts.get(s, 0) for s in ERROR_STATUSES) / calls,
                degraded_rate=counts.get("degraded", 0) / calls,
                p50_ms=_nearest_rank(ordered, 50),
                p95_ms=_nearest_rank(ordered, 95),
                p99_ms=_nearest_rank(ordered, 99),
                p50_result_bytes=_nearest_rank(sorted(sizes[name]), 50),
            )
        )
    return result
