"""The tools a federation declares but does not serve right now, and why: a disabled backend's, a server's that has
not connected, a route's whose providers are all down. A call of one is still an unknown tool (a JSON-RPC error:
nothing is listed under that name), but its message says whose the tool is and why it is off, instead of a bare
"Unknown tool".

What is known of such a backend's tools: an adapter's and the wiki's from the file; a server's from its last
connection (``last_known_tools``) or, when it never connected, its ``tools.include`` and ``unlisted_tools``. Names
are the published ones (after ``rename``), unprefixed and, unless ``naming.mode`` is ``never``, prefixed too: a
collision cannot be told while the backend is off.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from gateway.backends.base import Backend, BackendState
from gateway.config import WIKI_TOOLS, Federation

__all__ = ["Unserved", "unserved", "why_off"]


@dataclass(frozen=True, slots=True)
class Unserved:
    """Why a declared tool is not served: the backends it would come from, and a sentence for its caller."""

    backends: tuple[str, ...]
    why: str


def unserved(
    config: Federation, backends: Mapping[str, Backend], served: Collection[str], routes_off: Collection[str]
) -> dict[str, Unserved]:
    """Every name a client may call that would be a tool of a backend that serves none now (``served``: the names
    the catalog holds), or a route of ``routes_off`` (declared, not published), with why."""
    found: dict[str, Unserved] = {}
    mode, sep = config.gateway.naming.mode, config.gateway.naming.separator
    consumed = {step.provider for route in config.routes.values() for step in route.providers}
    for name, backend in backends.items():
        status = backend.status
        if status.state in (BackendState.READY, BackendState.DEGRADED):
            continue
        if status.state is not BackendState.DISABLED and (backend.static_tools or backend.last_known_tools()):
            continue  # its tools stay listed while it is down, and their calls say why (router.py)
        kind = "server" if name in config.servers else "adapter" if name in config.adapters else "wiki"
        why = f"it is a tool of {kind} {name!r}, which is {status.state}: {status.reason or 'no reason given'}"
        for local, published in _declared(config, backend, name):
            if f"{name}/{local}" in consumed:
                continue  # served under a route's name
            names = [published] if mode != "always" else []
            names += [f"{name}{sep}{published}"] if mode != "never" else []
            for public in names:
                if public not in served:
                    found.setdefault(public, Unserved((name,), why))
    for route in routes_off:
        steps = [step.provider.split("/", 1)[0] for step in config.routes[route].providers]
        down = [f"{b} ({_state(backends.get(b))})" for b in dict.fromkeys(steps)]
        why = f"it is a route none of whose providers is available: {', '.join(down)}"
        found.setdefault(route, Unserved(tuple(dict.fromkeys(steps)), why))
    return found


def why_off(found: Mapping[str, Unserved], name: str, visible: Collection[str] | None) -> str | None:
    """Why ``name`` is off, for a caller whose policy would show it (``visible``: None, every tool); else None."""
    off = found.get(name)
    return off.why if off is not None and (visible is None or name in visible) else None


def _state(backend: Backend | None) -> str:
    if backend is None:
        return "not running"
    status = backend.status
    return f"{status.state}: {status.reason}" if status.reason else str(status.state)


def _declared(config: Federation, backend: Backend, name: str) -> Iterator[tuple[str, str]]:
    """(its own name, its published name) of each tool ``backend`` would serve."""
    if name in config.adapters:
        yield from ((tool, tool) for tool in config.adapters[name].tools)
        return
    if config.wiki is not None and name == config.wiki.name:
        yield from ((tool, tool) for tool in (config.wiki.tools or WIKI_TOOLS))
        return
    server = config.servers.get(name)
    if server is None:
        return
    flt = server.tools
    known = [tool.name for tool in backend.last_known_tools()] or list(flt.include or ())
    for local in known:
        if (flt.include is None or local in flt.include) and local not in flt.exclude:
            yield local, flt.rename.get(local, local)
    yield from ((local, local) for local in server.unlisted_tools)
