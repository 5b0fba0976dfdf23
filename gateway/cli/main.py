"""The ``gateway`` command: serve | check | tools | audit | import.

Each command imports what it runs once the command line is parsed (the grammar is parser.py): ``--version``,
``--help`` and ``import`` never load the server stack, ``audit`` with ``--db`` needs no federation.yaml, and only
``serve``, ``check`` and ``tools`` start a gateway (serving.py). On Linux the pid of ``gateway serve`` that receives
the signals is a small supervisor (``processes.supervise``) that forwards them and, should the gateway die by
SIGKILL, kills every process it left.

Exit codes: 0 success (``check`` too, even with failed or disabled backends: they are reported, not fatal, unless
``--strict``, which exits 1 when one failed); 2 an invalid configuration or command line (the message names the
file, the key path and the line), or any other failure the gateway raises on purpose while starting (a
``GatewayError``, such as an audit ledger that cannot be opened): one sentence on stderr, never a traceback, even
when it was raised inside a task group; 1 anything else that stops a command.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence

from gateway.cli.parser import AUDIT_DB_FROM_CONFIG, build_parser
from gateway.errors import ConfigError, GatewayError

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
CHECK_REPORTS = ("backend.state", "backend.variant_not_ready")  # events whose content `check` prints in its table


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "import":  # converts a client's JSON: needs no federation.yaml and starts nothing
        from gateway.cli.importer import run_import

        return run_import(args)
    from gateway.observe.logs import configure_logging

    level = args.log_level or ("info" if args.command == "serve" else "warning")
    # check's table states each backend's state, reason and not-ready variant: at the default level their log lines
    # would say it a second time (a --log-level asked for writes them, as a timeline)
    quiet = CHECK_REPORTS if args.command == "check" and args.log_level is None else ()
    configure_logging(level, json=args.log_json, quiet=quiet)
    try:
        if args.command == "audit" and not _needs_config(args):
            from gateway.cli.audit import run_audit

            return run_audit(args)
        return _run(args)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # whoever read the output stopped (`gateway audit query | head`): no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        return EXIT_FAILED
    except (GatewayError, BaseExceptionGroup) as exc:  # e.g. tracing on without its SDK, a ledger that cannot open
        errors = _gateway_errors(exc)
        if errors is None:
            raise
        for error in errors:
            print(f"gateway: {_sentence(error)}", file=sys.stderr)
        return EXIT_USAGE


def _needs_config(args: argparse.Namespace) -> bool:
    """Whether an ``audit`` command needs federation.yaml: only for a ledger (or ``copy``'s target) it was not given."""
    return args.db == AUDIT_DB_FROM_CONFIG or (args.audit_command == "copy" and not args.to)


def _run(args: argparse.Namespace) -> int:
    """A command that reads federation.yaml: ``serve``, ``check``, ``tools``, or ``audit`` without ``--db``."""
    from gateway.config import load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"gateway: invalid configuration: {exc}", file=sys.stderr)
        if args.command == "audit":
            wanted = "--to URL" if args.db != AUDIT_DB_FROM_CONFIG else "--db FILE"
            hint = f"audit reads the file only for the ledger it names: pass {wanted} instead"
            print(f"gateway: ({hint})", file=sys.stderr)
        return EXIT_USAGE
    from gateway.cli.secrets import register_secrets

    register_secrets(config)
    if args.command == "audit":
        from gateway.cli.audit import run_audit

        audit = config.gateway.audit
        if args.audit_command == "copy":
            args.to = args.to or audit.url
            if args.db == AUDIT_DB_FROM_CONFIG:
                args.db = audit.path
        elif args.db == AUDIT_DB_FROM_CONFIG:
            args.db = audit.url or audit.path  # the ledger the gateway writes
        return run_audit(args)
    if args.command == "pins":
        from gateway.cli.pins import run_pins

        return run_pins(config, args)
    if args.command == "connections":
        from gateway.cli.connections import run_connections

        return run_connections(config, args)
    if args.command == "serve" and not (args.stdio and sys.stdin.isatty()) and threading.active_count() == 1:
        from gateway.backends.processes import supervise

        # From here on this process is the gateway's supervisor's child (backends/processes.py); a terminal's
        # stdin would make the gateway, in a process group of its own, stop on reading it (SIGTTIN).
        supervise()
    from gateway.cli.serving import run

    return run(config, args)


def _gateway_errors(exc: BaseException) -> list[GatewayError] | None:
    """The failures inside ``exc`` (unwrapping task groups' ExceptionGroups) if every one is a ``GatewayError``,
    else None: anything else is a bug, and its traceback is what its report needs."""
    if isinstance(exc, GatewayError):
        return [exc]
    if not isinstance(exc, BaseExceptionGroup):
        return None
    found: list[GatewayError] = []
    for inner in exc.exceptions:
        errors = _gateway_errors(inner)
        if errors is None:
            return None
        found += [error for error in errors if str(error) not in {str(seen) for seen in found}]
    return found


def _sentence(error: GatewayError) -> str:
    return f"invalid configuration: {error}" if isinstance(error, ConfigError) else str(error)


if __name__ == "__main__":
    sys.exit(main())
