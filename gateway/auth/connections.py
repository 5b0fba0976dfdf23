"""The tokens the gateway holds for callers at OAuth-protected downstream servers (``auth: {oauth: ...}``), sealed.

One row per (server, caller): the access token, the refresh token, where to refresh it (token endpoint, resource,
the client it was issued to) and when it expires, as one JSON document encrypted with Fernet (AES-128-CBC and
HMAC-SHA256) under a key derived (HKDF-SHA256) from the gateway's state key (auth/keys.py). Several state keys (a
rotation): the first seals, every one opens, and a row is sealed again under the first at its next write. The
server's name and the caller's are sealed inside the document too, so a row copied onto another caller's does not
open. One row per server with caller ``""`` holds the client the gateway registered there (DCR), shared by callers.

The rows live where the audit ledger does (ledger/token_rows.py): its PostgreSQL database when ``gateway.audit.url``
is set, else its SQLite file, so a restart keeps them and every replica serves them; with the ledger off, in memory.
``watch()`` tells this process of the rows other processes wrote or deleted (a sign-in or a revocation through
another replica) within ``WATCH_S``. Nothing here logs: a caller's name, a server's and times are what
``connected()`` tells, never a token.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import structlog
from anyio.abc import TaskStatus
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.errors import AuditError
from gateway.ledger.token_rows import TokenRow, open_token_rows

__all__ = ["CLIENT_ROW", "OPEN_CALLER", "Connection", "Connections", "SignInFailed"]

CLIENT_ROW = ""
"""The caller name of a server's registered-client row."""
OPEN_CALLER = "local"
"""Who signs in on a gateway without tokens (open, loopback only): the browser at its pages and the unnamed caller of
its MCP endpoint alike, so a sign-in made on the page serves the calls (never the client row's ``""``)."""
_INFO = b"mcp-gateway/downstream-tokens/v1"

WATCH_S = 5.0
"""How often ``watch()`` reads the rows for what other processes changed."""

log = structlog.get_logger("gateway.signin")


class SignInFailed(Exception):
    """A sign-in to a downstream could not start or finish; the message is plain words, never a token or a code."""


@dataclass(frozen=True)
class Connection:
    """Who is connected to what, and until when: what the status page and ``gateway connections`` show."""

    backend: str
    caller: str
    connected_at: float
    expires_at: float | None
    refreshable: bool


def _fernet(key: bytes) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(key)
    return Fernet(base64.urlsafe_b64encode(derived))


class Connections:
    """The sealed token rows (see the module docstring) at ``target``: a PostgreSQL URL, a SQLite file, or memory
    (None). Blocking work runs in a worker thread; PostgreSQL failing raises ``AuditError`` (no password)."""

    def __init__(self, target: str | None, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("at least one state key is needed to seal downstream tokens")
        self._box = MultiFernet([_fernet(key) for key in keys])
        self._rows = open_token_rows(target)
        self._listeners: list[Callable[[str, str, bool], None]] = []
        self._seen: dict[tuple[str, str], float] | None = None

    def close(self) -> None:
        self._rows.close()

    def on_change(self, listener: Callable[[str, str, bool], None]) -> None:
        """``listener(backend, caller, removed)`` is told of every write and delete made through this object, and
        (while ``watch()`` runs) of those other processes made."""
        self._listeners.append(listener)

    def _told(self, backend: str, caller: str, removed: bool = False) -> None:
        for listener in self._listeners:
            listener(backend, caller, removed)

    # -- sealing ---------------------------------------------------------------------------------------------------

    def _seal(self, backend: str, caller: str, document: dict[str, Any]) -> bytes:
        return self._box.encrypt(json.dumps({"b": backend, "c": caller, "d": document}).encode())

    def _open(self, backend: str, caller: str, sealed: bytes) -> dict[str, Any] | None:
        try:
            outer = json.loads(self._box.decrypt(sealed))
        except (InvalidToken, ValueError):
            return None  # sealed under a key no longer configured, or tampered with: as if absent
        if not isinstance(outer, dict) or outer.get("b") != backend or outer.get("c") != caller:
            return None
        document = outer.get("d")
        return document if isinstance(document, dict) else None

    # -- reads and writes ------------------------------------------------------------------------------------------

    async def _read(self, backend: str | None = None, caller: str | None = None) -> list[TokenRow]:
        return await anyio.to_thread.run_sync(self._rows.read, backend, caller)

    async def get(self, backend: str, caller: str) -> dict[str, Any] | None:
        """The document stored for ``caller`` at ``backend``, None when there is none (or it does not open)."""
        rows = await self._read(backend, caller)
        return self._open(backend, caller, rows[0][2]) if rows else None

    async def put(self, backend: str, caller: str, document: dict[str, Any], expires_at: float | None) -> None:
        """Store ``document`` for ``caller`` at ``backend`` (sealed), replacing what was there."""
        now = time.time()
        row = (backend, caller, self._seal(backend, caller, document), expires_at, now, now)
        await anyio.to_thread.run_sync(self._rows.write, row)
        if self._seen is not None:
            self._seen[backend, caller] = now
        self._told(backend, caller)

    @asynccontextmanager
    async def exclusive(self, backend: str, caller: str) -> AsyncIterator[None]:
        """Hold ``caller``'s row at ``backend`` against other processes doing the same (on PostgreSQL: a replica
        refreshing the same token waits, then reads what this one wrote).

        Raises:
            AuditError: PostgreSQL cannot be reached, or another process held the row too long.
        """
        release = await anyio.to_thread.run_sync(self._rows.exclusive, backend, caller)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(release)

    async def delete(self, backend: str | None, caller: str) -> list[str]:
        """Forget ``caller``'s tokens at ``backend`` (every server when None); the servers it was connected to."""
        gone = await anyio.to_thread.run_sync(self._rows.delete, backend, caller) if caller != CLIENT_ROW else []
        for name in gone:
            if self._seen is not None:
                self._seen.pop((name, caller), None)
            self._told(name, caller, removed=True)
        return gone

    async def connected(self, caller: str | None = None, backend: str | None = None) -> list[Connection]:
        """Who is connected to what (one caller's, one server's, or every row), never a token."""
        found = []
        for name, who, sealed, expires, connected, _ in await self._read(backend, caller):
            if who == CLIENT_ROW:
                continue
            document = self._open(name, who, sealed) or {}
            refreshable = bool((document.get("token") or {}).get("refresh_token"))
            found.append(Connection(name, who, connected, expires, refreshable))
        return found

    async def latest(self, backend: str, exclude: Sequence[str] = ()) -> str | None:
        """The caller whose tokens at ``backend`` were written last (besides ``exclude``), or None."""
        rows = sorted(await self._read(backend), key=lambda row: row[5], reverse=True)
        return next((row[1] for row in rows if row[1] != CLIENT_ROW and row[1] not in exclude), None)

    async def watch(self, every: float = WATCH_S, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, every ``every`` seconds: tell the listeners of the rows other processes wrote or
        deleted since the last look (nothing to do for rows in memory); started once the first look is done. A look
        that fails is tried again later."""
        if not self._rows.shared:
            task_status.started()
            return
        while True:
            try:
                stamps = await anyio.to_thread.run_sync(self._rows.stamps)
            except AuditError as exc:
                log.warning("signin.tokens_unreadable", reason=str(exc))
            else:
                now = {(name, who): updated for name, who, updated in stamps if who != CLIENT_ROW}
                before, self._seen = self._seen, now
                for key, updated in now.items() if before is not None else ():
                    if before is not None and before.get(key) != updated:
                        self._told(*key)  # signed in, or refreshed, through another process
                for key in set(before or ()) - set(now):
                    self._told(*key, removed=True)  # signed out through another process
            if before is None:
                task_status.started()
            await anyio.sleep(every)
