"""The sealed store of callers' downstream tokens (gateway/auth/connections.py): what it keeps, what it refuses to
open, and key rotation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from gateway.auth.connections import CLIENT_ROW, Connections
from gateway.errors import AuditError
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.anyio

OLD, NEW = b"o" * 32, b"n" * 32
DOCUMENT = {"token": {"access_token": "at-secret-1", "refresh_token": "rt-secret-1"}, "expires_at": 1e12}


async def test_a_row_is_sealed_on_disk_and_opens_for_its_own_server_and_caller_only(tmp_path: Path) -> None:
    path = str(tmp_path / "audit.db")
    store = Connections(path, [OLD])
    await store.put("remote", "alice", DOCUMENT, 1e12)
    assert await store.get("remote", "alice") == DOCUMENT
    store.close()
    raw = sqlite3.connect(path).execute("SELECT sealed FROM downstream_tokens").fetchone()[0]
    assert b"at-secret-1" not in bytes(raw) and b"rt-secret-1" not in bytes(raw)
    # a row copied onto another caller's name does not open for them
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO downstream_tokens SELECT backend, 'mallory', sealed, expires_at, connected_at, "
        "updated_at FROM downstream_tokens WHERE caller = 'alice'"
    )
    db.commit()
    store = Connections(path, [OLD])
    assert await store.get("remote", "mallory") is None
    assert [(c.caller, c.refreshable) for c in await store.connected("alice")] == [("alice", True)]


async def test_rotation_the_first_key_seals_every_key_opens_and_a_dropped_key_opens_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "audit.db")
    old = Connections(path, [OLD])
    await old.put("remote", "alice", DOCUMENT, None)
    rotated = Connections(path, [NEW, OLD])
    assert await rotated.get("remote", "alice") == DOCUMENT
    await rotated.put("remote", "alice", DOCUMENT, None)  # sealed again, under the new key
    assert await Connections(path, [NEW]).get("remote", "alice") == DOCUMENT
    assert await Connections(path, [OLD]).get("remote", "alice") is None


async def test_revocation_forgets_and_tells_and_the_client_row_is_no_connection(tmp_path: Path) -> None:
    store = Connections(None, [OLD])
    told: list[tuple[str, str, bool]] = []
    store.on_change(lambda backend, caller, removed: told.append((backend, caller, removed)))
    await store.put("remote", CLIENT_ROW, {"client": {"client_id": "gw"}}, None)
    await store.put("remote", "alice", DOCUMENT, None)
    await store.put("other", "alice", DOCUMENT, None)
    assert [c.backend for c in await store.connected()] == ["other", "remote"]
    assert await store.latest("remote") == "alice"
    assert await store.delete(None, "alice") == ["other", "remote"]
    assert await store.connected() == [] and await store.get("remote", CLIENT_ROW) is not None
    assert told[-2:] == [("other", "alice", True), ("remote", "alice", True)]


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgresql", marks=pytest.mark.spawns)])
async def test_two_stores_on_one_ledger_share_rows_and_the_watch_tells_the_other(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two processes' stores on one ledger (its file, or its PostgreSQL database): what one writes the other reads
    and, through ``watch()``, is told of; a delete through one is told to the other as a removal."""
    target = str(tmp_path / "audit.db") if engine == "sqlite" else request.getfixturevalue("pg_url")
    one, other = Connections(target, [NEW, OLD]), Connections(target, [NEW])
    told: list[tuple[str, str, bool]] = []
    news = anyio.Event()

    def listener(backend: str, caller: str, removed: bool) -> None:
        told.append((backend, caller, removed))
        news.set()

    other.on_change(listener)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(other.watch, 0.05)  # after its first look: what is there already is not news
            await one.put("remote", CLIENT_ROW, {"client": {"client_id": "gw"}}, None)  # no caller: not told
            await one.put("remote", "alice", DOCUMENT, 1e12)
            await news.wait()
            assert await other.get("remote", "alice") == DOCUMENT
            assert await other.latest("remote") == "alice"
            news = anyio.Event()
            assert await one.delete("remote", "alice") == ["remote"]
            await news.wait()
            tg.cancel_scope.cancel()
    assert told == [("remote", "alice", False), ("remote", "alice", True)]
    assert await other.get("remote", "alice") is None and await other.connected() == []
    one.close(), other.close()


async def test_an_unreachable_postgresql_is_said_in_plain_words_without_its_password() -> None:
    store = Connections("postgresql://gw:pw-not-shown@127.0.0.1:1/ledger", [OLD])
    with pytest.raises(AuditError) as failed:
        await store.get("remote", "alice")
    assert "Cannot reach the tokens in the ledger at postgresql://" in str(failed.value)
    assert "pw-not-shown" not in str(failed.value)
    store.close()


@pytest.mark.spawns
async def test_a_replica_refreshing_a_token_holds_its_row_and_the_other_waits_then_reads_the_fresh_one(
    pg_url: str,
) -> None:
    """Two replicas' stores on one PostgreSQL database: while one holds alice's row (refreshing her token, which a
    rotating refresh token allows only once), the other's hold waits for it (its lock shows as waiting in
    ``pg_locks``), then reads what the first wrote; the first's write was not blocked by the other's wait."""
    import psycopg

    one, other = Connections(pg_url, [NEW]), Connections(pg_url, [NEW])
    await one.put("remote", "alice", DOCUMENT, 1e12)
    fresh = {**DOCUMENT, "token": {"access_token": "at-secret-2", "refresh_token": "rt-secret-2"}}
    seen: list[dict[str, object] | None] = []

    async def second() -> None:
        async with other.exclusive("remote", "alice"):
            seen.append(await other.get("remote", "alice"))

    async def waiting() -> bool:
        def count() -> int:
            with psycopg.connect(pg_url) as conn:
                found = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                return int(found.fetchone()[0])  # type: ignore[index]

        return await anyio.to_thread.run_sync(count) > 0

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async with one.exclusive("remote", "alice"):
                tg.start_soon(second)
                await eventually(waiting, within=10)  # the other replica waits for the row
                assert seen == []
                await one.put("remote", "alice", fresh, 1e12)  # the refresh's write is not blocked meanwhile
        assert seen == [fresh]
    one.close(), other.close()
