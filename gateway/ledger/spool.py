"""The PostgreSQL ledger's local spool: a SQLite ledger file used as a queue while PostgreSQL is unreachable.

Rows are appended in batches and read back, oldest first, by id; a row appended has committed (WAL, synchronous
NORMAL: the SQLite ledger's durability), and a row is dropped only after its copy committed in PostgreSQL. The file
has the SQLite ledger's schema, so ``gateway audit`` reads it and a spool left at shutdown waits for the next start.
One connection, used on the event loop only: every operation is one short transaction without an fsync.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.errors import AuditError
from gateway.ledger.records import COLUMNS
from gateway.ledger.sqlite import BUSY_TIMEOUT_S, INSERT, create_private, migrate


class Spool:
    """The spool file at ``path``, created (mode 0600) and migrated if need be; ``count`` is how many rows wait.

    Raises:
        AuditError: the file cannot be created, opened or migrated.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            create_private(path)
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            migrate(self._conn, path)
            self.count: int = self._conn.execute("SELECT count(*) FROM calls").fetchone()[0]
        except (OSError, sqlite3.Error) as exc:
            raise AuditError(f"Cannot open the audit spool at {path}: {exc}.") from exc

    def append(self, rows: Sequence[Sequence[Any]]) -> None:
        """Commit ``rows`` at the end of the queue.

        Raises:
            sqlite3.Error: nothing was written.
        """
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(INSERT, rows)
            conn.execute("COMMIT")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.count += len(rows)

    def head(self, limit: int) -> tuple[int, list[tuple[Any, ...]]]:
        """The oldest ``limit`` rows and the id of the last of them (0 when the spool is empty)."""
        found = self._conn.execute(f"SELECT id, {COLUMNS} FROM calls ORDER BY id LIMIT ?", (limit,)).fetchall()
        return (found[-1][0] if found else 0), [tuple(row[1:]) for row in found]

    def drop(self, upto: int) -> None:
        """Delete the rows up to id ``upto``: their copies have committed elsewhere."""
        self.count -= self._conn.execute("DELETE FROM calls WHERE id <= ?", (upto,)).rowcount

    def close(self) -> None:
        self._conn.close()
