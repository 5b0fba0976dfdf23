"""Token budgets through a real gateway process over HTTP, as clients meet them: a client that declares a small window
in the ``X-Context-Window`` header gets answers within its budget in either protocol era, reads the rest as a
resource and through ``read_result``, and another caller (another bearer token) can neither list nor read it."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.search.tokens import count_tokens
from tests.fixtures.gateway_proc import GatewayProcesses

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdefgh"
WORDS = "gateway budget token answer search wiki router ledger caller client window context".split()


def _config(root: Path) -> str:
    return f"""
version: 1
gateway: {{audit: {{path: audit.db}}}}
wiki: {{root: {root}}}
clients:
  budget: {{answer_share: 0.1}}
"""


@asynccontextmanager
async def _client(url: str, token: str, mode: str, window: int | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    if window is not None:
        headers["X-Context-Window"] = str(window)
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
            yield client


def _texts(result: types.CallToolResult) -> list[str]:
    return [b.text for b in result.content if isinstance(b, types.TextContent)]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_declared_small_window_is_kept_to_and_the_rest_is_its_callers_alone(
    tmp_path: Path, gateway_process: GatewayProcesses, mode: str
) -> None:
    rng = random.Random(3)
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    body = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(50)) + "." for _ in range(100))
    (wiki / "big.md").write_text(f"# Big\n\n{body}\n", encoding="utf-8")
    server = gateway_process(_config(wiki), tokens=f"alice={ALICE},bob={BOB}", folder=tmp_path)
    url = server.url()
    async with _client(url, ALICE, mode, 8_000) as alice:
        result = await alice.call_tool("files_read", {"path": "big.md"})
        body_text, note = _texts(result)
        assert count_tokens(body_text) + count_tokens(note) <= 800
        ident = note.split('"id": "')[1].split('"')[0]
        uri = f"gateway://results/{ident}"
        assert uri in [r.uri for r in (await alice.list_resources()).resources]
        page = await alice.read_resource(f"{uri}?page=2")
        assert page.contents[0].text and page.contents[0].text != body_text  # type: ignore[union-attr]
        again = await alice.call_tool("read_result", {"id": ident, "page": 2})
        assert _texts(again)[0] == page.contents[0].text  # type: ignore[union-attr]
    async with _client(url, BOB, mode, 8_000) as bob:
        assert uri not in [r.uri for r in (await bob.list_resources()).resources]
        with pytest.raises(MCPError, match="Resource not found"):
            await bob.read_resource(f"{uri}?page=2")
        refused = await bob.call_tool("read_result", {"id": ident, "page": 2})
        assert refused.is_error and "No kept result" in _texts(refused)[0]
    async with _client(url, BOB, mode, None) as whole:  # no window declared: no budget, the answer as it was
        plain = await whole.call_tool("files_read", {"path": "big.md"})
        assert len(plain.content) == 1 and body in _texts(plain)[0]
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}) as http:
        doc = json.loads((await http.get(server.url("/status"))).text)
    assert doc["kept_results"]["kept"] >= 1  # counts only
    assert doc["catalog"]["tokens"]["large_context"] > 0 and doc["catalog"]["tokens"]["others"] > 0
