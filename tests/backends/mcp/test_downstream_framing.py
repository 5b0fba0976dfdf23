"""A 2026-07-28 downstream that frames its answers as the conformance suite's reference server does is served
through the gateway as it is directly.

That server streams a request's messages as `application/json`, one JSON-RPC message per line (progress, then the
result), and leaves `resultType` out of its results (SEP-2322: a client must read that as `complete`). The SDK client
under the gateway read such an answer as one message (-32700) and refused a result without `resultType`; the gateway
now reframes those bodies (gateway/backends/framing.py) and defaults the field. The downstream is
tests/fixtures/conformance_server.py with `--json-lines`, over streamable HTTP; the client a handshake-era SDK one.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import mcp_session, one_backend_config, run_gateway

pytestmark = pytest.mark.anyio


def _config(downstream: Downstream) -> str:
    return one_backend_config(
        "framing-gateway", "modern", transport="streamable_http", url=downstream.url(), protocol="2026-07-28"
    )


async def test_results_without_result_type_and_json_lines_answers_pass_through(
    downstream: Downstreams, tmp_path: Path
) -> None:
    json_lines = downstream("conformance", "streamable_http", "--json-lines")
    progress: list[tuple[float, float | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total))

    with run_gateway(_config(json_lines), tmp_path) as gateway:
        async with mcp_session(gateway.url()) as session:
            with anyio.fail_after(30):
                image = await session.call_tool("test_image_content", {})
                assert not image.is_error, image
                (block,) = image.content
                assert isinstance(block, types.ImageContent) and block.mime_type == "image/png"

                # Three progress notifications and then the result, one JSON line each in one application/json body.
                stepped = await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
                assert not stepped.is_error, stepped
                assert progress == [(0, 100), (50, 100), (100, 100)]

                prompt = await session.get_prompt("test_simple_prompt")
                (message,) = prompt.messages
                assert isinstance(message.content, types.TextContent)
                assert message.content.text == "This is a simple prompt for testing."
