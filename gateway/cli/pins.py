"""``gateway pins approve SERVER [TOOL]`` and ``gateway pins diff`` (their arguments: cli/parser.py): record what a
server's tools say now as approved, and show what differs from what was approved (gateway/core/pins.py), with what
in each definition speaks to the model (gateway/core/poisoning.py). Approving a whole server leaves out the tools
with such findings (named with them); naming one approves it as it is. Both connect to the servers as
``gateway tools`` does.
"""

from __future__ import annotations

import argparse
import difflib
import getpass
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types as types

from gateway.config import Federation
from gateway.core.pins import definition, digest, findings
from gateway.core.poisoning import poisoned
from gateway.core.runtime import Gateway, settle_budget
from gateway.ledger.pins import PinRow, read_pins, write_pins

__all__ = ["run_pins"]

EXIT_OK, EXIT_PENDING, EXIT_USAGE = 0, 1, 2


def run_pins(config: Federation, args: argparse.Namespace) -> int:
    """Run ``pins approve`` or ``pins diff``; the exit status."""
    import anyio

    current = anyio.run(_current_tools, config)
    if args.pins_command == "approve":
        return _approve(config, current, args.server, args.tool, args.by or getpass.getuser())
    return _diff(config, current, args.json)


async def _current_tools(config: Federation) -> dict[str, list[types.Tool]]:
    async with Gateway(config, audit=False).running() as gateway:
        await gateway.wait_settled(settle_budget(config))
        return {name: list(b.tools()) for name, b in gateway.backends.items() if name in config.servers}


def _approve(
    config: Federation, current: Mapping[str, Sequence[types.Tool]], server: str, tool: str | None, by: str
) -> int:
    if server not in config.servers:
        print(f"gateway pins approve: no server {server!r} in {config.source}", file=sys.stderr)
        return EXIT_USAGE
    listed = current.get(server, ())
    tools = [t for t in listed if tool is None or t.name == tool]
    if not tools:
        print(f"gateway pins approve: {server} lists no tool {tool or ''} now (is it ready?)".strip(), file=sys.stderr)
        return EXIT_USAGE
    if tool is None:
        flagged = {t.name: found for t in tools if poisoned(found := findings(t, peers=listed))}
        for name, found in flagged.items():
            print(f"not approved: {server}/{name}: {'; '.join(map(str, found))}", file=sys.stderr)
            print(f"  (approve it as it is by naming it: gateway pins approve {server} {name})", file=sys.stderr)
        tools = [t for t in tools if t.name not in flagged]
        if not tools:
            return EXIT_PENDING
    now = time.time()
    rows: list[PinRow] = [(server, t.name, digest(t), json.dumps(definition(t)), by, now) for t in tools]
    count = write_pins(config.gateway.audit.url or config.gateway.audit.path, rows)
    print(f"approved {count} tool(s) of {server} as {by}: {', '.join(t.name for t in tools)}")
    return EXIT_OK


def _diff(config: Federation, current: Mapping[str, Sequence[types.Tool]], as_json: bool) -> int:
    approved = {(row[0], row[1]): row for row in read_pins(config.gateway.audit.url or config.gateway.audit.path)}
    pending: list[dict[str, Any]] = []
    for server, tools in current.items():
        for tool in tools:
            row = approved.get((server, tool.name))
            if row is not None and row[2] == digest(tool):
                continue
            was = json.dumps(json.loads(row[3]), indent=2, sort_keys=True).splitlines() if row is not None else []
            now = json.dumps(definition(tool), indent=2, sort_keys=True).splitlines()
            change = "changed" if row is not None else "new"
            text = "\n".join(difflib.unified_diff(was, now, "approved", "now", lineterm=""))
            found = [str(finding) for finding in findings(tool, peers=tools)]
            pending.append({"server": server, "tool": tool.name, "change": change, "diff": text, "findings": found})
    if as_json:
        print(json.dumps(pending, indent=2))
    for item in [] if as_json else pending:
        said = "".join(f"\n  ! {finding}" for finding in item["findings"])
        print(f"{item['change']}: {item['server']}/{item['tool']}{said}\n{item['diff']}\n")
    if not pending and not as_json:
        print("every server tool is as approved")
    return EXIT_PENDING if pending else EXIT_OK
