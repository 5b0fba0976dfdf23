"""Progressive disclosure: a client in ``search`` exposure sees a tool search instead of the whole catalog.

``Disclosure`` decides each client's exposure (``exposure.mode``, overridden by ``exposure.clients`` patterns on
its clientInfo, the initialize's or, for a 2026-07-28 client, its request's ``_meta``'s; ``auto`` means search
when the catalog is over ``auto_tools`` tools or ``auto_tokens`` estimated tokens, or when the client is below the
context gate), and serves what search mode adds:

* the ``tools/list`` of search mode: the search tool, the call tool and the operator's ``pinned`` tools, pre-serialised
  once per catalog. The search tool's description carries the router note, so a model still reads one routing
  paragraph, now ending with how to find tools;
* the search tool: query -> the best tools (name, one-line description, input schema, backend health, cost band,
  and ``score``, the calibrated probability that the tool fits), ranked by the shared engine
  (``search/tools.py``'s ``ToolIndex``, built in a worker thread once per catalog, reusing the vectors of the
  previous one; a search ranks in a worker thread too), filtered by backend and annotations, and only among tools
  whose backend is ready unless ``include_unavailable`` is set. When no tool fits, the answer says so plainly: no
  ``tools``, a note, and the ``closest`` few by name and score only;
* learning from use: a call, by the same connection, of a tool its last search found is remembered for the
  caller's team (its policy; ``search/learning.py``) and nudges that team's later alike searches;
* the call tool: ``unwrap`` turns ``{name, arguments}`` into the real call, which the router then serves exactly as a
  direct call (same route, ladder, audit row under the real tool's name). A direct call by name still works;
* ``tools_changed``: whether a search-mode client's list changed (only when the pinned set or the search tool's
  description did), so the other catalog changes do not send it ``list_changed``.

Per-caller policies (core/policies.py) narrow all of it: ``visible``, the names the caller's view holds (less the
large-context tools for a small client), is applied by the search before ranking; the pins and the router note of a
caller's search list are those its view allows; and a call through the call tool is refused by the router exactly as
a direct call of a tool the caller may not see.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import threading
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import mcp_types as types
import structlog

from gateway.backends.base import Backend, BackendState
from gateway.calls import Caller
from gateway.config import Exposure, Federation
from gateway.core.catalog import Catalog, CatalogEntry
from gateway.core.costs import BYTES_PER_TOKEN, Cost
from gateway.core.gate import note_without
from gateway.core.policies import View, Views
from gateway.errors import InvalidArguments

if TYPE_CHECKING:  # the search engine (numpy, the models) is imported when a search-mode client first needs it
    from gateway.search.learning import UseMemory
    from gateway.search.ranking import Embedder, Vectors
    from gateway.search.tools import Ranking, ToolDoc, ToolIndex

__all__ = ["INDEX_WAIT_S", "Disclosure", "cost_band", "meta_tools"]

log = structlog.get_logger("gateway.disclosure")

_SERVING = (BackendState.READY, BackendState.DEGRADED)
_LINE_CHARS = 160  # a result's one-line description
_CLOSEST = 3  # tools named when none fits
INDEX_WAIT_S = 5.0
"""How long a search waits for the catalog's semantic index before it ranks by keywords alone."""


def _search_description(exposure: Exposure, note: str) -> str:
    text = (
        "Find the tool for a task: this gateway's catalog is searched, not listed. Give what you want to do in a few "
        "words (e.g. 'create a Jira issue', 'screenshot the web page'); get the best matching tools with their input "
        f"schema, backend health and cost. Then call one by its name, or through {exposure.call_tool} with "
        "{name, arguments}. Filters: backend, read_only, destructive; include_unavailable also shows tools whose "
        "backend is down."
    )
    return f"{text}\n\n{note}" if note else text


def meta_tools(exposure: Exposure, note: str = "") -> list[dict[str, Any]]:
    """The search and call tools' definitions (wire shape), the search tool's description ending with ``note``."""
    search = {
        "name": exposure.search_tool,
        "description": _search_description(exposure, note),
        "inputSchema": {
            "type": "object",
            "required": ["query"],
            "properties": {
                "query": {"type": "string", "minLength": 1, "description": "What you want to do, in a few words."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": exposure.results},
                "backend": {"type": "string", "description": "Only tools served by this backend."},
                "read_only": {"type": "boolean", "description": "true: only tools that change nothing."},
                "destructive": {"type": "boolean", "description": "false: leave out tools that may destroy data."},
                "include_unavailable": {
                    "type": "boolean",
                    "default": False,
                    "description": "Also show tools whose backend is down, marked as such.",
                },
            },  # fmt: skip
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    }
    call = {
        "name": exposure.call_tool,
        "description": (
            f"Call a tool found with {exposure.search_tool}: name is the tool's name, arguments its arguments (as its "
            "input schema says). The same as calling the tool directly."
        ),
        "inputSchema": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "description": "The tool's name."},
                "arguments": {"type": "object", "description": "The tool's arguments."},
            },
            "additionalProperties": False,
        },
    }
    return [search, call]


def cost_band(cost: Cost | None) -> str:
    """A measured cost as a band a model can act on: small, medium or large answers, with the figures."""
    if cost is None or cost.tokens is None:
        return "not measured yet"
    band = "small" if cost.tokens < 1_000 else "medium" if cost.tokens < 10_000 else "large"
    return f"{band} ({cost.text()})"


def _one_line(text: str | None) -> str:
    line = (text or "").strip().split("\n", 1)[0].strip()
    return line if len(line) <= _LINE_CHARS else line[: _LINE_CHARS - 1].rstrip() + "…"


def _matches(patterns: Mapping[str, str], name: str | None, version: str | None) -> str | None:
    if not name:
        return None
    full = f"{name}@{version or ''}".lower()
    for pattern, mode in patterns.items():
        target = full if "@" in pattern else name.lower()
        if fnmatch.fnmatchcase(target, pattern.lower()):
            return mode
    return None


class Disclosure:
    """What search exposure adds to the gateway (see the module docstring); one per served gateway."""

    def __init__(
        self,
        config: Callable[[], Federation],
        catalog: Callable[[], Catalog],
        backends: Callable[[], Mapping[str, Backend]],
        load_model: Callable[[], Embedder] | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._backends = backends
        self._load_model = load_model
        self._lists: dict[tuple[int, bool, str | None], tuple[Catalog, Mapping[str, Any]]] = {}
        self._views: Views | None = None
        self._index: tuple[Catalog, ToolIndex] | None = None
        self._building: tuple[Catalog, threading.Event, ToolIndex] | None = None
        self._lock = threading.Lock()
        self._searching: weakref.WeakSet[Any] = weakref.WeakSet()
        self._sizes: dict[int, tuple[Catalog, int]] = {}
        self._memory: UseMemory | None = None
        self._last: weakref.WeakKeyDictionary[Any, tuple[str | None, Vectors, frozenset[str]]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def memory(self) -> UseMemory:
        """What each team chose after its searches (search/learning.py), made at the first search."""
        if self._memory is None:
            from gateway.search.learning import UseMemory

            self._memory = UseMemory()
        return self._memory

    @property
    def exposure(self) -> Exposure:
        return self._config().exposure

    # -- who sees what ----------------------------------------------------------------------------------------------

    def searching(
        self, name: str | None, version: str | None, large: bool, connection: Any = None, window: int | None = None
    ) -> bool:
        """Whether this client (clientInfo ``name``/``version``, above the context gate or not, its declared
        ``window``) is in search exposure; a search-mode ``connection`` is remembered, so it is told of list changes
        only when its list changed (``quiet``)."""
        found = self._mode(name, version, large, window)
        if found and connection is not None:
            self._searching.add(connection)
        return found

    def _mode(self, name: str | None, version: str | None, large: bool, window: int | None = None) -> bool:
        exposure = self.exposure
        mode = _matches(exposure.clients, name, version) or exposure.mode
        if mode != "auto":
            return mode == "search"
        catalog = self._catalog()
        if len(catalog) > exposure.auto_tools or not large:
            return True
        budget = self._config().clients.budget
        if budget is not None and window is not None and catalog.tokens[0] > budget.catalog_share * window:
            return True  # the list would take more of this client's window than clients.budget.catalog_share
        size = self._sizes.get(id(catalog))
        if size is None or size[0] is not catalog:
            self._sizes = {id(catalog): (catalog, len(json.dumps(catalog.list_result, separators=(",", ":"))))}
            size = self._sizes[id(catalog)]
        return size[1] / BYTES_PER_TOKEN > exposure.auto_tokens

    def tools_changed_for(self, connection: Any, identity: Caller, previous: Catalog, catalog: Catalog) -> bool | None:
        """For a search-exposure ``connection`` of ``identity``: whether its tools/list changed between the catalogs
        (only when the pins or the router note did, as its policy sees them); None for any other connection (it
        lists the catalog itself)."""
        if connection not in self._searching:
            return None
        return self.search_list_changed(identity, previous, catalog)

    def search_list_changed(self, identity: Caller, previous: Catalog, catalog: Catalog) -> bool:
        """Whether the search-exposure tools/list of ``identity`` changed between the catalogs (the pins or the router
        note, as its policy sees them)."""
        if self._views is None:
            return self.tools_changed(previous, catalog)
        old, new = self._views.view(previous, identity), self._views.view(catalog, identity)
        return any(self.listing(previous, large, old) != self.listing(catalog, large, new) for large in (False, True))

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The search or call tool's input schema, for a name that is one of them."""
        for tool in meta_tools(self.exposure):
            if tool["name"] == name:
                schema: Mapping[str, Any] = tool["inputSchema"]
                return schema
        return None

    def may_search(self) -> bool:
        """Whether any client can be in search exposure (the instructions then say how to find tools)."""
        exposure = self.exposure
        return exposure.mode != "all" or any(mode != "all" for mode in exposure.clients.values())

    def instructions(self, base: str | None) -> str | None:
        if not self.may_search():
            return base
        exposure = self.exposure
        how = (
            f"Finding tools: when your tool list shows {exposure.search_tool}, this gateway's catalog is searched, "
            f"not listed. Call {exposure.search_tool} with what you want to do, then call the tool it names directly "
            f"or through {exposure.call_tool}."
        )
        return f"{base.rstrip()}\n\n{how}" if base else how

    def use_views(self, views: Views) -> None:
        """The callers' views (core/policies.py), for telling a search-mode caller of changes to its own list."""
        self._views = views

    def listing(self, catalog: Catalog, large: bool, view: View | None = None) -> Mapping[str, Any]:
        """The search-mode ``tools/list`` of ``catalog`` as ``view`` (a caller's policy; None: everything) sees it,
        cached per catalog and policy."""
        key = (id(catalog), large, view.policy if view is not None else None)
        found = self._lists.get(key)
        if found is not None and found[0] is catalog:
            return found[1]
        exposure = catalog.exposure  # as built: a reload's new pins are compared with the old ones
        hidden = set() if large else set(self._config().clients.large_context_tools)
        if view is not None:
            hidden |= {name for name in catalog.entries if name not in view.tools}
        note = catalog.notes[0]
        if hidden:
            note = note_without(note, hidden)  # a description is no clue to what the caller cannot see
        tools = meta_tools(exposure, note)
        for name in exposure.pinned:
            entry = catalog.get(name)
            if entry is not None and name not in hidden and name not in (exposure.search_tool, exposure.call_tool):
                tools.append(entry.tool.model_dump(by_alias=True, mode="json", exclude_none=True))
        listing = {"tools": tools}
        if len(self._lists) >= 8:
            self._lists.clear()  # older catalogs' lists: never asked for again
        self._lists[key] = (catalog, listing)
        return listing

    def tools_changed(self, previous: Catalog, catalog: Catalog) -> bool:
        """Whether a search-mode client's ``tools/list`` differs between the two catalogs."""
        return any(self.listing(previous, large) != self.listing(catalog, large) for large in (False, True))

    # -- the call tool ----------------------------------------------------------------------------------------------

    def unwrap(self, arguments: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
        """The real call inside a call-tool call: (tool name, its arguments).

        Raises:
            InvalidArguments: ``name`` is missing or not a string, or ``arguments`` is not an object.
        """
        call_tool = self.exposure.call_tool
        arguments = arguments or {}
        name = arguments.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArguments(call_tool, "name", "give the name of the tool to call (a string)")
        if name == call_tool:
            raise InvalidArguments(call_tool, "name", f"{call_tool} cannot call itself")
        inner = arguments.get("arguments")
        if inner is not None and not isinstance(inner, dict):
            raise InvalidArguments(call_tool, "arguments", "must be an object of the tool's arguments")
        return name, inner

    # -- the search tool --------------------------------------------------------------------------------------------

    async def index(self) -> ToolIndex:
        """The search index of the current catalog, built once per catalog in a thread of its own (embedding a
        large catalog takes a while: up to ``INDEX_WAIT_S`` is waited for, then searches rank by keywords and say so
        until the build is done)."""
        from gateway.search.tools import ToolIndex

        catalog = self._catalog()
        with self._lock:
            if self._index is not None and self._index[0] is catalog:
                return self._index[1]
            if self._building is None or self._building[0] is not catalog:
                docs = [_doc(entry) for entry in catalog.entries.values()]
                quick = ToolIndex.build(docs, None, f"the semantic index of {len(docs)} tools is being built")
                self._building = (catalog, threading.Event(), quick)
                worker = threading.Thread(target=self._finish, args=(catalog, docs), name="toolsearch-index")
                worker.daemon = True  # pure computation on a snapshot: nothing to clean up if the process ends
                worker.start()
            _, done, quick = self._building
        if await anyio.to_thread.run_sync(done.wait, INDEX_WAIT_S):
            with self._lock:
                if self._index is not None and self._index[0] is catalog:
                    return self._index[1]
        return quick

    def _finish(self, catalog: Catalog, docs: list[ToolDoc]) -> None:
        try:
            built = self._build(docs)
            with self._lock:
                self._index = (catalog, built)
        except Exception:  # the thread's top level: searches go on by keywords, and the log says why
            log.exception("toolsearch.index_failed", tools=len(docs))
        finally:
            with self._lock:
                if self._building is not None and self._building[0] is catalog:
                    self._building[1].set()

    def _build(self, docs: list[ToolDoc]) -> ToolIndex:
        from gateway.search.ranking import SemanticUnavailable, load_embedder
        from gateway.search.tools import ToolIndex

        try:
            embedder: Embedder | None = (self._load_model or load_embedder)()
            reason = None
        except SemanticUnavailable as exc:
            embedder, reason = None, exc.reason
            log.warning("toolsearch.keyword_only", reason=reason)
        previous = self._index[1] if self._index is not None else None
        built = ToolIndex.build(docs, embedder, reason, previous)
        log.info("toolsearch.index", tools=len(built), embedded=built.embedded, build_s=round(built.build_s, 3))
        return built

    def called(self, connection: Any, name: str) -> None:
        """A search-mode ``connection`` called ``name``: if its last search found it, its team learns the choice."""
        if connection is None:
            return
        last = self._last.pop(connection, None)
        if last is not None and name in last[2]:
            self.memory.record(last[0], last[1], name)

    async def intercept(
        self, params: types.CallToolRequestParams, visible: Collection[str] | None, team: str | None, connection: Any
    ) -> types.CallToolResult | types.CallToolRequestParams:
        """A search-mode client's ``tools/call``: the search tool's answer, or the call to route (the call tool's
        inner call unwrapped, so it is routed and audited as the real tool's call; ``visible``: what the caller may
        find)."""
        if params.name == self.exposure.search_tool:
            return await self.search(params.arguments, visible, team, connection)
        if params.name == self.exposure.call_tool:
            name, arguments = self.unwrap(params.arguments)
            params = params.model_copy(update={"name": name, "arguments": arguments})
        self.called(connection, params.name)  # what its last search found, if it did
        return params

    async def search(
        self,
        arguments: Mapping[str, Any] | None,
        visible: Collection[str] | None,
        team: str | None = None,
        connection: Any = None,
    ) -> types.CallToolResult:
        """Answer one search-tool call; ``visible`` (None: every tool) is the caller's policy seam, ``team`` its
        policy's name (what it learns from), ``connection`` whose next call tells what it chose.

        Raises:
            InvalidArguments: an argument has the wrong type or range.
        """
        exposure = self.exposure
        args = dict(arguments or {})
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InvalidArguments(exposure.search_tool, "query", "give what you want to do, in a few words")
        limit = _int(args.get("limit", exposure.results), exposure.search_tool)
        backend = args.get("backend")
        if backend is not None and not isinstance(backend, str):
            raise InvalidArguments(exposure.search_tool, "backend", "must be a backend's name (a string)")
        flags = {}
        for flag in ("read_only", "destructive", "include_unavailable"):
            value = args.get(flag)
            if value is not None and not isinstance(value, bool):
                raise InvalidArguments(exposure.search_tool, flag, "must be true or false")
            flags[flag] = value
        index = await self.index()
        backends = self._backends()
        serving = {name for name, b in backends.items() if b.status.state in _SERVING}
        allowed = set(visible) if visible is not None else None
        if not flags["include_unavailable"]:
            ready = {doc.name for doc in index.docs if any(b in serving for b in doc.backends)}
            allowed = ready if allowed is None else allowed & ready
        ranking: Ranking = await anyio.to_thread.run_sync(
            functools.partial(
                index.rank,
                query,
                limit,
                backends=(backend,) if backend is not None else None,
                read_only=flags["read_only"],
                destructive=flags["destructive"],
                allowed=allowed,
                learned=self.memory.nudge(team),
            )
        )
        answer = self._answer(query, index, ranking, backends)
        if connection is not None and index.embedder is not None and ranking.hits:
            vector = await anyio.to_thread.run_sync(index.query_vector, query)
            if vector is not None:
                self._last[connection] = (team, vector, frozenset(index.docs[i].name for i, _ in ranking.hits))
        if index.semantic_reason:
            answer["ranking"] = f"keyword only (scores are BM25's, not probabilities): {index.semantic_reason}"
        text = json.dumps(answer, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=answer)

    def _answer(
        self, query: str, index: ToolIndex, ranking: Ranking, backends: Mapping[str, Backend]
    ) -> dict[str, Any]:
        catalog = self._catalog()
        hits = [(entry, score) for i, score in ranking.hits if (entry := catalog.get(index.docs[i].name)) is not None]
        if not hits:
            return {"query": query, "tools": [], "note": "No tool matched; try other words, or fewer filters."}
        if not ranking.fits:
            closest = [
                {"name": entry.name, "description": _one_line(entry.tool.description), "score": score}
                for entry, score in hits[:_CLOSEST]
            ]
            note = (
                "No tool fits this request: this gateway has no tool for it, as far as its search can tell (the "
                "closest are named, with the probability that each fits). Say so rather than force one; or search "
                "again in other words."
            )
            return {"query": query, "tools": [], "fits": False, "note": note, "closest": closest}
        return {"query": query, "tools": [self._result(entry, backends, score) for entry, score in hits], "fits": True}

    def _result(self, entry: CatalogEntry, backends: Mapping[str, Backend], score: float) -> dict[str, Any]:
        health = {}
        for provider in entry.providers:
            backend = backends.get(provider.backend)
            status = backend.status if backend is not None else None
            state = status.state.value if status is not None else "unknown"
            health[provider.backend] = state if status is None or not status.reason else f"{state}: {status.reason}"
        result: dict[str, Any] = {
            "name": entry.name,
            "description": _one_line(entry.tool.description),
            "inputSchema": entry.tool.input_schema,
            "backend": ", ".join(health) if len(health) > 1 else next(iter(health), ""),
            "health": health if len(health) > 1 else next(iter(health.values()), "unknown"),
            "cost": cost_band(self._catalog().costs.get(entry.name)),
            "score": score,
        }
        if entry.tool.annotations is not None:
            result["annotations"] = entry.tool.annotations.model_dump(by_alias=True, exclude_none=True)
        return result


def _int(value: Any, tool: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 50:
        raise InvalidArguments(tool, "limit", "must be a whole number from 1 to 50")
    return value


def _doc(entry: CatalogEntry) -> ToolDoc:
    from gateway.search.tools import ToolDoc

    annotations = entry.tool.annotations
    dumped = annotations.model_dump(by_alias=True, exclude_none=True) if annotations is not None else {}
    backends: Sequence[str] = tuple(dict.fromkeys(p.backend for p in entry.providers))
    return ToolDoc(entry.name, entry.tool.description or "", tuple(backends), entry.tool.input_schema, dumped)
