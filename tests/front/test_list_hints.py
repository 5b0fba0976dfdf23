"""SEP-2549's cache hints on a 2026-07-28 client's lists: ``cacheScope`` is always ``private`` (a list is answered to
a signed-in caller and often filtered for it), and ``ttlMs`` says what the gateway knows: a list may be reused for
``LIST_TTL_MS`` while every backend is settled and serving, and must be asked again (0) while one is not, since its
tools may come or go at any moment. A handshake-era list carries no hints."""

from __future__ import annotations

import anyio
import pytest

from gateway.core.runtime import LIST_TTL_MS
from gateway.testing import in_process_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]  # the dead server is attempted (it cannot start)

SETTLED = "gateway:\n  audit: {enabled: false}\nwiki: {root: .}\n"
DOWN = SETTLED + "servers:\n  dead: {transport: stdio, command: /nonexistent/server}\n"


async def test_lists_may_be_reused_while_every_backend_serves_and_not_while_one_is_down() -> None:
    with anyio.fail_after(20):
        async with in_process_gateway(SETTLED, mode="2026-07-28") as (client, _):
            for listed in (await client.list_tools(), await client.list_prompts(), await client.list_resources()):
                assert (listed.ttl_ms, listed.cache_scope) == (LIST_TTL_MS, "private")
        async with in_process_gateway(DOWN, mode="2026-07-28") as (client, gateway):
            assert gateway.backends["dead"].status.state == "failed"
            for listed in (await client.list_tools(), await client.list_prompts(), await client.list_resources()):
                assert (listed.ttl_ms, listed.cache_scope) == (0, "private")
