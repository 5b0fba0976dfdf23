"""The house's layering, enforced over packages: every module of ``gateway/`` belongs to a layer (its package, or
for the few modules at the top of the package, the module itself), imports only from its own layer or below, and
no two modules import each other, directly or around a circle. The client-facing side (``front/``) knows the
backends only by their protocol (``backends/base.py``); only ``config/`` touches the process environment.

Layers, bottom to top (DESIGN.md section 6). A new package or top-level module fails
``test_every_module_has_a_declared_layer`` until it is added to ``LAYERS`` here, so where it sits is a decision.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "gateway"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

LAYERS: tuple[tuple[str, ...], ...] = (
    # the values every layer passes, the error tree, the version, what a caller's input must be
    ("errors", "version", "calls", "inputs"),
    ("config",),  # federation.yaml -> frozen models; the only reader of the environment
    ("observe", "ledger"),  # logging, metrics, tracing; the audit ledger's engines and readers
    ("auth",),  # identity only: tokens, OAuth, cookies, per-caller secrets and credentials, token exchange
    ("search", "backends"),  # ranking and the tool index; the MCP client half: every kind of downstream
    ("core",),  # router, catalog, listings, breakers, budget, results, context gate, costs, policies, runtime
    ("front",),  # the MCP server half: the face, eras, clients, exposure, stdio and HTTP (guard, sessions, limits)
    ("cli", "__main__", "__init__", "testing"),  # the command; "__init__" is gateway/__init__.py; testing: fakes
)
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}

ENVIRONMENT_READER = "config"
ENV_ATTRIBUTES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})

FRONT_SEES_OF_BACKENDS = frozenset({"backends", "backends.base"})
"""What the client-facing side may import of the backends: their protocol, never a family's internals."""


def unit(module: str) -> str:
    """The layer unit of a module: its top-level package ("backends.mcp.session" -> "backends")."""
    return module.split(".")[0]


def modules() -> dict[str, Path]:
    """Every module of the package by its name relative to the package ("backends.cli", "__init__", ...)."""
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts == ("__init__",):
            name = "__init__"
        elif parts[-1] == "__init__":
            name = ".".join(parts[:-1])
        else:
            name = ".".join(parts)
        found[name] = path
    return found


def _absolute(name: str) -> str:
    return PACKAGE if name == "__init__" else f"{PACKAGE}.{name}"


def _relative(absolute: str, known: set[str]) -> str | None:
    """The package-relative module an absolute import names, or None when it is not ours."""
    if absolute == PACKAGE:
        return "__init__"
    if not absolute.startswith(PACKAGE + "."):
        return None
    name = absolute.removeprefix(PACKAGE + ".")
    while name and name not in known:  # `import gateway.backends.cli.thing` -> the module part
        name = name.rpartition(".")[0]
    return name or "__init__"


def imports(module: str, source: str, known: set[str]) -> Iterator[tuple[str, int]]:
    """The package modules ``module`` imports (anywhere in the file, including function bodies), with line numbers."""
    is_package = module == "__init__" or any(k.startswith(module + ".") for k in known)
    own = _absolute(module)
    package = own if is_package else own.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _relative(alias.name, known)
                if target is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                absolute = f"{base}.{node.module}" if node.module else base
            else:
                absolute = node.module or ""
            for alias in node.names:
                submodule = _relative(f"{absolute}.{alias.name}", known)
                if submodule is not None and submodule in known and submodule != _relative(absolute, known):
                    yield submodule, node.lineno  # `from gateway import errors`: the submodule itself
                    continue
                target = _relative(absolute, known)
                if target is not None:
                    yield target, node.lineno


def _level(module: str, layer: dict[str, int]) -> int | None:
    """A module's layer: its own entry when it has one, else its top-level package's."""
    if module in layer:
        return layer[module]
    return layer.get(unit(module))


def upward_edges(sources: dict[str, str], layer: dict[str, int]) -> list[str]:
    known = set(sources) | set(layer)
    problems = []
    for module, source in sorted(sources.items()):
        own = _level(module, layer)
        for target, line in imports(module, source, known):
            theirs = _level(target, layer)
            if target != module and own is not None and theirs is not None and theirs > own:
                problems.append(f"{module} (layer {own}) imports {target} (layer {theirs}) at line {line}")
    return problems


def circles(sources: dict[str, str]) -> list[list[str]]:
    """Every set of modules that import each other around a circle (strongly connected, more than one module),
    counting imports anywhere in a file, function bodies included (a lazy import is still a dependency)."""
    known = set(sources)
    edges = {m: {t for t, _ in imports(m, src, known) if t != m and t in known} for m, src in sources.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def environment_uses(source: str) -> list[str]:
    """Every use of the process environment through ``os`` (``os.environ``, ``os.getenv``, ``from os import
    environ``, ...). ``config.environ(...)``, the sanctioned accessor, is not one."""
    tree = ast.parse(source)
    config_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            config_names |= {a.asname or a.name for a in node.names if a.name == "config"}
        elif isinstance(node, ast.Import):
            config_names |= {a.asname for a in node.names if a.name == f"{PACKAGE}.config" and a.asname}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_ATTRIBUTES:
            if isinstance(node.value, ast.Name) and node.value.id in config_names:
                continue
            uses.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "posix", "nt"):
            uses += [
                f"line {node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if a.name in ENV_ATTRIBUTES or a.name == "*"
            ]
    return uses


# ----------------------------------------------------------------------------------------------- the real package


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in modules().items()}


def test_every_module_has_a_declared_layer() -> None:
    undeclared = sorted(m for m in modules() if _level(m, LAYER) is None)
    assert not undeclared, f"add their packages (or modules) to LAYERS in tests/test_layering.py: {undeclared}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert upward_edges(_sources(), LAYER) == []


def test_no_modules_import_each_other_around_a_circle() -> None:
    assert circles(_sources()) == []


def test_the_client_facing_side_knows_the_backends_only_by_their_protocol() -> None:
    sources = _sources()
    known = set(sources)
    found = [
        f"{module} imports {target} at line {line}"
        for module, source in sorted(sources.items())
        if unit(module) == "front"
        for target, line in imports(module, source, known)
        if unit(target) == "backends" and target not in FRONT_SEES_OF_BACKENDS
    ]
    assert found == []


SERVER_SIDE = ("starlette", "uvicorn", "mcp.server")
"""What serves clients: only the front and the command may import it; below them no code can read a request's
headers or ASGI scope, so a request's context reaches the core and the backends only as arguments."""


def foreign_imports(source: str) -> list[str]:
    """The modules of other packages ``source`` imports, anywhere in the file."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    return [name for name in names if name.split(".")[0] != PACKAGE]


def test_below_the_front_no_module_imports_what_serves_clients() -> None:
    found = {
        module: served
        for module, path in sorted(modules().items())
        if unit(module) not in ("front", "cli", "__main__", "__init__", "testing")
        and (served := [n for n in foreign_imports(path.read_text()) if n == "starlette" or n.startswith(SERVER_SIDE)])
    }
    assert found == {}


def test_only_config_touches_the_process_environment() -> None:
    found = {}
    for name, path in modules().items():
        if unit(name) != ENVIRONMENT_READER:
            uses = environment_uses(path.read_text(encoding="utf-8"))
            if uses:
                found[name] = uses
    assert found == {}


def test_the_layer_table_knows_the_packages_it_is_meant_to_check() -> None:
    present = {unit(m) for m in modules()}
    assert {"errors", "config", "core", "backends", "front", "cli", "ledger", "auth", "observe", "search"} <= present
    assert len(LAYER) == sum(len(layer) for layer in LAYERS)  # nothing listed twice


# ----------------------------------------------------------------------------------------------- the checkers


@pytest.mark.parametrize(
    ("module", "source", "target"),
    [
        ("config", "from gateway.server import Guard\n", "server"),
        ("config", "import gateway.router\n", "router"),
        ("config", "import gateway.backends.cli as cli\n", "backends.cli"),
        ("config", "from gateway import router\n", "router"),
        ("config", "from gateway.backends import cli\n", "backends.cli"),
        ("config", "from . import server\n", "server"),
        ("config", "from .router import Router\n", "router"),
        ("backends.base", "from ..router import Router\n", "router"),
        ("backends.base", "from .cli import CliBackend\n", "backends.cli"),
        ("config", "def f():\n    from gateway.server import Guard\n", "server"),
        ("config", "from gateway import Gateway\n", "__init__"),
    ],
)
def test_the_import_checker_reports_an_upward_edge_in_every_spelling(module: str, source: str, target: str) -> None:
    layer = {
        "errors": 0,
        "config": 1,
        "backends": 2,
        "backends.base": 2,
        "backends.cli": 3,
        "router": 4,
        "server": 5,
        "__init__": 6,
    }
    problems = upward_edges({module: source}, layer)
    assert [p.split(" imports ")[1].split(" ")[0] for p in problems] == [target]


def test_the_import_checker_allows_downward_and_same_layer_edges_and_foreign_packages() -> None:
    layer = {"errors": 0, "config": 1, "router": 2, "server": 3}
    sources = {
        "server": "from gateway.router import Router\nfrom gateway import errors\nimport anyio\n",
        "router": "from .config import Federation\nimport gateway_extras\nfrom gatewayx import y\n",
        "config": "from gateway.errors import ConfigError\n",
    }
    assert upward_edges(sources, layer) == []


def test_the_circle_checker_finds_a_circle_through_a_lazy_import() -> None:
    sources = {
        "ledger.engines": "def f():\n    from gateway.ledger import postgres\n",
        "ledger.postgres": "from gateway.ledger.engines import redact_url\n",
        "config": "import yaml\n",
    }
    assert circles(sources) == [["ledger.engines", "ledger.postgres"]]
    assert circles({"a": "from gateway import b\n", "b": "import os\n"}) == []


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.environ['X']\n",
        "import os\nos.environ.get('X')\n",
        "import os as o\no.getenv('X')\n",
        "from os import environ\n",
        "from os import getenv as g\n",
        "import os\nos.putenv('X', '1')\n",
    ],
)
def test_the_environment_checker_finds_every_spelling(source: str) -> None:
    assert environment_uses(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from gateway.config import environ\nenviron('X')\n",
        "from gateway import config\nconfig.environ('X')\n",
        "import os\nos.path.join('a', 'b')\n",
        "from mcp.client.stdio import get_default_environment\n",
    ],
)
def test_the_environment_checker_allows_the_config_accessor_and_other_os_uses(source: str) -> None:
    assert environment_uses(source) == []


PRIVATE_IMPORTS = {
    # anyio.open_process takes no preexec_fn: processes.py hands it to the event-loop backend, which passes it on
    ("backends.processes", "anyio._core._eventloop"),
}
"""Another package's private modules that a module imports anyway, each with why: none may be added silently."""


def private_imports(source: str) -> list[str]:
    """The modules of other packages named with a leading underscore that ``source`` imports."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    return [
        name
        for name in names
        if name.split(".")[0] != PACKAGE and any(part.startswith("_") for part in name.split(".")[1:])
    ]


def test_no_module_imports_another_packages_private_module() -> None:
    found = {(module, name) for module, path in modules().items() for name in private_imports(path.read_text())}
    assert found == PRIVATE_IMPORTS


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from watchfiles._rust_notify import RustNotify\n", ["watchfiles._rust_notify"]),
        ("import anyio._core._eventloop\n", ["anyio._core._eventloop"]),
        ("import watchfiles\nfrom mcp.shared.message import SessionMessage\n", []),
        ("from gateway.backends.wiki_index import _Index\nfrom . import _logging\n", []),
    ],
)
def test_the_private_import_checker_finds_a_private_module_of_another_package(source: str, found: list[str]) -> None:
    assert private_imports(source) == found


# ------------------------------------------------------------------------- ask the backend, not its class or kind


def backend_classes() -> set[str]:
    """Every class of ``gateway/backends/`` that is a backend: ``Backend``, ``BackendBase`` and their subclasses
    (by base name, transitively), and any class named ``...Backend``."""
    classes: dict[str, set[str]] = {}
    for name, path in modules().items():
        if name == "backends" or name.startswith("backends."):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                    classes[node.name] = bases
    found = {"Backend", "BackendBase"} | {c for c in classes if c.endswith("Backend")}
    while True:
        more = {c for c, bases in classes.items() if bases & found} - found
        if not more:
            return found
        found |= more


def class_questions(source: str, backends: set[str]) -> list[str]:
    """Where ``source`` asks what a backend is instead of asking the backend: ``isinstance``/``issubclass`` against a
    backend class, or a comparison (``==``, ``in``, ...) on the ``kind`` of something named a backend
    (``backend.kind``, ``backends[name].kind``). An ``isinstance`` on an exception class is not one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            against = node.args[1]
            names = against.elts if isinstance(against, ast.Tuple) else [against]
            for item in names:
                named = item.id if isinstance(item, ast.Name) else getattr(item, "attr", None)
                if named in backends:
                    found.append(f"line {node.lineno}: {node.func.id}(..., {named})")
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if (
                    isinstance(operand, ast.Attribute)
                    and operand.attr == "kind"
                    and "backend" in ast.unparse(operand.value).lower()
                ):
                    found.append(f"line {node.lineno}: a comparison on {ast.unparse(operand)}")
    return found


def test_no_module_above_the_backends_asks_a_backend_its_class_or_kind() -> None:
    backends = backend_classes()
    assert {"McpBackend", "CliBackend", "WikiBackend", "DisabledBackend"} <= backends
    found = {}
    for name, path in modules().items():
        if unit(name) != "backends":  # everything that is not a backend asks the backend, not its class
            questions = class_questions(path.read_text(encoding="utf-8"), backends)
            if questions:
                found[name] = questions
    assert found == {}, "widen the Backend protocol (gateway/backends/base.py) instead"


@pytest.mark.parametrize(
    "source",
    [
        "isinstance(backend, McpBackend)\n",
        "if not isinstance(b, (CliBackend, int)): pass\n",
        "isinstance(x, mcp.McpBackend)\n",
        "backend.kind in ('adapter', 'wiki')\n",
        "backends[name].kind == 'wiki'\n",
        "'stdio' != self._backends['a'].kind\n",
    ],
)
def test_the_class_checker_finds_every_spelling(source: str) -> None:
    assert class_questions(source, {"McpBackend", "CliBackend"}) != []


@pytest.mark.parametrize(
    "source",
    [
        "isinstance(exc, BackendRpcError)\n",
        "isinstance(result, types.CallToolResult)\n",
        "backend.static_tools\n",
        "labels = [backend.kind]\n",
        "span.kind == SpanKind.SERVER\n",
    ],
)
def test_the_class_checker_allows_asking_the_backend_and_other_isinstance_uses(source: str) -> None:
    assert class_questions(source, {"McpBackend", "CliBackend"}) == []
