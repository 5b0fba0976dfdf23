"""Many echo MCP servers in one process: backend K is served over streamable HTTP at ``/bK/mcp``.

    python bench/multi_echo.py --port P --backends 50 [--tools 50]

Each backend is the test fixture's server (``tests/fixtures/echo_server.py``) with prefix ``bK_`` (so every tool
name is distinct) and exactly ``--tools`` tools: the fixture's 8 built-in tools plus ``--tools - 8`` extra echo tools.
One process instead of fifty keeps the 50-backend ``tools/list`` benchmark light on a 2-core machine; every backend
still has its own MCP server object, session manager and sessions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.echo_server import build  # noqa: E402

BUILTIN_TOOLS = 8  # echo, add, fail, slow, sleep, crash, pid, with_defs


def app(backends: int, tools: int) -> Any:
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.routing import Route

    managers = []
    routes = []
    for k in range(backends):
        server = build(f"echo-b{k}", f"b{k}_", max(tools - BUILTIN_TOOLS, 0))
        manager = StreamableHTTPSessionManager(
            app=server, security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False)
        )
        managers.append(manager)
        routes.append(Route(f"/b{k}/mcp", endpoint=StreamableHTTPASGIApp(manager)))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for manager in managers:
                await stack.enter_async_context(manager.run())
            yield

    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backends", type=int, default=50)
    parser.add_argument("--tools", type=int, default=50, help="tools per backend (at least 8)")
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(app(args.backends, args.tools), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
