"""The merged, immutable tool catalog: what clients see, and which providers serve each published tool.

``Catalog.build(config, backends)`` takes the tools of every ready backend, applies the per-backend filters
(``include`` / ``exclude`` / ``rename`` / ``describe``), the routes (a published tool served by an ordered list of
providers), the naming policy (``never`` | ``conditional``: prefix only names that collide | ``always``) and the
router note, and pre-serialises the ``tools/list`` answer once (and, when some tools are for large-context clients
only, the smaller list the others get, whose router note names none of them: ``clients.note_without``). A route's
declared result shape rides on its entry (``CatalogEntry.result``) for the router. A catalog is never mutated: when
a backend joins, leaves or changes its tools, the runtime builds a new one and swaps it whole, so ``tools/list`` costs
a dictionary lookup and a request never sees a half-built catalog.

A backend that was ready and is now lost (reconnecting, or failing to) keeps its last known tools listed: clients
cache lists, and a tool that vanishes for the seconds of a reconnect would leave them calling names they were told
are gone, or never calling them again. Calls to them are answered at once with an ``isError`` naming the backend and
why it is unavailable (router.py), and leave a row. A backend that is disabled, or removed by a reload, leaves.

A server's declared ``unlisted_tools`` (tools it serves without listing them) are kept apart, in
``Catalog.unlisted``: ``get`` finds them, so the router routes, audits, limits and polices their calls as any
tool's, but no listing holds them.

A tool the file declares that no backend serves now (a disabled backend's, a route's whose providers are all
down) is kept apart too, in ``Catalog.unserved`` with why (core/unserved.py), so that a call of it, still an unknown
tool, says whose it is and why it is off.

Problems found while building (a downstream tool whose name cannot be published, a collision under ``never``)
never fail the build: the tool is left out and the problem is kept in ``Catalog.problems`` for ``gateway check``
and ``/status``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import structlog

from gateway.backends.base import Backend, BackendState, CallerLists
from gateway.config import TOOL_NAME_RE, Exposure, Federation, Policy, RouteStep, SearchHitsResult
from gateway.core.costs import Cost, fill_placeholders
from gateway.core.gate import note_without, with_note
from gateway.core.kept import READ_DESCRIPTION, READ_SCHEMA, READ_TOOL
from gateway.core.listings import Listings
from gateway.core.pins import Pending, Pin, PinCheck
from gateway.core.shadowing import house_owner, reserved, server_name
from gateway.core.unserved import Unserved, unserved
from gateway.search.tokens import count_tokens

__all__ = ["Catalog", "CatalogEntry", "Provider", "list_tokens", "with_note"]

log = structlog.get_logger("gateway.catalog")

"""Backends whose tools are known without a connection: a route keeps their schema even while they are down."""


@dataclass(frozen=True, slots=True)
class Provider:
    """One way to serve a published tool: a backend's own tool, with an optional argument template."""

    backend: str
    tool: str
    arguments: Mapping[str, Any] | None = None
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.tool}"

    def applies(self, arguments: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
        """Whether this provider serves a call with ``arguments`` (its ``when`` conditions hold)."""
        for name, allowed in self.when.items():
            if arguments.get(name, defaults.get(name)) not in allowed:
                return False
        return True

    def map_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments this provider is sent for a call with ``arguments``."""
        if self.arguments is None:
            return dict(arguments)
        mapped = _fill(self.arguments, arguments)
        return mapped if isinstance(mapped, dict) else {}

    def published_argument(self, argument: str) -> str:
        """The client's name for one of this provider's arguments (a dotted path): the published argument a
        template passed on under another name, else the same path."""
        head, dot, rest = argument.partition(".")
        if isinstance(self.arguments, Mapping):
            template = self.arguments.get(head)
            match = _PLACEHOLDER.match(template) if isinstance(template, str) else None
            if match is not None:
                return match.group(1) + dot + rest
        return argument


_MISSING = object()


_PLACEHOLDER = re.compile(r"^\{([^{}]+)\}$")


def _fill(template: Any, arguments: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        match = _PLACEHOLDER.match(template)
        if match is None:
            return template
        return arguments.get(match.group(1), _MISSING)
    if isinstance(template, Mapping):
        out = {}
        for key, value in template.items():
            filled = _fill(value, arguments)
            if filled is not _MISSING:
                out[key] = filled
        return out
    if isinstance(template, list | tuple):
        return [item for item in (_fill(v, arguments) for v in template) if item is not _MISSING]
    return template


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """A published tool: its public definition and its providers, tried in order."""

    name: str
    tool: types.Tool
    providers: tuple[Provider, ...]
    audit: Mapping[str, int] = field(default_factory=dict)
    route: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """The schema's argument defaults (what an absent argument means to a route's ``when`` conditions)."""
    result: SearchHitsResult | None = None
    """The route's declared result shape (core/results.py), applied to whichever provider answers."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    backend: str
    local: str  # the backend's own name
    published: str  # after rename, before any prefix
    tool: types.Tool
    router: bool
    audit: Mapping[str, int]
    downstream: bool = False  # a server's tool, named by the server: it may not shadow the house (shadowing.py)


@dataclass(frozen=True)
class Catalog:
    entries: Mapping[str, CatalogEntry]
    list_result: Mapping[str, Any]
    """The pre-serialised ``tools/list`` result (wire shape, camelCase), built once per catalog."""
    problems: tuple[str, ...] = ()
    list_result_small: Mapping[str, Any] | None = None
    """The same list without the large-context tools (``clients.large_context_tools``); None when none is gated."""
    lists: Listings = field(default_factory=Listings)
    """Resources, resource templates and prompts, built and swapped with the tools (see listings.py)."""
    notes: tuple[str, str] = ("", "")
    """The router note as the full and the small list carry it (a policy's view drops the items naming tools its
    callers cannot see, as the small list does for large-context tools)."""
    policies: Mapping[str, Policy] = field(default_factory=dict)
    """Who sees what of it (core/policies.py): swapped with the catalog, so a reload that changes only a
    policy is a change clients are told of."""
    costs: Mapping[str, Cost] = field(default_factory=dict)
    """The measured costs the catalog was built with (the tool search shows them as cost bands)."""
    exposure: Exposure = field(default_factory=Exposure)
    """How clients in search exposure see it (front/exposure.py): a change of pins is a change of their list."""

    @classmethod
    def empty(cls) -> Catalog:
        return cls({}, {"tools": []})

    def listing(self, large_context: bool) -> Mapping[str, Any]:
        """The ``tools/list`` answer for a client with (or without) a large context window."""
        if large_context or self.list_result_small is None:
            return self.list_result
        return self.list_result_small

    unlisted: Mapping[str, CatalogEntry] = field(default_factory=dict)
    """Tools served but not listed (``servers.NAME.unlisted_tools``): callable by name, never in a listing."""
    unserved: Mapping[str, Unserved] = field(default_factory=dict)
    """Names declared but not served now, with why (core/unserved.py): for the message of a call of one."""
    tokens: tuple[int, int] = (0, 0)
    """What the full and the small ``tools/list`` cost a client's context, in tokens (search/tokens.py)."""
    pins_pending: tuple[Pending, ...] = ()
    """Server tools new or changed since approval, under ``pin: warn`` or ``enforce`` (pins.py)."""
    caller_lists: Mapping[str, CallerLists] = field(default_factory=dict)
    """By backend, for servers whose callers each list with their own session: which of its tools each caller sees
    (core/policies.py hides the others from them, as tools that do not exist)."""

    def get(self, name: str) -> CatalogEntry | None:
        """The entry a ``tools/call`` of ``name`` is routed by: a published tool, else a declared unlisted one."""
        entry = self.entries.get(name)
        return entry if entry is not None else self.unlisted.get(name)

    def changes(self, previous: Catalog) -> frozenset[str]:
        """What a client would see differently from ``previous``: any of ``tools`` (either listing), ``resources``
        (resources or templates), ``prompts``, ``offers`` (the capabilities behind the lists), ``search`` (what
        search-exposure clients list) and ``policies``. Empty when nothing a client sees changed; what each caller is
        told is core/policies.py ``lists_changed``'s to say."""
        changed = set(self.lists.changes(previous.lists))
        if self.list_result != previous.list_result or self.list_result_small != previous.list_result_small:
            changed.add("tools")
        if self.exposure != previous.exposure or self.notes != previous.notes:
            changed.add("search")  # what search-exposure clients list (front/exposure.py)
        if self.policies != previous.policies:
            changed.add("policies")
        if self.caller_lists != previous.caller_lists:
            changed.add("tools")  # what some caller sees: lists_changed says whom to tell
        return frozenset(changed)

    def __len__(self) -> int:
        return len(self.entries)

    def by_backend(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.entries.values():
            for provider in entry.providers:
                counts[provider.backend] = counts.get(provider.backend, 0) + 1
        return counts

    @classmethod
    def build(
        cls,
        config: Federation,
        backends: Mapping[str, Backend],
        costs: Mapping[str, Cost] | None = None,
        pins: Mapping[tuple[str, str], Pin] | None = None,
    ) -> Catalog:
        """Merge the tools of ``backends``; ``costs`` fill the ``{cost:TOOL}`` placeholders (see costs.py); ``pins``
        are the approved definitions (pins.py)."""
        problems: list[str] = []
        pinned = PinCheck(config, pins or {})
        costs = costs or {}
        note = fill_placeholders((config.gateway.router_note or "").strip(), costs)
        carries = _NoteCarrier(config)
        route_providers = {step.provider for route in config.routes.values() for step in route.providers}

        candidates: list[_Candidate] = []
        known: dict[str, tuple[Backend, types.Tool]] = {}  # "backend/local" -> the backend's own tool
        for name, backend in backends.items():
            state = backend.status.state
            if state is BackendState.DISABLED:
                continue  # disabled (declared or by reload): its tools leave
            publish = state in (BackendState.READY, BackendState.DEGRADED)
            tools = backend.tools()
            if not publish and not backend.static_tools:
                # Lost and reconnecting (or failing to): it keeps the tools it had when last ready, so clients'
                # cached lists stay true; the router answers their calls at once with why the backend is down.
                tools, publish = backend.last_known_tools(), True
            for tool in tools:
                known[f"{name}/{tool.name}"] = (backend, tool)
                if f"{name}/{tool.name}" in route_providers or not publish:
                    continue  # consumed by a route (served under the route's name), or not serving on its own
                admitted = pinned.admit(name, tool, tools)  # as approved, or withheld (pins.py)
                candidate = _candidate(config, name, admitted) if admitted is not None else None
                if candidate is not None:
                    candidates.append(candidate)

        entries, routes_off = _routes(config, known, backends, costs, note, carries, problems)

        published = _name(config, candidates, entries, problems)
        for public, cand in published:
            description = fill_placeholders(cand.tool.description or "", costs)
            tool = _publish(cand.tool, public, description, note if carries(public, cand.router) else "")
            entries[public] = CatalogEntry(public, tool, (Provider(cand.backend, cand.local),), cand.audit)

        unlisted = _unlisted(config, backends, known, entries, problems)
        dumped = {name: e.tool.model_dump(by_alias=True, mode="json", exclude_none=True) for name, e in entries.items()}
        gated = set(config.clients.large_context_tools) & dumped.keys()
        small_note = note_without(note, gated)  # a small client is not told about the tools it cannot see
        small = (
            {"tools": [with_note(t, note, small_note) for n, t in dumped.items() if n not in gated]} if gated else None
        )
        budget = config.clients.budget
        if budget is not None and READ_TOOL not in entries:  # the reader of cut answers, for the clients they reach
            reader = types.Tool(name=READ_TOOL, description=READ_DESCRIPTION, input_schema=READ_SCHEMA)
            entries[READ_TOOL] = CatalogEntry(READ_TOOL, reader, ())
            listed = reader.model_dump(by_alias=True, mode="json", exclude_none=True)
            small = {"tools": [*(small or {"tools": list(dumped.values())})["tools"], listed]}
            if not budget.exempt_large:
                dumped[READ_TOOL] = listed
        lists = Listings.build(config, backends, pinned.admit)
        problems += pinned.problems
        problems += lists.problems
        full = {"tools": list(dumped.values())}
        return cls(
            entries,
            full,
            tuple(problems),
            small,
            lists,
            (note, small_note),
            dict(config.policies),
            costs,
            config.exposure,
            unlisted,
            unserved(config, backends, entries.keys() | unlisted.keys(), routes_off),
            (list_tokens(full), list_tokens(small) if small is not None else list_tokens(full)),
            tuple(pinned.pending),
            {name: seen for name, backend in backends.items() if (seen := backend.caller_lists()) is not None},
        )


def _routes(
    config: Federation,
    known: Mapping[str, tuple[Backend, types.Tool]],
    backends: Mapping[str, Backend],
    costs: Mapping[str, Cost],
    note: str,
    carries: _NoteCarrier,
    problems: list[str],
) -> tuple[dict[str, CatalogEntry], list[str]]:
    """The declared routes' entries, each published with its first available provider's schema; and the routes not
    published (none of their providers is available yet), each a problem."""
    entries: dict[str, CatalogEntry] = {}
    routes_off: list[str] = []
    for route_name, route in config.routes.items():
        source = _schema_source(route.schema_from, route.providers, known, backends)
        if source is None:
            problems.append(f"route {route_name!r}: no provider is available yet, so it is not published")
            routes_off.append(route_name)
            continue
        base = known[source][1]
        description = route.description if route.description is not None else (base.description or "")
        description = fill_placeholders(description, costs)
        tool = _publish(
            base,
            route_name,
            description,
            note if carries(route_name, route.router or _routes_router(config, source)) else "",
        )
        providers = tuple(_provider(step) for step in route.providers)
        audit = dict(route.audit) or _adapter_audit(config, source)
        entries[route_name] = CatalogEntry(
            route_name, tool, providers, audit, route=True, defaults=_defaults(tool), result=route.result
        )
    return entries, routes_off


def _name(
    config: Federation, candidates: Sequence[_Candidate], routes: Mapping[str, CatalogEntry], problems: list[str]
) -> list[tuple[str, _Candidate]]:
    """Each published candidate with its public name, by the naming policy: the tools the file declares (adapters',
    the wiki's) first, then the servers' tools, which never take the house's names (shadowing.py)."""
    mode, sep = config.gateway.naming.mode, config.gateway.naming.separator
    own = reserved(config)
    taken: dict[str, _Candidate | None] = dict.fromkeys(routes)
    house = [c for c in candidates if not c.downstream]
    servers: dict[str, list[str]] = {}
    for cand in candidates:
        if cand.downstream:
            servers.setdefault(cand.published, []).append(cand.backend)
    counts: dict[str, int] = {}
    for cand in house:
        counts[cand.published] = counts.get(cand.published, 0) + 1
    for cand in house:
        collides = counts[cand.published] > 1 or cand.published in own
        prefixed = mode == "always" or (mode == "conditional" and collides)
        public = f"{cand.backend}{sep}{cand.published}" if prefixed else cand.published
        if public in taken or public in own:
            problems.append(
                f"tool {cand.backend}/{cand.local} is not published: the name {public!r} is already taken "
                f"(naming mode {mode!r})"
            )
            continue
        if _valid(cand, public, problems):
            taken[public] = cand
            own.setdefault(public, house_owner(config, cand.backend, cand.local))
    for cand in candidates:
        if not cand.downstream:
            continue
        others = [b for b in servers[cand.published] if b != cand.backend]
        name, problem = server_name(
            cand.backend, cand.local, cand.published, own.get(cand.published), others, (mode, sep), taken
        )
        if problem is not None:
            problems.append(problem)
        if name is not None and _valid(cand, name, problems):
            taken[name] = cand
    order = {id(cand): index for index, cand in enumerate(candidates)}  # the listing keeps the backends' order
    return sorted(((n, c) for n, c in taken.items() if c is not None), key=lambda item: order[id(item[1])])


def _valid(cand: _Candidate, public: str, problems: list[str]) -> bool:
    if TOOL_NAME_RE.fullmatch(public):
        return True
    problems.append(
        f"tool {cand.backend}/{cand.local} is not published: {public!r} is not a valid tool name "
        f"(1 to 64 characters from A-Z a-z 0-9 _ . -; it has {len(public)}); rename it in federation.yaml"
    )
    return False


_MOOT: set[str] = set()  # "backend/tool" declarations already logged as moot (once per process)

_NO_SCHEMA: dict[str, Any] = {"type": "object"}


def _unlisted(
    config: Federation,
    backends: Mapping[str, Backend],
    known: Mapping[str, tuple[Backend, types.Tool]],
    entries: Mapping[str, CatalogEntry],
    problems: list[str],
) -> dict[str, CatalogEntry]:
    """The declared ``unlisted_tools`` of each present server, named by the rule its listed tools are named by
    (``always``: prefixed; ``conditional``: prefixed when the name is taken; ``never``: as is). They never take a name
    from a published tool: a listed tool wins."""
    mode, sep = config.gateway.naming.mode, config.gateway.naming.separator
    own = reserved(config)  # the gateway's own names are never a server's (shadowing.py)
    declared: list[tuple[str, str]] = []
    for backend, server in config.servers.items():
        if not server.unlisted_tools or backend not in backends:
            continue
        if backends[backend].status.state is BackendState.DISABLED:
            continue
        for local in server.unlisted_tools:
            if f"{backend}/{local}" in known:
                if f"{backend}/{local}" not in _MOOT:
                    _MOOT.add(f"{backend}/{local}")
                    log.info("catalog.unlisted_moot", backend=backend, tool=local)
                continue  # the server lists it after all: published (or filtered) as any listed tool
            declared.append((backend, local))
    counts: dict[str, int] = {}
    for _, local in declared:
        counts[local] = counts.get(local, 0) + 1
    out: dict[str, CatalogEntry] = {}
    for backend, local in declared:
        collides = counts[local] > 1 or local in entries or local in own
        public = f"{backend}{sep}{local}" if mode == "always" or (mode == "conditional" and collides) else local
        if public in entries or public in out or public in own:
            problems.append(
                f"unlisted tool {backend}/{local} is not served: the name {public!r} is already taken "
                f"(naming mode {mode!r})"
            )
            continue
        if not TOOL_NAME_RE.fullmatch(public):
            problems.append(
                f"unlisted tool {backend}/{local} is not served: {public!r} is not a valid tool name "
                f"(1 to 64 characters from A-Z a-z 0-9 _ . -; it has {len(public)})"
            )
            continue
        tool = types.Tool(name=public, input_schema=_NO_SCHEMA)
        out[public] = CatalogEntry(public, tool, (Provider(backend, local),))
    return out


def _provider(step: RouteStep) -> Provider:
    backend, tool = step.provider.split("/", 1)
    return Provider(backend, tool, step.arguments, dict(step.when))


def _defaults(tool: types.Tool) -> dict[str, Any]:
    properties = tool.input_schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    return {k: v["default"] for k, v in properties.items() if isinstance(v, dict) and "default" in v}


def _candidate(config: Federation, backend: str, tool: types.Tool) -> _Candidate | None:
    local = tool.name
    if backend in config.servers:
        server = config.servers[backend]
        flt = server.tools
        if flt.include is not None and local not in flt.include:
            return None
        if local in flt.exclude:
            return None
        published = flt.rename.get(local, local)
        if published in flt.describe:
            tool = tool.model_copy(update={"description": flt.describe[published]})
        elif local in flt.describe:
            tool = tool.model_copy(update={"description": flt.describe[local]})
        router = server.router or published in flt.router
        return _Candidate(backend, local, published, tool, router, {}, downstream=True)
    if backend in config.adapters:
        spec = config.adapters[backend].tools.get(local)
        router = spec.router if spec is not None else False
        return _Candidate(backend, local, local, tool, router, dict(spec.audit) if spec is not None else {})
    if config.wiki is not None and backend == config.wiki.name:
        if config.wiki.tools is not None and local not in config.wiki.tools:
            return None
        return _Candidate(backend, local, local, tool, local in config.wiki.router, {})
    return None


def _schema_source(
    explicit: str | None,
    steps: Sequence[RouteStep],
    known: Mapping[str, tuple[Backend, types.Tool]],
    backends: Mapping[str, Backend],
) -> str | None:
    if explicit is not None and explicit in known:
        return explicit
    labels = [step.provider for step in steps]
    static = [
        label
        for label in labels
        if label.split("/", 1)[0] in backends and backends[label.split("/", 1)[0]].static_tools
    ]
    for label in (*static, *labels):
        if label in known:
            return label
    return None


def _routes_router(config: Federation, source: str) -> bool:
    backend, local = source.split("/", 1)
    adapter = config.adapters.get(backend)
    if adapter is not None and local in adapter.tools:
        return adapter.tools[local].router
    return False


def _adapter_audit(config: Federation, source: str) -> dict[str, int]:
    backend, local = source.split("/", 1)
    adapter = config.adapters.get(backend)
    if adapter is not None and local in adapter.tools:
        return dict(adapter.tools[local].audit)
    return {}


def list_tokens(listing: Mapping[str, Any]) -> int:
    """What a ``tools/list`` answer costs a client's context: the tokens of its tools' JSON, as clients put the
    definitions in the model's prompt (names, descriptions, schemas)."""
    return count_tokens(json.dumps(listing.get("tools", []), ensure_ascii=False, separators=(",", ":")))


class _NoteCarrier:
    """Which routed tools carry the router note: every one (``router_note_in: each``), or only ``router_note_tool``,
    else the first routed tool built (``once``; the instructions carry it too, front/server.py)."""

    def __init__(self, config: Federation) -> None:
        self.once = config.gateway.router_note_in == "once"
        self.chosen = config.gateway.router_note_tool

    def __call__(self, name: str, routed: bool) -> bool:
        if not self.once:
            return routed
        if self.chosen is None and routed:
            self.chosen = name
        return name == self.chosen


def _publish(tool: types.Tool, name: str, description: str, note: str) -> types.Tool:
    if note:
        description = f"{description.rstrip()}\n\n{note}" if description else note
    return tool.model_copy(update={"name": name, "description": description or None})
