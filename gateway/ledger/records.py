"""What the ledger keeps: one row per request that reached a backend, the same in either engine.

``AuditRecord`` (with its provider chain of ``AuditStep``) is the row; a row never holds a call's arguments, only
their digest (``args_hash``) and the previews the config asks for (``arg_previews``). ``MIGRATIONS`` is the one
schema both engines apply, and ``encode_row``/``decode_row`` turn a record into the ``COLUMNS`` they store and back;
``encode_row`` refuses a status or kind outside ``STATUSES`` and ``KINDS``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.errors import AuditError

STATUSES: Final = (
    "ok",
    "error",
    "degraded",
    "refused",
    "cancelled",
    "timeout",
    "unknown_tool",
    "invalid_params",
    "internal_error",
    "input_required",  # a multi-round-trip round that ended asking the client for input (SEP-2322)
    "task",  # a tools/call answered with a task the backend runs on (the tasks extension, SEP-2663)
)
ERROR_STATUSES: Final = frozenset({"error", "timeout", "internal_error"})
"""The statuses counted as errors: the tool did not answer. ``refused`` is policy, ``cancelled`` the client."""
REFUSED_STATUSES: Final = frozenset({"refused", "unknown_tool", "invalid_params"})
"""The statuses of a request refused before any tool answered it (a policy, a limit, the context gate, an unknown
tool, arguments refused): counted apart, outside error rates and latencies, which are the tools'."""

KINDS: Final = (
    "tools/call",
    "resources/read",
    "prompts/get",
    "completion/complete",
    "resources/subscribe",
    "resources/unsubscribe",
    "pins/pending",
    "pins/approve",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
)
"""What a row can be: the MCP method of the request that reached a backend (``tasks/get`` only the one that first
found a task ended, its status the task's end; ``tasks/cancel`` each cancellation asked; any ``tasks/*`` refused or
unanswered); or ``pins/pending`` (a
server's tool seen new or changed since approval: ``tool`` is ``server/tool``) and ``pins/approve`` (its approval:
``caller`` is who approved)."""

# Both engines apply this one list (PostgreSQL translates SQLite's column types: INTEGER PRIMARY KEY AUTOINCREMENT,
# INTEGER and REAL): write each statement in SQL that SQLite and PostgreSQL both accept. MIGRATIONS[i] takes a
# database from schema version i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # v0 -> v1: the calls table.
    (
        """CREATE TABLE calls (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            ts REAL NOT NULL,
            correlation_id TEXT NOT NULL,
            session_id TEXT,
            client_name TEXT,
            client_version TEXT,
            caller TEXT,
            tool TEXT NOT NULL,
            chain TEXT NOT NULL,
            status TEXT NOT NULL,
            duration_ms REAL NOT NULL,
            result_bytes INTEGER NOT NULL,
            arg_preview TEXT NOT NULL,
            args_hash TEXT NOT NULL
        )""",
        "CREATE INDEX calls_ts ON calls (ts)",
        "CREATE INDEX calls_tool ON calls (tool, ts)",
        "CREATE INDEX calls_status ON calls (status, ts)",
    ),
    # v1 -> v2: what kind of request each row is (rows written before it were all tools/call).
    (
        "ALTER TABLE calls ADD COLUMN kind TEXT NOT NULL DEFAULT 'tools/call'",
        "CREATE INDEX calls_kind ON calls (kind, ts)",
    ),
    # v2 -> v3: tokens in (the arguments) and out (the answer as delivered); NULL in rows written before it.
    (
        "ALTER TABLE calls ADD COLUMN tokens_in INTEGER",
        "ALTER TABLE calls ADD COLUMN tokens_out INTEGER",
        "CREATE INDEX calls_caller ON calls (caller, ts)",
    ),
    # v3 -> v4: credentials found in flight (core/leaks.py), a JSON list of [kind, place, action]; NULL: none.
    ("ALTER TABLE calls ADD COLUMN secrets TEXT",),
    # v4 -> v5: approved tool definitions (gateway/core/pins.py, ledger/pins.py), one per server and tool.
    (
        """CREATE TABLE pins (
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            digest TEXT NOT NULL,
            definition TEXT NOT NULL,
            approved_by TEXT,
            approved_at REAL NOT NULL,
            PRIMARY KEY (server, tool)
        )""",
    ),
)

COLUMNS: Final = (
    "ts, correlation_id, session_id, client_name, client_version, caller, tool, chain, status, duration_ms,"
    " result_bytes, arg_preview, args_hash, kind, tokens_in, tokens_out, secrets"
)
"""The stored columns, in the order of ``encode_row``'s tuple (the row id aside)."""
COLUMN_NAMES: Final = tuple(name.strip() for name in COLUMNS.split(","))


@dataclass(frozen=True, slots=True)
class AuditStep:
    """One rung of a call's provider chain: who was asked, in which variant, and how it went."""

    provider: str
    variant: str | None
    outcome: str  # "ok", or a BackendError.outcome: "timeout", "unavailable", "thin", ...
    reason: str | None
    duration_ms: float


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One request as the ledger keeps it. ``caller`` names the token (a name or a hash), never the token; ``tool``
    is what the request named: the published tool, prompt or resource URI."""

    ts: float  # unix time the call arrived
    correlation_id: str  # one id for every step of the fallback chain
    session_id: str | None  # 12 hex digits of the session id's SHA-256 (server.session_digest), never the id
    client_name: str | None
    client_version: str | None
    caller: str | None
    tool: str
    chain: tuple[AuditStep, ...]
    status: str  # one of STATUSES
    duration_ms: float
    result_bytes: int
    arg_preview: Mapping[str, str]
    args_hash: str
    kind: str = "tools/call"  # one of KINDS
    tokens_in: int | None = None  # the arguments' tokens (search/tokens.py), None when not counted
    tokens_out: int | None = None  # the answer's tokens as the client received it (after any budget's cut)
    secrets: tuple[tuple[str, str, str], ...] = ()  # credentials found in flight: (kind, place, action), no value


# Built once: json.dumps with any option builds a new JSONEncoder on every call (a few microseconds per row).
_canonical_json: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_compact_json: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def canonical_json(arguments: Mapping[str, Any]) -> str:
    """The arguments' canonical JSON (sorted keys, no spaces), as ``args_hash`` digests it."""
    return _canonical_json(arguments if type(arguments) is dict else dict(arguments))


def args_hash(arguments: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of the arguments' canonical JSON (sorted keys, no spaces, UTF-8).

    Equal arguments hash equally whatever their key order, so repeated calls can be matched without storing them.
    """
    plain = arguments if type(arguments) is dict else dict(arguments)
    return hashlib.sha256(_canonical_json(plain).encode("utf-8")).hexdigest()[:16]


def arg_previews(arguments: Mapping[str, Any], spec: Mapping[str, int]) -> dict[str, str]:
    """Previews of the arguments ``spec`` lists (``{name: max_chars}``), in ``spec`` order; all others are left out.

    A string is kept as is, any other value as its canonical JSON. A value longer than ``max_chars`` keeps its first
    ``max_chars`` characters followed by "…" so a reader can tell it was cut; ``0`` means no limit (the config's
    ``mode: 0`` keeps a short enum whole). Arguments the call did not pass have no preview.

    Raises:
        ValueError: a limit is negative.
    """
    previews: dict[str, str] = {}
    for name, limit in spec.items():
        if limit < 0:
            raise ValueError(f"The preview length of argument {name!r} must be 0 (no limit) or more, not {limit}.")
        if name not in arguments:
            continue
        value = arguments[name]
        text = value if isinstance(value, str) else _canonical_json(value)
        previews[name] = text[:limit] + "…" if 0 < limit < len(text) else text
    return previews


def encode_row(rec: AuditRecord) -> tuple[Any, ...]:
    """``rec`` as the values of ``COLUMNS``: the chain and the previews as compact JSON.

    Raises:
        AuditError: the status is not one of ``STATUSES`` or the kind not one of ``KINDS``.
    """
    if rec.status not in STATUSES:
        raise AuditError(f"Audit status {rec.status!r} is not one of {', '.join(STATUSES)}.")
    if rec.kind not in KINDS:
        raise AuditError(f"Audit kind {rec.kind!r} is not one of {', '.join(KINDS)}.")
    chain = [
        {"provider": s.provider, "variant": s.variant, "outcome": s.outcome, "reason": s.reason, "ms": s.duration_ms}
        for s in rec.chain
    ]
    return (
        rec.ts,
        rec.correlation_id,
        rec.session_id,
        rec.client_name,
        rec.client_version,
        rec.caller,
        rec.tool,
        _compact_json(chain),
        rec.status,
        rec.duration_ms,
        rec.result_bytes,
        _compact_json(dict(rec.arg_preview)) if rec.arg_preview else "{}",
        rec.args_hash,
        rec.kind,
        rec.tokens_in,
        rec.tokens_out,
        _compact_json([list(found) for found in rec.secrets]) if rec.secrets else None,
    )


def decode_row(row: Sequence[Any]) -> AuditRecord:
    """The record of a row of ``COLUMNS`` values, as either engine returns it."""
    chain = tuple(
        AuditStep(
            provider=s["provider"], variant=s["variant"], outcome=s["outcome"], reason=s["reason"], duration_ms=s["ms"]
        )
        for s in json.loads(row[7])
    )
    return AuditRecord(
        ts=row[0],
        correlation_id=row[1],
        session_id=row[2],
        client_name=row[3],
        client_version=row[4],
        caller=row[5],
        tool=row[6],
        chain=chain,
        status=row[8],
        duration_ms=row[9],
        result_bytes=row[10],
        arg_preview=json.loads(row[11]),
        args_hash=row[12],
        kind=row[13],
        tokens_in=row[14],
        tokens_out=row[15],
        secrets=tuple(tuple(found) for found in json.loads(row[16])) if len(row) > 16 and row[16] else (),
    )
