"""The PostgreSQL ledger against a real PostgreSQL server started by the tests on loopback (tests/engines.py):
the commit guarantee and group commit, the shared schema, ``gateway audit`` reading it, the copy from SQLite, and the
spool that keeps every row while PostgreSQL is down, in-process and through a real gateway process."""

from __future__ import annotations

import argparse
import io
import json
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli.audit import add_audit_subcommands, run_audit
from gateway.config import parse_config
from gateway.core.router import META_KEY
from gateway.errors import AuditError, ConfigError
from gateway.ledger.engines import open_reader
from gateway.ledger.pgsql import _pg_ddl, copy_ledger, row_key
from gateway.ledger.postgres import PgLedger
from gateway.ledger.readers import Filters
from gateway.ledger.records import COLUMN_NAMES, MIGRATIONS, encode_row
from gateway.ledger.sqlite import Ledger
from gateway.ledger.urls import redact_url, url_secrets
from tests.engines import PostgresServer
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.waiting import eventually
from tests.ledger.test_sqlite import make

pytestmark = pytest.mark.anyio


def pg_rows(url: str, columns: str = "correlation_id") -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT {columns} FROM calls ORDER BY id").fetchall()  # type: ignore[arg-type]


# --- the write side ---------------------------------------------------------------------------------------------


async def test_a_row_is_in_postgresql_when_record_returns(pg_url: str, tmp_path: Path) -> None:
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db") as ledger:
        for n in range(3):
            rec = make(n, correlation_id=f"c{n}")
            await ledger.record(rec)
            # Another connection sees it at once: the transaction committed before record() returned.
            assert await anyio.to_thread.run_sync(pg_rows, pg_url) == [(f"c{i}",) for i in range(n + 1)]
        assert ledger.statistics().spooling is False
    assert open_reader(pg_url).query(limit=None) == [make(n, correlation_id=f"c{n}") for n in range(3)]


async def test_concurrent_records_are_group_committed_and_all_written_once(pg_url: str, tmp_path: Path) -> None:
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db") as ledger:
        async with anyio.create_task_group() as tg:
            for n in range(300):
                tg.start_soon(ledger.record, make(n, correlation_id=f"c{n:03}"))
        figures = ledger.statistics()
    assert figures.rows_written == 300 and figures.spooled_rows == 0
    assert figures.commits < 300 and figures.largest_commit > 1, figures  # rows shared transactions
    assert sorted(pg_rows(pg_url)) == [(f"c{n:03}",) for n in range(300)]


async def test_the_schema_is_the_shared_migration_list_in_postgresql_types(pg_url: str, tmp_path: Path) -> None:
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db") as ledger:
        await ledger.record(make(1, ts=1_750_000_000.123456))
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db"):  # opening again migrates nothing twice
        pass
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM ledger_schema").fetchall() == [(len(MIGRATIONS),)]
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'calls'"
            ).fetchall()
        )
    sqlite_columns = set(COLUMN_NAMES)
    assert set(types) == sqlite_columns | {"id", "row_key"}
    assert types["ts"] == "double precision" and types["id"] == "bigint"
    assert open_reader(pg_url).query()[0].ts == 1_750_000_000.123456  # 8 bytes: not rounded to a float4
    assert "DOUBLE PRECISION" in _pg_ddl(MIGRATIONS[0][0]) and "AUTOINCREMENT" not in _pg_ddl(MIGRATIONS[0][0])


async def test_a_database_of_a_newer_schema_is_refused(pg_url: str, tmp_path: Path) -> None:
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db"):
        pass
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE ledger_schema SET version = 99")
    with pytest.raises(AuditError, match="schema version 99, newer"):
        async with PgLedger(pg_url, spool_path=tmp_path / "spool.db"):
            pass
    with pytest.raises(AuditError, match="schema version 99"):
        open_reader(pg_url).query()


async def test_text_postgresql_refuses_is_kept_as_replacement_characters(pg_url: str, tmp_path: Path) -> None:
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db") as ledger:
        await ledger.record(make(1, client_name="nul\x00inside"))
        assert ledger.statistics().spooling is False
    assert open_reader(pg_url).query()[0].client_name == "nul\ufffdinside"


def test_the_row_key_is_the_same_for_equal_rows_and_differs_otherwise() -> None:
    one, same, other = (encode_row(make(1)), encode_row(make(1)), encode_row(make(2)))
    assert row_key(one) == row_key(same) != row_key(other)
    assert len(row_key(one)) == 32


# --- the URL's password -----------------------------------------------------------------------------------------


def test_a_url_is_shown_without_its_password_in_either_place() -> None:
    url = "postgresql://gw:s%40cret@db.example:5432/audit?password=other&sslmode=require"
    shown = redact_url(url)
    assert "s%40cret" not in shown and "other" not in shown
    assert shown.startswith("postgresql://gw:***@db.example:5432/audit?") and "sslmode=require" in shown
    assert set(url_secrets(url)) == {"s%40cret", "s@cret", "other"}
    assert url_secrets("postgresql://gw@db/audit") == [] and url_secrets(None) == []


async def test_errors_never_show_the_password(postgres_server: PostgresServer, tmp_path: Path) -> None:
    wrong = postgres_server.dsn().replace(postgres_server.password, "wrong-pass-9f3e")
    with pytest.raises(AuditError) as caught:
        open_reader(wrong).query()
    assert "wrong-pass-9f3e" not in str(caught.value) and "password authentication failed" in str(caught.value)
    absent = postgres_server.dsn("no_such_db")
    with pytest.raises(AuditError) as caught:
        open_reader(absent).stats()
    assert postgres_server.password not in str(caught.value) and "no_such_db" in str(caught.value)


# --- reading: gateway audit tail|query|stats --------------------------------------------------------------------


def _cli(default: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_audit_subcommands(parser.add_subparsers(dest="command"), default_db=default)
    return parser


async def test_a_postgresql_ledger_keeps_each_rows_kind_and_filters_by_it(pg_url: str, tmp_path: Path) -> None:
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db") as ledger:
        await ledger.record(make(1, tool="search"))
        await ledger.record(make(2, tool="fid://r/1", kind="resources/read"))
    assert [(r.tool, r.kind) for r in open_reader(pg_url).query()] == [
        ("search", "tools/call"),
        ("fid://r/1", "resources/read"),
    ]
    assert [r.correlation_id for r in open_reader(pg_url).query(Filters(kind="resources/read"))] == ["corr-2"]
    assert [(s.tool, s.kind) for s in open_reader(pg_url).stats()] == [
        ("fid://r/1", "resources/read"),
        ("search", "tools/call"),
    ]
    assert [s.tool for s in open_reader(pg_url).stats(Filters(kind="tools/call"))] == ["search"]


async def test_gateway_audit_query_stats_and_tail_read_postgresql(pg_url: str, tmp_path: Path) -> None:
    records = [
        make(1, tool="search", status="ok", duration_ms=10.0),
        make(2, tool="search", status="timeout", duration_ms=30.0),
        make(3, tool="read", status="ok", duration_ms=5.0),
    ]
    async with PgLedger(pg_url, spool_path=tmp_path / "spool.db") as ledger:
        for rec in records:
            await ledger.record(rec)

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = run_audit(_cli(pg_url).parse_args(["audit", *argv]), stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    code, out, _ = await anyio.to_thread.run_sync(run, "query", "--json", "--tool", "search")
    assert code == 0 and [r["status"] for r in json.loads(out)] == ["ok", "timeout"]
    code, out, _ = await anyio.to_thread.run_sync(run, "stats", "--json")
    by_tool = {item["tool"]: item for item in json.loads(out)}
    assert by_tool["search"]["calls"] == 2 and by_tool["search"]["error_rate"] == 0.5
    assert by_tool["read"]["p50_ms"] == 5.0
    code, out, _ = await anyio.to_thread.run_sync(run, "tail", "--json", "-n", "2")
    assert code == 0 and [json.loads(line)["tool"] for line in out.splitlines()] == ["search", "read"]

    # tail --follow sees rows committed after it started, and stops when its sleep is interrupted.
    polls = 0

    def sleep(_: float) -> None:
        nonlocal polls
        polls += 1
        if polls == 1:
            anyio.from_thread.run(ledger_b.record, make(4, tool="late"))
        else:
            raise KeyboardInterrupt

    async with PgLedger(pg_url, spool_path=tmp_path / "spool2.db") as ledger_b:
        seen = await anyio.to_thread.run_sync(_follow, pg_url, sleep)
    assert seen == ["read", "late"]


def _follow(url: str, sleep: Any) -> list[str]:
    seen: list[str] = []
    try:
        for rec in open_reader(url).tail(last=1, follow=True, poll_interval=0, sleep=sleep):
            seen.append(rec.tool)
    except KeyboardInterrupt:
        pass
    return seen


# --- copy -------------------------------------------------------------------------------------------------------


async def test_copy_moves_a_sqlite_ledger_into_postgresql_once_however_often_it_runs(
    pg_url: str, tmp_path: Path
) -> None:
    db = tmp_path / "audit.db"
    records = [make(n, correlation_id=f"c{n:02}") for n in range(40)]
    async with Ledger(db) as ledger:
        for rec in records[:30]:
            await ledger.record(rec)
    assert await copy_ledger(db, pg_url, chunk=7) == (30, 0)
    async with Ledger(db) as ledger:  # the ledger grew since
        for rec in records[30:]:
            await ledger.record(rec)

    def cli_copy() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        args = _cli(str(db)).parse_args(["audit", "copy", "--db", str(db), "--to", pg_url])
        return run_audit(args, stdout=out, stderr=err), out.getvalue(), err.getvalue()

    code, out, err = await anyio.to_thread.run_sync(cli_copy)
    assert (code, err) == (0, "")
    assert "copied 10 row(s)" in out and "30 were there already" in out
    assert pg_pass_free(out, pg_url)
    assert open_reader(pg_url).query(limit=None) == records  # every field, in order, once
    assert await copy_ledger(db, pg_url) == (0, 40)


def pg_pass_free(text: str, url: str) -> bool:
    return all(secret not in text for secret in url_secrets(url))


# --- the spool --------------------------------------------------------------------------------------------------


async def test_rows_spool_while_postgresql_is_down_and_arrive_in_order_when_it_returns(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = own_postgres.create_database("ledger")
    spool = tmp_path / "spool.db"
    written: list[str] = []
    async with PgLedger(url, spool_path=spool, write_timeout_s=1.0) as ledger:
        for n in range(5):
            await ledger.record(make(n, correlation_id=f"a{n}"))
            written.append(f"a{n}")
        await anyio.to_thread.run_sync(own_postgres.stop, "immediate")
        with anyio.fail_after(10):  # the first batch after the crash fails over; later ones go to the spool
            for n in range(20):
                await ledger.record(make(n, correlation_id=f"b{n:02}"))
                written.append(f"b{n:02}")
        figures = ledger.statistics()
        assert figures.spooling and figures.spooled_rows == 20, figures
        assert figures.problem is not None and own_postgres.password not in figures.problem
        assert [r.correlation_id for r in open_reader(spool).query(limit=None)] == written[5:]  # a ledger file
        await anyio.to_thread.run_sync(own_postgres.start)
        await eventually(lambda: not ledger.statistics().spooling, within=30)
        assert ledger.statistics().spooled_rows == 0
        await ledger.record(make(99, correlation_id="after"))
        written.append("after")
    assert [r[0] for r in pg_rows(url)] == written


async def test_a_hung_postgresql_costs_one_write_timeout_and_a_late_commit_is_not_a_duplicate(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = own_postgres.create_database("ledger")
    written: list[str] = []
    async with PgLedger(url, spool_path=tmp_path / "spool.db", write_timeout_s=0.5) as ledger:
        for n in range(3):
            await ledger.record(make(n, correlation_id=f"a{n}"))
            written.append(f"a{n}")
        with own_postgres.paused():  # connections open, nothing answers
            with anyio.fail_after(5):
                await ledger.record(make(10, correlation_id="hung"))  # waits out the write timeout, then spools
                written.append("hung")
            with anyio.fail_after(2):  # the rest go straight to the spool
                for n in range(5):
                    await ledger.record(make(20 + n, correlation_id=f"b{n}"))
                    written.append(f"b{n}")
            figures = ledger.statistics()
            assert figures.spooling and figures.spooled_rows == 6, figures
            assert figures.problem == "PostgreSQL did not answer in time"
        # resumed: the abandoned insert of "hung" may now commit, or be cancelled
        await eventually(lambda: not ledger.statistics().spooling, within=30)
    assert [r[0] for r in pg_rows(url)] == written


async def test_a_spool_left_at_shutdown_is_replayed_by_the_next_start(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = own_postgres.create_database("ledger")
    spool = tmp_path / "spool.db"
    async with PgLedger(url, spool_path=spool):
        pass
    own_postgres.stop("immediate")
    async with PgLedger(url, spool_path=spool, write_timeout_s=0.5) as ledger:  # starts while PostgreSQL is down
        assert ledger.statistics().spooling
        for n in range(3):
            await ledger.record(make(n, correlation_id=f"s{n}"))
    assert [r.correlation_id for r in open_reader(spool).query(limit=None)] == ["s0", "s1", "s2"]
    own_postgres.start()
    async with PgLedger(url, spool_path=spool) as ledger:
        await eventually(lambda: ledger.statistics().spooled_rows == 0, within=30)
        await ledger.record(make(9, correlation_id="next"))
    assert [r[0] for r in pg_rows(url)] == ["s0", "s1", "s2", "next"]
    assert open_reader(spool).query(limit=None) == []


async def test_a_batch_replayed_twice_leaves_one_row_each(pg_url: str, tmp_path: Path) -> None:
    """What a crash between a replayed chunk's commit and its deletion from the spool leads to: the row keys."""
    spool = tmp_path / "spool.db"
    async with Ledger(spool) as ledger:
        for n in range(4):
            await ledger.record(make(n, correlation_id=f"r{n}"))
    assert await copy_ledger(spool, pg_url) == (4, 0)
    async with PgLedger(pg_url, spool_path=spool) as ledger:  # the same rows, still in the spool: replayed again
        await eventually(lambda: ledger.statistics().spooled_rows == 0, within=30)
    assert [r[0] for r in pg_rows(pg_url)] == ["r0", "r1", "r2", "r3"]


# --- through a real gateway -------------------------------------------------------------------------------------


def _config(url: str, extra: str = "") -> str:
    return f"""
gateway:
  name: pg-gateway
  audit: {{url: "{url}", path: audit.db}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
{extra}"""


def _stop(server: Any) -> str:
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    return str(server.output())


async def test_calls_through_the_gateway_leave_their_row_in_postgresql_before_the_answer(
    pg_url: str, tmp_path: Path
) -> None:
    with run_gateway(_config(pg_url), tmp_path) as gateway:
        async with mcp_session(gateway.url()) as session:
            ids: list[str] = []
            for n in range(5):
                with anyio.fail_after(30):
                    result = await session.call_tool("echo", {"text": f"hi {n}"})
                assert result.meta is not None
                ids.append(result.meta[META_KEY]["id"])
                # The answer is here: its row is already committed in PostgreSQL.
                assert [r[0] for r in await anyio.to_thread.run_sync(pg_rows, pg_url)] == ids

            async def call(n: int) -> None:
                with anyio.fail_after(60):
                    await session.call_tool("echo", {"text": f"many {n}"})

            async with anyio.create_task_group() as tg:
                for n in range(40):
                    tg.start_soon(call, n)
        async with httpx2.AsyncClient() as http:
            status = (await http.get(gateway.url("/status"))).json()
        # `gateway audit` reads the ledger the config names.
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [PYTHON, "-m", "gateway", "audit", "-c", str(tmp_path / "federation.yaml"), "stats", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        output = _stop(gateway)
    assert status["ledger"] == {
        "engine": "postgresql",
        "state": "ok",
        "spooled_rows": 0,
        "pending_rows": 0,
        "rows_written": 45,
        "problem": None,
    }
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["calls"] == 45
    assert len(pg_rows(pg_url)) == 45
    assert all(secret not in output for secret in url_secrets(pg_url))


async def test_with_postgresql_stopped_under_steady_calls_no_row_is_lost(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = own_postgres.create_database("ledger")
    answered: dict[int, list[str]] = {0: [], 1: []}
    stop_calls = anyio.Event()

    with run_gateway(_config(url), tmp_path) as gateway:

        async def client(k: int) -> None:
            async with mcp_session(gateway.url()) as session:
                n = 0
                while not stop_calls.is_set():
                    with anyio.fail_after(30):  # a call may wait out one write timeout, never longer
                        result = await session.call_tool("echo", {"text": f"{k}-{n}"})
                    assert result.is_error is False and result.meta is not None
                    answered[k].append(result.meta[META_KEY]["id"])
                    n += 1

        async with httpx2.AsyncClient() as http:

            async def ledger_state() -> tuple[dict[str, Any], dict[str, float]]:
                doc = (await http.get(gateway.url("/status"))).json()["ledger"]
                text = (await http.get(gateway.url("/metrics"))).text
                gauges = {
                    s.name: s.value
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                    if s.name in ("mcp_gateway_ledger_spooling", "mcp_gateway_ledger_spooled_rows")
                }
                return doc, gauges

            async with anyio.create_task_group() as tg:
                tg.start_soon(client, 0)
                tg.start_soon(client, 1)
                await eventually(lambda: len(answered[0]) >= 10 and len(answered[1]) >= 10, within=30)
                before = len(answered[0]) + len(answered[1])
                await anyio.to_thread.run_sync(own_postgres.stop, "immediate")

                async def spooling_seen() -> bool:
                    doc, gauges = await ledger_state()
                    return (
                        doc["state"] == "spooling"
                        and doc["spooled_rows"] >= 20
                        and gauges.get("mcp_gateway_ledger_spooling") == 1.0
                    )

                await eventually(spooling_seen, within=30)
                doc, gauges = await ledger_state()
                assert doc["engine"] == "postgresql" and gauges["mcp_gateway_ledger_spooled_rows"] >= 20
                assert own_postgres.password not in json.dumps(doc)
                assert len(answered[0]) + len(answered[1]) >= before + 20  # calls kept being served
                await anyio.to_thread.run_sync(own_postgres.start)

                async def replayed() -> bool:
                    doc, gauges = await ledger_state()
                    return (
                        doc["state"] == "ok" and doc["spooled_rows"] == 0 and gauges["mcp_gateway_ledger_spooling"] == 0
                    )

                await eventually(replayed, within=60)
                settled = len(answered[0]) + len(answered[1])
                await eventually(lambda: len(answered[0]) + len(answered[1]) >= settled + 10, within=30)
                stop_calls.set()
        output = _stop(gateway)

    rows = [r[0] for r in pg_rows(url)]
    assert len(rows) == len(set(rows)), "a row was written twice"
    assert sorted(rows) == sorted(answered[0] + answered[1]), "rows lost or extra"
    position = {cid: i for i, cid in enumerate(rows)}
    for k in (0, 1):  # each client's calls, one after another, are in the ledger in that order
        assert [position[cid] for cid in answered[k]] == sorted(position[cid] for cid in answered[k])
    assert "audit.spooling" in output and "audit.spool_replayed" in output
    assert own_postgres.password not in output
    assert sqlite3.connect(tmp_path / "audit.db.spool").execute("SELECT count(*) FROM calls").fetchone() == (0,)


def test_the_config_takes_a_url_and_a_spool_path_beside_the_file_and_refuses_another_scheme(tmp_path: Path) -> None:
    file = str(tmp_path / "federation.yaml")
    text = 'gateway:\n  audit: {url: "postgresql://gw:${PW}@db/audit", spool_path: spool/a.db}\n'
    settings = parse_config(text, file=file, env={"PW": "s3cret-value"}).gateway.audit
    assert settings.url == "postgresql://gw:s3cret-value@db/audit"
    assert settings.spool_path == str(tmp_path / "spool" / "a.db")
    with pytest.raises(ConfigError) as caught:
        parse_config("gateway:\n  audit: {url: mysql://gw:pw-4c1d@db/audit}\n", file=file)
    assert caught.value.key_path == "gateway.audit.url" and caught.value.line == 2
    assert "must be a PostgreSQL URL" in str(caught.value) and "pw-4c1d" not in str(caught.value)


async def test_gateway_audit_copy_takes_its_source_and_target_from_the_config(pg_url: str, tmp_path: Path) -> None:
    (tmp_path / "federation.yaml").write_text(_config(pg_url))
    async with Ledger(tmp_path / "audit.db") as ledger:
        for n in range(3):
            await ledger.record(make(n, correlation_id=f"f{n}"))

    def copy() -> subprocess.CompletedProcess[str]:
        argv = [PYTHON, "-m", "gateway", "audit", "-c", str(tmp_path / "federation.yaml"), "copy"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    first, again = await anyio.to_thread.run_sync(copy), await anyio.to_thread.run_sync(copy)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert "copied 3 row(s)" in first.stdout and "copied 0 row(s)" in again.stdout
    assert "3 were there already" in again.stdout
    assert all(secret not in first.stdout + first.stderr for secret in url_secrets(pg_url))
    assert [r[0] for r in pg_rows(pg_url)] == ["f0", "f1", "f2"]
