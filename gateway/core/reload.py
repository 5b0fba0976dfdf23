"""Hot reload: what an edit of federation.yaml changes, and the watcher that notices the edit.

``plan_reload(old, new)`` compares two validated federations backend by backend: a backend whose configuration is
equal keeps its session (``unchanged``), one that disappeared is drained and stopped (``removed``), a new one starts
(``added``), and one whose configuration differs is restarted (``changed``). Everything else (routes, naming, notes,
client rules) lives in the catalog, which the runtime rebuilds and swaps whole. A few gateway settings are bound at
startup (the listen address, the tokens variable, the ledger, tracing): a change there is reported in
``restart_needed`` and otherwise ignored until the next start.

``check_reload(old, new)`` refuses, with a ``ConfigError``, an edit that would remove every backend (an empty or
truncated save) unless the new file says ``gateway.allow_no_backends: true``.

``watch_config(path, reload)`` calls ``reload()`` whenever the file changes (editors that save by writing a new file
and renaming it over the old one included) or the process receives SIGHUP.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import structlog
from pydantic import BaseModel

from gateway.config import Federation
from gateway.errors import ConfigError

__all__ = ["ReloadPlan", "backend_specs", "check_reload", "plan_reload", "watch_config"]

log = structlog.get_logger("gateway.reload")

POLL_INTERVAL_S = 0.25  # how often the watcher looks at the file
SETTLE_S = 0.2  # how long a changed file must stay unchanged before it is reloaded
RESTART_ONLY = ("listen", "auth", "audit", "tracing", "name")
"""``gateway.*`` settings read once at startup."""


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    restart_needed: tuple[str, ...]

    def summary(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in (("added", self.added), ("removed", self.removed), ("changed", self.changed),
                                        ("restart_needed", self.restart_needed)) if v}  # fmt: skip


def backend_specs(config: Federation) -> dict[str, tuple[str, BaseModel]]:
    """Every backend's name -> (kind of section, its configuration), in declaration order."""
    specs: dict[str, tuple[str, BaseModel]] = {}
    for name, server in config.servers.items():
        specs[name] = ("server", server)
    for name, adapter in config.adapters.items():
        specs[name] = ("adapter", adapter)
    if config.wiki is not None:
        specs[config.wiki.name] = ("wiki", config.wiki)
    return specs


def plan_reload(old: Federation, new: Federation) -> ReloadPlan:
    before, after = backend_specs(old), backend_specs(new)
    added = tuple(name for name in after if name not in before)
    removed = tuple(name for name in before if name not in after)
    common = [name for name in after if name in before]
    changed = tuple(name for name in common if before[name] != after[name])
    unchanged = tuple(name for name in common if before[name] == after[name])
    restart = tuple(f"gateway.{key}" for key in RESTART_ONLY if getattr(old.gateway, key) != getattr(new.gateway, key))
    return ReloadPlan(added, removed, changed, unchanged, restart)


def check_reload(old: Federation, new: Federation) -> None:
    """Refuse an edit that would remove every backend, unless the new file allows it explicitly.

    Raises:
        ConfigError: naming the file, with how to say that no backends is what is wanted.
    """
    if not backend_specs(old) or backend_specs(new) or new.gateway.allow_no_backends:
        return
    what = (
        "the file is empty" if not new.model_fields_set else "the file declares no backends (servers, adapters, wiki)"
    )
    count = len(backend_specs(old))
    removed = "the only backend" if count == 1 else f"all {count} backends"
    raise ConfigError(
        new.source,
        "",
        None,
        f"{what}: applying it would remove {removed}, so it is taken for an unfinished or truncated save and "
        "refused; to serve without backends, set `gateway.allow_no_backends: true`",
    )


def _signature(target: Path) -> tuple[int, int, int, int, int] | None:
    """What tells one version of the file from another: its inode (a save that renames a new file over the old one
    changes it), size, and modification and change times (in ns); None while the file is missing."""
    try:
        st = os.stat(target)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


async def watch_config(
    path: str | Path,
    reload: Callable[[str], Awaitable[None]],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``reload(reason)`` when ``path`` changes on disk or on SIGHUP, until cancelled. With ``tg.start`` it
    returns once the file's current version is known (a change from then on is seen)."""
    target = Path(os.path.abspath(path))  # noqa: ASYNC240 - a string operation, no file system access

    async def on_file(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # Poll the file, not a watch of its folder: the folder usually holds the audit ledger too (audit.path
        # defaults to audit.db beside the file), and a folder watch woke the watcher thread for every commit's WAL
        # write, costing each call about 0.15 ms of CPU. A stat per POLL_INTERVAL_S costs nothing measurable, and a
        # save that replaces the file (a new inode) is seen like one that writes it. A change is reloaded once the
        # file has stayed the same for SETTLE_S, so a save written in several steps is read whole.
        seen = await anyio.to_thread.run_sync(_signature, target)
        task_status.started()
        while True:
            await anyio.sleep(POLL_INTERVAL_S)
            now = await anyio.to_thread.run_sync(_signature, target)
            if now == seen:
                continue
            while True:
                await anyio.sleep(SETTLE_S)
                settled = await anyio.to_thread.run_sync(_signature, target)
                if settled == now:
                    break
                now = settled
            seen = now
            await reload("file changed")

    async def on_sighup() -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                await reload("SIGHUP")

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_sighup)
        await tg.start(on_file)
        task_status.started()
