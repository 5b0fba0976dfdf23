"""The audit ledger in PostgreSQL, with a local SQLite spool for when PostgreSQL is unreachable.

Promise, as the SQLite ledger's: ``await PgLedger.record(row)`` returns only once a transaction holding the row has
committed, in PostgreSQL or, while PostgreSQL fails or is slower than ``write_timeout_s``, in the spool
(``spool.py``). While spooling, every batch goes straight to the spool and a task probes PostgreSQL with a growing
backoff; when it answers, the spool is replayed into it in order and writing switches back once the spool is empty,
so rows reach PostgreSQL in the order they committed. Row keys (``pgsql.row_key``) make a replayed row that had
landed a no-op. A spool left at shutdown is replayed by the next start.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread
import psycopg
import psycopg_pool
import structlog

from gateway.errors import AuditError
from gateway.ledger.commits import (
    DEFAULT_MAX_PENDING,
    MAX_BATCH,
    PRUNE_CHUNK,
    PRUNE_INTERVAL_S,
    GroupCommit,
    LedgerStatistics,
)
from gateway.ledger.pgsql import CONNECT_TIMEOUT_S, FAILURES, conninfo, describe, insert, migrate
from gateway.ledger.spool import Spool
from gateway.ledger.urls import redact_url

_log = structlog.get_logger(__name__)
# The pool logs a warning per failed reconnection attempt (several a second while PostgreSQL is down); the ledger's
# own audit.spooling line, /status and /metrics say it once, with the reason.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

WRITE_TIMEOUT_S: Final = 2.0  # a PostgreSQL commit slower than this is committed to the spool instead
REPLAY_TIMEOUT_S: Final = 30.0  # one replay pass (connect, migrate, a chunk): a hung server is abandoned and retried
PROBE_MIN_S: Final = 0.1  # the replay task's first wait after PostgreSQL failed; doubles up to PROBE_MAX_S
PROBE_MAX_S: Final = 2.0
CLOSE_REPLAY_S: Final = 5.0  # at shutdown, how long the spool may still be replayed; what is left waits for next start
POOL_SIZE: Final = 3  # the writer, the replay task, and a timed-out write still being cancelled


class PgLedger(GroupCommit):
    """The write side of a PostgreSQL ledger; see the module docstring. Single-use, like ``sqlite.Ledger``.

    Args:
        url: a libpq URL (``postgresql://user:password@host:port/db``; or leave the password to ``PGPASSWORD`` or
            ``~/.pgpass``, which libpq reads itself).
        spool_path: the local SQLite file rows wait in while PostgreSQL is unreachable.
        retention_days: rows older than this are deleted every ``prune_interval_s``; None keeps all.
        max_pending: how many rows may await their commit before ``record()`` makes callers wait.
        write_timeout_s: a PostgreSQL commit that takes longer is committed to the spool instead.
    """

    def __init__(
        self,
        url: str,
        *,
        spool_path: str | os.PathLike[str],
        retention_days: float | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        prune_interval_s: float = PRUNE_INTERVAL_S,
    ) -> None:
        super().__init__(retention_days=retention_days, max_pending=max_pending, prune_interval_s=prune_interval_s)
        self._url = url
        self._conninfo = conninfo(url)
        self._spool_path = Path(spool_path)
        self._write_timeout_s = write_timeout_s
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._spool: Spool | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._slots: anyio.Semaphore = anyio.Semaphore(max_pending, fast_acquire=True)
        # Held while a batch commits, and while replay switches back.
        self._writing: anyio.Lock = anyio.Lock(fast_acquire=True)
        self._drained: anyio.Event = anyio.Event()
        self._wake = anyio.Event()  # the replay task has work
        self._replaying = anyio.Lock()  # one replay at a time (the task's, or the last one at close)
        self._spooling = False
        self._migrated = False
        self._problem: str | None = None
        self._rows_replayed = 0

    @property
    def disabled(self) -> bool:
        return False

    @property
    def target(self) -> str:
        return self._url

    def statistics(self) -> LedgerStatistics:
        return self._statistics(
            engine="postgresql",
            spooling=self._spooling,
            spooled_rows=0 if self._spool is None else self._spool.count,
            problem=self._problem,
        )

    @asynccontextmanager
    async def _engine(self) -> AsyncGenerator[None]:
        spool = self._spool = await anyio.to_thread.run_sync(Spool, self._spool_path)
        pool = self._pool = psycopg_pool.AsyncConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            timeout=self._write_timeout_s,
            reconnect_timeout=PROBE_MAX_S,  # give up soon: the replay task's next request starts a fresh attempt
            kwargs={"autocommit": True},  # each insert is one statement: its own transaction, one round trip
            name="audit-ledger",
        )
        try:
            await pool.open(wait=False)
            try:
                with anyio.fail_after(CONNECT_TIMEOUT_S):
                    async with pool.connection() as conn:
                        await migrate(conn, self._url)
                self._migrated = True
            except FAILURES as exc:
                self._enter_spooling(exc, "at start")
            if spool.count:
                self._spooling = True  # older rows first: replay them before writing to PostgreSQL
                self._wake.set()
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._replay_loop, name="audit-ledger:replay")
                if self._retention_s is not None:
                    tg.start_soon(self._prune_loop, name="audit-ledger:prune")
                try:
                    yield
                finally:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_REPLAY_S):
                        if spool.count and not self._problem:
                            try:
                                await self._replay_once()
                            except (*FAILURES, AuditError) as exc:  # what is left waits for the next start
                                self._problem = describe(exc, self._url)
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await pool.close(timeout=1.0)
                spool.close()
            if spool.count:
                _log.warning(
                    "audit.spool_left",
                    spool=str(self._spool_path),
                    rows=spool.count,
                    message="rows wait in the spool; the next start replays them into PostgreSQL",
                )

    async def _commit_batch(self, rows: list[tuple[Any, ...]]) -> str | None:
        """Commit ``rows`` to PostgreSQL or, when spooling or when that fails or is slow, to the spool."""
        if not self._spooling and self._migrated:
            outcome: list[BaseException | None] = []
            done = anyio.Event()
            scope = anyio.CancelScope()
            assert self._tg is not None
            self._tg.start_soon(self._attempt, rows, scope, outcome, done)
            with anyio.move_on_after(self._write_timeout_s):
                await done.wait()
            if outcome and outcome[0] is None:
                self._count_commit(len(rows))
                return None
            # Failed, or still running: the attempt is abandoned (its cancellation finishes in the background; if
            # it committed after all, the row keys make the replay of these rows a no-op).
            scope.cancel()
            self._enter_spooling(outcome[0] if outcome else TimeoutError(), "while writing")
        elif not self._spooling:
            self._enter_spooling(None, "before the schema was ready")
        assert self._spool is not None
        try:
            self._spool.append(rows)
        except sqlite3.Error as exc:
            return f"Could not write {len(rows)} row(s) to the audit spool at {self._spool_path}: {exc}."
        self._count_commit(len(rows))
        self._wake.set()
        return None

    async def _attempt(
        self,
        rows: list[tuple[Any, ...]],
        scope: anyio.CancelScope,
        outcome: list[BaseException | None],
        done: anyio.Event,
    ) -> None:
        assert self._pool is not None
        try:
            with scope:
                async with self._pool.connection() as conn:
                    await insert(conn, rows)
                outcome.append(None)
        except FAILURES as exc:
            outcome.append(exc)
        finally:
            done.set()

    def _enter_spooling(self, exc: BaseException | None, when: str) -> None:
        why = "the schema is not migrated yet" if exc is None else describe(exc, self._url)
        self._problem = why
        if not self._spooling:
            self._spooling = True
            _log.warning(
                "audit.spooling",
                url=redact_url(self._url),
                spool=str(self._spool_path),
                reason=why,
                when=when,
                message="PostgreSQL is unreachable: rows are committed to the spool and replayed when it returns",
            )
        self._wake.set()

    # --- replay -------------------------------------------------------------------------------------------------

    async def _replay_loop(self) -> None:
        delay = PROBE_MIN_S
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._spooling:
                try:
                    with anyio.fail_after(REPLAY_TIMEOUT_S):
                        await self._replay_once()
                    delay = PROBE_MIN_S
                except (*FAILURES, AuditError) as exc:  # AuditError: a newer gateway migrated the database meanwhile
                    self._problem = describe(exc, self._url)
                    await anyio.sleep(delay)
                    delay = min(delay * 2, PROBE_MAX_S)

    async def _replay_once(self) -> None:
        """Copy the spool into PostgreSQL chunk by chunk; once it is empty, switch back to writing PostgreSQL."""
        assert self._pool is not None and self._spool is not None
        spool = self._spool
        async with self._replaying, self._pool.connection() as conn:
            if not self._migrated:
                await migrate(conn, self._url)
                self._migrated = True
            while True:
                upto, rows = spool.head(MAX_BATCH)
                if rows:
                    await insert(conn, rows)
                    spool.drop(upto)  # after the commit; a crash in between replays them again: no-op
                    self._rows_replayed += len(rows)
                    continue
                await self._pool.check()  # connections from before the outage are dropped, not handed to a caller
                async with self._writing:  # no batch is being spooled now: if the spool is still empty, switch
                    if spool.count == 0 and self._spooling:
                        self._spooling = False
                        self._problem = None
                        _log.info(
                            "audit.spool_replayed",
                            url=redact_url(self._url),
                            rows=self._rows_replayed,
                            message="PostgreSQL is back: the spool is replayed and rows go to PostgreSQL again",
                        )
                        return
                if not self._spooling:
                    return

    async def _prune_loop(self) -> None:
        assert self._pool is not None and self._retention_s is not None
        while True:
            try:
                with anyio.fail_after(REPLAY_TIMEOUT_S):
                    async with self._pool.connection() as conn:
                        while True:
                            cur = await conn.execute(
                                "DELETE FROM calls WHERE id IN"
                                " (SELECT id FROM calls WHERE ts < %s ORDER BY ts LIMIT %s)",
                                (time.time() - self._retention_s, PRUNE_CHUNK),
                            )
                            self._rows_pruned += max(cur.rowcount, 0)
                            if cur.rowcount < PRUNE_CHUNK:
                                break
            except FAILURES as exc:
                _log.warning("audit.maintenance_failed", url=redact_url(self._url), error=describe(exc, self._url))
            await anyio.sleep(self._prune_interval_s)
