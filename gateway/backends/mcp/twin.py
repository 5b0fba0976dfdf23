"""The second session of a downstream that speaks both protocol eras, beside its shared session: ``Twin``.

Its shared session speaks one era; the twin speaks the other, for the clients of that era. It lists what the
downstream offers in its era too: what it alone lists is published after the shared session's lists, and a request
naming one of those goes on it whatever the calling client's era (``only``). Today the twin is the stateless lane
(2026-07-28) beside a handshake session: it adopts the downstream's ``server/discover`` answer (no wire traffic), and
is taught the tools listed so that a call on it mirrors their ``x-mcp-header`` arguments into ``Mcp-Param-*``
headers (SEP-2243).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from gateway.backends.mcp.eras import stateless
from gateway.backends.mcp.failures import Life
from gateway.backends.mcp.lists import relist
from gateway.config import ServerConfig

__all__ = ["LIST_KEYS", "Twin"]


class Twin:
    """The session of the other era beside one downstream's shared session, and what it alone lists."""

    def __init__(self, backend: str, config: ServerConfig) -> None:
        self._name = backend
        self._config = config
        self.session: ClientSession | None = None
        self._only: dict[str, frozenset[str]] = {}  # by list kind, the keys (LIST_KEYS) of what the twin alone lists
        self._templates: tuple[UriTemplate, ...] = ()  # the templates it alone lists, parsed

    async def open(
        self,
        stack: AsyncExitStack,
        connect: AbstractAsyncContextManager[ClientSession],
        found: types.DiscoverResult,
    ) -> None:
        """Enter ``connect`` (a session over a transport of its own) on ``stack`` and make it a stateless one from
        the discover answer ``found``."""
        self.session = await stack.enter_async_context(connect)
        stateless(self.session, found)

    def close(self) -> None:
        self.session = None
        self._only, self._templates = {}, ()

    async def merged(self, lists: dict[str, tuple[Any, ...]], life: Life) -> dict[str, tuple[Any, ...]]:
        """``lists`` (the shared session's, by kind) with, after each, what the twin lists besides (its era's alone).
        Without a twin, or when its listing failed (``relist`` logs why), ``lists`` as they are."""
        lane = self.session
        found = lane.discover_result if lane is not None else None
        if lane is None or found is None:
            return lists
        kinds = tuple(lists)
        theirs = await relist(lane, kinds, found.capabilities, self._config, backend=self._name, life=life)
        if theirs is None:
            return lists
        merged = dict(lists)
        for kind in kinds:
            key = LIST_KEYS[kind]
            keys = {key(item) for item in lists[kind]}
            more = tuple(item for item in theirs[kind] if key(item) not in keys)
            merged[kind] = (*lists[kind], *more)
            self._only[kind] = frozenset(key(item) for item in more)
            if kind == "resource_templates":
                self._templates = tuple(t for t in map(_parsed, self._only[kind]) if t is not None)
        return merged

    def names(self, method: str, params: Any) -> bool:
        """Whether the request ``method`` with ``params`` names something the twin alone lists (it goes there)."""
        if method == "tools/call":
            return params.name in self._only.get("tools", ())
        if method == "prompts/get":
            return params.name in self._only.get("prompts", ())
        if method == "resources/read":
            return self._resource(params.uri)
        if method == "completion/complete":
            ref = params.ref
            if isinstance(ref, types.PromptReference):
                return ref.name in self._only.get("prompts", ())
            return ref.uri in self._only.get("resource_templates", ())
        return False

    def learn(self, tools: Sequence[types.Tool]) -> None:
        """Teach the twin the tools listed, as if it had listed them itself: a call on it then mirrors the arguments
        its tool annotates with ``x-mcp-header`` into ``Mcp-Param-*`` headers (SEP-2243)."""
        if self.session is not None:
            self.session._absorb_tool_listing(types.ListToolsResult(tools=list(tools)), complete=True)

    def _resource(self, uri: str) -> bool:
        return uri in self._only.get("resources", ()) or any(t.match(uri) is not None for t in self._templates)


LIST_KEYS: dict[str, Callable[[Any], str]] = {
    "tools": lambda item: item.name,
    "prompts": lambda item: item.name,
    "resources": lambda item: str(item.uri),
    "resource_templates": lambda item: item.uri_template,
}
"""What names an item of each list kind (what a request names it by)."""


def _parsed(template: str) -> UriTemplate | None:
    try:
        return UriTemplate.parse(template)
    except InvalidUriTemplate:
        return None
