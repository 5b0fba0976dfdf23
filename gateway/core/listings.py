"""Resources, resource templates and prompts: the merged lists clients see, and where each published item comes from.

``Listings.build(config, backends)`` merges the resources, resource templates and prompts of every ready downstream
server and pre-serialises the three list answers once, like the tool catalog does for ``tools/list`` (it is built
with it and swapped with it, see ``Catalog.lists``). Names follow the tools' naming policy (``gateway.naming``):

  * ``conditional`` (the default): a prompt name, resource URI or URI template is published untouched unless two
    backends offer the same one; then each is published as ``{backend}{separator}{name}`` (``a__test://x``),
  * ``always``: every one is published that way; ``never``: the first backend keeps it, the others' are left out
    and the problem is recorded.

The mapping is reversible by construction, because it is a prefix: ``resolve(uri)`` finds the backend (and its own
URI) for a listed URI, for a URI expanded from a listed template (the prefix survives expansion) and, as a last
resort, for an unlisted URI (every backend that serves resources is a candidate, in declaration order); and back,
``published(origin)`` is the name an origin is published under, whatever name a request used to reach it (what a
policy is applied to). What the gateway offers is what the ready backends offer: ``offers`` is the union of their
capabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp_types as types
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from gateway.backends.base import Backend, BackendState
from gateway.calls import Origin
from gateway.config import Federation

__all__ = ["Listings", "Offers"]

_SERVING = (BackendState.READY, BackendState.DEGRADED)

_ItemT = TypeVar("_ItemT", types.Prompt, types.Resource, types.ResourceTemplate)


@dataclass(frozen=True, slots=True)
class Offers:
    """The capabilities the ready backends offer together (the gateway advertises exactly these)."""

    resources: bool = False
    subscribe: bool = False
    prompts: bool = False
    completions: bool = False
    logging: bool = False


@dataclass(frozen=True, slots=True)
class _Template:
    published: str
    origin: Origin
    prefix: str  # "" when published untouched
    matcher: UriTemplate | None  # None when the template does not parse (then only the fallback can route to it)


@dataclass(frozen=True)
class Listings:
    prompts: Mapping[str, Origin] = field(default_factory=dict)
    resources: Mapping[str, Origin] = field(default_factory=dict)
    templates: tuple[_Template, ...] = ()
    resource_backends: tuple[str, ...] = ()
    """Backends serving resources, in declaration order (the fallback candidates for an unlisted URI)."""
    separator: str = "__"
    naming: str = "conditional"
    offers: Offers = Offers()
    prompts_result: Mapping[str, Any] = field(default_factory=lambda: {"prompts": []})
    resources_result: Mapping[str, Any] = field(default_factory=lambda: {"resources": []})
    templates_result: Mapping[str, Any] = field(default_factory=lambda: {"resourceTemplates": []})
    """The pre-serialised list answers (wire shape, camelCase), built once per catalog."""
    problems: tuple[str, ...] = ()
    published_as: Mapping[Origin, str] = field(default_factory=dict)
    """Each listed resource's and template's origin -> the URI (template) it is published as."""

    # -- lookups ----------------------------------------------------------------------------------------------------

    def prompt(self, name: str) -> Origin | None:
        return self.prompts.get(name)

    def template(self, published: str) -> Origin | None:
        """The origin of a published URI template (for a ``completion/complete`` reference)."""
        for template in self.templates:
            if template.published == published:
                return template.origin
        return None

    def resolve(self, uri: str) -> tuple[Origin, ...]:
        """The backends (with their own URI) that may serve ``uri``, best first; empty when none serves resources."""
        listed = self.resources.get(uri)
        if listed is not None:
            return (listed,)
        found: list[Origin] = []
        for template in self.templates:
            if template.matcher is None or not uri.startswith(template.prefix):
                continue
            local = uri[len(template.prefix) :]
            if template.matcher.match(local) is not None:
                origin = Origin(template.origin.backend, local)
                if origin not in found:
                    found.append(origin)
        if found:
            return tuple(found)
        for backend in self.resource_backends:
            prefix = f"{backend}{self.separator}"
            if uri.startswith(prefix):
                return (Origin(backend, uri[len(prefix) :]),)
        return tuple(Origin(backend, uri) for backend in self.resource_backends)

    def published(self, origin: Origin) -> str:
        """The name ``origin`` is published under, however a request named it: a listed resource's or template's
        published URI, a URI one of its backend's templates expands to (under that template's prefix), else its URI
        as the naming mode publishes it. A policy is applied to this name (core/policies.py ``View.origins``), so
        ``a__x://1`` is no way around a policy that hides ``x://1``."""
        listed = self.published_as.get(origin)
        if listed is not None:
            return listed
        for template in self.templates:
            if template.origin.backend == origin.backend and template.matcher is not None:
                if template.matcher.match(origin.local) is not None:
                    return template.prefix + origin.local
        return f"{origin.backend}{self.separator}{origin.local}" if self.naming == "always" else origin.local

    def changes(self, other: Listings) -> frozenset[str]:
        """What clients would see differently from ``other``: any of ``resources`` (resources or templates),
        ``prompts`` and ``offers`` (the capabilities behind the lists)."""
        changed = set()
        if self.resources_result != other.resources_result or self.templates_result != other.templates_result:
            changed.add("resources")
        if self.prompts_result != other.prompts_result:
            changed.add("prompts")
        if self.offers != other.offers:
            changed.add("offers")
        return frozenset(changed)

    # -- building ---------------------------------------------------------------------------------------------------

    @classmethod
    def build(cls, config: Federation, backends: Mapping[str, Backend], admit: Admit | None = None) -> Listings:
        """Merge the lists of ``backends``; ``admit`` (pins.py ``PinCheck.admit``) says how each server's prompt is
        served: as it is, as approved, or not at all."""
        mode, sep = config.gateway.naming.mode, config.gateway.naming.separator
        problems: list[str] = []
        serving = [b for b in backends.values() if b.serves_requests and b.status.state in _SERVING]
        offers = _offers(b.capabilities for b in serving)

        per_backend = [(b.name, _admitted(b.name, b.prompts(), admit)) for b in serving]
        prompts = _merge(mode, sep, "prompt", per_backend, _prompt_name, problems)
        resources = _merge(mode, sep, "resource", [(b.name, b.resources()) for b in serving], _uri, problems)
        templates = _merge(
            mode, sep, "resource template", [(b.name, b.resource_templates()) for b in serving], _uri_template, problems
        )

        published_prompts = [p.model_copy(update={"name": name}) for name, _, p in prompts]
        published_resources = [r.model_copy(update={"uri": name}) for name, _, r in resources]
        published_templates = [t.model_copy(update={"uri_template": name}) for name, _, t in templates]
        caps = {b.name: b.capabilities for b in serving}
        published_as = {origin: name for name, origin, _ in templates} | {origin: name for name, origin, _ in resources}
        return cls(
            prompts={name: origin for name, origin, _ in prompts},
            resources={name: origin for name, origin, _ in resources},
            templates=tuple(
                _Template(name, origin, name[: len(name) - len(origin.local)], _matcher(origin.local))
                for name, origin, _ in templates
            ),
            resource_backends=tuple(name for name, c in caps.items() if c is not None and c.resources is not None),
            separator=sep,
            naming=mode,
            offers=offers,
            prompts_result={"prompts": _dump(published_prompts)},
            resources_result={"resources": _dump(published_resources)},
            templates_result={"resourceTemplates": _dump(published_templates)},
            problems=tuple(problems),
            published_as=published_as,
        )


Admit = Callable[[str, types.Prompt, Sequence[types.Prompt]], types.Prompt | None]


def _admitted(backend: str, prompts: Sequence[types.Prompt], admit: Admit | None) -> list[types.Prompt]:
    if admit is None:
        return list(prompts)
    return [served for prompt in prompts if (served := admit(backend, prompt, prompts)) is not None]


def _prompt_name(prompt: types.Prompt) -> str:
    return prompt.name


def _uri(resource: types.Resource) -> str:
    return resource.uri


def _uri_template(template: types.ResourceTemplate) -> str:
    return template.uri_template


def _merge(
    mode: str,
    sep: str,
    what: str,
    per_backend: Sequence[tuple[str, Sequence[_ItemT]]],
    key: Any,
    problems: list[str],
) -> list[tuple[str, Origin, _ItemT]]:
    """Publish every backend's items under the naming policy: ``(published name, origin, item)``, in order."""
    counts: dict[str, int] = {}
    for _, items in per_backend:
        for local in {key(item) for item in items}:
            counts[local] = counts.get(local, 0) + 1
    out: list[tuple[str, Origin, _ItemT]] = []
    taken: set[str] = set()
    for backend, items in per_backend:
        for item in items:
            local = key(item)
            prefixed = mode == "always" or (mode == "conditional" and counts[local] > 1)
            name = f"{backend}{sep}{local}" if prefixed else local
            if name in taken:
                problems.append(
                    f"{what} {backend}/{local} is not published: {name!r} is already taken (naming mode {mode!r})"
                )
                continue
            taken.add(name)
            out.append((name, Origin(backend, local), item))
    return out


def _matcher(template: str) -> UriTemplate | None:
    try:
        return UriTemplate.parse(template)
    except InvalidUriTemplate:
        return None


def _offers(capabilities: Iterable[types.ServerCapabilities | None]) -> Offers:
    resources = subscribe = prompts = completions = logging = False
    for caps in capabilities:
        if caps is None:
            continue
        if caps.resources is not None:
            resources = True
            subscribe = subscribe or bool(caps.resources.subscribe)
        prompts = prompts or caps.prompts is not None
        completions = completions or caps.completions is not None
        logging = logging or caps.logging is not None
    return Offers(resources, subscribe, prompts, completions, logging)


def _dump(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in items]
