"""``gateway audit tail|query|stats|copy``: the ledger read back as an aligned terminal table or as JSON.

The renderers are pure functions of the records they are given. ``add_audit_subcommands`` (cli/parser.py) mounts
the ``audit`` command on the CLI's argparse subparsers and ``run_audit`` runs it; both leave the ledger to the caller
(``--db``, a SQLite file or a ``postgresql://`` URL, defaulting to what the CLI passes as ``default_db``). ``copy``
copies a SQLite ledger into a PostgreSQL one (``--to``), skipping the rows already there. JSON output is one array
for ``query`` and ``stats`` and one object per line (JSON Lines) for ``tail``, so ``tail --follow --json`` can be
piped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import anyio

from gateway.cli.parser import add_audit_subcommands, parse_time
from gateway.errors import AuditError
from gateway.ledger.engines import open_reader
from gateway.ledger.readers import CallerTokens, Filters, ToolStats
from gateway.ledger.records import AuditRecord
from gateway.ledger.urls import is_url, redact_url

__all__ = [
    "add_audit_subcommands",
    "parse_time",
    "record_to_json",
    "render_callers",
    "render_records",
    "render_stats",
    "run_audit",
    "stats_to_json",
]


def record_to_json(rec: AuditRecord) -> dict[str, Any]:
    """One record as a JSON object: every field, plus ``time`` (the ``ts`` as ISO 8601 UTC)."""
    return {
        "time": datetime.fromtimestamp(rec.ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "ts": rec.ts,
        "correlation_id": rec.correlation_id,
        "session_id": rec.session_id,
        "client_name": rec.client_name,
        "client_version": rec.client_version,
        "caller": rec.caller,
        "tool": rec.tool,
        "chain": [
            {
                "provider": s.provider,
                "variant": s.variant,
                "outcome": s.outcome,
                "reason": s.reason,
                "duration_ms": s.duration_ms,
            }
            for s in rec.chain
        ],
        "status": rec.status,
        "duration_ms": rec.duration_ms,
        "result_bytes": rec.result_bytes,
        "arg_preview": dict(rec.arg_preview),
        "args_hash": rec.args_hash,
        "kind": rec.kind,
        "tokens_in": rec.tokens_in,
        "tokens_out": rec.tokens_out,
        "secrets": [{"kind": kind, "at": place, "action": action} for kind, place, action in rec.secrets],
    }


def stats_to_json(item: ToolStats) -> dict[str, Any]:
    """One tool's figures; ``kind`` is there only for the figures of a request that is not a tools/call."""
    kind = {} if item.kind == "tools/call" else {"kind": item.kind}
    return {
        "tool": item.tool,
        **kind,
        "calls": item.calls,
        "refused": item.refused,
        "by_status": dict(item.by_status),
        "error_rate": item.error_rate,
        "degraded_rate": item.degraded_rate,
        "p50_ms": item.p50_ms,
        "p95_ms": item.p95_ms,
        "p99_ms": item.p99_ms,
        "tokens_in": item.tokens_in,
        "tokens_out": item.tokens_out,
    }


def render_callers(items: Sequence[CallerTokens], as_json: bool) -> str:
    """Per-caller tool calls and tokens (in: arguments, out: answers as delivered) as a table or a JSON array."""
    if as_json:
        return json.dumps([dataclasses.asdict(item) for item in items], ensure_ascii=False, indent=2)
    rows = [
        [
            item.caller or "-",
            str(item.calls),
            str(item.tokens_in),
            str(item.tokens_out),
            ", ".join(f"{tool} {tokens}" for tool, tokens in sorted(item.by_tool.items(), key=lambda kv: -kv[1])),
        ]
        for item in items
    ]
    return _table(("CALLER", "CALLS", "TOKENS IN", "TOKENS OUT", "OUT BY TOOL"), rows, frozenset({1, 2, 3}), (0,) * 5)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: frozenset[int], minimum: Sequence[int]) -> str:
    """Columns padded to their widest cell (at least ``minimum``), numbers (``right``) aligned right, 2 spaces apart."""
    body = [list(row) for row in rows]
    widths = [max([minimum[i], len(headers[i]), *(len(row[i]) for row in body)]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in body)])


_RECORD_HEADERS = (
    "TIME",
    "STATUS",
    "TOOL",
    "KIND",
    "MS",
    "BYTES",
    "CLIENT",
    "CALLER",
    "CORRELATION",
    "CHAIN",
    "ARGS",
)
_RECORD_RIGHT = frozenset({4, 5})
# Minimum widths, so rows printed one at a time (tail --follow) line up with the header printed before them.
_RECORD_MIN = (19, 9, 24, 14, 9, 8, 20, 14, 16, 0, 0)


def _record_cells(rec: AuditRecord) -> list[str]:
    client = "/".join(part for part in (rec.client_name, rec.client_version) if part) or "-"
    chain = " > ".join(
        f"{s.provider}{'/' + s.variant if s.variant else ''}:{s.outcome}" for s in rec.chain
    )  # e.g. search/full:timeout > search/lite:ok
    args = " ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in rec.arg_preview.items())
    return [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.ts)),
        rec.status,
        rec.tool,
        rec.kind,
        f"{rec.duration_ms:.1f}",
        str(rec.result_bytes),
        client,
        rec.caller or "-",
        rec.correlation_id,
        chain or "-",
        args,
    ]


def render_records(records: Sequence[AuditRecord], as_json: bool) -> str:
    """Records as a table (times are local) or as a JSON array."""
    if as_json:
        return json.dumps([record_to_json(rec) for rec in records], ensure_ascii=False, indent=2)
    return _table(_RECORD_HEADERS, map(_record_cells, records), _RECORD_RIGHT, _RECORD_MIN)


def render_stats(items: Sequence[ToolStats], as_json: bool) -> str:
    """Per-tool statistics as a table (refusals counted apart; rates in percent and latencies in ms, of the calls
    not refused; "-" when there is none) or as a JSON array."""
    if as_json:
        return json.dumps([stats_to_json(item) for item in items], ensure_ascii=False, indent=2)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def pct(rate: float, item: ToolStats) -> str:
        return f"{rate * 100:.1f}" if item.answered else "-"

    rows = [
        [
            item.tool if item.kind == "tools/call" else f"{item.tool} ({item.kind})",
            str(item.calls),
            str(item.refused),
            pct(item.error_rate, item),
            pct(item.degraded_rate, item),
            ms(item.p50_ms),
            ms(item.p95_ms),
            ms(item.p99_ms),
            str(item.tokens_in),
            str(item.tokens_out),
        ]
        for item in items
    ]
    headers = (
        "TOOL", "CALLS", "REFUSED", "ERROR%", "DEGRADED%", "P50 MS", "P95 MS", "P99 MS", "TOKENS IN", "TOKENS OUT"
    )  # fmt: skip
    return _table(headers, rows, frozenset(range(1, 10)), (0,) * 10)


def run_audit(
    args: argparse.Namespace,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run a parsed ``gateway audit`` command. Returns the exit status: 0, or 1 with a sentence on stderr."""
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    try:
        if args.audit_command == "copy":
            _run_copy(args, out)
        else:
            _run_read(args, out, sleep)
    except AuditError as exc:
        print(f"gateway audit: {exc}", file=err)
        return 1
    except KeyboardInterrupt:  # the way to stop tail --follow
        return 0
    return 0


def _run_copy(args: argparse.Namespace, out: TextIO) -> None:
    if not args.to or not is_url(args.to):
        raise AuditError("gateway audit copy needs --to postgresql://... (or gateway.audit.url in the config).")
    if is_url(args.db):
        raise AuditError("gateway audit copy reads a SQLite ledger file (--db), not a URL.")
    from gateway.ledger.pgsql import copy_ledger

    copied, skipped = anyio.run(copy_ledger, args.db, args.to)
    print(f"copied {copied} row(s) from {args.db} into {redact_url(args.to)}; {skipped} were there already", file=out)


def _run_read(args: argparse.Namespace, out: TextIO, sleep: Callable[[float], None]) -> None:
    reader = open_reader(args.db)
    filters = Filters(
        tool=args.tool, status=args.status, client=args.client, kind=args.kind, since=args.since, until=args.until
    )
    if args.audit_command == "query":
        print(render_records(reader.query(filters, limit=args.limit or None), args.json), file=out)
    elif args.audit_command == "stats" and args.by == "caller":
        print(render_callers(reader.callers(filters), args.json), file=out)
    elif args.audit_command == "stats":
        print(render_stats(reader.stats(filters), args.json), file=out)
    else:
        rows = reader.tail(filters, last=args.lines, follow=args.follow, poll_interval=args.interval, sleep=sleep)
        _print_tail(rows, args.json, out)


def _print_tail(rows: Iterator[AuditRecord], as_json: bool, out: TextIO) -> None:
    if as_json:
        for rec in rows:
            print(json.dumps(record_to_json(rec), ensure_ascii=False), file=out, flush=True)
        return
    widths = list(_RECORD_MIN)  # grow as wider cells arrive, and stay grown, so later rows keep lining up
    print(_table(_RECORD_HEADERS, [], _RECORD_RIGHT, widths), file=out)
    for rec in rows:
        cells = _record_cells(rec)
        widths = [max(width, len(cell)) for width, cell in zip(widths, cells, strict=True)]
        print(_table(_RECORD_HEADERS, [cells], _RECORD_RIGHT, widths).partition("\n")[2], file=out, flush=True)
