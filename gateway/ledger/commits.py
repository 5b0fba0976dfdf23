"""Group commit, the write discipline both engines share.

``await record(row)`` returns only once a transaction holding the row has committed. The caller that opens a batch
(its leader) yields once to the event loop, so every caller that is ready joins it, then commits the batch (at most
``MAX_BATCH`` rows) in one transaction and wakes the others. At most ``max_pending`` rows wait for their commit; a
further ``record()`` waits for room, and no row is ever dropped. ``record()`` is shielded from cancellation, the
leader's commit included: the row of a cancelled call is itself a row the ledger must keep. Closing stops admitting
rows and waits for every pending one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Self

import anyio
import anyio.lowlevel

from gateway.errors import AuditError
from gateway.ledger.records import AuditRecord, encode_row

DEFAULT_MAX_PENDING: Final = 1024  # rows accepted but not yet committed; beyond this record() waits
MAX_BATCH: Final = 512  # rows per transaction: bounds how long one commit holds the write lock
PRUNE_INTERVAL_S: Final = 3600.0  # retention runs this often
PRUNE_CHUNK: Final = 5000  # rows deleted per transaction, so a large prune does not stall queued rows


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


@dataclass(slots=True, eq=False)
class _Batch:
    """Rows that share one transaction; its first caller (the leader) commits it, the others wait for ``done``."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None


class GroupCommit(anyio.AsyncContextManagerMixin):
    """The write side's common part, single-use: ``async with`` opens it and closing waits for every pending row.
    An engine sets ``_slots``, ``_writing`` and ``_drained`` before rows arrive (``_slots`` stays None for a disabled
    ledger) and supplies ``_engine`` (its resources, open for the block; closed after the last pending row) and
    ``_commit_batch`` (write the rows in one transaction under ``_writing``; return None or the error every caller
    of the batch gets).

    Raises:
        ValueError: a retention, a bound or an interval that is not positive.
    """

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

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        if self._state != "new":
            raise RuntimeError(f"A {type(self).__name__} cannot be reopened once closed; create a new one.")
        try:
            async with self._engine():
                self._state = "open"
                try:
                    yield self
                finally:
                    await self._drain()
        finally:
            self._state = "closed"

    def _engine(self) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

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
        row = encode_row(rec)
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
