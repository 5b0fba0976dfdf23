"""The floor of a Python gateway: a bare relay in front of one streamable HTTP MCP server (a benchmark target).

    .venv/bin/python bench/bare_relay.py --port P --url http://127.0.0.1:Q/mcp [--prefix echo__] [--uvloop]

A raw ASGI app on uvicorn that reads each request's body, parses the JSON-RPC message, renames the tool of a
``tools/call`` (``--prefix`` stripped from the name, as a gateway maps a published name to the downstream's), and
forwards it over one pooled httpx2 client (as the gateway does), streaming the downstream's answer back with its
status, content type and ``Mcp-Session-Id``. GET (the server's event stream) and DELETE are passed through. Nothing
else: no MCP session of its own, no validation, no audit, no limits; it costs what any Python relay must (an HTTP
server, a JSON parse and dump, an HTTP client), which is what the gateway is measured against.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

PASS_HEADERS = (b"content-type", b"accept", b"mcp-session-id", b"mcp-protocol-version", b"last-event-id")
BACK_HEADERS = ("content-type", "mcp-session-id", "cache-control")


def renamed(message: bytes, prefix: str) -> bytes:
    """A JSON-RPC message parsed, a ``tools/call``'s tool renamed (``prefix`` stripped), and dumped again."""
    doc = json.loads(message)
    if isinstance(doc, dict) and doc.get("method") == "tools/call" and prefix:
        params = doc.get("params") or {}
        name = params.get("name")
        if isinstance(name, str) and name.startswith(prefix):
            params["name"] = name[len(prefix) :]
    return json.dumps(doc, separators=(",", ":")).encode()


def make_app(url: str, prefix: str) -> Any:
    import httpx2

    client = httpx2.AsyncClient(
        timeout=httpx2.Timeout(30.0, read=300.0),
        trust_env=False,
        limits=httpx2.Limits(max_connections=200, max_keepalive_connections=200),
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "POST" and body:
            body = renamed(body, prefix)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in PASS_HEADERS}
        request = client.build_request(scope["method"], url, headers=headers, content=body or None)
        response = await client.send(request, stream=True)
        try:
            back = [(k.encode(), response.headers[k].encode()) for k in BACK_HEADERS if k in response.headers]
            await send({"type": "http.response.start", "status": response.status_code, "headers": back})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url", required=True, help="the downstream's streamable HTTP endpoint")
    parser.add_argument("--prefix", default="", help="stripped from a tools/call's tool name")
    parser.add_argument("--uvloop", action="store_true", help="uvloop instead of asyncio")
    args = parser.parse_args()
    import uvicorn

    print(f"bare relay on 127.0.0.1:{args.port} -> {args.url}", file=sys.stderr, flush=True)
    uvicorn.run(
        make_app(args.url, args.prefix),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop" if args.uvloop else "asyncio",
        http="httptools",  # uvicorn's own choice when httptools is installed, and the gateway's edge's parser
        lifespan="on",
    )


if __name__ == "__main__":
    main()
