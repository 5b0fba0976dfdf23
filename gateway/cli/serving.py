"""What ``gateway serve``, ``check`` and ``tools`` run once main.py has read the configuration: the gateway started
with every backend, over HTTP or stdio until a signal, or long enough to report each backend's state and the catalog.

``gateway serve`` stops on SIGTERM or SIGINT: it stops taking connections, lets the calls in progress finish for at
most ``gateway.drain_s``, answers the rest with "the gateway is shutting down" (a ``cancelled`` row each), stops the
backends and their processes, and exits 0. A second signal cuts the drain short; it never skips the ledger or the
processes. docs/operations.md, "Shutdown and processes", has what holds on each signal, measured.

``gateway check`` exits 0 even with failed or disabled backends (they are reported, not fatal); with ``--strict``
(for CI) it exits 1 when a backend that is not declared disabled failed, or the catalog has a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import gc
import importlib.util
import json
import math
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import replace
from typing import Any

import anyio
import structlog

from gateway.auth.tokens import Tokens
from gateway.backends.processes import become_subreaper
from gateway.calls import Caller
from gateway.cli.secrets import register_secrets
from gateway.config import Federation, add_project_tools, environ, load_config
from gateway.core.catalog import list_tokens
from gateway.core.policies import Views
from gateway.core.reload import watch_config
from gateway.core.runtime import Gateway, settle_budget
from gateway.errors import ConfigError, GatewayError
from gateway.front.face import Face
from gateway.search.tokens import counter

__all__ = ["run", "settle_heap"]

log = structlog.get_logger("gateway.cli")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
ANSWER_GRACE_S = 1.0
"""After the drain, how long the answers (the shutdown's error results included) have to reach their callers."""


def run(config: Federation, args: argparse.Namespace) -> int:
    """Run ``serve``, ``check`` or ``tools`` (``args.command``) on ``config``; the exit status.

    Raises:
        GatewayError: (or an ExceptionGroup of them) the gateway could not start; main.py says it in one sentence.
    """
    # Orphans of the programs the gateway spawns re-parent to it, so none escapes (backends/processes.py).
    become_subreaper()
    tools = add_project_tools(config.source, sys.prefix)  # scripts/install's .tools/bin, when not on PATH
    if tools is not None:
        log.info("gateway.tools_path", folder=tools, message="the project's tools are first on PATH")
    if args.command == "serve":
        # GATEWAY_UVLOOP=1: serve on uvloop, a measurement switch (docs/benchmarks.md): 3-13% less CPU per call,
        # and not fit to spawn the gateway's children: libuv has no close_fds, so each child keeps, at other
        # numbers, the copies of its stdio uvloop made inheritable for it (and a CLI's daemon that closed 0-2 still
        # holds the call's output open: the call waits for its timeout).
        uvloop = environ("GATEWAY_UVLOOP") == "1"
        if uvloop and importlib.util.find_spec("uvloop") is None:
            print("gateway: GATEWAY_UVLOOP=1 needs the uvloop package (pip install uvloop)", file=sys.stderr)
            return EXIT_USAGE
        return anyio.run(_serve, config, args, backend_options={"use_uvloop": uvloop})
    if args.command == "check":
        return anyio.run(_check, config, args.json, args.strict)
    return anyio.run(_tools, config, args.json, args.full, args.caller)


# ----------------------------------------------------------------------------------------------- serve


async def _serve(config: Federation, args: argparse.Namespace) -> int:
    if args.stdio:
        return await _serve_stdio(config)
    # The HTTP edge's own modules (its app, sessions, limits) are imported here, where they are used: not by stdio.
    from gateway.front.http.app import build_app
    from gateway.front.http.connections import (
        PARSERS,
        edge_protocol,
        effective_max_connections,
        quiet_edge_logs,
        raise_open_files_limit,
    )
    from gateway.front.http.guard import is_loopback

    host = args.host or config.gateway.listen.host
    port = args.port if args.port is not None else config.gateway.listen.port
    tokens = Tokens(environ(config.gateway.auth.tokens_env))
    oauth = config.gateway.auth.oauth is not None
    if not tokens and not oauth:
        if not is_loopback(host):
            print(
                f"gateway: refusing to serve on {host} without a bearer token: set {config.gateway.auth.tokens_env} "
                "(comma-separated tokens, optionally name=token), configure gateway.auth.oauth, or bind to 127.0.0.1",
                file=sys.stderr,
            )
            return EXIT_USAGE
        log.warning(
            "auth.disabled",
            message=f"NO BEARER TOKENS ({config.gateway.auth.tokens_env} is empty): serving on loopback only, "
            "any local process can call every tool",
        )
    import uvicorn

    class _Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn would re-raise SIGTERM after its own shutdown, killing the process before the backends (and
            # their child processes) are stopped; the gateway handles the signals itself instead.
            yield

    parser = environ("GATEWAY_HTTP_PARSER") or "httptools"
    if parser not in PARSERS:
        print(f"gateway: GATEWAY_HTTP_PARSER must be one of {', '.join(PARSERS)}, not {parser!r}", file=sys.stderr)
        return EXIT_USAGE
    limits = config.gateway.limits  # read at start: a reload does not change them
    max_connections = effective_max_connections(limits, raise_open_files_limit())
    quiet_edge_logs(asyncio.get_running_loop())
    settle_heap()
    # Bound before any backend starts: a port in use is one sentence, not a traceback after the backends' start.
    with _bound_socket(host, port, config.gateway.edge.send_buffer_bytes) as listening:
        async with Gateway(config).running() as gateway:
            app = build_app(gateway, host=host, tokens=tokens)
            server = _Uvicorn(
                uvicorn.Config(
                    app,
                    host=host,
                    port=port,
                    log_level="warning",
                    lifespan="on",
                    access_log=False,
                    # deadlines and the cap (connections.py), on httptools unless GATEWAY_HTTP_PARSER=h11
                    http=edge_protocol(limits, max_connections=max_connections, parser=parser),
                    backlog=max_connections,  # one accept burst opens at most this many sockets (connections.py)
                    timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]  # uvicorn takes any number here
                    # A backstop only: _stop_http ends the connections first (an idle stream does not hold the exit).
                    timeout_graceful_shutdown=math.ceil(config.gateway.drain_s + 2 * ANSWER_GRACE_S),
                )
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signals, gateway, functools.partial(_stop_http, server, gateway))
                tg.start_soon(watch_config, config.source, _reloader(gateway))
                log.info(
                    "gateway.serving",
                    url=f"http://{host}:{port}/mcp",
                    backends=len(gateway.backends),
                    auth=bool(tokens) or oauth,
                    oauth=oauth,
                )
                await server.serve(sockets=[listening])
                tg.cancel_scope.cancel()
    log.info("gateway.stopped")
    return EXIT_OK


YOUNG_OBJECTS = 10_000
"""Objects allocated (net) before the young generation is collected (CPython's default: 700)."""


def settle_heap() -> None:
    """Take what start-up made out of the cyclic garbage collector's sight, once everything serving needs is imported,
    and collect the young generation less often.

    Modules, classes, functions and the SDK's schemas (about 115,000 objects, all of them for the process's life)
    were walked by every full collection: 36 ms on a quiet machine, up to 80 ms under load, a pause every call in
    flight waited out. Frozen (``gc.freeze``, after one collection so no garbage is kept), a full collection walks
    only what serving made since. Frozen objects are still freed when nothing refers to them; only a cycle among
    them would stay, and these live as long as the process.

    What serving makes is still walked by a full collection, and every call in flight holds a few hundred objects:
    under a burst of calls a full collection paused the loop 22-147 ms. With a collection of the young generation every
    700 objects, a call's objects were collected while it was still in flight, promoted, and soon made a full
    collection due (one every 100 young ones); every ``YOUNG_OBJECTS`` instead, most of them are gone by then: the
    hostile soak's attack made none due (docs/benchmarks.md). Garbage cycles are still freed, a little later.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, middle, old)


_BIND_FAILURES = {
    errno.EADDRINUSE: "the address is already in use (another gateway or program listens there; pass --port or "
    "change gateway.listen)",
    errno.EACCES: "permission denied (a port below 1024 needs privileges)",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address",
}


def _bound_socket(host: str, port: int, send_buffer_bytes: int | None = None) -> socket.socket:
    """The listening address, bound as uvicorn binds it (its own failure is a log line and ``sys.exit(3)``); every
    connection accepted on it inherits its send buffer (``gateway.edge.send_buffer_bytes``).

    Raises:
        GatewayError: the address cannot be bound, in one sentence naming it and the cause.
    """
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on accepted sockets of that protocol;
    # with it on, every response after the first on a kept-alive connection waited for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        cause = _BIND_FAILURES.get(exc.errno or 0, exc.strerror or str(exc))
        raise GatewayError(f"Cannot listen on {host}:{port}: {cause}") from None
    return sock


async def _stop_on_signals(gateway: Gateway, stop: Callable[[anyio.Event], Coroutine[Any, Any, None]]) -> None:
    """The first SIGINT/SIGTERM starts the shutdown (``stop``: drain, then cancel what is left); a second one
    cuts the drain short (``hurry``). Neither kills the process: the shutdown always writes the ledger and stops
    the children (the table in docs/operations.md, "Shutdown and processes")."""
    hurry = anyio.Event()
    stopping = False
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            async for signum in signals:
                name = signal.Signals(signum).name
                if not stopping:
                    stopping = True
                    log.info("gateway.stopping", signal=name, drain_s=gateway.config.gateway.drain_s)
                    tg.start_soon(stop, hurry)
                else:
                    log.warning("gateway.stopping_now", signal=name, calls=gateway.router.drain.calls_in_progress())
                    hurry.set()


async def _stop_http(server: Any, gateway: Gateway, hurry: anyio.Event) -> None:
    """Stop taking connections, drain the calls, then give the answers ANSWER_GRACE_S to be written and close
    what is still open (idle event streams: nothing anyone waits for)."""
    server.should_exit = True
    await gateway.drain(hurry)
    with anyio.move_on_after(ANSWER_GRACE_S):
        while server.server_state.tasks:  # noqa: ASYNC110 - uvicorn offers no event for it
            await anyio.sleep(0.02)
    for task in list(server.server_state.tasks):
        task.cancel(msg="the gateway is shutting down")


async def _serve_stdio(config: Federation) -> int:
    from gateway.front.stdio import stdio_edge  # the SDK's stdio_server() where stdin/stdout are not pipes

    settle_heap()
    async with Gateway(config).running() as gateway:
        server = Face(gateway).server()
        async with anyio.create_task_group() as tg:

            async def stop(hurry: anyio.Event) -> None:
                await gateway.drain(hurry)
                await anyio.sleep(ANSWER_GRACE_S)  # the answers are written to stdout meanwhile
                tg.cancel_scope.cancel()

            async def answer_what_was_read() -> None:
                # stdin ended with requests unanswered: each gets its answer (a call at least its row) before the
                # session ends, which would cancel them. One waiting for the backends to start waits on (bounded);
                # the calls then have drain_s, as at a signal, and the answers ANSWER_GRACE_S to be sent. Each
                # sleep is a bound: the edge ends this wait as soon as every request read is answered.
                await gateway.wait_started()
                limit = gateway.config.gateway.drain_s
                await anyio.sleep(limit)
                gateway.stop_calls(f"the gateway is shutting down: its stdin closed (calls had {limit:g} s to finish)")
                await anyio.sleep(ANSWER_GRACE_S)

            tg.start_soon(_stop_on_signals, gateway, stop)
            tg.start_soon(watch_config, config.source, _reloader(gateway))
            async with stdio_edge(answer_what_was_read) as (read, write):
                await server.run(read, write, server.create_initialization_options())
            tg.cancel_scope.cancel()  # the client closed stdin: shut down
    return EXIT_OK


def _reloader(gateway: Gateway) -> Callable[[str], Awaitable[None]]:
    """Re-read the file and apply it; a broken edit is refused (named by file, key path and line) and the
    configuration in effect keeps serving."""

    async def reload(reason: str) -> None:
        source = gateway.config.source
        try:
            config = await anyio.to_thread.run_sync(load_config, source)
            register_secrets(config)
            await gateway.reload(config)
        except ConfigError as exc:  # invalid, or it would remove every backend (gateway.allow_no_backends)
            gateway.reload_error = str(exc)
            log.error("reload.refused", reason=reason, error=str(exc), message="keeping the configuration in effect")
            return
        gateway.reload_error = None

    return reload


# ----------------------------------------------------------------------------------------------- check / tools


async def _check(config: Federation, as_json: bool, strict: bool = False) -> int:
    from gateway.front.http.status import status_document  # /status's document; `check` prints the same

    async with Gateway(config, audit=False).running() as gateway:
        await gateway.wait_settled(settle_budget(config, probes=True), checked=True)  # the adapters' probes too
        doc = status_document(gateway)  # its config section names the file checked, as /status names the one served
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_check(config, doc)
    failures = _strict_failures(doc) if strict else []
    for failure in failures:
        print(f"gateway check --strict: {failure}", file=sys.stderr)
    return EXIT_FAILED if failures else EXIT_OK


def _print_check(config: Federation, doc: dict[str, Any]) -> None:
    rows = [("NAME", "KIND", "STATE", "TOOLS", "ERAS", "REASON")]
    for b in doc["backends"]:
        reason = b["reason"] or ""
        if b["declared"]:
            reason = f"(declared) {reason}"
        eras = ",".join(b["eras"]) or "-"  # the protocol eras an MCP downstream answered in
        rows.append((b["name"], b["kind"], b["state"], str(b["tools"]), eras, reason))
        for variant in b["variants_not_ready"]:  # a ready backend whose variant cannot run here (its probe said)
            rows.append(("", "", "", "", "", f"(detected) variant {variant['variant']} not ready: {variant['reason']}"))
    print(f"config: {config.source}  (valid)")
    print(_table(rows))
    print(f"catalog: {doc['catalog']['tools']} tools; status: {doc['status']}")
    for problem in doc["catalog"]["problems"]:
        print(f"  problem: {problem}")


def _strict_failures(doc: dict[str, Any]) -> list[str]:
    """What fails ``check --strict``: each backend neither ready nor declared disabled, and each catalog problem."""
    failures = [
        f"backend {b['name']!r} is {b['state']}: {b['reason'] or 'no reason given'}"
        for b in doc["backends"]
        if b["state"] not in ("ready", "disabled")
    ]
    return failures + [f"catalog problem: {problem}" for problem in doc["catalog"]["problems"]]


async def _tools(config: Federation, as_json: bool, full: bool, caller: str | None = None) -> int:
    async with Gateway(config, audit=False).running() as gateway:
        await gateway.wait_settled(settle_budget(config))
        await gateway.refresh_costs()  # show {cost:TOOL} placeholders filled, as clients see them
        catalog = gateway.catalog
        entries = list(catalog.entries.values())
        view = Views().view(catalog, Caller(caller)) if caller is not None else None
        if view is not None:  # that caller's view: its tools, their descriptions as it is shown them
            shown = {tool["name"]: tool.get("description") for tool in view.list_result["tools"]}
            entries = [
                replace(e, tool=e.tool.model_copy(update={"description": shown[e.name]}))
                for e in entries
                if e.name in shown
            ]
    if as_json:
        out: list[dict[str, Any]] = [
            {
                "name": e.name,
                "providers": [p.label for p in e.providers],
                "description": e.tool.description,
                "input_schema": e.tool.input_schema,
                "tokens": list_tokens({"tools": [e.tool.model_dump(by_alias=True, mode="json", exclude_none=True)]}),
            }
            for e in entries
        ]
        print(json.dumps(out, indent=2))
        return EXIT_OK
    rows = [("TOOL", "PROVIDERS", "DESCRIPTION")]
    for e in entries:
        description = (e.tool.description or "").strip()
        rows.append(
            (
                e.name,
                " -> ".join(p.label for p in e.providers),
                description if full else description.split("\n")[0][:80],
            )
        )
    print(_table(rows))
    large, small = catalog.tokens
    if view is not None:
        large, small = list_tokens(view.list_result), list_tokens(view.list_result_small or view.list_result)
    print(f"\ntools/list costs a client ~{large:,} tokens (large context), ~{small:,} (the others) by {counter().name}")
    return EXIT_OK


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)
