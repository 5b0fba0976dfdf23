"""A stateless (2026-07-28) client's `subscriptions/listen` for a resource, served by a handshake-era downstream.

That era has no `resources/subscribe`: a client names the resources it watches in its listen stream's
`resourceSubscriptions`. The gateway subscribes the downstream that serves each one with `resources/subscribe`, relays
its `notifications/resources/updated` onto the stream, and unsubscribes when the stream ends. The downstream is
tests/fixtures/conformance_server.py over streamable HTTP, declared `protocol: handshake` (undeclared, a 2026 client is
served in its own era): its `test_update_watched_resource` changes `test://watched-resource` and tells how many
subscribers it notified.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp.client.subscriptions import listen
from mcp.shared.subscriptions import ResourceUpdated

from tests.fixtures.gateway_proc import one_backend_config, run_gateway
from tests.fixtures.procs import conformance_server_argv, free_port, start_http_server
from tests.fixtures.waiting import eventually
from tests.front.test_input_required import KEY, TOKENS, _text, client

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WATCHED = "test://watched-resource"


async def test_a_listen_streams_resource_subscription_subscribes_a_handshake_era_downstream(tmp_path: Path) -> None:
    port = free_port()
    with start_http_server(conformance_server_argv(port), port) as downstream:
        config = one_backend_config(
            "listen-resources", "classic", transport="streamable_http", url=downstream.url(), protocol="handshake"
        )
        with run_gateway(config, tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            async with client(gateway.url()) as c:
                with anyio.fail_after(30):
                    async with listen(c.session, resource_subscriptions=[WATCHED]) as sub:
                        assert sub.honored.resource_subscriptions == [WATCHED]
                        updated = _text(await c.call_tool("test_update_watched_resource", {}))
                        assert updated.endswith("its 1 subscribers have been notified."), updated
                        assert await sub.__anext__() == ResourceUpdated(uri=WATCHED)

                    # The stream has ended (the gateway hears it when the stream's connection closes): the downstream
                    # is unsubscribed, and notifies nobody.
                    async def nobody_notified() -> bool:
                        updated = _text(await c.call_tool("test_update_watched_resource", {}))
                        return updated.endswith("its 0 subscribers have been notified.")

                    await eventually(nobody_notified, within=10)
