"""A PostgreSQL ledger's URL, shown without its password: ``redact_url`` is what every message, log line and
``/status`` shows of a URL, ``scrub_url`` cleans a driver's message of it, and ``url_secrets`` is what the log
redactor learns. Pure functions; a URL that cannot be parsed is never echoed."""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

URL_SCHEMES: Final = ("postgresql://", "postgres://")


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether a ledger target is a PostgreSQL URL (else it is a SQLite file)."""
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
    """The password a URL carries, as written and percent-decoded, longest first (empty when it has none)."""
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
