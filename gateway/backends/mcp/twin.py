"""The second session of a downstream that speaks both protocol eras, beside its shared session: ``Twin``.

Its shared session speaks one era; the twin speaks the other, for the clients of that era. It lists what the
downstream offers in its era too: what it alone lists is published after the shared session's lists, and a request
naming one of those goes on it whatever the calling client's era (``only``). Today the twin is the stateless lane
(2026-07-28) beside a handshake session: it adopts the downstream's ``server/discover`` answer (no wire traffic), and
is taught the tools listed so that a call on it mirrors their ``x-mcp-header`` arguments into ``Mcp-Param-*``
headers (SEP-2243).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession

from gateway.backends.mcp.eras import stateless
from gateway.backends.mcp.failures import Life
from gateway.backends.mcp.lists import relist
from gateway.config import ServerConfig

__all__ = ["Twin"]


class Twin:
    """The session of the other era beside one downstream's shared session, and what it alone lists."""

    def __init__(self, backend: str, config: ServerConfig) -> None:
        self._name = backend
        self._config = config
        self.session: ClientSession | None = None
        self.only: frozenset[str] = frozenset()
        """The tools the downstream lists on the twin alone (called there whatever the client's era)."""

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

    async def with_tools(self, tools: tuple[Any, ...], life: Life) -> tuple[Any, ...]:
        """``tools`` and, after them, those the twin lists besides (its era's alone)."""
        tools, self.only = _merge(tools, await self._tools(life))
        return tools

    def learn(self, tools: Sequence[types.Tool]) -> None:
        """Teach the twin the tools listed, as if it had listed them itself: a call on it then mirrors the arguments
        its tool annotates with ``x-mcp-header`` into ``Mcp-Param-*`` headers (SEP-2243)."""
        if self.session is not None:
            self.session._absorb_tool_listing(types.ListToolsResult(tools=list(tools)), complete=True)

    async def _tools(self, life: Life) -> tuple[types.Tool, ...]:
        """The tools the twin lists; none without one, or when its listing failed (``relist`` logs why)."""
        lane = self.session
        found = lane.discover_result if lane is not None else None
        if lane is None or found is None:
            return ()
        listed = await relist(lane, ("tools",), found.capabilities, self._config, backend=self._name, life=life)
        return listed["tools"] if listed is not None else ()


def _merge(shared: Sequence[types.Tool], lane: Sequence[types.Tool]) -> tuple[tuple[types.Tool, ...], frozenset[str]]:
    """The shared session's tools and, after them, those only the twin lists; and the latter's names."""
    names = {tool.name for tool in shared}
    more = tuple(tool for tool in lane if tool.name not in names)
    return (*shared, *more), frozenset(tool.name for tool in more)
