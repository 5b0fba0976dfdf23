"""The audit ledger in a SQLite file, the default engine.

Promise: ``await Ledger.record(row)`` returns only once the transaction holding the row has committed (group commit,
``commits.py``), and the router awaits it before it answers. In WAL mode with ``synchronous="NORMAL"`` (the default)
a committed row survives the gateway being killed; only a power loss or a kernel crash before the WAL reaches the
disk (the OS's flush, typically within 30 s, or the next checkpoint, at most ``CHECKPOINT_INTERVAL_S`` later while
rows arrive) can lose it. ``"FULL"`` fsyncs every commit and survives those too. A NORMAL commit runs on the event
loop and never waits there for another connection's lock; checkpoints and retention run in a maintenance thread.
``PRAGMA user_version`` is the schema version, migrated on open. ``SqliteReader`` reads the file read-only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import anyio.to_thread
import structlog

from gateway.errors import AuditError
from gateway.ledger.commits import DEFAULT_MAX_PENDING, PRUNE_CHUNK, PRUNE_INTERVAL_S, GroupCommit, LedgerStatistics
from gateway.ledger.readers import LedgerReader, Rows, Run
from gateway.ledger.records import COLUMN_NAMES, COLUMNS, MIGRATIONS

_log = structlog.get_logger(__name__)

CHECKPOINT_INTERVAL_S: Final = 1.0  # the maintenance thread checkpoints the WAL this often while rows arrive
CHECKPOINT_COMMITS: Final = 1000  # ... or after this many commits, whichever comes first
BUSY_TIMEOUT_S: Final = 5.0  # another process (a second gateway, a manual VACUUM) may hold the write lock briefly

INSERT: Final = f"INSERT INTO calls ({COLUMNS}) VALUES ({', '.join(['?'] * len(COLUMN_NAMES))})"


def create_private(path: Path) -> None:
    """Create ``path`` empty, readable by its owner only (previews may be sensitive), unless it exists."""
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def migrate(conn: sqlite3.Connection, path: Path) -> None:
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


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class _Busy(Exception):
    """Another connection holds the write lock: commit in a worker thread, where waiting for it blocks no one."""


class Ledger(GroupCommit):
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
    def disabled(self) -> bool:
        return self._path is None

    @property
    def target(self) -> Path | None:
        """What ``SqliteReader`` reads: the file."""
        return self._path

    def statistics(self) -> LedgerStatistics:
        return self._statistics()

    @asynccontextmanager
    async def _engine(self) -> AsyncGenerator[None]:
        if self._path is None:
            yield
            return
        self._slots = anyio.Semaphore(self._max_pending, fast_acquire=True)
        self._writing = anyio.Lock(fast_acquire=True)
        self._drained = anyio.Event()
        conn, self._maintenance_conn = await anyio.to_thread.run_sync(self._open, self._path)
        self._conn = conn
        maintenance = threading.Thread(target=self._maintain, name=f"audit-ledger:{self._path.name}", daemon=True)
        maintenance.start()
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                self._maintenance_stop = True
                self._maintenance_wake.set()
                await anyio.to_thread.run_sync(maintenance.join)
                # Closing the last connection checkpoints the WAL (an fsync): off the event loop too.
                await anyio.to_thread.run_sync(conn.close)

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
            create_private(path)
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
            migrate(conn, path)
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
            conn.executemany(INSERT, rows)
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


def connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to the ledger file at ``path``, which never blocks its writer.

    Raises:
        AuditError: the file is missing, is not a ledger, or has another schema version than this gateway's.
    """
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


class SqliteReader(LedgerReader):
    """The read side of the ledger file at ``path``, opened read-only for each call."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = path

    @contextmanager
    def _reading(self) -> Iterator[Run]:
        conn = connect_readonly(self._path)

        def run(sql: str, params: Sequence[Any]) -> Rows:
            return conn.execute(sql, params).fetchall()

        try:
            yield run
        except sqlite3.Error as exc:
            raise AuditError(f"Cannot read the audit ledger at {self._path}: {exc}.") from exc
        finally:
            conn.close()
