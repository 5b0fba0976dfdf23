"""``gateway connections [--caller NAME] [--revoke SERVER] [--json]``: who is signed in to which OAuth-protected
server (``auth: {oauth: ...}``), read from the store the gateway keeps their tokens in (the audit ledger's SQLite
file; core/connect.py), never a token; ``--revoke`` forgets a caller's tokens there (a running gateway asks that
caller to sign in again when its token's session next opens: at the latest when the token expires).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import anyio

from gateway.config import Federation
from gateway.core.connect import open_connections, uses_oauth

__all__ = ["run_connections"]

EXIT_OK, EXIT_USAGE = 0, 2


def run_connections(config: Federation, args: argparse.Namespace) -> int:
    """List or revoke; the exit status."""
    if not uses_oauth(config):
        print("gateway: no server in this configuration has auth.oauth: nobody signs in to one", file=sys.stderr)
        return EXIT_USAGE
    if args.revoke and not args.caller:
        print("gateway: --revoke needs --caller (whose sign-in to forget)", file=sys.stderr)
        return EXIT_USAGE
    store = open_connections(config)
    try:
        if args.revoke:
            gone = anyio.run(store.delete, None if args.revoke == "*" else args.revoke, args.caller)
            print(f"revoked {args.caller} at {', '.join(gone)}" if gone else f"{args.caller} was not connected there")
            return EXIT_OK
        rows = anyio.run(store.connected, args.caller)
    finally:
        store.close()
    if args.json:
        print(json.dumps([row.__dict__ for row in rows], indent=2))
        return EXIT_OK
    now = time.time()
    for row in rows:
        left = "unknown" if row.expires_at is None else f"{max(0, int(row.expires_at - now))} s"
        refresh = ", refreshable" if row.refreshable else ""
        print(f"{row.caller}\t{row.backend}\ttoken expires in {left}{refresh}")
    if not rows:
        print("nobody is connected")
    return EXIT_OK
