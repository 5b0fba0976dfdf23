"""Shadowing refused: which names a downstream server's tool may not take, and what becomes of one that tries.

The house's names are the gateway's own tools (the search and call tools of search exposure, the reader of kept
answers, whether or not they are on now), the routes, and the tools the file itself declares (each adapter's, the
wiki's). A server's tool, named by the server or renamed in the file, is never served under one of them nor under a
name another server publishes too: under ``never`` it is left out, under ``conditional`` it takes its server's prefix,
and either way the catalog keeps a problem naming the tool, the name and whose it is. A name two servers publish is
prefixed for both under ``conditional`` (the documented rule, so no problem) and served by neither under ``never``:
first come is no rule, since a server that adds a tool later would take the name from the one that had it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.config import Federation
from gateway.core.kept import READ_TOOL

__all__ = ["house_owner", "reserved", "server_name"]


def reserved(config: Federation) -> dict[str, str]:
    """The names that are the gateway's own or a route's, each with whose it is, in words."""
    exposure = config.exposure
    names = {route: f"route {route!r}" for route in config.routes}
    names[READ_TOOL] = "the gateway's reader of kept answers"
    names[exposure.call_tool] = "the gateway's call tool (exposure.call_tool)"
    names[exposure.search_tool] = "the gateway's tool search (exposure.search_tool)"
    return names


def house_owner(config: Federation, backend: str, local: str) -> str:
    """Whose a tool the file declares is, in words: the wiki's or an adapter's."""
    if config.wiki is not None and backend == config.wiki.name:
        return f"the wiki's tool {backend}/{local}"
    return f"adapter {backend}'s tool {backend}/{local}"


def server_name(
    backend: str,
    local: str,
    published: str,
    owner: str | None,
    others: Sequence[str],
    naming: tuple[str, str],
    taken: Mapping[str, object],
) -> tuple[str | None, str | None]:
    """The name a server's tool is served under (None: not served) and the problem to keep (None: none).

    Args:
        published: its name after ``tools.rename``, before any prefix.
        owner: whose ``published`` is when the house has it (``reserved``, ``house_owner``), else None.
        others: the other servers that publish ``published`` too.
        naming: the naming mode and separator.
        taken: the names already served.
    """
    mode, sep = naming
    label = f"{backend}/{local}"
    if owner is None and not others and mode != "always":
        public = published
    elif mode == "never":
        whose = owner if owner is not None else f"also published by {', '.join(others)}"
        return None, f"tool {label} is not published: the name {published!r} is {whose} (naming mode 'never')"
    else:
        public = f"{backend}{sep}{published}"
    if public in taken:
        return None, f"tool {label} is not published: the name {public!r} is already taken (naming mode {mode!r})"
    if owner is not None and mode != "always":
        return public, f"tool {label} is published as {public!r}: the name {published!r} is {owner}"
    return public, None
