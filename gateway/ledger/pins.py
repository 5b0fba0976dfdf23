"""The pins table beside the ledger's calls (gateway/core/pins.py says what a pin is): read by the gateway when it
starts and every few seconds after, written by ``gateway pins approve``. In the ledger the gateway writes:
``gateway.audit.url`` (PostgreSQL, so every replica serves the same approvals) else ``gateway.audit.path`` (SQLite).
The table is one of the shared migrations (``records.MIGRATIONS``).
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gateway.errors import AuditError
from gateway.ledger.records import COLUMN_NAMES, COLUMNS, AuditRecord, encode_row
from gateway.ledger.sqlite import create_private, migrate
from gateway.ledger.urls import is_url, redact_url

__all__ = ["PinRow", "pin_record", "read_pins", "write_pins"]

PinRow = tuple[str, str, str, str, str | None, float]
"""(server, tool, digest, definition as JSON, approved by, approved at: unix time)."""


_COLUMNS = "server, tool, digest, definition, approved_by, approved_at"
_UPSERT = (
    f"INSERT INTO pins ({_COLUMNS}) VALUES ({{marks}}) ON CONFLICT (server, tool) DO UPDATE SET "
    "digest = excluded.digest, definition = excluded.definition, approved_by = excluded.approved_by, "
    "approved_at = excluded.approved_at"
)


def pin_record(
    kind: str, server: str, tool: str, digest: str, *, ts: float, caller: str | None, status: str, **preview: str
) -> AuditRecord:
    """A ledger row about a pin (``pins/pending`` or ``pins/approve``, records.KINDS): ``tool`` is ``server/tool``,
    the definition's digest its ``args_hash`` and ``preview``; no definition text."""
    return AuditRecord(
        ts=ts,
        correlation_id=secrets.token_hex(8),
        session_id=None,
        client_name=None,
        client_version=None,
        caller=caller,
        tool=f"{server}/{tool}",
        chain=(),
        status=status,
        duration_ms=0.0,
        result_bytes=0,
        arg_preview={"digest": digest[:16], **preview},
        args_hash=digest[:16],
        kind=kind,
    )


def _approvals(rows: Sequence[PinRow]) -> list[tuple[Any, ...]]:
    return [
        encode_row(pin_record("pins/approve", server, tool, digest, ts=at, caller=by, status="ok"))
        for server, tool, digest, _, by, at in rows
    ]


def read_pins(path: str | Path) -> list[PinRow]:
    """Every pin in the ledger at ``path`` (a SQLite file or a PostgreSQL URL); none when the ledger or its table
    does not exist yet.

    Raises:
        AuditError: a PostgreSQL ledger cannot be read (the reason, never the password).
    """
    if is_url(str(path)):
        return _pg_read(str(path))
    file = Path(path)
    if not file.exists():
        return []
    with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as conn:
        try:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM pins ORDER BY server, tool").fetchall()
        except sqlite3.OperationalError:  # a ledger older than the pins table: nothing approved yet
            return []
    return _rows(rows)


def _rows(rows: Iterable[Sequence[Any]]) -> list[PinRow]:
    return [(str(a), str(b), str(c), str(d), e, float(f)) for a, b, c, d, e, f in rows]


def write_pins(path: str | Path, rows: Iterable[PinRow]) -> int:
    """Record ``rows`` (replacing the pins of the same server and tool) in the ledger at ``path`` (a SQLite file or
    a PostgreSQL URL), created and migrated if need be, each with its ``pins/approve`` row among the calls, in one
    transaction; returns how many. Called outside any event loop.

    Raises:
        AuditError: a PostgreSQL ledger cannot be written (the reason, never the password).
    """
    if is_url(str(path)):
        return _pg_write(str(path), list(rows))
    file = Path(path)
    create_private(file)
    conn = sqlite3.connect(file, isolation_level=None)
    try:
        migrate(conn, file)
        rows = list(rows)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_UPSERT.format(marks=", ".join("?" * 6)), rows)
        conn.executemany(
            f"INSERT INTO calls ({COLUMNS}) VALUES ({', '.join('?' * len(COLUMN_NAMES))})", _approvals(rows)
        )
        conn.execute("COMMIT")
        return len(rows)
    finally:
        conn.close()


def _pg_read(url: str) -> list[PinRow]:
    import psycopg
    import psycopg.errors

    from gateway.ledger.pgsql import conninfo, describe

    try:
        with psycopg.connect(conninfo(url), autocommit=True) as conn:
            return _rows(conn.execute(f"SELECT {_COLUMNS} FROM pins ORDER BY server, tool").fetchall())
    except psycopg.errors.UndefinedTable:  # a ledger no gateway of this version has migrated yet
        return []
    except psycopg.Error as exc:
        raise AuditError(f"Cannot read the pins in the ledger at {redact_url(url)}: {describe(exc, url)}.") from None


def _pg_write(url: str, rows: list[PinRow]) -> int:
    import anyio
    import psycopg

    from gateway.ledger.pgsql import conninfo, describe, insert, migrate

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True) as conn:
            await migrate(conn, url)
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(_UPSERT.format(marks=", ".join(["%s"] * 6)), rows)
                if rows:
                    await insert(conn, _approvals(rows))

    try:
        anyio.run(write)
    except psycopg.Error as exc:
        raise AuditError(f"Cannot write the pins to the ledger at {redact_url(url)}: {describe(exc, url)}.") from None
    return len(rows)
