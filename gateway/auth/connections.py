"""The tokens the gateway holds for callers at OAuth-protected downstream servers (``auth: {oauth: ...}``), sealed.

One row per (server, caller): the access token, the refresh token, where to refresh it (token endpoint, resource,
the client it was issued to) and when it expires, as one JSON document encrypted with Fernet (AES-128-CBC and
HMAC-SHA256) under a key derived (HKDF-SHA256) from the gateway's state key (auth/keys.py). Several state keys (a
rotation): the first seals, every one opens, and a row is sealed again under the first at its next write. The
server's name and the caller's are sealed inside the document too, so a row copied onto another caller's does not
open. One row per server with caller ``""`` holds the client the gateway registered there (DCR), shared by callers.

The rows live in the audit ledger's SQLite file (table ``downstream_tokens``), so a restart keeps them and every
process reading that file serves them; with the ledger off, in memory. Nothing here logs: a caller's name, a
server's and times are what ``connected()`` tells, never a token.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["CLIENT_ROW", "Connection", "Connections", "SignInFailed"]

CLIENT_ROW = ""
"""The caller name of a server's registered-client row."""
_INFO = b"mcp-gateway/downstream-tokens/v1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS downstream_tokens (
    backend TEXT NOT NULL,
    caller TEXT NOT NULL,
    sealed BLOB NOT NULL,
    expires_at REAL,
    connected_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (backend, caller)
)
"""


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
    """The sealed token rows (see the module docstring). Blocking SQLite work runs in a worker thread."""

    def __init__(self, path: str | None, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("at least one state key is needed to seal downstream tokens")
        self._box = MultiFernet([_fernet(key) for key in keys])
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, timeout=10.0, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute(_SCHEMA)
        self._listeners: list[Callable[[str, str, bool], None]] = []

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def on_change(self, listener: Callable[[str, str, bool], None]) -> None:
        """``listener(backend, caller, removed)`` is told of every write and delete made through this object."""
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

    async def get(self, backend: str, caller: str) -> dict[str, Any] | None:
        """The document stored for ``caller`` at ``backend``, None when there is none (or it does not open)."""

        def read() -> bytes | None:
            with self._lock:
                row = self._db.execute(
                    "SELECT sealed FROM downstream_tokens WHERE backend = ? AND caller = ?", (backend, caller)
                ).fetchone()
            return bytes(row[0]) if row else None

        sealed = await anyio.to_thread.run_sync(read)
        return None if sealed is None else self._open(backend, caller, sealed)

    async def put(self, backend: str, caller: str, document: dict[str, Any], expires_at: float | None) -> None:
        """Store ``document`` for ``caller`` at ``backend`` (sealed), replacing what was there."""
        sealed = self._seal(backend, caller, document)
        now = time.time()

        def write() -> None:
            with self._lock:
                self._db.execute(
                    "INSERT INTO downstream_tokens (backend, caller, sealed, expires_at, connected_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (backend, caller) DO UPDATE SET sealed = excluded.sealed, "
                    "expires_at = excluded.expires_at, updated_at = excluded.updated_at",
                    (backend, caller, sealed, expires_at, now, now),
                )

        await anyio.to_thread.run_sync(write)
        self._told(backend, caller)

    async def delete(self, backend: str | None, caller: str) -> list[str]:
        """Forget ``caller``'s tokens at ``backend`` (every server when None); the servers it was connected to."""

        def remove() -> list[str]:
            where, args = ("backend = ? AND caller = ?", (backend, caller)) if backend else ("caller = ?", (caller,))
            with self._lock:
                rows = self._db.execute(f"SELECT backend FROM downstream_tokens WHERE {where}", args).fetchall()
                self._db.execute(f"DELETE FROM downstream_tokens WHERE {where}", args)
            return sorted(str(row[0]) for row in rows)

        gone = await anyio.to_thread.run_sync(remove) if caller != CLIENT_ROW else []
        for name in gone:
            self._told(name, caller, removed=True)
        return gone

    async def connected(self, caller: str | None = None, backend: str | None = None) -> list[Connection]:
        """Who is connected to what (one caller's, one server's, or every row), never a token."""

        def rows() -> list[tuple[Any, ...]]:
            query = "SELECT backend, caller, sealed, expires_at, connected_at FROM downstream_tokens WHERE caller != ?"
            args: list[Any] = [CLIENT_ROW]
            if caller is not None:
                query, args = query + " AND caller = ?", [*args, caller]
            if backend is not None:
                query, args = query + " AND backend = ?", [*args, backend]
            with self._lock:
                return list(self._db.execute(query + " ORDER BY backend, caller", args).fetchall())

        found = []
        for name, who, sealed, expires, connected in await anyio.to_thread.run_sync(rows):
            document = self._open(name, who, bytes(sealed)) or {}
            refreshable = bool((document.get("token") or {}).get("refresh_token"))
            found.append(Connection(name, who, float(connected), expires, refreshable))
        return found

    async def latest(self, backend: str, exclude: Sequence[str] = ()) -> str | None:
        """The caller whose tokens at ``backend`` were written last (besides ``exclude``), or None."""

        def read() -> str | None:
            with self._lock:
                rows = self._db.execute(
                    "SELECT caller FROM downstream_tokens WHERE backend = ? AND caller != ? ORDER BY updated_at DESC",
                    (backend, CLIENT_ROW),
                ).fetchall()
            return next((str(row[0]) for row in rows if row[0] not in exclude), None)

        return await anyio.to_thread.run_sync(read)
