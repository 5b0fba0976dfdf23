"""The configuration watcher on real files: what makes it reload, and what does not (the audit ledger's writes in the
same folder)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from gateway.reload import watch_config

pytestmark = pytest.mark.anyio


async def test_a_write_a_rename_over_and_a_recreated_file_each_reload_once(tmp_path: Path) -> None:
    config = tmp_path / "federation.yaml"
    config.write_text("version: 1\n")
    reasons: list[str] = []
    reloaded = anyio.Event()

    async def reload(reason: str) -> None:
        reasons.append(reason)
        reloaded.set()

    async def reloads_once_after(change: Callable[[], object]) -> None:
        nonlocal reloaded
        reloaded = anyio.Event()
        count = len(reasons)
        change()
        with anyio.fail_after(10):
            await reloaded.wait()
        assert reasons[count:] == ["file changed"]

    def rename_over() -> None:
        replacement = tmp_path / "federation.yaml.new"
        replacement.write_text("version: 1\n# saved by renaming a new file over the old one\n")
        os.replace(replacement, config)

    def recreate() -> None:
        config.unlink()
        config.write_text("version: 1\n# deleted and written again\n")

    async with anyio.create_task_group() as tg:
        await tg.start(watch_config, config, reload)
        await reloads_once_after(lambda: config.write_text("version: 1\n# edited in place\n"))
        await reloads_once_after(rename_over)
        await reloads_once_after(recreate)
        tg.cancel_scope.cancel()
    assert reasons == ["file changed"] * 3


async def test_the_audit_ledgers_commits_beside_the_file_do_not_reload_it(tmp_path: Path) -> None:
    config = tmp_path / "federation.yaml"
    config.write_text("version: 1\n")
    reasons: list[str] = []
    reloaded = anyio.Event()

    async def reload(reason: str) -> None:
        reasons.append(reason)
        reloaded.set()

    conn = sqlite3.connect(tmp_path / "audit.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE calls (n INTEGER)")
    async with anyio.create_task_group() as tg:
        await tg.start(watch_config, config, reload)
        for n in range(200):  # about a second of commits: several polls see the folder change under them
            conn.execute("INSERT INTO calls VALUES (?)", (n,))
            await anyio.sleep(0.005)  # a steady rate of commits, not synchronisation
        assert reasons == []
        config.write_text("version: 1\n# edited\n")
        with anyio.fail_after(10):
            await reloaded.wait()
        tg.cancel_scope.cancel()
    conn.close()
    assert reasons == ["file changed"]  # the edit, once; none of the ledger's writes
