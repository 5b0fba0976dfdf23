"""The ledger's engines behind one face: SQLite (``audit.py``, the default) or PostgreSQL (``ledger_pg.py``).

``open_ledger(settings)`` builds the write side that ``gateway.audit`` asks for; ``query``, ``tail`` and ``stats`` read
either engine from a *target*: a file path, or a ``postgresql://`` URL. PostgreSQL's driver is imported only when a
URL is used, so the embedded default never loads it. The URL helpers here are pure: ``redact_url`` is what every
message, log line and ``/status`` shows of a URL (never its password), ``url_secrets`` what the log redactor learns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from gateway.ledger import sqlite as audit
from gateway.ledger.sqlite import AuditRecord, Ledger, LedgerStatistics, ToolStats

if TYPE_CHECKING:
    from gateway.config import AuditSettings
    from gateway.ledger.postgres import PgLedger

URL_SCHEMES = ("postgresql://", "postgres://")


class AuditLedger(Protocol):
    """What the gateway asks of a ledger's write side, whichever the engine."""

    @property
    def disabled(self) -> bool: ...

    @property
    def target(self) -> str | Path | None:
        """What ``query``/``stats`` read this ledger from (a path or a URL, with its password: never show it)."""
        ...

    def statistics(self) -> LedgerStatistics: ...

    async def record(self, rec: AuditRecord) -> None: ...


def is_url(target: str | os.PathLike[str]) -> bool:
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def redact_url(url: str) -> str:
    """``url`` without its password (in the authority or as a ``password=`` parameter), for messages and /status."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            user = userinfo.partition(":")[0]
            netloc = f"{user}:***@{hosts}" if ":" in userinfo else f"{user}@{hosts}"
        query = urlencode(
            [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "postgresql://(a URL that cannot be parsed)"


def url_secrets(url: str | None) -> list[str]:
    """The password a URL carries, as written and percent-decoded (empty when it has none)."""
    if not url or not is_url(url):
        return []
    found: list[str] = []
    try:
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.partition(":")[2])
        found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password"]
    except ValueError:
        return []
    secrets = {s for s in found if s} | {unquote(s) for s in found if s}
    return sorted(secrets, key=len, reverse=True)


def scrub_url(text: str, url: str) -> str:
    """``text`` with every form of ``url``'s password, and the URL itself, replaced."""
    text = text.replace(url, redact_url(url))
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


def open_ledger(settings: AuditSettings) -> Ledger | PgLedger:
    """The write side ``settings`` ask for: PostgreSQL when ``url`` is set (spooling to ``spool_path``), else SQLite."""
    if settings.url is None:
        return Ledger(settings.path, retention_days=settings.retention_days)
    from gateway.ledger.postgres import PgLedger

    return PgLedger(
        settings.url,
        spool_path=settings.spool_path or f"{settings.path}.spool",
        retention_days=settings.retention_days,
    )


def query(
    target: str | os.PathLike[str],
    *,
    tool: str | None = None,
    status: str | None = None,
    client: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = 100,
    kind: str | None = None,
) -> list[AuditRecord]:
    """``audit.query`` on either engine."""
    filters: dict[str, Any] = dict(tool=tool, status=status, client=client, since=since, until=until, kind=kind)
    if is_url(target):
        from gateway.ledger import postgres as ledger_pg

        return ledger_pg.query(str(target), limit=limit, **filters)
    return audit.query(target, limit=limit, **filters)


def stats(
    target: str | os.PathLike[str],
    *,
    since: float | None = None,
    until: float | None = None,
    tool: str | None = None,
    client: str | None = None,
    status: str | None = None,
    kind: str | None = None,
) -> list[ToolStats]:
    """``audit.stats`` on either engine."""
    filters: dict[str, Any] = dict(since=since, until=until, tool=tool, client=client, status=status, kind=kind)
    if is_url(target):
        from gateway.ledger import postgres as ledger_pg

        return ledger_pg.stats(str(target), **filters)
    return audit.stats(target, **filters)


def tail(
    target: str | os.PathLike[str],
    *,
    tool: str | None = None,
    status: str | None = None,
    client: str | None = None,
    last: int = 10,
    follow: bool = True,
    poll_interval: float = 0.5,
    sleep: Callable[[float], None] | None = None,
    kind: str | None = None,
) -> Generator[AuditRecord]:
    """``audit.tail`` on either engine."""
    kwargs: dict[str, Any] = {"kind": kind} if sleep is None else {"sleep": sleep, "kind": kind}
    if is_url(target):
        from gateway.ledger import postgres as ledger_pg

        return ledger_pg.tail(
            str(target),
            tool=tool,
            status=status,
            client=client,
            last=last,
            follow=follow,
            poll_interval=poll_interval,
            **kwargs,
        )
    return audit.tail(
        target, tool=tool, status=status, client=client, last=last, follow=follow, poll_interval=poll_interval, **kwargs
    )
