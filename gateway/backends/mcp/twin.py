"""The second session of a downstream that speaks both protocol eras, beside its shared session: ``Twin``.

The shared session speaks one era; the twin speaks the other, for the clients of that era (``route``). It lists what
the downstream offers in its era too: what it alone lists is published after the shared session's lists
(``merged``), and a request naming one of those goes on it whatever the calling client's era; a request of a client
of the twin's era naming what the twin does not list goes on the shared session.

Two kinds, by what the downstream said at connect (eras.py ``open_session``):

* a **stateless twin** (``open_stateless``) beside a handshake session, adopting the ``server/discover`` answer (no
  wire traffic), taught the tools listed so that a call on it mirrors their ``x-mcp-header`` arguments into
  ``Mcp-Param-*`` headers (SEP-2243). Kept for servers whose callers have sessions of their own, or that sign in.
* a **handshake twin** (``defer``) beside a stateless shared session: nothing is sent for it at connect, so every
  request the downstream sees until a handshake-era client comes is one of the 2026-07-28 era. The first request of such
  a client, or a resource subscription (held there: ``handshake_open``), opens it (once, shared by all of them; again
  after it was lost); when it cannot be opened, the reason is kept and logged, those clients are served over the
  stateless session as a 2026-only downstream's are, and it is not asked again until the backend reconnects. ``eras``
  tells which of this is the truth: the handshake era spoken, offered by the discover answer, not yet tried, or refused.
  As it opens, the backend sets on it the log level its clients keep (held.py ``restore_log_level``).

``Listed`` gives a backend its lists (its shared session's, merged with its twin's) and the shorter ``ttlMs``
(SEP-2549) of the two sessions' last listings.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.client.session import ClientSession
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from gateway.backends.mcp.eras import HANDSHAKE, MODERN, stateless
from gateway.backends.mcp.failures import Life
from gateway.backends.mcp.fastpath import DirectLane
from gateway.backends.mcp.lanes import Lane
from gateway.backends.mcp.lists import listed_ttl_ms, relist
from gateway.config import ServerConfig

__all__ = ["LIST_KEYS", "NOT_YET_TRIED", "Listed", "Twin"]

log = structlog.get_logger("gateway.backend")

NOT_YET_TRIED = f"{HANDSHAKE}: not yet tried"
"""The handshake era in ``eras`` while no handshake-era client has needed it and the discover answer did not name it."""

OpenHandshake = Callable[[], Awaitable[Lane]]
"""Open (or find open) the downstream's handshake session (lanes.py ``Lanes.for_handshake``)."""
Changed = Callable[[], Awaitable[None]]
"""The twin opened (set on it what its clients hold) or was refused: re-read the lists, the twin's among them."""


class Twin:
    """The session of the other era beside one downstream's shared session, and what it lists."""

    def __init__(self, backend: str, config: ServerConfig) -> None:
        self._name = backend
        self._config = config
        self.era: str | None = None  # the twin's era; None: no twin
        self.session: ClientSession | None = None
        self.fast: DirectLane | None = None  # a handshake twin's direct lane (set by its transport)
        self._caps: types.ServerCapabilities | None = None
        self._keys: dict[str, frozenset[str]] = {}  # by list kind, the keys (LIST_KEYS) of what the twin lists
        self._only: dict[str, frozenset[str]] = {}  # ... and of what it alone lists
        self._templates: tuple[tuple[UriTemplate, bool], ...] = ()  # its templates, parsed (and whether alone)
        self._open: OpenHandshake | None = None
        self._changed: Changed | None = None
        self._lane: Lane | None = None
        self._offered = False  # the discover answer names a handshake-era version
        self._refused: str | None = None
        self._lock = anyio.Lock()

    async def open_stateless(
        self,
        stack: AsyncExitStack,
        connect: AbstractAsyncContextManager[ClientSession],
        found: types.DiscoverResult,
    ) -> None:
        """Enter ``connect`` (a session over a transport of its own) on ``stack`` and make it a stateless one from
        the discover answer ``found``."""
        self.session = await stack.enter_async_context(connect)
        stateless(self.session, found)
        self.era, self._caps = MODERN, found.capabilities

    def defer(self, found: types.DiscoverResult, open_handshake: OpenHandshake, changed: Changed) -> None:
        """A handshake twin, opened by ``open_handshake`` when a handshake-era client first needs it; ``changed``
        is awaited once it opened (to list it) or was refused."""
        self.era, self._open, self._changed = HANDSHAKE, open_handshake, changed
        self.session = self._lane = None
        self._offered = any(version in found.supported_versions for version in HANDSHAKE_PROTOCOL_VERSIONS)

    def close(self) -> None:
        """The shared session ended: so does the twin (a handshake twin's session is told so)."""
        if self._lane is not None:
            self._lane.life.mark_lost("the shared session ended")
        self.era = self.session = self._caps = self._lane = self._open = self._refused = None
        self._keys, self._only, self._templates = {}, {}, ()

    @property
    def handshake(self) -> ClientSession | None:
        """A handshake twin's session, when open (where a 2025 client's log level is asked for)."""
        return self.session if self.era == HANDSHAKE else None

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What the twin's session offered (None while a handshake twin is not open)."""
        return self._caps

    async def handshake_open(self) -> ClientSession | None:
        """A handshake twin's session, opened if need be (None: no handshake twin, or it was refused)."""
        return await self._opened() if self.era == HANDSHAKE else None

    @property
    def life(self) -> Life:
        """A handshake twin's session's life (the cause of its calls' failures when it is lost)."""
        return self._lane.life if self._lane is not None else Life()

    def eras(self, shared: tuple[str, ...]) -> tuple[str, ...]:
        """The eras the downstream speaks, as far as is known: ``shared``'s, with the handshake twin's state."""
        if self.era != HANDSHAKE:
            return shared
        if self.session is not None or (self._offered and self._refused is None):
            return (HANDSHAKE, *shared)
        if self._refused is not None:
            return (*shared, f"{HANDSHAKE}: refused ({self._refused})")
        return (*shared, NOT_YET_TRIED)

    async def route(self, method: str, params: Any, wanted: str) -> ClientSession | None:
        """The twin's session when the request goes on it (else None: the shared session, or the caller's own).
        ``wanted``: the era the calling client is best served in. A handshake twin is opened here when needed."""
        if self.era is None:
            return None
        if wanted != self.era:
            return self.session if self._named(method, params) == "alone" else None
        if self._named(method, params) is None and not (method.startswith("tasks/") and self.era == MODERN):
            return None  # names nothing listed: the shared session's (a task's requests go on a stateless twin)
        session = await self._opened()
        if session is None or self._named(method, params) == "unlisted":
            return None
        return session

    async def merged(self, lists: dict[str, tuple[Any, ...]], life: Life) -> dict[str, tuple[Any, ...]]:
        """``lists`` (the shared session's, by kind) with, after each, what the twin lists besides (its era's alone).
        Without an open twin, or when its listing failed (``relist`` logs why), ``lists`` as they are."""
        lane = self.session
        if lane is None:
            return lists
        kinds = tuple(lists)
        theirs = await relist(lane, kinds, self._caps, self._config, backend=self._name, life=life)
        if theirs is None:
            return lists
        merged = dict(lists)
        for kind in kinds:
            key = LIST_KEYS[kind]
            keys = {key(item) for item in lists[kind]}
            more = tuple(item for item in theirs[kind] if key(item) not in keys)
            merged[kind] = (*lists[kind], *more)
            self._keys[kind] = frozenset(key(item) for item in theirs[kind])
            self._only[kind] = frozenset(key(item) for item in more)
            if kind == "resource_templates":
                parsed = ((_parsed(k), k in self._only[kind]) for k in self._keys[kind])
                self._templates = tuple((t, alone) for t, alone in parsed if t is not None)
        return merged

    def learn(self, tools: Sequence[types.Tool]) -> None:
        """Teach a stateless twin the tools listed, as if it had listed them itself: a call on it then mirrors the
        arguments its tool annotates with ``x-mcp-header`` into ``Mcp-Param-*`` headers (SEP-2243)."""
        if self.session is not None and self.era == MODERN:
            self.session._absorb_tool_listing(types.ListToolsResult(tools=list(tools)), complete=True)

    async def _opened(self) -> ClientSession | None:
        """The twin's session; a handshake twin's opened once (shared by every caller), or None when refused."""
        if self._open is None or self._refused is not None:
            return self.session
        async with self._lock:
            if self._lane is not None and self._lane.closed.is_set():
                self.session = self._lane = None  # lost since: opened again
            if self.session is None and self._refused is None:
                lane = await self._open()
                if self._open is None:  # the shared session ended meanwhile (close): so does this one
                    lane.life.mark_lost("the shared session ended")
                    return None
                if lane.session is None:
                    self._refused = lane.failure or "closed"
                    log.warning("backend.handshake_refused", backend=self._name, reason=self._refused)
                else:
                    self._lane, self.session = lane, lane.session
                    init = lane.session.initialize_result
                    self._caps = init.capabilities if init is not None else None
                    if self.fast is not None and init is not None:
                        self.fast.version = init.protocol_version
                if self._changed is not None:
                    await self._changed()
        return self.session

    def _named(self, method: str, params: Any) -> str | None:
        """What the request names, as the twin lists it: ``alone`` (the twin alone lists it), ``listed`` (the twin
        lists it too), ``unlisted`` (the twin does not list it, or has not been listed yet) or None (it names
        nothing a list holds)."""
        if method in ("tools/call", "prompts/get"):
            kind, key = ("tools" if method == "tools/call" else "prompts"), params.name
        elif method == "resources/read":
            return self._resource(str(params.uri))
        elif method == "completion/complete":
            ref = params.ref
            is_prompt = isinstance(ref, types.PromptReference)
            kind, key = ("prompts", ref.name) if is_prompt else ("resource_templates", ref.uri)
        else:
            return None
        if key in self._only.get(kind, ()):
            return "alone"
        return "listed" if key in self._keys.get(kind, ()) else "unlisted"

    def _resource(self, uri: str) -> str:
        if uri in self._only.get("resources", ()):
            return "alone"
        if uri in self._keys.get("resources", ()):
            return "listed"
        matched = [alone for template, alone in self._templates if template.match(uri) is not None]
        if matched:
            return "alone" if all(matched) else "listed"
        return "unlisted"


class Listed:
    """The lists of the Backend protocol (backends/base.py) for a backend whose lists (``_lists``, by kind) come from
    its shared ``_session`` and, beside it, the session of a dual-era server's other era (``_twin``), and their
    ``list_ttl_ms``: the shorter one's."""

    _session: ClientSession | None
    _twin: Twin
    _lists: dict[str, tuple[Any, ...]]

    def tools(self) -> Sequence[types.Tool]:
        return self._lists["tools"]

    def resources(self) -> Sequence[types.Resource]:
        return self._lists["resources"]

    def resource_templates(self) -> Sequence[types.ResourceTemplate]:
        return self._lists["resource_templates"]

    def prompts(self) -> Sequence[types.Prompt]:
        return self._lists["prompts"]

    def list_ttl_ms(self, kind: str) -> int | None:
        found = (listed_ttl_ms(session, kind) for session in (self._session, self._twin.session))
        return min((ttl for ttl in found if ttl is not None), default=None)


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
