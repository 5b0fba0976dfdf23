"""FastMCP's own proxy in front of one downstream, served over streamable HTTP: the comparison row of the benchmark.

Runs under FastMCP's venv (``.tools/bin/fastmcp-python``, made by ``scripts/install``), never the gateway's:

    .tools/bin/fastmcp-python bench/fastmcp_proxy.py --port P --url http://127.0.0.1:Q/mcp
    .tools/bin/fastmcp-python bench/fastmcp_proxy.py --port P --stdio -- COMMAND ARG...

It is ``fastmcp.server.create_proxy(target)`` with FastMCP's defaults (a URL string for an HTTP downstream, a
``StdioTransport`` for a stdio one), served at ``/mcp`` on 127.0.0.1 with the banner off. With a non-``Client``
target, FastMCP opens a fresh backend session for every request (its documented way of keeping request contexts
apart); that is the behaviour being measured.
"""

from __future__ import annotations

import argparse
import sys

import anyio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="streamable HTTP downstream")
    target.add_argument("--stdio", action="store_true", help="stdio downstream: the command follows `--`")
    parser.add_argument("command", nargs="*", help="with --stdio: the downstream's command line")
    args = parser.parse_args()

    import fastmcp  # type: ignore[import-not-found]  # FastMCP's own venv, not the gateway's
    from fastmcp.server import create_proxy  # type: ignore[import-not-found]

    if args.stdio:
        if not args.command:
            parser.error("--stdio needs the downstream command after `--`")
        from fastmcp.client.transports import StdioTransport  # type: ignore[import-not-found]

        proxy = create_proxy(StdioTransport(args.command[0], args.command[1:]), name="fastmcp-proxy")
    else:
        proxy = create_proxy(args.url, name="fastmcp-proxy")
    print(f"fastmcp {fastmcp.__version__} proxy on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    anyio.run(
        lambda: proxy.run_http_async(
            transport="http", host="127.0.0.1", port=args.port, path="/mcp", show_banner=False, log_level="warning"
        )
    )


if __name__ == "__main__":
    main()
