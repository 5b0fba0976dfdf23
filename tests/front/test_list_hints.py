"""SEP-2549's cache hints on a 2026-07-28 client's lists: ``cacheScope`` is always ``private`` (a list is answered to
a signed-in caller and often filtered for it), and ``ttlMs`` says what the gateway knows: a list may be reused for
``LIST_TTL_MS`` while every backend is settled and serving, and must be asked again (0) while one is not, since its
tools may come or go at any moment; and never longer than a downstream gave its own list (the tasks fixture, over
real loopback HTTP, with its hints set by flags). A handshake-era list carries no hints."""

from __future__ import annotations

import anyio
import pytest

from gateway.core.runtime import LIST_TTL_MS
from gateway.testing import in_process_gateway
from tests.fixtures.procs import free_port, start_http_server
from tests.system.test_conformance_tasks import tasks_server_argv

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


@pytest.mark.parametrize(
    ("flags", "ttl_ms"),
    [
        (["--list-ttl-ms", "5000", "--list-scope", "public"], 5000),  # shorter than the gateway's: the downstream's
        (["--list-ttl-ms", "600000", "--list-scope", "private"], LIST_TTL_MS),  # longer: the gateway's own
        ([], 0),  # the SDK's server says ttlMs 0 ("ask again") unless told otherwise: the gateway says so too
    ],
)
async def test_a_merged_list_is_fresh_no_longer_than_its_downstream_said(flags: list[str], ttl_ms: int) -> None:
    port = free_port()
    with start_http_server(tasks_server_argv(port, *flags), port) as server:
        config = SETTLED + f"servers:\n  target: {{transport: streamable_http, url: {server.url()}}}\n"
        with anyio.fail_after(20):
            async with in_process_gateway(config, mode="2026-07-28") as (client, _):
                listed = await client.list_tools()
                assert "slow_compute" in {tool.name for tool in listed.tools}
                assert (listed.ttl_ms, listed.cache_scope) == (ttl_ms, "private")
                prompts = await client.list_prompts()  # the downstream lists no prompts: only the gateway's own say
                assert prompts.ttl_ms == LIST_TTL_MS
