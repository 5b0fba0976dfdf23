"""Who sees what: the ``policies:`` section applied to a catalog, one pre-serialised view per policy.

A ``Caller`` (its name, and for a JWT its verified scopes and claims) picks its policy: the first one,
in file order, whose ``callers`` globs match the name and whose ``claims`` and ``scopes`` the token carries. A
caller no policy matches sees nothing (with policies configured, access is granted, never assumed); with no
``policies:`` section every caller sees everything (``Views.view`` answers None) and nothing here runs.

A ``View`` is one policy over one catalog: the tool names it may call, and the ``tools/list`` (both sizes),
``resources/list``, ``resources/templates/list`` and ``prompts/list`` answers filtered from the catalog's own
pre-serialised ones. It is built the first time a caller of that policy asks and reused by every request until the
catalog is swapped (a reload swaps it too: ``Catalog.policies`` is part of it), so a request costs a policy match
and a dictionary lookup. A tool is visible when its published name passes ``tools`` and the backend of every one of
its providers passes ``backends`` (a route never falls back to a backend the caller may not use); a resource, a
template or a prompt when its published URI (template) or name passes its selection and its backend passes
``backends``. What a caller may not see answers exactly as what does not exist (front/face.py, core/router.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from gateway.calls import Caller, Origin
from gateway.config import Policy, Selection
from gateway.core.catalog import Catalog, with_note
from gateway.core.gate import note_without
from gateway.core.listings import Listings

__all__ = ["NOBODY", "View", "Views", "policy_for"]

NOBODY = ""
"""The name of the view of a caller that no policy matches: nothing at all."""
MAX_CATALOGS = 4
"""Views are kept for this many catalogs (the current one and the ones announcements still compare against)."""
MAX_CALLERS = 1024
"""Callers remembered for /status (the most recent ones)."""


def _claim_holds(claims: Mapping[str, Any], name: str, wanted: str) -> bool:
    value = claims.get(name)
    if isinstance(value, list | tuple):
        return wanted in value
    if name in ("scope", "scp") and isinstance(value, str):
        return wanted in value.split()
    return value == wanted


def _matches(policy: Policy, caller: Caller) -> bool:
    name = caller.name or ""
    if not any(fnmatchcase(name, pattern) for pattern in policy.callers):
        return False
    if not all(_claim_holds(caller.claims, k, v) for k, v in policy.claims.items()):
        return False
    return all(scope in caller.scopes for scope in policy.scopes)


def policy_for(policies: Mapping[str, Policy], caller: Caller) -> str:
    """The name of the caller's policy: the first that matches, else ``NOBODY``."""
    for name, policy in policies.items():
        if _matches(policy, caller):
            return name
    return NOBODY


def _selected(selection: Selection, name: str) -> bool:
    if selection.include is not None and not any(fnmatchcase(name, p) for p in selection.include):
        return False
    return not any(fnmatchcase(name, p) for p in selection.exclude)


_SEES_NOTHING = Policy(tools=Selection(include=()), backends=Selection(include=()))
_SEES_ALL = Policy()
EVERYONE = "*"
"""The name of the view of a catalog without policies, for a caller some of whose tools are hidden (``hidden``)."""


def hidden(catalog: Catalog, caller: str) -> frozenset[str]:
    """The published tools ``caller`` does not see because a provider of theirs is a server whose callers each list
    with their own session and theirs does not list it (``Catalog.caller_lists``): to them, tools that do not exist.
    """
    if not catalog.caller_lists:
        return frozenset()
    seen = {backend: lists.seen_by(caller) for backend, lists in catalog.caller_lists.items()}
    return frozenset(
        entry.name
        for entry in catalog.entries.values()
        if any(p.backend in seen and p.tool not in seen[p.backend] for p in entry.providers)
    )


@dataclass(frozen=True)
class View:
    """One policy's view of one catalog (see the module docstring)."""

    policy: str
    tools: frozenset[str]
    list_result: Mapping[str, Any]
    list_result_small: Mapping[str, Any] | None
    resources_result: Mapping[str, Any]
    templates_result: Mapping[str, Any]
    prompts_result: Mapping[str, Any]
    prompts: frozenset[str]
    _rule: Policy = field(repr=False)
    _listings: Listings = field(repr=False, compare=False, default_factory=Listings)

    def listing(self, large_context: bool) -> Mapping[str, Any]:
        if large_context or self.list_result_small is None:
            return self.list_result
        return self.list_result_small

    def sees_backend(self, backend: str) -> bool:
        """Whether this view's policy lets its callers use ``backend`` at all (its ``backends`` selection)."""
        return _selected(self._rule.backends, backend)

    def origins(self, uri: str, origins: tuple[Origin, ...]) -> tuple[Origin, ...]:
        """Of the backends that may serve ``uri``, those this view may read it from (none: "Resource not found"):
        the policy must pass both the URI as the request named it and what it resolves to on each backend (the name
        that origin is published under, core/listings.py ``published``), so a backend-prefixed form of a hidden URI
        stays hidden. Every request kind that names a resource (read, subscribe, completion) asks this."""
        rule = self._rule
        if not _selected(rule.resources, uri):
            return ()
        return tuple(
            o
            for o in origins
            if _selected(rule.backends, o.backend) and _selected(rule.resources, self._listings.published(o))
        )

    def changed(self, other: View | None, catalog: Catalog | None = None) -> frozenset[str]:
        """The lists (``tools``, ``resources``, ``prompts``) that differ between this view and ``other`` (None: the
        whole of ``catalog``, as a caller without policies sees it)."""
        if other is None:
            assert catalog is not None
            theirs = _whole(catalog)
        else:
            theirs = other._lists()
        return _diff(self._lists(), theirs)

    def _lists(self) -> tuple[Mapping[str, Any] | None, ...]:
        return (
            self.list_result,
            self.list_result_small,
            self.resources_result,
            self.templates_result,
            self.prompts_result,
        )


def _whole(catalog: Catalog) -> tuple[Mapping[str, Any] | None, ...]:
    lists = catalog.lists
    small = catalog.list_result_small
    return catalog.list_result, small, lists.resources_result, lists.templates_result, lists.prompts_result


def _diff(a: tuple[Mapping[str, Any] | None, ...], b: tuple[Mapping[str, Any] | None, ...]) -> frozenset[str]:
    changed = set()
    if a[0] != b[0] or a[1] != b[1]:
        changed.add("tools")
    if a[2] != b[2] or a[3] != b[3]:
        changed.add("resources")
    if a[4] != b[4]:
        changed.add("prompts")
    return frozenset(changed)


def lists_changed(before: Catalog, after: Catalog, caller: Caller, views: Views) -> frozenset[str]:
    """What ``caller`` sees differently in ``after`` than in ``before`` (policies or none, on either side)."""
    old, new = views.view(before, caller), views.view(after, caller)
    if new is not None:
        return new.changed(old, before)
    if old is not None:
        return old.changed(None, after)
    return _diff(_whole(before), _whole(after))


def build_view(catalog: Catalog, name: str, rule: Policy, unseen: frozenset[str] = frozenset()) -> View:
    """``rule``'s view of ``catalog``, less the tools ``unseen`` (``hidden``): filtered once, from the catalog's
    pre-serialised lists."""
    backends = rule.backends
    tools = frozenset(
        entry.name
        for entry in catalog.entries.values()
        if _selected(rule.tools, entry.name)
        and all(_selected(backends, p.backend) for p in entry.providers)
        and entry.name not in unseen
    )
    lists = catalog.lists
    hidden = [name for name in catalog.entries if name not in tools]
    tools |= {  # callable, never listed: kept() lists only what the catalog's listings hold
        entry.name
        for entry in catalog.unlisted.values()
        if _selected(rule.tools, entry.name) and all(_selected(backends, p.backend) for p in entry.providers)
    }
    tools |= {  # not served now: a call is told why, as the policy would let it call the tool
        name
        for name, off in catalog.unserved.items()
        if _selected(rule.tools, name) and all(_selected(backends, backend) for backend in off.backends)
    }

    def kept(listing: Mapping[str, Any], note: str) -> Mapping[str, Any]:
        # The router note loses the items that name a hidden tool: a description is no clue either.
        shown = note_without(note, hidden) if note and hidden else note
        return {**listing, "tools": [with_note(t, note, shown) for t in listing["tools"] if t["name"] in tools]}

    resources = {
        uri
        for uri, origin in lists.resources.items()
        if _selected(rule.resources, uri) and _selected(backends, origin.backend)
    }
    templates = {
        t.published
        for t in lists.templates
        if _selected(rule.resources, t.published) and _selected(backends, t.origin.backend)
    }
    prompts = frozenset(
        n for n, origin in lists.prompts.items() if _selected(rule.prompts, n) and _selected(backends, origin.backend)
    )
    return View(
        policy=name if not unseen else f"{name}~{hash(unseen) & 0xFFFFFFFF:08x}",  # one per what it sees
        tools=tools,
        list_result=kept(catalog.list_result, catalog.notes[0]),
        list_result_small=kept(catalog.list_result_small, catalog.notes[1])
        if catalog.list_result_small is not None
        else None,
        resources_result={"resources": [r for r in lists.resources_result["resources"] if r["uri"] in resources]},
        templates_result={
            "resourceTemplates": [
                t for t in lists.templates_result["resourceTemplates"] if t["uriTemplate"] in templates
            ]
        },
        prompts_result={"prompts": [p for p in lists.prompts_result["prompts"] if p["name"] in prompts]},
        prompts=prompts,
        _rule=rule,
        _listings=lists,
    )


class Views:
    """Each policy's view of the recent catalogs, built on first use; and the callers seen, for /status."""

    def __init__(self) -> None:
        # id(catalog) -> (the catalog, kept alive so its id is not reused; its views by policy name and hidden tools;
        # the tools hidden from each caller, ``hidden``)
        self._views: dict[int, tuple[Catalog, dict[tuple[str, frozenset[str]], View], dict[str, frozenset[str]]]] = {}
        self.seen: dict[str, str] = {}
        """caller -> its policy, the most recent ``MAX_CALLERS`` callers that asked."""

    def view(self, catalog: Catalog, caller: Caller) -> View | None:
        """``caller``'s view of ``catalog``; None when ``catalog`` has no policies and hides nothing from them
        (everyone sees everything)."""
        policies = catalog.policies
        if not policies and not catalog.caller_lists:
            return None
        found = self._views.get(id(catalog))
        if found is None or found[0] is not catalog:
            if len(self._views) >= MAX_CATALOGS:
                self._views.pop(next(iter(self._views)))
            found = self._views[id(catalog)] = (catalog, {}, {})
        views, hides = found[1], found[2]
        unseen = hides.get(caller.name or "")
        if unseen is None:  # worked out once per catalog and caller, not on every request
            if len(hides) >= MAX_CALLERS:
                hides.pop(next(iter(hides)))
            unseen = hides[caller.name or ""] = hidden(catalog, caller.name or "")
        if not policies and not unseen:
            return None
        name = policy_for(policies, caller) if policies else EVERYONE
        view = views.get((name, unseen))
        if view is None:
            rule = _SEES_ALL if not policies else policies[name] if name else _SEES_NOTHING
            view = views[name, unseen] = build_view(catalog, name, rule, unseen)
        who = caller.name
        if not policies:
            return view
        if who is not None and self.seen.get(who) != name:
            self.seen.pop(who, None)
            if len(self.seen) >= MAX_CALLERS:
                self.seen.pop(next(iter(self.seen)))
            self.seen[who] = name
        return view

    def statistics(self, catalog: Catalog, known: tuple[str, ...] = ()) -> dict[str, Any]:
        """For /status and /ui: each policy (its conditions and how many tools it shows), and each caller known
        (``known``: the static tokens' names; and every caller seen) with its policy and tool count."""
        policies = catalog.policies
        out: dict[str, Any] = {"policies": [], "callers": []}
        if not policies:
            everyone = [*known, *(c for c in self.seen if c not in known)]
            out["callers"] = [{"caller": c, "policy": None, "tools": len(catalog)} for c in everyone]
            return out
        for name, rule in policies.items():
            view = self._named(catalog, name, rule)
            out["policies"].append(
                {
                    "name": name,
                    "callers": list(rule.callers),
                    "claims": dict(rule.claims),
                    "scopes": list(rule.scopes),
                    "tools": len(view.tools - catalog.unlisted.keys() - catalog.unserved.keys()),
                    "limits": rule.limits.model_dump(exclude_none=True) if rule.limits is not None else None,
                }
            )
        callers = dict.fromkeys(known, "")
        for caller in known:
            callers[caller] = policy_for(policies, Caller(caller))
        for caller, name in self.seen.items():
            callers[caller] = name
        for caller, name in callers.items():
            tools = (
                len(
                    self._named(catalog, name, policies[name]).tools - catalog.unlisted.keys() - catalog.unserved.keys()
                )
                if name in policies
                else 0
            )
            out["callers"].append({"caller": caller, "policy": name or None, "tools": tools})
        return out

    def _named(self, catalog: Catalog, name: str, rule: Policy) -> View:
        found = self._views.get(id(catalog))
        if found is not None and found[0] is catalog and (name, frozenset()) in found[1]:
            return found[1][name, frozenset()]
        return build_view(catalog, name, rule)
