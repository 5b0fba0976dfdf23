"""Where the sealed rows of callers' downstream tokens (auth/connections.py) are kept, behind one small face
(``TokenRows``): the ledger's SQLite file (or memory), or its PostgreSQL database when ``gateway.audit.url`` is set,
so every replica reads the rows any of them wrote. The rows are opaque here: sealed bytes, never opened.

Table ``downstream_tokens``, one row per (server, caller), created by the store itself when it first connects
(``CREATE TABLE IF NOT EXISTS``: replicas starting together create it once). Every method blocks: call it in a worker
thread.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from gateway.errors import AuditError
from gateway.ledger.urls import is_url, redact_url

__all__ = ["EXCLUSIVE_WAIT_S", "TokenRow", "TokenRows", "open_token_rows"]

TokenRow = tuple[str, str, bytes, float | None, float, float]
"""(server, caller, sealed document, expires at, connected at, updated at: unix times)."""

_T = TypeVar("_T")
EXCLUSIVE_WAIT_S = 30.0
"""The longest a replica waits for another that holds a token row (refreshing it) before it gives up."""
_COLUMNS = "backend, caller, sealed, expires_at, connected_at, updated_at"
_TABLE = """
CREATE TABLE IF NOT EXISTS downstream_tokens (
    backend TEXT NOT NULL,
    caller TEXT NOT NULL,
    sealed {blob} NOT NULL,
    expires_at {real},
    connected_at {real} NOT NULL,
    updated_at {real} NOT NULL,
    PRIMARY KEY (backend, caller)
)
"""
_STAMPS = "SELECT backend, caller, updated_at FROM downstream_tokens"
_UPSERT = (
    f"INSERT INTO downstream_tokens ({_COLUMNS}) VALUES ({{marks}}) ON CONFLICT (backend, caller) DO UPDATE SET "
    "sealed = excluded.sealed, expires_at = excluded.expires_at, updated_at = excluded.updated_at"
)


class TokenRows(Protocol):
    """The rows' store: blocking calls, each its own transaction."""

    shared: bool
    """Other processes may write these rows (a file or a database, not memory): worth watching."""

    def read(self, backend: str | None = None, caller: str | None = None) -> list[TokenRow]:
        """The rows of ``backend`` and ``caller`` (each None: any), by server then caller."""
        ...

    def stamps(self) -> list[tuple[str, str, float]]:
        """(server, caller, updated at) of every row: what a watch compares, without the sealed documents."""
        ...

    def write(self, row: TokenRow) -> None:
        """Insert or replace the row of its (server, caller); ``connected_at`` of an existing row is kept."""
        ...

    def delete(self, backend: str | None, caller: str) -> list[str]:
        """Remove ``caller``'s rows (at ``backend``, or at every server); the servers they were at."""
        ...

    def exclusive(self, backend: str, caller: str) -> Callable[[], None]:
        """Hold the row of (``backend``, ``caller``) against every other process that asks to hold it (a replica
        refreshing the same token), waiting for one that holds it; the function returned lets go. Reads and writes
        of the row are not blocked by it."""
        ...

    def close(self) -> None: ...


def _where(backend: str | None, caller: str | None, mark: str) -> tuple[str, list[Any]]:
    clauses, args = [], []
    for column, value in (("backend", backend), ("caller", caller)):
        if value is not None:
            clauses.append(f"{column} = {mark}")
            args.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def _rows(found: Sequence[Sequence[Any]]) -> list[TokenRow]:
    return [(str(b), str(c), bytes(s), e, float(con), float(u)) for b, c, s, e, con, u in found]


class SqliteTokenRows:
    """The rows in the ledger's SQLite file, or in memory (``path`` None)."""

    def __init__(self, path: str | None) -> None:
        self.shared = path is not None
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, timeout=10.0, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute(_TABLE.format(blob="BLOB", real="REAL"))

    def read(self, backend: str | None = None, caller: str | None = None) -> list[TokenRow]:
        where, args = _where(backend, caller, "?")
        with self._lock:
            found = self._db.execute(f"SELECT {_COLUMNS} FROM downstream_tokens{where} ORDER BY 1, 2", args)
            return _rows(found.fetchall())

    def stamps(self) -> list[tuple[str, str, float]]:
        with self._lock:
            found = self._db.execute(_STAMPS).fetchall()
        return [(str(b), str(c), float(u)) for b, c, u in found]

    def write(self, row: TokenRow) -> None:
        with self._lock:
            self._db.execute(_UPSERT.format(marks=", ".join("?" * 6)), row)

    def delete(self, backend: str | None, caller: str) -> list[str]:
        where, args = _where(backend, caller, "?")
        with self._lock:
            gone = self._db.execute(f"SELECT backend FROM downstream_tokens{where}", args).fetchall()
            self._db.execute(f"DELETE FROM downstream_tokens{where}", args)
        return sorted(str(row[0]) for row in gone)

    def exclusive(self, backend: str, caller: str) -> Callable[[], None]:
        return lambda: None  # one process uses a SQLite file at a time (replicas share PostgreSQL)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PgTokenRows:
    """The rows in the ledger's PostgreSQL database: one connection, opened at first use and again after a failure.

    Raises (every method):
        AuditError: PostgreSQL cannot be reached or refuses (the reason, never the password).
    """

    shared = True

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._conn: Any = None

    def _run(self, work: Callable[[Any], _T]) -> _T:
        import psycopg

        from gateway.ledger.pgsql import conninfo, describe

        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(conninfo(self._url), autocommit=True)
                    self._conn.execute(_TABLE.format(blob="BYTEA", real="DOUBLE PRECISION"))
                with self._conn.transaction():
                    return work(self._conn)
            except psycopg.Error as exc:
                if self._conn is not None and self._conn.broken:
                    self._conn = None
                where = redact_url(self._url)
                raise AuditError(
                    f"Cannot reach the tokens in the ledger at {where}: {describe(exc, self._url)}."
                ) from None

    def read(self, backend: str | None = None, caller: str | None = None) -> list[TokenRow]:
        where, args = _where(backend, caller, "%s")
        query = f"SELECT {_COLUMNS} FROM downstream_tokens{where} ORDER BY 1, 2"
        return self._run(lambda conn: _rows(conn.execute(query, args).fetchall()))

    def stamps(self) -> list[tuple[str, str, float]]:
        return self._run(lambda conn: [(str(b), str(c), float(u)) for b, c, u in conn.execute(_STAMPS).fetchall()])

    def write(self, row: TokenRow) -> None:
        self._run(lambda conn: conn.execute(_UPSERT.format(marks=", ".join(["%s"] * 6)), row))

    def delete(self, backend: str | None, caller: str) -> list[str]:
        where, args = _where(backend, caller, "%s")
        query = f"DELETE FROM downstream_tokens{where} RETURNING backend"
        return self._run(lambda conn: sorted(str(row[0]) for row in conn.execute(query, args).fetchall()))

    def exclusive(self, backend: str, caller: str) -> Callable[[], None]:
        """A transaction-scoped advisory lock on its own connection (a row lock, ``SELECT ... FOR UPDATE``, would
        block this process's own write of the refreshed row, made on its main connection); a replica that dies
        holding it lets go as its connection closes. At most ``EXCLUSIVE_WAIT_S`` of waiting."""
        import psycopg

        from gateway.ledger.pgsql import conninfo, describe

        try:
            conn = psycopg.connect(conninfo(self._url))
            try:
                conn.execute(f"SET LOCAL lock_timeout = '{int(EXCLUSIVE_WAIT_S * 1000)}ms'")
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"{backend}\n{caller}"])
            except BaseException:
                conn.close()
                raise
        except psycopg.Error as exc:
            where = redact_url(self._url)
            raise AuditError(
                f"Cannot hold the token row in the ledger at {where}: {describe(exc, self._url)}."
            ) from None

        def release() -> None:
            conn.rollback()  # ends the transaction, and the lock with it
            conn.close()

        return release

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def open_token_rows(target: str | None) -> SqliteTokenRows | PgTokenRows:
    """The rows' store at ``target``: a ``postgresql://`` URL, a SQLite file, or memory (None)."""
    return PgTokenRows(target) if target is not None and is_url(target) else SqliteTokenRows(target)
