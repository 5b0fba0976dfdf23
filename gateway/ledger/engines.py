"""The ledger's engines behind one face: SQLite (the default, a file) or PostgreSQL (a ``postgresql://`` URL).

``open_ledger(settings)`` builds the write side the config asks for, ``open_reader(target)`` the read side of a
target (a file path or a URL). PostgreSQL's modules, and its driver, are imported only when a URL is used, so the
embedded default never loads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gateway.ledger.commits import LedgerStatistics
from gateway.ledger.readers import LedgerReader
from gateway.ledger.records import AuditRecord
from gateway.ledger.sqlite import Ledger, SqliteReader
from gateway.ledger.urls import is_url

if TYPE_CHECKING:
    from gateway.config import AuditSettings
    from gateway.ledger.postgres import PgLedger


class AuditLedger(Protocol):
    """What the gateway asks of a ledger's write side, whichever the engine."""

    @property
    def disabled(self) -> bool: ...

    @property
    def target(self) -> str | Path | None:
        """What ``open_reader`` reads this ledger from (a path, or a URL with its password: never show it)."""
        ...

    def statistics(self) -> LedgerStatistics: ...

    async def record(self, rec: AuditRecord) -> None: ...


def open_ledger(settings: AuditSettings) -> Ledger | PgLedger:
    """The write side ``settings`` ask for: PostgreSQL when ``url`` is set (spooling to ``spool_path``), else SQLite."""
    if settings.url is None:
        return Ledger(settings.path, retention_days=settings.retention_days)
    from gateway.ledger.postgres import PgLedger

    return PgLedger(
        settings.url,
        spool_path=settings.spool_path or f"{settings.path}.spool",
        retention_days=settings.retention_days,
    )


def open_reader(target: str | os.PathLike[str]) -> LedgerReader:
    """The read side of the ledger at ``target``: a SQLite file, or a ``postgresql://`` URL. Opens nothing yet: each
    read connects, and says then (``AuditError``) if the ledger is missing or unreadable."""
    if is_url(target):
        from gateway.ledger.pgsql import PgReader

        return PgReader(str(target))
    return SqliteReader(target)
