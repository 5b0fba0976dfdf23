"""The audit ledger: one durable SQLite row per request that reaches a backend (``tools/call``, ``resources/read``,
``prompts/get``, ``completion/complete``, ``resources/subscribe``/``unsubscribe``: the row's ``kind``),
group-committed, read by ``gateway audit``.

Guarantee: ``await Ledger.record(row)`` returns only after the transaction holding the row has committed. The ledger
runs SQLite in WAL mode; with the default ``synchronous="NORMAL"`` a commit has written the row into the WAL file
(the OS page cache) but has not fsynced it, so a row whose ``record()`` returned survives the gateway being killed
(SIGKILL, OOM, a crash); it can be lost only if the *machine* loses power or its kernel crashes before the OS has
written the WAL out (its dirty-page flush, typically within 30 s, or the ledger's next checkpoint, which fsyncs and
runs at least every ``CHECKPOINT_INTERVAL_S`` while rows arrive). ``synchronous="FULL"`` fsyncs the WAL on every
commit and survives power loss too. NORMAL is the default because its cost does not depend on the disk:
``bench/bench_audit.py`` on the development VM (2 CPUs, ext4 on a virtual disk) puts an uncontended ``record()`` at a
p50 of 0.07 ms with NORMAL, and at 0.31-0.37 ms with FULL while the disk is idle but 2-3 ms while other processes keep
it busy. The router awaits ``record()`` before it answers, so a caller never sees a response whose row is not on
disk in that sense.

Writing (group commit): ``record()`` adds its row to the open batch; the caller that opened the batch (its leader)
yields once to the event loop, so every caller that is ready joins the batch, then commits the batch in one
transaction (up to ``MAX_BATCH`` rows) and wakes the others. With NORMAL a commit does not fsync (tens of
microseconds), so the leader runs it on the event loop itself: no hand-off to a thread and no wake-up back. It never
sleeps there on a lock: if another connection holds the write lock (retention, another process), that batch is
committed from a worker thread, which waits for the lock. Checkpoints, which do fsync, are never a commit's: the
writer connection has ``wal_autocheckpoint=0`` and a maintenance thread with its own connection runs a PASSIVE
checkpoint every ``CHECKPOINT_INTERVAL_S`` (or ``CHECKPOINT_COMMITS`` commits) when rows were written, and retention
every ``prune_interval_s``. With FULL every commit fsyncs, so the leader commits in a worker thread (SQLite's own
checkpoints included) and rows arriving meanwhile form the next batch. At most ``max_pending`` rows wait for their
commit; a further ``record()`` waits for room (back-pressure), and no row is ever dropped. ``record()`` is shielded
from cancellation, the leader's commit included: the row of a cancelled call is itself a row the ledger must keep.

Schema: ``PRAGMA user_version`` is the schema version; ``MIGRATIONS[i]`` takes a database from version ``i`` to
``i + 1`` and each runs in its own transaction, so a database of any older version is brought up to date in order
when a ``Ledger`` opens it. Row ids are ``AUTOINCREMENT`` and never reused, which is what ``tail`` follows.

Reading (``query``, ``tail``, ``stats``) is synchronous, opens the file read-only and never blocks the writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Self, TypedDict, Unpack

import anyio
import anyio.lowlevel
import anyio.to_thread
import structlog

from gateway.errors import AuditError

_log = structlog.get_logger(__name__)

STATUSES: Final = (
    "ok",
    "error",
    "degraded",
    "refused",
    "cancelled",
    "timeout",
    "unknown_tool",
    "invalid_params",
    "internal_error",
    "input_required",  # a multi-round-trip round that ended asking the client for input (SEP-2322)
)
ERROR_STATUSES: Final = frozenset({"error", "timeout", "internal_error"})
"""The statuses ``stats`` counts as errors: the tool did not answer. ``refused`` is policy, ``cancelled`` the client."""

DEFAULT_MAX_PENDING: Final = 1024  # rows accepted but not yet committed; beyond this record() waits
MAX_BATCH: Final = 512  # rows per transaction: bounds how long one commit holds the file's write lock
PRUNE_INTERVAL_S: Final = 3600.0  # retention runs at open and then this often
PRUNE_CHUNK: Final = 5000  # rows deleted per transaction, so a large prune does not stall queued rows
CHECKPOINT_INTERVAL_S: Final = 1.0  # the maintenance thread checkpoints the WAL this often while rows arrive
CHECKPOINT_COMMITS: Final = 1000  # ... or after this many commits, whichever comes first
BUSY_TIMEOUT_S: Final = 5.0  # another process (a second gateway, a manual VACUUM) may hold the write lock briefly

# Both engines apply this one list (ledger_pg.py translates SQLite's column types: INTEGER PRIMARY KEY
# AUTOINCREMENT, INTEGER and REAL): write each statement in SQL that SQLite and PostgreSQL both accept.
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
    # v1 -> v2: what kind of request each row is (rows written before it were all tools/call).
    (
        "ALTER TABLE calls ADD COLUMN kind TEXT NOT NULL DEFAULT 'tools/call'",
        "CREATE INDEX calls_kind ON calls (kind, ts)",
    ),
)

_COLUMNS: Final = (
    "ts, correlation_id, session_id, client_name, client_version, caller, tool, chain, status, duration_ms,"
    " result_bytes, arg_preview, args_hash, kind"
)
_INSERT: Final = f"INSERT INTO calls ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

KINDS: Final = (
    "tools/call",
    "resources/read",
    "prompts/get",
    "completion/complete",
    "resources/subscribe",
    "resources/unsubscribe",
)
"""What a row can be: the MCP method of the request that reached a backend."""


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
    """One request as the ledger keeps it. ``caller`` names the token (a name or a hash), never the token; ``tool``
    is what the request named: the published tool, prompt or resource URI."""

    ts: float  # unix time the call arrived
    correlation_id: str  # one id for every step of the fallback chain
    session_id: str | None  # 12 hex digits of the session id's SHA-256 (server.session_digest), never the id
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
    kind: str = "tools/call"  # one of KINDS


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
    kind: str = "tools/call"  # one of KINDS: ``tool`` is then a prompt's name or a resource's URI


@dataclass(frozen=True, slots=True)
class LedgerStatistics:
    pending: int  # rows accepted and not yet committed
    peak_pending: int  # the most rows ever pending at once (max_pending means callers have waited)
    max_pending: int
    rows_written: int
    commits: int
    largest_commit: int  # rows in the largest group commit
    rows_pruned: int
    engine: str = "sqlite"  # or "postgresql"
    spooling: bool = False  # PostgreSQL is unreachable: rows are committed to the local spool file instead
    spooled_rows: int = 0  # rows in the spool waiting to be replayed into PostgreSQL
    problem: str | None = None  # why the ledger is spooling (password-free)


# Built once: json.dumps with any option builds a new JSONEncoder on every call (a few microseconds per row).
_canonical_json: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_compact_json: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def args_hash(arguments: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of the arguments' canonical JSON (sorted keys, no spaces, UTF-8).

    Equal arguments hash equally whatever their key order, so repeated calls can be matched without storing them.
    """
    plain = arguments if type(arguments) is dict else dict(arguments)
    return hashlib.sha256(_canonical_json(plain).encode("utf-8")).hexdigest()[:16]


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
    if rec.kind not in KINDS:
        raise AuditError(f"Audit kind {rec.kind!r} is not one of {', '.join(KINDS)}.")
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
        _compact_json(chain),
        rec.status,
        rec.duration_ms,
        rec.result_bytes,
        _compact_json(dict(rec.arg_preview)) if rec.arg_preview else "{}",
        rec.args_hash,
        rec.kind,
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
        kind=row[13],
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
class _Batch:
    """Rows that share one transaction; its first caller (the leader) commits it, the others wait for ``done``."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None


class _GroupCommit:
    """Group commit, as both engines' write sides do it (see the module docstring): ``record()`` admits a row (at
    most ``max_pending`` wait), joins it to the open batch or leads a new one, and returns once the batch committed.
    An engine sets the state its ``__init__``/open calls for and supplies ``_commit_batch`` (write the rows in one
    transaction under ``_writing``; return None or the error every caller of the batch gets)."""

    _slots: anyio.Semaphore | None  # max_pending rows; a further record() waits (None: a disabled ledger)
    _writing: anyio.Lock | None  # held while a batch commits
    _drained: anyio.Event | None  # set on close once no row is pending

    def __init__(self, *, retention_days: float | None, max_pending: int, prune_interval_s: float) -> None:
        if retention_days is not None and retention_days <= 0:
            raise ValueError(
                f"audit.retention_days must be more than 0 (or unset to keep every row), not {retention_days}."
            )
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}.")
        if prune_interval_s <= 0:
            raise ValueError(f"prune_interval_s must be more than 0, not {prune_interval_s}.")
        self._retention_s = None if retention_days is None else retention_days * 86400.0
        self._max_pending = max_pending
        self._prune_interval_s = prune_interval_s
        self._state: Literal["new", "open", "closing", "closed"] = "new"
        self._batch: _Batch | None = None  # the batch new rows join, until its leader starts the commit
        self._pending = self._peak_pending = 0
        self._rows_written = self._commits = self._largest_commit = self._rows_pruned = 0

    async def _commit_batch(self, rows: list[tuple[Any, ...]]) -> str | None:
        raise NotImplementedError

    def _batch_done(self) -> None:
        """Called after each batch's callers are woken (the SQLite ledger's checkpoint trigger)."""

    def _count_commit(self, rows: int) -> None:
        self._rows_written += rows
        self._commits += 1
        self._largest_commit = max(self._largest_commit, rows)

    def _statistics(self, **engine: Any) -> LedgerStatistics:
        return LedgerStatistics(
            pending=self._pending,
            peak_pending=self._peak_pending,
            max_pending=self._max_pending,
            rows_written=self._rows_written,
            commits=self._commits,
            largest_commit=self._largest_commit,
            rows_pruned=self._rows_pruned,
            **engine,
        )

    async def record(self, rec: AuditRecord) -> None:
        """Write one row; return once its transaction has committed.

        Raises:
            AuditError: the ledger is not open, the row is invalid, or the engine could not write it.
        """
        if self._state != "open":
            raise AuditError(f"The audit ledger is {self._state}; rows can be recorded only while it is open.")
        if self._slots is None:  # disabled
            return
        row = _encode(rec)
        with anyio.CancelScope(shield=True):
            await self._slots.acquire()  # fast_acquire: no checkpoint unless the ledger is full
            if self._state != "open":
                self._slots.release()
                raise AuditError("The audit ledger closed before the row could be recorded.")
            self._pending += 1
            self._peak_pending = max(self._peak_pending, self._pending)
            joined = self._batch
            if joined is None or len(joined.rows) >= MAX_BATCH:
                batch = self._batch = _Batch(rows=[row])
                await self._lead(batch)
            else:
                batch = joined
                batch.rows.append(row)
                await batch.done.wait()
        if batch.error is not None:
            raise AuditError(batch.error)

    async def _drain(self) -> None:
        """Start closing: no row is admitted any more, and the pending ones (promised to their callers: their leaders
        commit them, ``record()`` is shielded) are waited for, even while being cancelled. No timeout: a row is never
        abandoned."""
        self._state = "closing"
        with anyio.CancelScope(shield=True):
            if self._pending:
                assert self._drained is not None
                await self._drained.wait()

    async def _lead(self, batch: _Batch) -> None:
        """Commit ``batch``: let the callers that are ready join it first, then write it in one transaction."""
        assert self._writing is not None and self._slots is not None
        await anyio.lowlevel.cancel_shielded_checkpoint()  # the one yield: concurrent callers join the batch
        try:
            async with self._writing:
                if self._batch is batch:
                    self._batch = None  # closed: later rows start the next batch
                try:
                    batch.error = await self._commit_batch(batch.rows)
                except BaseException as exc:  # a bug, not a write error: fail the batch, then let it surface
                    batch.error = f"The audit ledger could not commit: {exc!r}."
                    raise
        finally:
            rows = len(batch.rows)
            self._pending -= rows
            for _ in range(rows):
                self._slots.release()
            batch.done.set()
            if self._pending == 0 and self._state == "closing":
                assert self._drained is not None
                self._drained.set()
            self._batch_done()


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class _Busy(Exception):
    """Another connection holds the write lock: commit in a worker thread, where waiting for it blocks no one."""


class Ledger(_GroupCommit, anyio.AsyncContextManagerMixin):
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
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}.")
        super().__init__(retention_days=retention_days, max_pending=max_pending, prune_interval_s=prune_interval_s)
        self._path = None if path is None else Path(path)
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = None  # the write connection: used by one batch at a time
        self._slots: anyio.Semaphore | None = None  # max_pending rows; a further record() waits
        self._writing: anyio.Lock | None = None  # held while a batch commits
        self._drained: anyio.Event | None = None  # set on close once no row is pending
        # The maintenance thread: checkpoints and retention, on its own connection, off the event loop.
        self._maintenance_conn: sqlite3.Connection | None = None
        self._maintenance_lock = threading.Lock()  # the maintenance connection is used by one thread at a time
        self._maintenance_wake = threading.Event()
        self._maintenance_stop = False
        self._checkpointed_commits = 0  # self._commits as of the last checkpoint

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def disabled(self) -> bool:
        return self._path is None

    @property
    def target(self) -> Path | None:
        """What the read side (``query``, ``stats``) opens: the file."""
        return self._path

    def statistics(self) -> LedgerStatistics:
        return self._statistics()

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
        self._slots = anyio.Semaphore(self._max_pending, fast_acquire=True)
        self._writing = anyio.Lock(fast_acquire=True)
        self._drained = anyio.Event()
        conn, self._maintenance_conn = await anyio.to_thread.run_sync(self._open, self._path)
        self._conn = conn
        maintenance = threading.Thread(target=self._maintain, name=f"audit-ledger:{self._path.name}", daemon=True)
        maintenance.start()
        self._state = "open"
        try:
            yield self
        finally:
            await self._drain()
            with anyio.CancelScope(shield=True):
                self._maintenance_stop = True
                self._maintenance_wake.set()
                await anyio.to_thread.run_sync(maintenance.join)
                # Closing the last connection checkpoints the WAL (an fsync): off the event loop too.
                await anyio.to_thread.run_sync(conn.close)
            self._state = "closed"

    async def prune(self) -> int:
        """Apply retention now (in a worker thread, in chunks between commits); return how many rows were deleted."""
        if self._state != "open":
            raise AuditError(f"The audit ledger is {self._state}; it can be pruned only while it is open.")
        if self._slots is None or self._retention_s is None:
            return 0
        with anyio.CancelScope(shield=True):
            pruned = await anyio.to_thread.run_sync(self._prune_all)
        return pruned

    # --- on the event loop ------------------------------------------------------------------------------------

    async def _commit_batch(self, rows: list[tuple[Any, ...]]) -> str | None:
        """With ``synchronous=NORMAL`` a commit only appends to the WAL (no fsync; tens of microseconds), so it runs
        right here on the event loop: no thread hand-off and no wake-up back. If another connection holds the write
        lock (retention, another process), the batch waits for it in a worker thread instead of blocking the loop.
        With ``FULL`` every commit fsyncs, so it always runs in a worker thread; rows arriving meanwhile gather in the
        next batch.
        """
        if self._synchronous == "FULL":
            return await anyio.to_thread.run_sync(self._commit, rows)
        try:
            return self._commit(rows, busy_wait=False)
        except _Busy:
            return await anyio.to_thread.run_sync(self._commit, rows)

    def _batch_done(self) -> None:
        if self._commits - self._checkpointed_commits >= CHECKPOINT_COMMITS:
            self._maintenance_wake.set()

    # --- SQLite (the event loop or a worker thread; never two at once on one connection) -----------------------

    def _open(self, path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "a file of that name is in the way" if isinstance(exc, FileExistsError) else exc.strerror
            raise AuditError(f"Cannot open the audit ledger at {path}: its folder cannot be created ({why}).") from exc
        try:
            if not path.exists():
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # previews may be sensitive
            # Used by the event loop and worker threads, never by two at once.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        except (OSError, sqlite3.Error) as exc:
            raise AuditError(f"Cannot open the audit ledger at {path}: {exc}.") from exc
        maintenance: sqlite3.Connection | None = None
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise AuditError(f"The audit ledger at {path} cannot use WAL (journal mode is {mode!r}).")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            _migrate(conn, path)
            while self._prune_chunk(conn) == PRUNE_CHUNK:
                pass
            if self._synchronous == "NORMAL":
                # Commits run on the event loop: checkpoints (which fsync) are the maintenance thread's, and a
                # commit never sleeps on another connection's lock (it hands the batch to a worker thread instead).
                # FULL commits run in a worker thread and fsync anyway: SQLite's own checkpoints stay in them.
                conn.execute("PRAGMA wal_autocheckpoint=0")
                conn.execute("PRAGMA busy_timeout=0")
            maintenance = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
            maintenance.execute(f"PRAGMA synchronous={self._synchronous}")
            maintenance.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            conn.close()
            if maintenance is not None:
                maintenance.close()
            raise AuditError(f"Cannot open the audit ledger at {path}: {exc}.") from exc
        except BaseException:
            conn.close()
            if maintenance is not None:
                maintenance.close()
            raise
        return conn, maintenance

    def _commit(self, rows: list[tuple[Any, ...]], *, busy_wait: bool = True) -> str | None:
        """Write ``rows`` in one transaction; return None, or the error every caller of the batch gets.

        Raises:
            _Busy: ``busy_wait`` is false and another connection holds the write lock (nothing was written).
        """
        conn = self._conn
        assert conn is not None
        if busy_wait and self._synchronous == "NORMAL":
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not busy_wait and _is_busy(exc):
                raise _Busy from exc
            return f"Could not write {len(rows)} row(s) to the audit ledger at {self._path}: {exc}."
        finally:
            if busy_wait and self._synchronous == "NORMAL":
                conn.execute("PRAGMA busy_timeout=0")
        self._count_commit(len(rows))
        return None

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

    def _prune_all(self) -> int:
        """Retention in chunks, one transaction each, on the maintenance connection (in a worker thread)."""
        assert self._maintenance_conn is not None
        pruned = 0
        try:
            with self._maintenance_lock:
                while (n := self._prune_chunk(self._maintenance_conn)) > 0:
                    pruned += n
        except sqlite3.Error as exc:
            raise AuditError(f"Could not prune the audit ledger at {self._path}: {exc}.") from exc
        return pruned

    def _maintain(self) -> None:
        """The maintenance thread: a PASSIVE checkpoint every ``CHECKPOINT_INTERVAL_S`` (or ``CHECKPOINT_COMMITS``
        commits) when rows were written, and retention every ``prune_interval_s``; then close its connection."""
        conn = self._maintenance_conn
        assert conn is not None
        next_prune = time.monotonic() + self._prune_interval_s
        try:
            while not self._maintenance_stop:
                now = time.monotonic()
                timeout = CHECKPOINT_INTERVAL_S
                if self._retention_s is not None:
                    timeout = min(timeout, max(0.0, next_prune - now))
                self._maintenance_wake.wait(timeout)
                self._maintenance_wake.clear()
                if self._maintenance_stop:
                    break
                commits = self._commits
                try:
                    with self._maintenance_lock:
                        if self._synchronous == "NORMAL" and commits != self._checkpointed_commits:
                            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                            self._checkpointed_commits = commits
                        if self._retention_s is not None and time.monotonic() >= next_prune:
                            # A full chunk means more is due: after the rows that committed meanwhile.
                            full = self._prune_chunk(conn) == PRUNE_CHUNK
                            next_prune = time.monotonic() + (0.0 if full else self._prune_interval_s)
                except sqlite3.Error as exc:
                    _log.warning("audit.maintenance_failed", path=str(self._path), error=str(exc))
                    next_prune = max(next_prune, time.monotonic() + min(self._prune_interval_s, 1.0))
        finally:
            with self._maintenance_lock:
                conn.close()


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


class TailFilters(TypedDict, total=False):
    """What ``tail`` matches rows on (each exact; None or absent matches all), in either engine."""

    tool: str | None
    status: str | None
    client: str | None
    kind: str | None


class Filters(TailFilters, total=False):
    """What ``query`` and ``stats`` match rows on: ``TailFilters`` and ``since <= ts < until``."""

    since: float | None
    until: float | None


def _where(**filters: Unpack[Filters]) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (SQL both engines accept, ``?`` placeholders) and parameters of ``filters``."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, key in (("tool", "tool"), ("status", "status"), ("client_name", "client"), ("kind", "kind")):
        value = filters.get(key)
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    since, until = filters.get("since"), filters.get("until")
    if since is not None:
        clauses.append("ts >= ?")
        params.append(since)
    if until is not None:
        clauses.append("ts < ?")
        params.append(until)
    return (" AND ".join(clauses) or "1 = 1"), params


def _query_sql(limit: int | None, **filters: Unpack[Filters]) -> tuple[str, list[Any]]:
    """``query``'s statement (both engines'; ``?`` placeholders): the newest ``limit`` matching rows, newest first."""
    where, params = _where(**filters)
    sql = f"SELECT {_COLUMNS} FROM calls WHERE {where} ORDER BY ts DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return sql, params


def _stats_sql(**filters: Unpack[Filters]) -> tuple[str, list[Any]]:
    """``stats``' statement (both engines'; ``?`` placeholders): the rows ``_tool_stats`` takes."""
    where, params = _where(**filters)
    return f"SELECT tool, status, duration_ms, result_bytes, kind FROM calls WHERE {where}", params


def query(
    path: str | os.PathLike[str],
    *,
    tool: str | None = None,
    status: str | None = None,
    client: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = 100,
    kind: str | None = None,
) -> list[AuditRecord]:
    """The most recent ``limit`` rows matching every given filter, oldest first.

    Args:
        path: the ledger file.
        tool, status, client, kind: exact matches on the tool name (or prompt, or URI), the status, the client's
            name and the row's kind (``KINDS``).
        since, until: unix times; ``since <= ts < until``.
        limit: the most rows to return (the newest ones), or None for all.

    Raises:
        AuditError: the file is missing, is not a ledger, or has another schema version.
    """
    sql, params = _query_sql(limit, tool=tool, status=status, client=client, since=since, until=until, kind=kind)
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
    kind: str | None = None,
) -> Generator[AuditRecord]:
    """Yield the ``last`` matching rows, then (with ``follow``) every new matching row as it is committed.

    New rows are found by polling for ids above the highest seen every ``poll_interval`` seconds (ids are never
    reused, so pruning cannot hide a row). The generator runs until closed; ``sleep`` is the wait between polls.

    Raises:
        AuditError: as ``query``.
    """
    where, params = _where(tool=tool, status=status, client=client, kind=kind)
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
    kind: str | None = None,
) -> list[ToolStats]:
    """Per-tool figures for the rows in ``since <= ts < until``, sorted by tool name (a prompt's or a resource's
    figures, by kind, after the tools of that name). Latencies cover every status.

    Percentiles are computed here, so every row in range is read (three columns of it): bound a large ledger with
    ``since``.

    Raises:
        AuditError: as ``query``.
    """
    sql, params = _stats_sql(tool=tool, status=status, client=client, since=since, until=until, kind=kind)
    conn = _connect_readonly(path)
    try:
        rows = conn.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        raise AuditError(f"Cannot read the audit ledger at {path}: {exc}.") from exc
    finally:
        conn.close()
    return _tool_stats(rows)


def _tool_stats(rows: Sequence[Sequence[Any]]) -> list[ToolStats]:
    """Per-tool figures from ``(tool, status, duration_ms, result_bytes, kind)`` rows (both engines' ``stats``)."""
    durations: dict[tuple[str, bool, str], list[float]] = {}  # (tool, not a tool call, kind): tools sort first
    sizes: dict[tuple[str, bool, str], list[float]] = {}
    statuses: dict[tuple[str, bool, str], dict[str, int]] = {}
    for name, row_status, duration, size, row_kind in rows:
        key = (name, row_kind != "tools/call", row_kind)
        durations.setdefault(key, []).append(duration)
        sizes.setdefault(key, []).append(float(size or 0))
        counts = statuses.setdefault(key, {})
        counts[row_status] = counts.get(row_status, 0) + 1
    result: list[ToolStats] = []
    for key in sorted(durations):
        name = key[0]
        ordered = sorted(durations[key])
        counts = statuses[key]
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
                p50_result_bytes=_nearest_rank(sorted(sizes[key]), 50),
                kind=key[2],
            )
        )
    return result
