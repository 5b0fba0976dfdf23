"""The pins table beside the ledger's calls (gateway/core/pins.py says what a pin is): read when the gateway
starts, written by ``gateway pins approve``. SQLite (``gateway.audit.path``) in this step; the table is created in
PostgreSQL too (``records.MIGRATIONS``), where the next step reads it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from gateway.ledger.sqlite import create_private, migrate

__all__ = ["PinRow", "read_pins", "write_pins"]

PinRow = tuple[str, str, str, str, str | None, float]
"""(server, tool, digest, definition as JSON, approved by, approved at: unix time)."""


def read_pins(path: str | Path) -> list[PinRow]:
    """Every pin in the ledger at ``path``; none when the file or its table does not exist yet."""
    file = Path(path)
    if not file.exists():
        return []
    with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as conn:
        try:
            rows = conn.execute(
                "SELECT server, tool, digest, definition, approved_by, approved_at FROM pins ORDER BY server, tool"
            ).fetchall()
        except sqlite3.OperationalError:  # a ledger older than the pins table: nothing approved yet
            return []
    return [(str(a), str(b), str(c), str(d), e, float(f)) for a, b, c, d, e, f in rows]


def write_pins(path: str | Path, rows: Iterable[PinRow]) -> int:
    """Record ``rows`` (replacing the pins of the same server and tool) in the ledger at ``path``, created and
    migrated if need be; returns how many."""
    file = Path(path)
    create_private(file)
    conn = sqlite3.connect(file, isolation_level=None)
    try:
        migrate(conn, file)
        rows = list(rows)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO pins (server, tool, digest, definition, approved_by, approved_at) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (server, tool) DO UPDATE SET digest = excluded.digest, definition = excluded.definition, "
            "approved_by = excluded.approved_by, approved_at = excluded.approved_at",
            rows,
        )
        conn.execute("COMMIT")
        return len(rows)
    finally:
        conn.close()
