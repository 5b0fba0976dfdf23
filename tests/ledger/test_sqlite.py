"""The audit ledger: durable rows under concurrency, back-pressure and SIGKILL; schema migration; retention; the
read side (query, tail, stats) and its rendering and CLI."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.cli.audit import (
    add_audit_subcommands,
    parse_time,
    record_to_json,
    render_callers,
    render_records,
    render_stats,
    run_audit,
)
from gateway.config import parse_config
from gateway.core.runtime import Gateway
from gateway.errors import AuditError
from gateway.ledger import sqlite as audit  # the SQLite engine's MIGRATIONS, which a test extends
from gateway.ledger.engines import open_reader
from gateway.ledger.readers import Filters, ToolStats
from gateway.ledger.records import MIGRATIONS, AuditRecord, AuditStep, arg_previews, args_hash
from gateway.ledger.sqlite import Ledger
from tests.fixtures import FIXTURES

WRITER = FIXTURES / "ledger_writer.py"
NOW = time.time()


def make(n: int = 0, **fields: Any) -> AuditRecord:
    rec = AuditRecord(
        ts=NOW + n / 1000,
        correlation_id=f"corr-{n}",
        session_id=f"session-{n % 3}",
        client_name="claude-code",
        client_version="1.2.3",
        caller="token:ci",
        tool="search",
        chain=(
            AuditStep("primary", "full", "timeout", "timed out after 15 s", 15000.0),
            AuditStep("fallback", None, "ok", None, 12.5 + n),
        ),
        status="degraded",
        duration_ms=15012.5 + n,
        result_bytes=100 + n,
        arg_preview={"query": f"query number {n} — é"},
        args_hash=args_hash({"query": f"query number {n} — é"}),
    )
    return replace(rec, **fields)


def write_rows(path: Path, records: list[AuditRecord], **ledger_args: Any) -> None:
    """Record rows from synchronous code (a fresh event loop), e.g. inside a fake ``sleep``."""

    async def run() -> None:
        async with Ledger(path, **ledger_args) as ledger:
            for rec in records:
                await ledger.record(rec)

    anyio.run(run)


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


# --- writing -------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_records_from_many_tasks_are_all_written_exactly(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    expected = [make(task * 100 + i, tool=f"tool-{task % 5}") for task in range(50) for i in range(10)]
    with anyio.fail_after(10):
        async with Ledger(db) as ledger:

            async def writer(task: int) -> None:
                for i in range(10):
                    await ledger.record(expected[task * 10 + i])

            async with anyio.create_task_group() as tg:
                for task in range(50):
                    tg.start_soon(writer, task)
            statistics = ledger.statistics()

    rows = open_reader(db).query(limit=None)
    assert sorted(rows, key=lambda r: r.correlation_id) == sorted(expected, key=lambda r: r.correlation_id)
    assert statistics.rows_written == 500
    assert statistics.commits < 500  # rows that arrived during a commit shared the next one
    assert statistics.pending == 0


@pytest.mark.anyio
async def test_back_pressure_makes_callers_wait_and_drops_no_row(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with anyio.fail_after(10):
        async with Ledger(db, max_pending=2) as ledger:
            async with anyio.create_task_group() as tg:
                for n in range(300):
                    tg.start_soon(ledger.record, make(n))
            statistics = ledger.statistics()

    assert len(open_reader(db).query(limit=None)) == 300
    assert statistics.peak_pending == 2
    assert statistics.rows_written == 300


@pytest.mark.anyio
async def test_closing_drains_every_queued_row(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with Ledger(db) as ledger:
                for n in range(200):
                    tg.start_soon(ledger.record, make(n))
                await anyio.wait_all_tasks_blocked()  # every row is queued or committing
    assert len(open_reader(db).query(limit=None)) == 200


@pytest.mark.anyio
async def test_a_cancelled_caller_still_gets_its_row_written(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with anyio.fail_after(10):
        async with Ledger(db) as ledger:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await ledger.record(make(1, status="cancelled"))
    assert [r.status for r in open_reader(db).query()] == ["cancelled"]


@pytest.mark.spawns
@pytest.mark.anyio
@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_rows_whose_record_returned_survive_sigkill(tmp_path: Path, synchronous: str) -> None:
    db = tmp_path / "audit.db"
    printed: list[str] = []
    process = await anyio.open_process(
        [sys.executable, str(WRITER), str(db), "4", synchronous], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        with anyio.fail_after(30):
            while len(printed) < 400:
                printed.append((await stdout.receive_until(b"\n", 100)).decode())
        process.kill()  # SIGKILL: no atexit, no close, no checkpoint
        with anyio.fail_after(10):
            rest = b""
            try:
                while True:
                    rest += await stdout.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                pass
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()

    assert process.returncode == -signal.SIGKILL
    printed += rest.decode().split("\n")[:-1]  # an unterminated last line was cut by the kill, not printed whole
    recorded = {r.correlation_id for r in open_reader(db).query(limit=None)}  # read-only, straight after the crash
    assert set(printed) <= recorded
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with anyio.fail_after(10):
        async with Ledger(db) as ledger:  # and the writer reopens it
            await ledger.record(make(1))


@pytest.mark.anyio
async def test_a_write_error_fails_the_callers_with_audit_error_and_the_writer_carries_on(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with anyio.fail_after(10):
        async with Ledger(db) as ledger:
            await ledger.record(make(1))
            with sqlite3.connect(db) as other:
                other.execute("ALTER TABLE calls RENAME TO calls_gone")
            with pytest.raises(AuditError, match="Could not write 1 row"):
                await ledger.record(make(2))
            with sqlite3.connect(db) as other:
                other.execute("ALTER TABLE calls_gone RENAME TO calls")
            await ledger.record(make(3))
    assert [r.correlation_id for r in open_reader(db).query()] == ["corr-1", "corr-3"]


@pytest.mark.anyio
async def test_a_disabled_ledger_records_nothing_and_creates_no_file(tmp_path: Path) -> None:
    async with Ledger(None) as ledger:
        assert ledger.disabled
        await ledger.record(make(1))
    assert [entry async for entry in anyio.Path(tmp_path).iterdir()] == []


@pytest.mark.anyio
async def test_misuse_is_refused_with_a_sentence(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "audit.db")
    with pytest.raises(AuditError, match="only while it is open"):
        await ledger.record(make(1))
    async with ledger:
        with pytest.raises(AuditError, match="is not one of"):
            await ledger.record(make(1, status="fine"))
    with pytest.raises(AuditError, match="closed"):
        await ledger.record(make(1))
    with pytest.raises(RuntimeError, match="cannot be reopened"):
        async with ledger:
            pass
    with pytest.raises(ValueError, match="retention_days"):
        Ledger(tmp_path / "x.db", retention_days=0)


@pytest.mark.anyio
async def test_a_ledger_that_cannot_be_opened_raises_audit_error(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(AuditError, match="Cannot open the audit ledger"):
        async with Ledger(tmp_path / "dir.db"):
            pass
    (tmp_path / "text.db").write_text("not a database, just some text that is long enough to be read" * 20)
    with pytest.raises(AuditError, match="Cannot open the audit ledger"):
        async with Ledger(tmp_path / "text.db"):
            pass


# --- schema ----------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_empty_v0_file_is_migrated_to_the_current_schema(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    db.touch()
    assert user_version(db) == 0
    async with Ledger(db) as ledger:
        await ledger.record(make(1))
    assert user_version(db) == len(MIGRATIONS) == 5
    with sqlite3.connect(db) as conn:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"calls_ts", "calls_tool", "calls_status"} <= indexes


@pytest.mark.anyio
async def test_migrations_are_applied_in_order_to_an_older_database_keeping_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "audit.db"
    async with Ledger(db) as ledger:  # a ledger of the current version with a row in it
        await ledger.record(make(1))
    later = (
        ("ALTER TABLE calls ADD COLUMN note TEXT", "CREATE TABLE notes_log (step INTEGER)"),
        ("INSERT INTO notes_log VALUES (3)", "UPDATE calls SET note = 'migrated'"),  # needs v2 before it
    )
    monkeypatch.setattr(audit, "MIGRATIONS", audit.MIGRATIONS + later)

    async with Ledger(db) as ledger:
        await ledger.record(make(2))

    assert user_version(db) == len(audit.MIGRATIONS) == 7
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT correlation_id, note FROM calls ORDER BY id").fetchall() == [
            ("corr-1", "migrated"),
            ("corr-2", None),
        ]
        assert conn.execute("SELECT step FROM notes_log").fetchall() == [(3,)]
    assert [r.correlation_id for r in open_reader(db).query()] == ["corr-1", "corr-2"]


@pytest.mark.anyio
async def test_rows_of_a_v1_ledger_read_as_tool_calls_once_it_is_migrated_and_kinds_filter(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with sqlite3.connect(db) as conn:  # a ledger written before rows had a kind
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute(
            "INSERT INTO calls (ts, correlation_id, tool, chain, status, duration_ms, result_bytes, arg_preview,"
            " args_hash) VALUES (?, 'old', 'search', '[]', 'ok', 1.0, 0, '{}', 'h')",
            (NOW,),
        )
    async with Ledger(db) as ledger:
        await ledger.record(make(1, tool="fid://r/1", kind="resources/read"))
    assert [(r.correlation_id, r.kind) for r in open_reader(db).query()] == [
        ("old", "tools/call"),
        ("corr-1", "resources/read"),
    ]
    assert [r.correlation_id for r in open_reader(db).query(Filters(kind="resources/read"))] == ["corr-1"]
    assert [(s.tool, s.kind) for s in open_reader(db).stats()] == [
        ("fid://r/1", "resources/read"),
        ("search", "tools/call"),
    ]
    assert [s.tool for s in open_reader(db).stats(Filters(kind="tools/call"))] == ["search"]
    with pytest.raises(AuditError, match="Audit kind 'tools/list' is not one of"):
        async with Ledger(db) as ledger:
            await ledger.record(make(2, kind="tools/list"))


@pytest.mark.anyio
async def test_a_ledger_from_a_newer_gateway_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(AuditError, match="schema version 99, newer than"):
        async with Ledger(db):
            pass
    with pytest.raises(AuditError, match="upgrade the gateway"):
        open_reader(db).query()
    federation = parse_config(f"gateway: {{audit: {{path: {json.dumps(str(db))}}}}}\n", file="f.yaml", env={})
    with pytest.raises(AuditError, match="schema version 99, newer than"):  # as it is, not in an exception group
        async with Gateway(federation).running():
            pass


def test_the_reader_refuses_a_missing_file_and_a_file_that_is_no_ledger(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="There is no audit ledger at"):
        open_reader(tmp_path / "missing.db").query()
    sqlite3.connect(tmp_path / "other.db").close()
    (tmp_path / "other.db").write_bytes(b"")
    with pytest.raises(AuditError, match="is not an audit ledger"):
        open_reader(tmp_path / "other.db").stats()


# --- retention -------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_retention_prunes_old_rows_at_open(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with Ledger(db) as ledger:
        for rec in [*(make(n, ts=time.time() - 10 * 86400) for n in range(5)), make(99)]:
            await ledger.record(rec)
    async with Ledger(db, retention_days=7) as ledger:
        assert ledger.statistics().rows_pruned == 5
    assert [r.correlation_id for r in open_reader(db).query()] == ["corr-99"]


@pytest.mark.anyio
async def test_retention_prunes_on_request_and_periodically_while_open(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with anyio.fail_after(10):
        async with Ledger(db, retention_days=1) as ledger:
            await ledger.record(make(1, ts=time.time() - 2 * 86400))
            await ledger.record(make(2))
            assert await ledger.prune() == 1
        assert [r.correlation_id for r in open_reader(db).query()] == ["corr-2"]

        async with Ledger(db, retention_days=1, prune_interval_s=0.01) as ledger:
            await ledger.record(make(3, ts=time.time() - 2 * 86400))
            while ledger.statistics().rows_pruned == 0:  # each round trip lets the writer's timer come due
                await ledger.record(make(4))
    assert "corr-3" not in {r.correlation_id for r in open_reader(db).query(limit=None)}


# --- hashing and previews --------------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(item) for item in value]
    return value


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(max_size=8), _json_values, max_size=6))
def test_args_hash_does_not_depend_on_key_order(arguments: dict[str, Any]) -> None:
    assert args_hash(_reversed_keys(arguments)) == args_hash(arguments)
    assert len(args_hash(arguments)) == 16


def test_args_hash_is_sha256_of_canonical_json() -> None:
    canonical = '{"a":"é","b":[1,{"c":null,"d":true}]}'
    assert (
        args_hash({"b": [1, {"d": True, "c": None}], "a": "é"}) == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    )
    assert args_hash({"a": 1}) != args_hash({"a": "1"})


def test_previews_cover_only_listed_arguments_truncated_to_their_length() -> None:
    arguments = {"query": "x" * 150, "mode": "exhaustive-but-long", "token": "secret", "filters": {"b": 2, "a": [1]}}
    previews = arg_previews(arguments, {"query": 100, "mode": 0, "filters": 5, "absent": 10})
    assert previews == {"query": "x" * 100 + "…", "mode": "exhaustive-but-long", "filters": '{"a":…'}
    assert "token" not in previews
    assert arg_previews({"query": "short"}, {"query": 100}) == {"query": "short"}
    assert arg_previews({"n": 12345}, {"n": 3}) == {"n": "123…"}
    with pytest.raises(ValueError, match="preview length"):
        arg_previews(arguments, {"query": -1})


# --- reading ---------------------------------------------------------------------------------------------------------


def test_query_filters_by_tool_status_client_and_time_and_keeps_the_newest(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    records = [
        make(0, tool="search", status="ok", ts=1000.0),
        make(1, tool="search", status="error", ts=2000.0),
        make(2, tool="fetch", status="ok", ts=3000.0, client_name="cursor"),
        make(3, tool="search", status="ok", ts=4000.0),
    ]
    write_rows(db, records)
    assert open_reader(db).query(Filters(tool="search", status="ok")) == [records[0], records[3]]
    assert open_reader(db).query(Filters(client="cursor")) == [records[2]]
    assert open_reader(db).query(Filters(since=2000.0, until=4000.0)) == [records[1], records[2]]
    assert open_reader(db).query(limit=2) == [records[2], records[3]]
    assert open_reader(db).query(Filters(tool="nothing")) == []


def test_tail_shows_the_last_rows_then_follows_new_ones(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    write_rows(db, [make(n) for n in range(5)])
    arrivals = iter([[make(10, tool="fetch"), make(11)], [], [make(12)]])

    def sleep(seconds: float) -> None:  # instead of waiting, another process records the next rows
        write_rows(db, next(arrivals))

    rows = open_reader(db).tail(Filters(tool="search"), last=2, sleep=sleep)
    seen = [next(rows).correlation_id for _ in range(4)]
    rows.close()
    assert seen == ["corr-3", "corr-4", "corr-11", "corr-12"]


def test_tail_without_follow_stops_after_the_last_rows(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    write_rows(db, [make(n) for n in range(5)])
    assert [r.correlation_id for r in open_reader(db).tail(last=3, follow=False)] == ["corr-2", "corr-3", "corr-4"]


def test_stats_give_rates_and_nearest_rank_percentiles_per_tool(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    statuses = ["error"] * 5 + ["timeout"] * 5 + ["degraded"] * 20 + ["ok"] * 70
    records = [make(n, tool="search", duration_ms=float(n + 1), status=statuses[n]) for n in range(100)]
    records += [make(200, tool="fetch", duration_ms=7.0, status="refused")]
    records += [
        make(300 + n, tool="wiki", duration_ms=float(v), status="ok") for n, v in enumerate([15, 20, 35, 40, 50])
    ]
    write_rows(db, records)

    by_tool = {s.tool: s for s in open_reader(db).stats()}

    assert [s.tool for s in open_reader(db).stats()] == ["fetch", "search", "wiki"]
    search = by_tool["search"]
    assert (search.calls, search.error_rate, search.degraded_rate) == (100, 0.10, 0.20)
    assert (search.p50_ms, search.p95_ms, search.p99_ms) == (50.0, 95.0, 99.0)
    assert search.by_status == {"degraded": 20, "error": 5, "ok": 70, "timeout": 5}
    fetch = by_tool["fetch"]  # refused: counted apart, no latency of a tool's
    assert (fetch.calls, fetch.refused, fetch.p50_ms, fetch.p99_ms, fetch.error_rate) == (1, 1, None, None, 0.0)
    wiki = by_tool["wiki"]  # the textbook nearest-rank example: ranks ceil(p/100 * 5)
    assert (wiki.p50_ms, wiki.p95_ms, wiki.p99_ms) == (35.0, 50.0, 50.0)
    assert open_reader(db).stats(Filters(tool="wiki", since=NOW + 0.3005)) == [
        replace(wiki, calls=4, p50_ms=35.0, by_status={"ok": 4})
    ]


# --- rendering and the CLI -------------------------------------------------------------------------------------------


def test_records_render_as_an_aligned_table_and_as_json_that_parses_back() -> None:
    records = [make(1), make(2, tool="a-much-longer-tool-name", status="ok", caller=None, arg_preview={})]
    table = render_records(records, as_json=False).splitlines()
    assert len(table) == 3
    header = table[0]
    for column in ("STATUS", "TOOL", "CLIENT", "CORRELATION", "CHAIN"):
        start = header.index(column)
        assert all(line[start - 2 : start] == "  " and line[start] != " " for line in table[1:])
    assert "primary/full:timeout > fallback:ok" in table[1]
    assert 'query="query number 1 — é"' in table[1]

    parsed = json.loads(render_records(records, as_json=True))
    assert parsed == [record_to_json(r) for r in records]
    assert parsed[0]["chain"][0] == {
        "provider": "primary",
        "variant": "full",
        "outcome": "timeout",
        "reason": "timed out after 15 s",
        "duration_ms": 15000.0,
    }
    assert parsed[0]["time"].endswith("Z")
    rebuilt = AuditRecord(
        **{k: v for k, v in parsed[0].items() if k not in ("time", "chain", "secrets")},
        chain=tuple(AuditStep(**step) for step in parsed[0]["chain"]),
        secrets=tuple((s["kind"], s["at"], s["action"]) for s in parsed[0]["secrets"]),
    )
    assert rebuilt == records[0]


def test_stats_render_as_a_table_and_as_json() -> None:
    items = [ToolStats("search", 100, {"ok": 90, "error": 10}, 0.1, 0.0, 50.0, 95.0, 99.0)]
    table = render_stats(items, as_json=False).splitlines()
    assert table[0].split() == [
        "TOOL", "CALLS", "REFUSED", "ERROR%", "DEGRADED%", "P50", "MS", "P95", "MS", "P99", "MS", "TOKENS", "IN",
        "TOKENS", "OUT",
    ]  # fmt: skip
    assert table[1].split() == ["search", "100", "0", "10.0", "0.0", "50.0", "95.0", "99.0", "0", "0"]
    assert len(table[0]) == len(table[1])  # numbers right-aligned under their headers
    assert json.loads(render_stats(items, as_json=True)) == [
        {
            "tool": "search",
            "calls": 100,
            "refused": 0,
            "by_status": {"ok": 90, "error": 10},
            "error_rate": 0.1,
            "degraded_rate": 0.0,
            "p50_ms": 50.0,
            "p95_ms": 95.0,
            "p99_ms": 99.0,
            "tokens_in": 0,
            "tokens_out": 0,
        }
    ]


@pytest.mark.anyio
async def test_tokens_per_caller_and_tool_and_per_hour_are_read_back_and_a_v2_ledger_migrates(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with sqlite3.connect(db) as conn:  # a ledger written before rows had tokens: they read as not counted
        for statement in (*MIGRATIONS[0], *MIGRATIONS[1]):
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.execute(
            "INSERT INTO calls (ts, correlation_id, caller, tool, chain, status, duration_ms, result_bytes,"
            " arg_preview, args_hash) VALUES (?, 'old', 'alice', 'search', '[]', 'ok', 1.0, 0, '{}', 'h')",
            (NOW,),
        )
    async with Ledger(db) as ledger:
        await ledger.record(make(1, caller="alice", tool="search", tokens_in=5, tokens_out=700))
        await ledger.record(make(2, caller="alice", tool="read", tokens_in=3, tokens_out=300))
        await ledger.record(make(3, caller="bob", tool="search", tokens_in=4, tokens_out=2_000))
        await ledger.record(make(4, caller="bob", tool="x://r", kind="resources/read", tokens_out=9))
    reader = open_reader(db)
    assert [(r.correlation_id, r.tokens_in, r.tokens_out) for r in reader.query(Filters(tool="search"))] == [
        ("old", None, None),
        ("corr-1", 5, 700),
        ("corr-3", 4, 2_000),
    ]
    callers = reader.callers()
    assert [(c.caller, c.calls, c.tokens_in, c.tokens_out) for c in callers] == [
        ("bob", 1, 4, 2_000),  # the resource read is not a tool call
        ("alice", 3, 8, 1_000),
    ]
    assert callers[1].by_tool == {"search": 700, "read": 300}
    assert sorted(reader.hourly()) == [(int(NOW // 3600), "alice", 1_000), (int(NOW // 3600), "bob", 2_000)]
    search = next(item for item in reader.stats() if item.tool == "search")
    assert (search.tokens_in, search.tokens_out) == (9, 2_700)
    table = render_callers(callers, as_json=False).splitlines()
    assert table[0].split()[:5] == ["CALLER", "CALLS", "TOKENS", "IN", "TOKENS"]
    assert table[1].split()[:4] == ["bob", "1", "4", "2000"]
    assert json.loads(render_callers(callers, as_json=True))[1]["by_tool"] == {"search": 700, "read": 300}


def _cli(db: Path) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway")
    add_audit_subcommands(parser.add_subparsers(dest="command"), default_db=str(db))
    return parser


def test_the_cli_queries_and_summarises_the_ledger(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    write_rows(db, [make(1, ts=time.time() - 7200), make(2, tool="fetch", status="error"), make(3)])
    out = io.StringIO()

    args = _cli(db).parse_args(["audit", "query", "--tool", "search", "--since", "1h", "--json"])
    assert run_audit(args, stdout=out) == 0
    assert [row["correlation_id"] for row in json.loads(out.getvalue())] == ["corr-3"]

    out = io.StringIO()
    assert run_audit(_cli(db).parse_args(["audit", "stats", "--json"]), stdout=out) == 0
    assert {row["tool"]: row["calls"] for row in json.loads(out.getvalue())} == {"fetch": 1, "search": 2}

    out = io.StringIO()
    assert run_audit(_cli(db).parse_args(["audit", "query", "--status", "error"]), stdout=out) == 0
    assert out.getvalue().splitlines()[0].startswith("TIME")
    assert "fetch" in out.getvalue() and "corr-1" not in out.getvalue()


def test_the_cli_stats_count_only_the_rows_of_the_status_asked_for(tmp_path: Path) -> None:
    # --status was offered by `audit stats` but not applied: the figures covered every status.
    db = tmp_path / "audit.db"
    write_rows(db, [make(1, status="ok"), make(2, status="error"), make(3, status="ok"), make(4, tool="fetch")])
    out = io.StringIO()
    assert run_audit(_cli(db).parse_args(["audit", "stats", "--status", "ok", "--json"]), stdout=out) == 0
    assert [(row["tool"], row["calls"], row["by_status"]) for row in json.loads(out.getvalue())] == [
        ("search", 2, {"ok": 2})
    ]


def test_the_cli_tail_follows_until_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    write_rows(db, [make(1)])
    polls = 0

    def sleep(seconds: float) -> None:
        nonlocal polls
        polls += 1
        if polls == 1:
            write_rows(db, [make(2)])
        else:
            raise KeyboardInterrupt

    out = io.StringIO()
    args = _cli(db).parse_args(["audit", "tail", "--follow", "--json"])
    assert run_audit(args, stdout=out, sleep=sleep) == 0
    assert [json.loads(line)["correlation_id"] for line in out.getvalue().splitlines()] == ["corr-1", "corr-2"]


def test_the_cli_tail_prints_a_table_whose_rows_line_up_with_its_header(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    write_rows(db, [make(1), make(2, tool="fetch", caller=None, chain=()), make(3)])
    out = io.StringIO()
    assert run_audit(_cli(db).parse_args(["audit", "tail", "-n", "2"]), stdout=out) == 0
    header, *rows = out.getvalue().splitlines()
    assert [row.split()[3] for row in rows] == ["fetch", "search"]
    for column in ("STATUS", "TOOL", "CLIENT", "CALLER", "CORRELATION", "CHAIN"):  # left-aligned: same start
        start = header.index(column)
        assert all(row[start - 1] == " " and row[start] != " " for row in rows), column
    for column in ("MS", "BYTES"):  # right-aligned: same end
        end = header.index(f" {column} ") + len(column) + 1
        assert all(row[end - 1] != " " and row[end] == " " for row in rows), column


def test_the_cli_reports_errors_as_a_sentence_and_bad_times_as_usage(tmp_path: Path) -> None:
    err = io.StringIO()
    args = _cli(tmp_path / "missing.db").parse_args(["audit", "stats"])
    assert run_audit(args, stdout=io.StringIO(), stderr=err) == 1
    assert err.getvalue().startswith("gateway audit: There is no audit ledger at")
    with pytest.raises(SystemExit) as exit_info:
        _cli(tmp_path / "audit.db").parse_args(["audit", "query", "--since", "yesterday-ish"])
    assert exit_info.value.code == 2


def test_times_parse_as_ages_iso_and_unix() -> None:
    assert parse_time("1h", now=10_000.0) == 6400.0
    assert parse_time("2d", now=200_000.0) == 200_000.0 - 2 * 86400
    assert parse_time("90s", now=100.0) == 10.0
    assert parse_time("2025-06-01T12:00:00Z") == 1748779200.0
    assert parse_time("2025-06-01T14:00:00+02:00") == 1748779200.0
    assert parse_time("1748779200") == 1748779200.0
    with pytest.raises(ValueError, match="is not a time"):
        parse_time("soon")


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("command", "default"),
    [
        ("tail", "(default: gateway.audit.url when set, else gateway.audit.path)"),
        ("stats", "(default: gateway.audit.url when set, else gateway.audit.path)"),
        ("copy", "(default: gateway.audit.path)"),
    ],
)
def test_the_audit_help_names_the_ledger_each_command_reads_by_default(command: str, default: str) -> None:
    # `audit tail` reads gateway.audit.url when one is set (the ledger the gateway writes), which its help left out.
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    db_help = " ".join(done.stdout.split("--db DB", 2)[-1].split("--", 1)[0].split())
    assert db_help.endswith(default), db_help
