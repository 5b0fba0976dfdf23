"""The configuration watcher on real files: what makes it reload, and what does not (the audit ledger's writes in the
same folder)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from gateway.core.reload import watch_config

pytestmark = pytest.mark.anyio


class Reloads:
    """The reasons ``watch_config`` reloaded for, and an event for the next one."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.reloaded = anyio.Event()

    async def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.reloaded.set()

    async def once_after(self, change: Callable[[], object]) -> None:
        """Make ``change`` and wait for exactly one reload."""
        self.reloaded = anyio.Event()
        count = len(self.reasons)
        change()
        with anyio.fail_after(10):
            await self.reloaded.wait()
        assert self.reasons[count:] == ["file changed"]


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "federation.yaml"
    config.write_text("version: 1\n")
    return config


async def test_a_write_a_rename_over_and_a_recreated_file_each_reload_once(tmp_path: Path) -> None:
    config = _config(tmp_path)
    reload = Reloads()

    def rename_over() -> None:
        replacement = tmp_path / "federation.yaml.new"
        replacement.write_text("version: 1\n# saved by renaming a new file over the old one\n")
        os.replace(replacement, config)

    def recreate() -> None:
        config.unlink()
        config.write_text("version: 1\n# deleted and written again\n")

    async with anyio.create_task_group() as tg:
        await tg.start(watch_config, config, reload)
        await reload.once_after(lambda: config.write_text("version: 1\n# edited in place\n"))
        await reload.once_after(rename_over)
        await reload.once_after(recreate)
        tg.cancel_scope.cancel()
    assert reload.reasons == ["file changed"] * 3


async def test_the_audit_ledgers_commits_beside_the_file_do_not_reload_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    reload = Reloads()

    conn = sqlite3.connect(tmp_path / "audit.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE calls (n INTEGER)")
    async with anyio.create_task_group() as tg:
        await tg.start(watch_config, config, reload)
        for n in range(200):  # about a second of commits: several polls see the folder change under them
            conn.execute("INSERT INTO calls VALUES (?)", (n,))
            await anyio.sleep(0.005)  # a steady rate of commits, not synchronisation
        assert reload.reasons == []
        await reload.once_after(lambda: config.write_text("version: 1\n# edited\n"))
        tg.cancel_scope.cancel()
    conn.close()
    assert reload.reasons == ["file changed"]  # the edit, once; none of the ledger's writes
