"""The structlog pipeline, configured once: readable console on a TTY, JSON lines otherwise; secrets redacted.

Logs always go to stderr (in ``serve --stdio`` stdout carries the MCP protocol). The redaction processor replaces
every registered secret value wherever it appears in an event's values (longest first, so a secret that contains
another is removed whole), and masks the value of any key whose *name* says it holds a secret (``is_secret_name``:
``Authorization``, ``Proxy-Authorization``, ``X-Api-Key``, ``access_token``, ``password``, ...) whatever that value
is. ``config_secrets(config)`` lists the secret values a configuration carries; the CLI registers them, with the
bearer tokens, before anything is logged. The router scrubs the reasons it puts into the audit ledger with the same
redactor, so a downstream that echoes a secret in its error output leaks it neither into the log nor the ledger.

Which configured values are secrets (documented in docs/operations.md, "Logs"):
  * every bearer token of the gateway (``gateway.auth.tokens_env``);
  * a server's ``headers`` value when the header's name is a secret name (``Authorization``, ``Cookie``,
    ``X-Api-Key``, ...) or is listed in the server's ``secret_headers``; for ``<scheme> <credential>`` values the
    credential alone is registered too;
  * a stdio server's or an adapter's ``env`` value when the variable's name is a secret name (``QMD_TOKEN``,
    ``OPENAI_API_KEY``, ``DB_PASSWORD``, ...) or is listed in its ``secret_env``; its ``pass_env`` variables by the
    same rule (their values come from the gateway's own environment), and the password of a URL one of them holds
    (``HTTPS_PROXY=http://user:password@proxy:3128``);
  * every ``gateway.tracing.headers`` value;
  * a URL's password (``https://user:PASSWORD@host``, as written and percent-decoded) and the value of a query
    parameter whose name is a secret name (``?api_key=...``): a server's ``url``, the ledger's and Redis's.

``relay_program_output`` turns the lines a program printed (scripts/serve pipes scripts/prepare's qmd and graphify
output through ``python -m gateway._logging prepare``) into structured events, so no raw text lands in the JSON log:
``program.output`` with the program and the line, at debug for chatter (tips, hints about API keys or ``qmd embed``),
warning for a line that reports an error, else info.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Collection, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog

from gateway.observe.credentials import ANY_MARKER, redact

if TYPE_CHECKING:  # configuring the logs (every command) needs no configuration module: it is imported when read
    from gateway.config import Federation

__all__ = ["MASK", "Redactor", "config_secrets", "configure_logging", "is_secret_name", "redactor", "url_secrets"]

MASK = "[redacted]"
MIN_SECRET_LENGTH = 4
"""Shorter values are not registered: masking every "1" or "abc" in the log would destroy it and protect nothing."""

_SECRET_NAME = re.compile(
    r"auth|token|secret|passw|passphrase|credential|cookie|api_?key|access_?key|private_?key|(?:^|_)key$|(?:^|_)pat$",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=4096)  # asked of every key of every log line: the names are few, the answer fixed
def is_secret_name(name: str) -> bool:
    """Whether a header, environment variable or log key named ``name`` holds a secret by its name alone.

    Matches (case-insensitive, ``-`` read as ``_``) names containing ``auth``, ``token``, ``secret``, ``passw``,
    ``passphrase``, ``credential``, ``cookie``, ``api_key``/``apikey``, ``access_key``, ``private_key``, and names
    that are or end in ``_key`` or ``_pat``.
    """
    return _SECRET_NAME.search(name.replace("-", "_")) is not None


class Redactor:
    """A structlog processor that removes known secret values from every string in an event and masks the value of
    every key whose name is a secret name (``is_secret_name``). Booleans, numbers and None are never masked."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._suspect = ANY_MARKER  # a string holding no match of it is left as it is: one scan in C

    def add(self, values: Iterable[str]) -> None:
        """Register secret values (those shorter than ``MIN_SECRET_LENGTH`` are ignored)."""
        fresh = {v for v in values if v and len(v) >= MIN_SECRET_LENGTH} - self._secrets
        if not fresh:
            return
        self._secrets |= fresh
        # One alternation, longest first: at each position the longest secret wins, so an overlapping shorter
        # secret can never cut a longer one in half and leave its remainder in the log.
        ordered = sorted(self._secrets, key=len, reverse=True)
        alternation = "|".join(re.escape(s) for s in ordered)
        self._pattern = re.compile(alternation)
        self._suspect = re.compile(f"{alternation}|{ANY_MARKER.pattern}")

    def scrub(self, value: Any) -> Any:
        """``value`` with every registered secret replaced by ``MASK`` and every credential the pattern set knows
        redacted (observe/credentials.py), recursing into dicts, lists and tuples."""
        if isinstance(value, str):
            if self._suspect.search(value) is None:  # no registered secret, no credential's marker: most strings
                return value
            return redact(value if self._pattern is None else self._pattern.sub(MASK, value))
        if isinstance(value, dict):
            return {k: self._masked(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub(v) for v in value)
        return value

    def _masked(self, key: str, value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        return MASK if is_secret_name(key) else self.scrub(value)

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key, value in list(event_dict.items()):
            event_dict[key] = self._masked(key, value)
        return event_dict


redactor = Redactor()
"""The process-wide redactor; the CLI registers the secrets it learns from the configuration."""


def _header_values(headers: Mapping[str, str], marked: Iterable[str]) -> list[str]:
    listed = {name.lower() for name in marked}
    values: list[str] = []
    for name, value in headers.items():
        if name.lower() in listed or is_secret_name(name):
            values.append(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.isalpha():  # "Bearer abc", "Basic abc=": the credential also appears alone
                values.append(credential.strip())
    return values


def _env_values(env: Mapping[str, str], marked: Iterable[str]) -> list[str]:
    listed = set(marked)
    return [value for name, value in env.items() if name in listed or is_secret_name(name)]


def _passed_values(pass_env: Iterable[str], marked: Iterable[str]) -> list[str]:
    """The secrets among the variables ``pass_env`` passes on: whole values by name, passwords of URLs."""
    from gateway.config import passed_environment

    passed = passed_environment(pass_env, {})
    values = _env_values(passed, marked)
    for value in passed.values():
        if "://" in value:
            values += url_secrets(value)
    return [value for value in values if value]


def url_secrets(url: str | None) -> list[str]:
    """The secrets a URL carries: its password, and the values of its query parameters with a secret name."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return []
    userinfo = parts.netloc.rpartition("@")[0]
    found = [userinfo.partition(":")[2]] if ":" in userinfo else []
    found += [value for name, value in query if is_secret_name(name) or name == "password"]
    return [secret for value in found if value for secret in {value, unquote(value)}]


def config_secrets(config: Federation) -> list[str]:
    """Every secret value ``config`` carries (see the module docstring for the rules), for ``Redactor.add``."""
    from gateway.config import StdioServer

    values: list[str] = []
    for server in config.servers.values():
        if isinstance(server, StdioServer):
            values += _env_values(server.env, server.secret_env)
            values += _passed_values(server.pass_env, server.secret_env)
        else:
            values += _header_values(server.headers, server.secret_headers)
            values += url_secrets(server.url)
            exchange = getattr(server, "token_exchange", None)
            if exchange is not None:
                values.append(exchange.client_secret)
            auth = getattr(server, "auth", None)
            if auth is not None:  # the client's secret, its workload token, the ID token and secret of cross_app
                cross_app = auth.oauth.cross_app
                found = [
                    auth.oauth.client_secret,
                    auth.oauth.workload_token,
                    *((cross_app.id_token, cross_app.client_secret) if cross_app else ()),
                ]
                values += [value for value in found if value]
    for adapter in config.adapters.values():
        values += _env_values(adapter.env, adapter.secret_env)
        values += _passed_values(adapter.pass_env, adapter.secret_env)
    values += _header_values(config.gateway.tracing.headers, config.gateway.tracing.headers.keys())
    values += url_secrets(config.gateway.audit.url)
    values += url_secrets(config.gateway.shared.redis_url)
    return values


class _Quiet:
    """Drops the events named: what a command's own report already prints (``gateway check``'s table)."""

    def __init__(self, events: Collection[str]) -> None:
        self.events = frozenset(events)

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if event_dict.get("event") in self.events:
            raise structlog.DropEvent
        return event_dict


def configure_logging(level: str = "info", *, json: bool | None = None, quiet: Collection[str] = ()) -> None:
    """Configure structlog (and the stdlib root logger) once, writing to stderr.

    Args:
        level: the lowest level written (debug, info, warning, error).
        json: JSON lines (True) or the console renderer (False); None picks JSON unless stderr is a terminal.
        quiet: event names never written (the command reports them itself).
    """
    as_json = (not sys.stderr.isatty()) if json is None else json
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            _Quiet(quiet),
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


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CHATTER = re.compile(
    r"^(tip:|hint:|note:)|qmd embed|api[_ ]key|in your ai assistant|need embeddings|for better results", re.I
)
_TROUBLE = re.compile(r"\b(error|failed|fatal|traceback)\b", re.I)


def relay_program_output(program: str, lines: Iterable[str]) -> int:
    """Log each non-blank line of ``program``'s output as one ``program.output`` event; the number logged."""
    log = structlog.get_logger(f"gateway.{program}")
    count = 0
    for raw in lines:
        line = _ANSI.sub("", raw).rstrip()
        if not line.strip():
            continue
        if _TROUBLE.search(line):
            log.warning("program.output", program=program, line=line)
        elif _CHATTER.search(line):
            log.debug("program.output", program=program, line=line)
        else:
            log.info("program.output", program=program, line=line)
        count += 1
    return count


if __name__ == "__main__":  # python -m gateway._logging PROGRAM [LEVEL] < lines  (scripts/serve)
    configure_logging(sys.argv[2] if len(sys.argv) > 2 else "info")
    relay_program_output(sys.argv[1] if len(sys.argv) > 1 else "program", sys.stdin)
