"""A ``per: caller`` server's lists follow what each caller's own session says: when the server sends
``notifications/tools/list_changed`` on one caller's session, that caller's list is read again and their clients are
told, and no other caller's list moves (tests/fixtures/oauth_mcp_server.py lists ``NAME_drafts`` to an account once
it called ``unlock_drafts``, and says so on that session alone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from tests.backends.mcp.test_signin import WAIT, gateway, oauth_world, ready, sign_in, tools_of
from tests.fixtures.gateway_proc import first_text, mcp_session
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

ALICE, BOB = "tok-alice-0123456789", "tok-bob-0123456789"


def announced(output: str) -> list[list[str]]:
    """The callers told of each catalog change, from the gateway's ``lists.announced`` log lines."""
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{") and "lists.announced" in line]
    return [line["callers"] for line in lines if line.get("event") == "lists.announced"]


async def test_a_callers_list_follows_their_session_and_only_they_are_told(tmp_path: Path) -> None:
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        for caller, account in ((ALICE, "alice-account"), (BOB, "bob-account")):
            assert (await sign_in(gw, caller, account)).status_code == 200
        await ready(gw)

        async def both_listed() -> bool:
            return "alice_notes" in await tools_of(gw, ALICE) and "bob_notes" in await tools_of(gw, BOB)

        await eventually(both_listed, within=WAIT)
        told = anyio.Event()

        async def alice_hears(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                told.set()

        async with (
            mcp_session(gw.url(), token=ALICE, message_handler=alice_hears) as alice,
            mcp_session(gw.url(), token=BOB) as bob,
        ):
            before = (await bob.list_tools()).model_dump_json()
            assert "alice_drafts" not in {tool.name for tool in (await alice.list_tools()).tools}
            with anyio.fail_after(WAIT):
                assert first_text(await alice.call_tool("unlock_drafts", {})) == "drafts unlocked for alice-account"
                await told.wait()
            assert "alice_drafts" in {tool.name for tool in (await alice.list_tools()).tools}
            assert (await bob.list_tools()).model_dump_json() == before  # byte for byte
        assert ["alice"] in announced(gw.output())
        assert all("bob" not in callers for callers in announced(gw.output()))
