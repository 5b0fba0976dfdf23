"""``gateway pins approve SERVER [TOOL]`` and ``gateway pins diff`` (their arguments: cli/parser.py): record what a
server's tools say now as approved, and show what differs from what was approved (gateway/core/pins.py), with what
in each definition speaks to the model (gateway/core/poisoning.py). Approving a whole server leaves out the tools
with such findings (named with them); naming one approves it as it is. Both connect to the servers as
``gateway tools`` does.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.config import Federation
from gateway.core.pins import Item, approval_rows, definition_diff, digest, findings, pin_key
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
        return _approve(config, current, args.server, args.tool, args.by or getpass.getuser(), args.all)
    return _diff(config, current, args.json)


async def _current_tools(config: Federation) -> dict[str, list[Item]]:
    """Each server's tools and prompts as it lists them now."""
    async with Gateway(config, audit=False).running() as gateway:
        await gateway.wait_settled(settle_budget(config))
        return {name: [*b.tools(), *b.prompts()] for name, b in gateway.backends.items() if name in config.servers}


def _approve(
    config: Federation,
    current: Mapping[str, Sequence[Item]],
    server: str | None,
    tool: str | None,
    by: str,
    every: bool,
) -> int:
    if every == (server is not None) or (every and tool is not None):
        print("gateway pins approve: name one server (and maybe one tool), or --all", file=sys.stderr)
        return EXIT_USAGE
    if server is not None and server not in config.servers:
        print(f"gateway pins approve: no server {server!r} in {config.source}", file=sys.stderr)
        return EXIT_USAGE
    rows: list[PinRow] = []
    left_out = False  # a tool that speaks to the model, or (with --all) a server that lists nothing now
    for name in list(config.servers) if every else [server or ""]:
        tools = _approvable(name, current.get(name, ()), tool)
        if tools is None and not every:
            return EXIT_USAGE
        wanted = [t for t in current.get(name, ()) if tool in (None, pin_key(t))]
        left_out = left_out or tools is None or len(tools) < len(wanted)
        rows += approval_rows(name, tools or (), by)
    if rows:
        write_pins(config.gateway.audit.url or config.gateway.audit.path, rows)
    for name in dict.fromkeys(row[0] for row in rows):
        approved = [row[1] for row in rows if row[0] == name]
        print(f"approved {len(approved)} definition(s) of {name} as {by}: {', '.join(approved)}")
    return EXIT_PENDING if left_out or not rows else EXIT_OK


def _approvable(server: str, listed: Sequence[Item], tool: str | None) -> list[Item] | None:
    """The tools of ``server`` to approve: ``tool`` as it is, or every tool but those whose definitions speak to the
    model (named on stderr); None (said why) when it lists none now."""
    tools = [t for t in listed if tool is None or pin_key(t) == tool]
    if not tools:
        print(f"gateway pins approve: {server} lists no tool {tool or ''} now (is it ready?)".strip(), file=sys.stderr)
        return None
    if tool is not None:
        return tools
    flagged = {pin_key(t): found for t in tools if poisoned(found := findings(t, peers=_kin(t, listed)))}
    for name, found in flagged.items():
        print(f"not approved: {server}/{name}: {'; '.join(map(str, found))}", file=sys.stderr)
        print(f"  (approve it as it is by naming it: gateway pins approve {server} {name})", file=sys.stderr)
    return [t for t in tools if pin_key(t) not in flagged]


def _kin(item: Item, listed: Sequence[Item]) -> list[Item]:
    """The others of ``item``'s kind among ``listed`` (tools with tools, prompts with prompts)."""
    return [other for other in listed if type(other) is type(item)]


def _diff(config: Federation, current: Mapping[str, Sequence[Item]], as_json: bool) -> int:
    approved = {(row[0], row[1]): row for row in read_pins(config.gateway.audit.url or config.gateway.audit.path)}
    pending: list[dict[str, Any]] = []
    for server, tools in current.items():
        for tool in tools:
            row = approved.get((server, pin_key(tool)))
            if row is not None and row[2] == digest(tool):
                continue
            change = "changed" if row is not None else "new"
            text = definition_diff(json.loads(row[3]) if row is not None else None, tool)
            found = [str(finding) for finding in findings(tool, peers=_kin(tool, tools))]
            item = {"server": server, "tool": pin_key(tool), "change": change, "diff": text, "findings": found}
            pending.append(item)
    if as_json:
        print(json.dumps(pending, indent=2))
    for item in [] if as_json else pending:
        said = "".join(f"\n  ! {finding}" for finding in item["findings"])
        print(f"{item['change']}: {item['server']}/{item['tool']}{said}\n{item['diff']}\n")
    if not pending and not as_json:
        print("every server tool is as approved")
    return EXIT_PENDING if pending else EXIT_OK
