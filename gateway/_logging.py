"""The structlog pipeline, configured once: readable console on a TTY, JSON lines otherwise; secrets redacted.

Logs always go to stderr (in ``serve --stdio`` stdout carries the MCP protocol). The redaction processor replaces
every registered secret (bearer tokens, configured header values, env values marked secret) wherever it appears in
an event's values, and masks ``Authorization``-like keys whatever their value.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

__all__ = ["Redactor", "configure_logging", "redactor"]

SENSITIVE_KEYS = frozenset({"authorization", "token", "tokens", "password", "secret", "api_key", "cookie"})
SENSITIVE_SUFFIXES = ("authorization", "_token", "api_key", "apikey", "password", "secret", "cookie")


def _sensitive(key: object) -> bool:
    name = str(key).lower().replace("-", "_")
    return name in SENSITIVE_KEYS or name.endswith(SENSITIVE_SUFFIXES)


MASK = "[redacted]"


class Redactor:
    """A structlog processor that removes known secret values from every string in an event."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._ordered: list[str] = []

    def add(self, values: Iterable[str]) -> None:
        self._secrets.update(v for v in values if v and len(v) >= 4)
        # Longest first, so a secret that starts another cannot leave the longer one's tail behind.
        self._ordered = sorted(self._secrets, key=len, reverse=True)

    def scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._ordered:
                if secret in value:
                    value = value.replace(secret, MASK)
            return value
        if isinstance(value, dict):
            return {k: MASK if _sensitive(k) else self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub(v) for v in value)
        return value

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key, value in list(event_dict.items()):
            event_dict[key] = MASK if _sensitive(key) else self.scrub(value)
        return event_dict


redactor = Redactor()
"""The process-wide redactor; the CLI registers the secrets it learns from the configuration."""


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog (and the stdlib root logger) once, writing to stderr."""
    as_json = (not sys.stderr.isatty()) if json is None else json
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redactor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=max(numeric, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
