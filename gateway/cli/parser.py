"""The ``gateway`` command line's grammar: every command, option and default, and nothing that runs one.

It imports only the standard library and the gateway's lightest modules (the version, the ledger's status names), so
``gateway --version``, ``gateway --help`` and a command that needs no server (``import``, ``audit`` with ``--db``)
start without loading the server stack; main.py imports what a command runs once it is known.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime

from gateway.ledger.records import KINDS, STATUSES

__all__ = [
    "AUDIT_DB_FROM_CONFIG",
    "FORMATS",
    "add_audit_subcommands",
    "add_import_subcommand",
    "build_parser",
    "parse_time",
]

AUDIT_DB_FROM_CONFIG = "gateway.audit.path"
"""``--db``'s default: not a file, the sign that the ledger is the one the configuration names."""
FORMATS = ("auto", "claude", "vscode")
"""``claude``: ``{"mcpServers": ...}`` (Claude Desktop, Claude Code, Cursor); ``vscode``: ``{"servers": ...}``."""

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class _Version(argparse.Action):
    """``--version``: the version is read from the package's metadata only when asked for (importlib.metadata is a
    third of what a command that serves nothing costs to start)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from gateway.version import VERSION

        print(f"{parser.prog} {VERSION}")  # stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gateway`` command line."""
    parser = argparse.ArgumentParser(prog="gateway", description="One MCP endpoint in front of many backends.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    parser.add_argument(
        "--log-level",
        default=None,
        help="debug | info | warning | error (default: info for serve, else warning; check leaves out the backend "
        "states its table shows unless this is given)",
    )
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON log lines even on a terminal")
    sub = parser.add_subparsers(dest="command", required=True)

    def config_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("-c", "--config", default="federation.yaml", help="federation.yaml (default: ./federation.yaml)")

    serve = sub.add_parser("serve", help="serve MCP over streamable HTTP at /mcp (or over stdio with --stdio)")
    config_arg(serve)
    serve.add_argument("--host", help="bind address (default: gateway.listen.host, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: gateway.listen.port, else 8080)")
    serve.add_argument("--stdio", action="store_true", help="serve over stdin/stdout instead of HTTP")

    check = sub.add_parser("check", help="validate the file, connect to every backend, report states and reasons")
    config_arg(check)
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a backend that is not declared disabled failed, or the catalog has a problem (for CI)",
    )

    tools = sub.add_parser("tools", help="the merged catalog as a client would see it")
    config_arg(tools)
    tools.add_argument("--json", action="store_true", help="machine-readable output")
    tools.add_argument("--full", action="store_true", help="whole descriptions, not their first line")
    tools.add_argument(
        "--caller", metavar="NAME", help="only what this caller's policy shows (a static token's name, or ISSUER:SUB)"
    )

    audit = add_audit_subcommands(
        sub,
        default_db=AUDIT_DB_FROM_CONFIG,
        read_default="gateway.audit.url when set, else gateway.audit.path",  # what main() resolves it to
        copy_default="gateway.audit.path",
    )
    config_arg(audit)
    for pins in add_pins_subcommands(sub):
        config_arg(pins)
    connections = sub.add_parser(
        "connections", help="who is signed in to which OAuth-protected server (never a token); revoke a sign-in"
    )
    connections.add_argument("--caller", metavar="NAME", help="only this caller's connections")
    connections.add_argument(
        "--revoke", metavar="SERVER", help="forget --caller's tokens at SERVER ('*': at every server)"
    )
    connections.add_argument("--json", action="store_true", help="machine-readable output")
    config_arg(connections)
    add_import_subcommand(sub)
    return parser


# --------------------------------------------------------------------------------------------------- pins


def add_pins_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> tuple[argparse.ArgumentParser, ...]:
    """Add ``pins`` (``approve``, ``diff``) to the CLI's subparsers; returns the two (each takes ``-c``)."""
    pins = subparsers.add_parser("pins", help="approve servers' tool definitions, and see what changed since")
    commands = pins.add_subparsers(dest="pins_command", required=True, metavar="{approve,diff}")
    approve = commands.add_parser(
        "approve", help="record a server's tools (or one, or every server's) as they are now as approved"
    )
    approve.add_argument("server", nargs="?", help="the server's name under servers:")
    approve.add_argument("tool", nargs="?", help="one of its tools, by its own name (default: every tool)")
    approve.add_argument("--all", action="store_true", help="every server's tools (first start, or after an import)")
    approve.add_argument("--by", default=None, help="who approves (default: the login name)")
    diff = commands.add_parser("diff", help="tools new or changed since approval; exit 1 when there are any")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    return approve, diff


# --------------------------------------------------------------------------------------------------- audit


def parse_time(text: str, *, now: float | None = None) -> float:
    """A unix time from ``now``, a relative age (``90s``, ``15m``, ``1h``, ``2d``, ``1w``: that long ago), an ISO 8601
    time (without an offset it is local time) or a plain unix timestamp.

    Raises:
        ValueError: the text is none of these.
    """
    current = time.time() if now is None else now
    if text.strip() == "now":
        return current
    if match := _RELATIVE.match(text):
        return current - float(match[1]) * _UNIT_S[match[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use an age like 15m, 1h or 2d, an ISO 8601 time, or a unix timestamp."
        ) from None
    return (moment if moment.tzinfo else moment.astimezone()).timestamp()


def _time_arg(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_audit_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    default_db: str = "audit.db",
    read_default: str | None = None,
    copy_default: str | None = None,
) -> argparse.ArgumentParser:
    """Add ``audit`` (``tail``, ``query``, ``stats``, ``copy``) to the CLI's subparsers; run what it parses with
    ``cli/audit.py``'s ``run_audit``. ``read_default`` / ``copy_default`` say in the help what ``--db`` means when it
    is left out (the caller resolves ``default_db`` to it); without them the help shows ``default_db``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=default_db,
        help=f"the ledger: a SQLite file or a postgresql:// URL (default: {read_default or default_db})",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--tool", help="only this tool")
    filters.add_argument("--status", choices=STATUSES, help="only calls with this status")
    filters.add_argument("--client", help="only calls from this client (its name)")
    filters.add_argument("--kind", choices=KINDS, help="only requests of this kind (default: every kind)")
    window = argparse.ArgumentParser(add_help=False)
    window.add_argument("--since", type=_time_arg, help="from this time: 1h, 2d, 2025-06-01T12:00, a unix time")
    window.add_argument("--until", type=_time_arg, help="before this time (same forms as --since)")

    audit = subparsers.add_parser("audit", help="read the audit ledger", description="Read the audit ledger.")
    commands = audit.add_subparsers(dest="audit_command", required=True, metavar="{tail,query,stats,copy}")
    tail_parser = commands.add_parser(
        "tail", parents=[common, filters], help="show the latest calls, and with --follow every new one"
    )
    tail_parser.add_argument("-n", "--lines", type=int, default=10, help="how many recent calls to show first")
    tail_parser.add_argument("-f", "--follow", action="store_true", help="keep printing calls as they are recorded")
    tail_parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls with --follow")
    tail_parser.set_defaults(since=None, until=None)
    query_parser = commands.add_parser("query", parents=[common, filters, window], help="list calls matching filters")
    query_parser.add_argument("--limit", type=int, default=100, help="the most (newest) calls to list; 0 for all")
    stats_parser = commands.add_parser(
        "stats",
        parents=[common, filters, window],
        help="per-tool (or per-caller) calls, refusals, error rates and latency (of the calls that were not "
        "refused), tokens",
    )
    stats_parser.add_argument(
        "--by", choices=("tool", "caller"), default="tool", help="per tool (default), or per caller: tokens in and out"
    )
    copy_parser = commands.add_parser(
        "copy",
        help="copy a SQLite ledger into PostgreSQL (rows already there are skipped, so it can be re-run)",
        description="Copy the SQLite ledger --db into the PostgreSQL ledger --to, in order; a re-run copies only "
        "the rows not there yet.",
    )
    copy_parser.add_argument(
        "--db", default=default_db, help=f"the SQLite ledger file (default: {copy_default or default_db})"
    )
    copy_parser.add_argument(
        "--to", default=None, help="the PostgreSQL ledger's postgresql:// URL (default: gateway.audit.url)"
    )
    return audit


# --------------------------------------------------------------------------------------------------- import


def add_import_subcommand(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``import`` to the CLI's subparsers; run what it parses with ``cli/importer.py``'s ``run_import`` (it
    needs no federation.yaml)."""
    parser = subparsers.add_parser(
        "import",
        help="turn a client's mcpServers JSON (Claude Desktop, Claude Code, Cursor, VS Code) into servers: entries",
        description=(
            "Print the servers of a client's MCP config as federation.yaml `servers:` entries; the report (renames, "
            "secrets moved to ${VAR}, what could not be mapped) goes to stderr."
        ),
    )
    parser.add_argument("file", help="claude_desktop_config.json, .mcp.json, ~/.cursor/mcp.json, .vscode/mcp.json")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="claude: {mcpServers} (Claude Desktop, Claude Code, Cursor); vscode: {servers}; auto: by the top key",
    )
    parser.add_argument("-o", "--output", help="write the YAML to this file instead of stdout")
    parser.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    return parser
