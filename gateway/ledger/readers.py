"""Reading a ledger back, whichever its engine: ``query``, ``stats`` and ``tail`` over one ``Filters`` value.

``LedgerReader`` runs the same SQL on either engine; an engine supplies only a read connection (``_reading``: its
dialect, and its errors as ``AuditError``) and how far back ``tail`` must look for rows that committed out of id
order. Each call opens its own connection and never blocks a writer. ``stats`` computes its percentiles here, so it
reads every row in range (five columns of it): bound a large ledger with ``since``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias

from gateway.ledger.records import COLUMNS, ERROR_STATUSES, REFUSED_STATUSES, AuditRecord, decode_row

Rows: TypeAlias = list[tuple[Any, ...]]
Run: TypeAlias = Callable[[str, Sequence[Any]], Rows]
"""Runs one read statement (``?`` placeholders) on an open connection and returns its rows."""


@dataclass(frozen=True, slots=True)
class Filters:
    """Which rows a reader returns: each field given must match exactly (None matches every row), and
    ``since <= ts < until``. ``client`` is the client's name; ``caller`` who called; ``kind`` one of ``KINDS``."""

    tool: str | None = None
    status: str | None = None
    client: str | None = None
    kind: str | None = None
    since: float | None = None
    until: float | None = None
    caller: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The ``WHERE`` clause (``?`` placeholders) and its parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("tool", self.tool),
            ("status", self.status),
            ("client_name", self.client),
            ("kind", self.kind),
            ("caller", self.caller),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.since is not None:
            clauses.append("ts >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("ts < ?")
            params.append(self.until)
        return (" AND ".join(clauses) or "1 = 1"), params


EVERY_ROW: Final = Filters()


@dataclass(frozen=True, slots=True)
class ToolStats:
    """Per-tool figures over a time range. ``calls`` counts every row, ``refused`` those refused before a tool
    answered (``REFUSED_STATUSES``: a policy, a limit, an unknown tool, arguments refused). Rates, latencies
    (nearest-rank, in ms) and the typical answer's size are over the other calls, the ones a tool answered or failed
    (``answered``); with none, the rates are 0 and the latencies None."""

    tool: str
    calls: int
    by_status: Mapping[str, int]
    error_rate: float  # share of the answered calls whose status is in ERROR_STATUSES
    degraded_rate: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p50_result_bytes: float = 0.0  # the typical answer's size (what a call costs a model's context)
    kind: str = "tools/call"  # one of KINDS: ``tool`` is then a prompt's name or a resource's URI
    refused: int = 0
    tokens_in: int = 0  # the arguments' tokens, summed over the rows that counted them
    tokens_out: int = 0  # the answers' tokens as delivered, summed likewise

    @property
    def answered(self) -> int:
        return self.calls - self.refused


@dataclass(frozen=True, slots=True)
class CallerTokens:
    """One caller's tool calls and tokens over a time range (``caller`` None: nobody in particular)."""

    caller: str | None
    calls: int
    tokens_in: int
    tokens_out: int
    by_tool: Mapping[str, int]
    """Tokens out per tool."""


class LedgerReader:
    """The read side of a ledger. Subclasses supply ``_reading`` and, where several writers commit out of id
    order, ``TAIL_WINDOW``.

    Every method raises ``AuditError`` when the ledger is missing, is not a ledger, has another schema version, or
    cannot be read.
    """

    TAIL_WINDOW: ClassVar[int] = 0
    """How many ids below the highest seen ``tail`` re-reads each poll, for rows whose transactions committed late
    (0: the engine commits ids in order)."""

    def _reading(self) -> AbstractContextManager[Run]:
        """A read-only connection to the ledger, for as long as the ``with`` block lasts."""
        raise NotImplementedError

    def query(self, filters: Filters = EVERY_ROW, *, limit: int | None = 100) -> list[AuditRecord]:
        """The newest ``limit`` rows that match ``filters`` (all of them with None), oldest first."""
        where, params = filters.where()
        sql = f"SELECT {COLUMNS} FROM calls WHERE {where} ORDER BY ts DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._reading() as run:
            rows = run(sql, params)
        return [decode_row(row) for row in reversed(rows)]

    def stats(self, filters: Filters = EVERY_ROW) -> list[ToolStats]:
        """Per-tool figures for the rows that match ``filters``, sorted by tool name (a prompt's or a resource's
        figures, by kind, after the tools of that name). Refusals are counted apart (``ToolStats``)."""
        where, params = filters.where()
        with self._reading() as run:
            rows = run(
                f"SELECT tool, status, duration_ms, result_bytes, kind, tokens_in, tokens_out FROM calls WHERE {where}",
                params,
            )
        return _tool_stats(rows)

    def callers(self, filters: Filters = EVERY_ROW) -> list[CallerTokens]:
        """Per caller, the tool calls that match ``filters`` and their tokens, most tokens out first."""
        where, params = filters.where()
        sql = (
            "SELECT caller, tool, count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0) FROM calls "
            f"WHERE kind = 'tools/call' AND {where} GROUP BY caller, tool"
        )
        with self._reading() as run:
            rows = run(sql, params)
        found: dict[str | None, list[Any]] = {}
        for caller, tool, calls, tokens_in, tokens_out in rows:
            entry = found.setdefault(caller, [0, 0, 0, {}])
            entry[0] += calls
            entry[1] += int(tokens_in)
            entry[2] += int(tokens_out)
            entry[3][tool] = int(tokens_out)
        out = [CallerTokens(caller, *entry) for caller, entry in found.items()]
        return sorted(out, key=lambda c: (-c.tokens_out, c.caller or ""))

    def hourly(self, filters: Filters = EVERY_ROW) -> list[tuple[int, str | None, int]]:
        """Tokens out of tool calls per hour and caller: ``(hour as unix time // 3600, caller, tokens)``, oldest
        first."""
        where, params = filters.where()
        sql = (
            "SELECT CAST(ts AS BIGINT) / 3600 AS hour, caller, coalesce(sum(tokens_out), 0) FROM calls "
            f"WHERE kind = 'tools/call' AND {where} GROUP BY hour, caller ORDER BY hour"
        )
        with self._reading() as run:
            rows = run(sql, params)
        return [(int(hour), caller, int(tokens)) for hour, caller, tokens in rows]

    def tail(
        self,
        filters: Filters = EVERY_ROW,
        *,
        last: int = 10,
        follow: bool = True,
        poll_interval: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Generator[AuditRecord]:
        """Yield the ``last`` rows that match ``filters``, then (with ``follow``) every new matching row as it is
        committed, until closed.

        New rows are found by polling every ``poll_interval`` seconds (``sleep`` waits between polls) for ids above
        the highest seen (ids are never reused, so pruning cannot hide a row), and ``TAIL_WINDOW`` ids below it.
        """
        where, params = filters.where()
        window = self.TAIL_WINDOW
        with self._reading() as run:
            top: int = run("SELECT coalesce(max(id), 0) FROM calls", [])[0][0]
            rows = run(
                f"SELECT {COLUMNS} FROM calls WHERE id <= ? AND {where} ORDER BY id DESC LIMIT ?", [top, *params, last]
            )
            # Every row already there counts as seen (shown or not); only rows committed later are news.
            seen = {row[0] for row in run("SELECT id FROM calls WHERE id > ? AND id <= ?", [top - window, top])}
            yield from (decode_row(row) for row in reversed(rows))
            while follow:
                sleep(poll_interval)
                newest: int = run("SELECT coalesce(max(id), 0) FROM calls", [])[0][0]
                rows = run(
                    f"SELECT id, {COLUMNS} FROM calls WHERE id > ? AND id <= ? AND {where} ORDER BY id",
                    [top - window, newest, *params],
                )
                yield from _unseen(rows, seen)
                top = max(top, newest)
                seen = {i for i in seen if i > top - window}


def _unseen(rows: Rows, seen: set[int]) -> Iterator[AuditRecord]:
    """The records of ``rows`` (id first) whose ids are not in ``seen``; each id yielded joins ``seen``."""
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            yield decode_row(row[1:])


def _nearest_rank(ordered: Sequence[float], pct: int) -> float:
    """The nearest-rank percentile of an ascending, non-empty sequence: the value at rank ceil(pct/100 * n)."""
    rank = max(1, (pct * len(ordered) + 99) // 100)  # integer ceil: no float rounding at exact ranks
    return ordered[rank - 1]


def _tool_stats(rows: Sequence[Sequence[Any]]) -> list[ToolStats]:
    """Per-tool figures from ``(tool, status, duration_ms, result_bytes, kind, tokens_in, tokens_out)`` rows."""
    durations: dict[tuple[str, bool, str], list[float]] = {}  # (tool, not a tool call, kind): tools sort first
    sizes: dict[tuple[str, bool, str], list[float]] = {}
    statuses: dict[tuple[str, bool, str], dict[str, int]] = {}
    tokens: dict[tuple[str, bool, str], list[int]] = {}
    for name, row_status, duration, size, row_kind, tokens_in, tokens_out in rows:
        key = (name, row_kind != "tools/call", row_kind)
        counted = tokens.setdefault(key, [0, 0])
        counted[0] += tokens_in or 0
        counted[1] += tokens_out or 0
        counts = statuses.setdefault(key, {})
        counts[row_status] = counts.get(row_status, 0) + 1
        timed, sized = durations.setdefault(key, []), sizes.setdefault(key, [])
        if row_status not in REFUSED_STATUSES:  # a refusal's time and size are the gateway's, not the tool's
            timed.append(duration)
            sized.append(float(size or 0))
    result: list[ToolStats] = []
    for key in sorted(statuses):
        ordered = sorted(durations[key])
        counts = statuses[key]
        answered = len(ordered)
        result.append(
            ToolStats(
                tool=key[0],
                calls=sum(counts.values()),
                by_status=dict(sorted(counts.items())),
                error_rate=sum(counts.get(s, 0) for s in ERROR_STATUSES) / answered if answered else 0.0,
                degraded_rate=counts.get("degraded", 0) / answered if answered else 0.0,
                p50_ms=_nearest_rank(ordered, 50) if answered else None,
                p95_ms=_nearest_rank(ordered, 95) if answered else None,
                p99_ms=_nearest_rank(ordered, 99) if answered else None,
                p50_result_bytes=_nearest_rank(sorted(sizes[key]), 50) if answered else 0.0,
                kind=key[2],
                refused=sum(counts.get(s, 0) for s in REFUSED_STATUSES),
                tokens_in=tokens[key][0],
                tokens_out=tokens[key][1],
            )
        )
    return result
