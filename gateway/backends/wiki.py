"""The built-in wiki provider: seven read-only tools over a folder of markdown pages, served in process.

``WikiBackend`` owns an in-memory index of the pages under its root (paths, titles, sizes, outgoing and inbound
links, BM25 postings). ``run`` installs a file watcher on the root *first* and builds the index *second*, so no change
can slip between the two; every later change marks the index dirty and rebuilds it in the background. A call that
finds the index dirty waits for (or runs) the rebuild, so it never sees a stale index it was told about, and an index
is swapped in whole, so a call never sees a half-built one. When nothing changed, no call walks the tree.

Semantic search (``wiki_vector_search``, ``wiki_hybrid_search``; ``wiki_semantic``) is served from a second snapshot
that follows the first: once the wiki is READY, a task loads the embedding model and embeds the sections in worker
threads (never on the event loop, never before READY), then rebuilds after each index build, re-embedding only the
pages that changed. A semantic call first brings the snapshot up to the index it sees, so it is as fresh as the other
tools. While the model loads, or for good when it cannot, a semantic call raises ``BackendThinResult`` naming the
reason (thin, not unavailable, so the wiki's breaker stays closed and its other tools keep serving); a disabled
semantic search is logged once and kept as the wiki's ``last_error``.

Pages are ``*.md`` and ``*.markdown`` files under the root, skipping hidden names, ``node_modules`` and
``graphify-out``; symbolic links to directories are not followed and linked files resolving outside the root are not
pages. Every file is opened through ``wiki_index._open_in_root`` (``files_read`` too, for any path it is given):
component by component relative to descriptors, never following a link out of the root, so a folder or page swapped
for a link to the outside, at any moment, is refused rather than read (``mcp``'s ``safe_join`` checks a path and then
opens it, which such a swap can slip between). Every file is decoded as UTF-8 with replacement, so no byte sequence
crashes a tool. File-level problems
(not found, a path refused because it leaves the root) are ``is_error`` answers; bad arguments raise
``InvalidArguments`` naming the argument; ``OSError`` never escapes (``map_wiki_errors``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import posixpath
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskStatus
from mcp.shared.path_security import contains_path_traversal, is_absolute_path

# The watchfiles public ``awatch`` neither says when its watch is installed (so ``started()`` could precede it and an
# early edit be lost) nor stops promptly on cancellation (it waits out the Rust timeout); its engine does both.
from watchfiles._rust_notify import RustNotify

from gateway.backends.base import BackendBase, BackendState, BackendStatus, ProgressFn
from gateway.backends.wiki_index import (
    _INDEX_MAX_BYTES_PER_PAGE,
    _WORD,
    EXCLUDED_DIRS,
    PAGE_SUFFIXES,
    OutsideRoot,
    _build_index,
    _Index,
    _is_page_name,
    _open_in_root,
    _Page,
    _read_fd,
    _read_page,
    _resolve_wikilink,
    _strip_suffix,
    _tokens,
)
from gateway.backends.wiki_semantic import (
    Embedder,
    SemanticIndex,
    SemanticUnavailable,
    build_semantic,
    load_embedder,
)
from gateway.config import WIKI_TOOLS
from gateway.errors import BackendThinResult, BackendUnavailable, InvalidArguments, ToolNotFound

__all__ = ["INDEX_FULL_LISTING_MAX_PAGES", "TOOL_NAMES", "WikiBackend", "WikiStatistics", "map_wiki_errors"]

log = structlog.get_logger("gateway.backend")

TOOL_NAMES = WIKI_TOOLS
"""Every tool the wiki can expose, in the order they are listed."""
INDEX_FULL_LISTING_MAX_PAGES = 300
"""Above this many pages ``wiki_index`` summarises folders instead of listing every page (it must stay cheap)."""
MAX_BYTES_LIMIT = 10_000_000
"""Upper bound of every ``max_bytes`` argument (raised to the configured default if that is larger)."""
_SUMMARY_MAX_FOLDERS = 60  # a summary coarsens folders to their parents until at most this many remain
_SUMMARY_FIRST_PAGES = 3
_MIN_CUT_BYTES = 200  # a page that would show less than this is omitted rather than cut to a stub
_SUGGESTIONS = 5
_SNIPPET_CHARS = 300
_WATCH_DEBOUNCE_MS = 1_600  # longest a burst of edits is grouped before the index is rebuilt
_WATCH_STEP_MS = 50  # quiet time that ends a burst; also how fast cancellation stops the watcher thread
_WATCH_POLL_DELAY_MS = 1_000  # only when native watching is unavailable (e.g. the inotify limit) and we poll
_ROOT_RETRY_S = 5.0  # how often a missing root, or a watcher that could not start, is retried


@contextmanager
def map_wiki_errors(backend_name: str) -> Iterator[None]:
    """Translate ``OSError`` raised while indexing or reading the wiki into ``BackendUnavailable``."""
    try:
        yield
    except OSError as exc:
        raise BackendUnavailable(backend_name, f"wiki I/O failed: {exc.strerror or type(exc).__name__}") from exc


@dataclass(frozen=True, slots=True)
class WikiStatistics:
    """Introspection for tests, ``/status`` and benchmarks.

    ``generation`` counts index builds (1 after startup; it grows only when files change); ``dirty`` is True while a
    change has been seen but not indexed yet; ``watching`` is False when changes are not watched (each call rebuilds).
    """

    generation: int
    pages: int
    bytes: int
    dirty: bool
    watching: bool
    last_build_s: float
    semantic: str = "off"
    """``off`` (no semantic tool configured), ``loading``, ``ready`` or ``disabled: <reason>``."""
    semantic_sections: int = 0
    semantic_generation: int = 0
    """The keyword index generation the semantic index was last built from (it follows ``generation``)."""
    semantic_build_s: float = 0.0
    model_load_s: float = 0.0


# --------------------------------------------------------------------------------------------------- output helpers


def _complete_utf8(data: bytes) -> bytes:
    """Drop a trailing partial UTF-8 sequence, so a cut never ends in a replacement character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last character (or ASCII)
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return data[:-back] if need > back else data
    return data


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


class _Capped:
    """Output text limited to a number of UTF-8 bytes, cut at a character boundary; tracks what was cut or omitted."""

    def __init__(self, max_bytes: int) -> None:
        self.parts: list[str] = []
        self.left = max_bytes
        self.full = False
        self.cut: list[tuple[str, int, int]] = []  # (path, bytes shown, bytes in the page)
        self.omitted: list[tuple[str, int]] = []  # (path, bytes in the page)

    def add(self, text: str) -> bool:
        """Append ``text``, or as much of it as fits; False if it did not fit whole."""
        if self.full:
            return False
        data = text.encode("utf-8")
        if len(data) <= self.left:
            self.parts.append(text)
            self.left -= len(data)
            return True
        self.parts.append(_complete_utf8(data[: self.left]).decode("utf-8"))
        self.left, self.full = 0, True
        return False

    def add_page(self, root: Path, page: _Page, header: str) -> None:
        """Append a header and the page's content (read from disk now), or record the page as omitted."""
        head = header.encode("utf-8")
        if self.full or self.left < len(head) + min(page.size, _MIN_CUT_BYTES):
            self.full = True
            self.omitted.append((page.path, page.size))
            return
        self.add(header)
        room = self.left
        try:
            data, size = _read_page(root, page.path, room)
        except OSError as exc:
            self.add(f"(unreadable: {exc.strerror or type(exc).__name__})\n\n")
            return
        text = data.decode("utf-8", errors="replace")
        if not self.add(text) or len(data) < size:
            self.cut.append((page.path, room - self.left, size))
            self.full = True
            return
        self.add("\n" if text.endswith("\n") else "\n\n")  # if even this does not fit, later pages are omitted

    def note(self, max_bytes: int, hint: str) -> str:
        if not self.cut and not self.omitted:
            return ""
        parts = [f"[truncated at max_bytes={max_bytes:,}:"]
        for path, shown, size in self.cut:
            parts.append(f"{path} cut after {shown:,} of {size:,} bytes;")
        if self.omitted:
            names = ", ".join(path for path, _ in self.omitted[:20])
            more = f" and {len(self.omitted) - 20:,} more" if len(self.omitted) > 20 else ""
            size = sum(s for _, s in self.omitted)
            parts.append(f"{_count(len(self.omitted), 'page')} omitted ({size:,} bytes): {names}{more}.")
        parts.append(hint + "]")
        return "\n" + " ".join(parts)

    def text(self) -> str:
        return "".join(self.parts)


def _text_result(text: str, structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _suggest(index: _Index, query: str) -> list[str]:
    """Up to five existing pages whose file name or title equals or is closest to ``query``'s (difflib).

    Only names and titles are compared, not whole paths: that finds a page in another folder at once, and keeps a
    miss on a 2,000-page wiki to a few milliseconds.
    """
    wanted = " ".join(_strip_suffix(query.strip().lower()).split())
    name = posixpath.basename(wanted)
    keys: list[tuple[dict[str, list[str]], str]] = [(index.by_stem, name), (index.by_title, wanted)]
    found: list[str] = []
    for table, key in keys:
        found += table.get(key, [])
    for table, key in keys:
        for close in difflib.get_close_matches(key, table, n=_SUGGESTIONS, cutoff=0.6):
            found += table[close]
    return list(dict.fromkeys(found))[:_SUGGESTIONS]


def _not_found(index: _Index, what: str, query: str) -> types.CallToolResult:
    suggestions = _suggest(index, query)
    if suggestions:
        return _error_result(f"No {what} {query!r} in the wiki. Nearest pages: {', '.join(suggestions)}.")
    return _error_result(
        f"No {what} {query!r} in the wiki, and no page with a similar name; list pages with wiki_index."
    )


def _refuse_path(path: str) -> str | None:
    """Why ``path`` may not be used (absolute, escaping, hidden), or None."""
    if "\0" in path:
        return f"Refused path {path!r}: it contains a NUL byte."
    if is_absolute_path(path):
        return f"Refused path {path!r}: absolute paths are not served; give a path relative to the wiki root."
    if contains_path_traversal(path):
        return f"Refused path {path!r}: '..' would leave the wiki root."
    if any(part.startswith(".") for part in posixpath.normpath(path).split("/") if part != "."):
        return f"Refused path {path!r}: hidden files and folders are not served."
    return None


def _open_existing(root: Path, path: str) -> int | None:
    """``_open_in_root``, or None when nothing is there (also when a folder on the way is a file)."""
    try:
        return _open_in_root(root, path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _find_page(index: _Index, query: str) -> str | None:
    """A page by path (any case, suffix optional), by file name, by title, or as a ``[[wikilink]]``."""
    text = query.strip()
    if text.startswith("[[") and text.endswith("]]"):
        text = text[2:-2].split("|", 1)[0].split("#", 1)[0].strip()
    if text in index.pages:
        return text
    normal = posixpath.normpath(text)
    hit = index.by_path.get(normal.lower()) or index.by_path.get(_strip_suffix(normal).lower())
    if hit is not None:
        return hit
    return _resolve_wikilink(index, text, "")


# --------------------------------------------------------------------------------------------------- tools


@dataclass(frozen=True, slots=True)
class _Tool:
    tool: types.Tool
    handler: Callable[[_Index, dict[str, Any]], types.CallToolResult]
    blocking: bool  # reads files: runs in a worker thread
    semantic: bool = False  # needs the semantic index (the handler reads it from the backend)


_READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def _search_schema(query: str) -> dict[str, Any]:
    """The input schema every search tool takes: a ``query`` (described as ``query``) and a ``limit``."""
    limit = {"type": "integer", "minimum": 1, "maximum": 50, "default": 10, "description": "Most results to return."}
    text = {"type": "string", "minLength": 1, "maxLength": 1000, "description": query}
    return _schema({"query": text, "limit": limit}, required=["query"])


def _schema(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def _max_bytes(default: int, description: str) -> dict[str, Any]:
    return {
        "type": "integer",
        "minimum": 1,
        "maximum": max(MAX_BYTES_LIMIT, default),
        "default": default,
        "description": description,
    }


_INDEX_OUTPUT = {
    "type": "object",
    "properties": {
        "total_pages": {"type": "integer"},
        "total_bytes": {"type": "integer"},
        "folder": {"type": ["string", "null"]},
        "summarised": {"type": "boolean"},
        "pages": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "title": {"type": "string"}, "size": {"type": "integer"}},
                "required": ["path", "title", "size"],
            },
        },
        "folders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "folder": {"type": "string"},
                    "pages": {"type": "integer"},
                    "bytes": {"type": "integer"},
                    "first": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["folder", "pages", "bytes", "first"],
            },
        },
    },
    "required": ["total_pages", "total_bytes", "folder", "summarised", "pages", "folders"],
}


def _hits_output(path_key: str) -> dict[str, Any]:
    """The output schema of a search tool: ``results``, each hit its page (under ``path_key``), title, line, score
    and snippet. The keyword search names the page ``path``; the section searches ``file``, as files_search does."""
    keys = [path_key, "title", "line", "score", "snippet"]
    types_ = {path_key: "string", "title": "string", "line": "integer", "score": "number", "snippet": "string"}
    hit = {"type": "object", "properties": {k: {"type": types_[k]} for k in keys}, "required": keys}
    return {
        "type": "object",
        "properties": {"results": {"type": "array", "items": hit}},
        "required": ["results"],
    }


_SEARCH_OUTPUT = _hits_output("path")
_SECTION_OUTPUT = _hits_output("file")
SEMANTIC_TOOLS = frozenset({"wiki_vector_search", "wiki_hybrid_search"})
"""The tools served from the semantic index (backends/wiki_semantic.py)."""


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string" if isinstance(value, str) else type(value).__name__


def _validate(tool: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``arguments`` against one of this module's flat schemas and fill in defaults.

    ``null`` counts as "not given" (clients send it for optional arguments); a float with no fraction is an integer,
    as in JSON Schema.

    Raises:
        InvalidArguments: naming the first offending argument.
    """
    properties: Mapping[str, Any] = schema["properties"]
    for key in arguments:
        if key not in properties:
            expected = ", ".join(properties) or "none"
            raise InvalidArguments(tool, key, f"unknown argument (expected: {expected})")
    valid: dict[str, Any] = {}
    for key, spec in properties.items():
        value = arguments.get(key)
        if value is None:
            if key in schema.get("required", ()):
                raise InvalidArguments(tool, key, "is required")
            valid[key] = spec.get("default")
            continue
        if spec["type"] == "integer":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArguments(tool, key, f"must be an integer, got {_json_type(value)}")
            if not spec["minimum"] <= value <= spec["maximum"]:
                raise InvalidArguments(tool, key, f"must be between {spec['minimum']:,} and {spec['maximum']:,}")
        elif not isinstance(value, str):
            raise InvalidArguments(tool, key, f"must be a string, got {_json_type(value)}")
        elif len(value) < spec.get("minLength", 0) or (spec.get("minLength") and not value.strip()):
            raise InvalidArguments(tool, key, "must not be empty")
        elif len(value) > spec.get("maxLength", len(value)):
            raise InvalidArguments(tool, key, f"must be at most {spec['maxLength']:,} characters")
        valid[key] = value
    return valid


def _folder_key(path: str, depth: int | None) -> str:
    parts = path.split("/")[:-1]
    return "/".join(parts if depth is None else parts[:depth])


def _index_listing(index: _Index, folder: str | None) -> tuple[str, dict[str, Any]] | None:
    """``wiki_index`` output for the whole wiki (``None``) or one folder; None if the folder has no pages."""
    cached = index.listings.get(folder) if folder is None else None
    if cached is not None:
        return cached
    pages = list(index.pages.values())
    if folder is not None:
        if folder == ".":
            pages = [p for p in pages if "/" not in p.path]
        else:
            prefix = folder.lower() + "/"
            pages = [p for p in pages if p.path.lower().startswith(prefix)]
        if not pages:
            return None
    size = sum(p.size for p in pages)
    structured: dict[str, Any] = {
        "total_pages": len(pages),
        "total_bytes": size,
        "folder": folder,
        "summarised": False,
        "pages": [],
        "folders": [],
    }
    where = "" if folder is None else f" in {folder}/" if folder != "." else " at the top level"
    if folder is not None or len(pages) <= INDEX_FULL_LISTING_MAX_PAGES:
        lines = [f"{_count(len(pages), 'page')}{where}, {_human(size)}. One per line: path — title (size)."]
        for page in pages:
            lines.append(f"{page.path} — {page.title} ({_human(page.size)})")
            structured["pages"].append({"path": page.path, "title": page.title, "size": page.size})
    else:
        groups = _group(pages, None)
        depth = max(p.path.count("/") for p in pages)
        while len(groups) > _SUMMARY_MAX_FOLDERS and depth > 1:
            depth -= 1
            groups = _group(pages, depth)
        structured["summarised"] = True
        lines = [
            f"{len(pages):,} pages, {_human(size)}, in {_count(len(groups), 'folder')} (too many pages to list). "
            'Call wiki_index with folder="<folder>" to list one folder in full ("." = top-level pages).'
        ]
        for key, members in sorted(groups.items(), key=lambda kv: (kv[0] != "", kv[0].casefold())):
            label = f"{key}/" if key else "."
            first = members[:_SUMMARY_FIRST_PAGES]
            examples = ", ".join(f'{p.path.rsplit("/", 1)[-1]} "{p.title}"' for p in first)
            more = ", …" if len(members) > len(first) else ""
            total = sum(p.size for p in members)
            lines.append(f"{label} — {_count(len(members), 'page')} ({_human(total)}): {examples}{more}")
            structured["folders"].append(
                {"folder": key or ".", "pages": len(members), "bytes": total, "first": [p.path for p in first]}
            )
    result = ("\n".join(lines), structured)
    if folder is None:  # only the whole-wiki listing is cached: folder names are caller-chosen
        index.listings[folder] = result
    return result


def _group(pages: Sequence[_Page], depth: int | None) -> dict[str, list[_Page]]:
    groups: dict[str, list[_Page]] = {}
    for page in pages:
        groups.setdefault(_folder_key(page.path, depth), []).append(page)
    return groups


def _snippet(index: _Index, path: str, terms: set[str]) -> tuple[int, str]:
    """The 1-based line with the most distinct query terms, and a snippet starting there."""
    try:
        data, _ = _read_page(index.root, path, _INDEX_MAX_BYTES_PER_PAGE)
    except OSError:
        return 0, ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    best, best_hits = 0, -1
    for number, line in enumerate(lines):
        hits = len(terms.intersection(_tokens(line))) if line.strip() else -1
        if hits > best_hits:
            best, best_hits = number, hits
        if hits == len(terms):
            break
    snippet = "\n".join(line.strip() for line in lines[best : best + 3] if line.strip())
    if len(snippet) > _SNIPPET_CHARS:
        # Keep the first match in view: start a little before it when the line is long.
        first = min((m.start() for m in _WORD.finditer(snippet.lower()) if m.group() in terms), default=0)
        start = max(0, first - _SNIPPET_CHARS // 4)
        if start and (space := snippet.find(" ", start, first)) != -1:
            start = space + 1  # begin at a word
        snippet = ("…" if start else "") + snippet[start : start + _SNIPPET_CHARS - 2].rstrip() + "…"
    return (best + 1 if lines else 0), snippet


# --------------------------------------------------------------------------------------------------- the backend


class WikiBackend(BackendBase):
    """The built-in wiki provider (kind ``wiki``). See the module docstring for what it guarantees.

    Args:
        name: the backend's name in federation.yaml.
        root: the folder of markdown pages (it may not exist yet: the backend is then FAILED until it appears).
        tools: which of ``TOOL_NAMES`` to expose (None = all).
        read_all_max_bytes: default cap of ``wiki_read_all``.
        default_max_bytes: default cap of ``files_read`` and ``files_neighbors``.
        load_model: loads the embedding model of the semantic tools (blocking; run in a worker thread after the
            wiki is READY); raises ``SemanticUnavailable`` with the reason it cannot.

    Raises:
        ValueError: an unknown tool name, or a cap below 1.
    """

    def __init__(
        self,
        name: str,
        root: Path,
        tools: Sequence[str] | None = None,
        *,
        read_all_max_bytes: int = 1_000_000,
        default_max_bytes: int = 50_000,
        load_model: Callable[[], Embedder] = load_embedder,
    ) -> None:
        unknown = sorted(set(tools or ()) - set(TOOL_NAMES))
        if unknown:
            raise ValueError(f"Unknown wiki tool(s) {', '.join(unknown)}; choose from {', '.join(TOOL_NAMES)}.")
        if read_all_max_bytes < 1 or default_max_bytes < 1:
            raise ValueError("read_all_max_bytes and default_max_bytes must be at least 1.")
        super().__init__(name, "wiki", BackendStatus(BackendState.STARTING, "indexing the wiki"))
        self._root = Path(root)
        self._root_real = self._root.resolve()
        self._read_all_max_bytes = read_all_max_bytes
        self._default_max_bytes = default_max_bytes
        wanted = TOOL_NAMES if tools is None else tuple(t for t in TOOL_NAMES if t in tools)
        specs = self._specs()
        self._tools: dict[str, _Tool] = {n: specs[n] for n in wanted}
        self._ran = False
        self._index: _Index | None = None
        self._build_lock = anyio.Lock()
        self._changes = 0  # change batches seen (or, when not watching, calls made)
        self._changed_paths: set[str] = set()  # reported by the watcher since the last build
        self._indexed_changes = -1  # value of _changes the current index was built after
        self._watching = False
        self._generation = 0
        self._generation_changed = anyio.Event()
        self._last_build_s = 0.0
        self._semantic_wanted = any(spec.semantic for spec in self._tools.values())
        self._semantic_state = "loading" if self._semantic_wanted else "off"
        self._semantic_reason = ""
        self._embedder: Embedder | None = None
        self._semantic: SemanticIndex | None = None
        self._semantic_generation = 0
        self._semantic_lock = anyio.Lock()
        self._semantic_changed = anyio.Event()
        self._load_model = load_model

    # ------------------------------------------------------------------ Backend protocol (the rest: BackendBase)

    def tools(self) -> Sequence[types.Tool]:
        if self._status.state not in (BackendState.READY, BackendState.DEGRADED):
            return ()
        return tuple(spec.tool for spec in self._tools.values())

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Answer one tool call from the current index (rebuilt first if a change is pending).

        Raises:
            ToolNotFound: ``tool`` is not one this backend exposes.
            InvalidArguments: an argument is missing, unknown, of the wrong type or out of bounds.
            BackendUnavailable: the backend is not ready (root missing, not started) or the disk failed.
            BackendThinResult: a semantic tool while its model is loading or could not load (the reason says which),
                so a route moves on to its next rung; thin, not unavailable, so the wiki's breaker stays closed.
        """
        spec = self._tools.get(tool)
        if spec is None:
            raise ToolNotFound(tool)
        if not isinstance(arguments, Mapping):
            raise InvalidArguments(tool, "", "arguments must be an object")
        valid = _validate(tool, spec.tool.input_schema, arguments)
        if self._status.state not in (BackendState.READY, BackendState.DEGRADED):
            raise BackendUnavailable(self._name, self._status.reason or f"the wiki is {self._status.state}")
        index = await self._fresh_index()
        if spec.semantic:
            await self._fresh_semantic(index)
        with map_wiki_errors(self._name):
            if spec.blocking:
                return await anyio.to_thread.run_sync(spec.handler, index, valid)
            return spec.handler(index, valid)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the root, index it, report READY (or FAILED with the reason), then keep the index fresh.

        A missing root, or a watcher that cannot start, is retried every few seconds. A watcher that fails is replaced
        at once; if it had failed within seconds of starting, the backend is DEGRADED (each call rebuilds the index)
        until the retry.
        """
        if self._ran:
            raise RuntimeError("WikiBackend.run() can only be called once per instance.")
        self._ran = True
        async with anyio.create_task_group() as tg:
            await tg.start(self._serve_index)
            if self._semantic_wanted:  # after READY: the model and the vectors are off startup's critical path
                tg.start_soon(self._serve_semantic)
            task_status.started()

    async def _serve_index(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            try:
                notify = await anyio.to_thread.run_sync(self._open_watcher)
            except _CannotWatch as exc:
                self._watching = False
                self._set_state(BackendState.FAILED, exc.reason)
            else:
                opened = time.monotonic()
                with notify:
                    self._watching = True
                    self._changes += 1  # index after the watch is installed: no change falls between the two
                    await self._fresh_index()
                    self._set_state(BackendState.READY, tool_count=len(self._tools))
                    if not started:
                        task_status.started()
                        started = True
                    gone, reason = await self._watch(notify)
                self._watching = False
                if gone:
                    self._set_state(BackendState.FAILED, reason)
                elif time.monotonic() - opened > _ROOT_RETRY_S:
                    # A watcher error is sticky (e.g. after one file name that is not UTF-8): start a new one now.
                    log.warning("wiki.watch_restart", backend=self._name, reason=reason)
                    continue
                else:
                    self._set_state(
                        BackendState.DEGRADED,
                        f"{reason}; the index is rebuilt on every call",
                        tool_count=len(self._tools),
                    )
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(_ROOT_RETRY_S)

    # ------------------------------------------------------------------ the semantic index

    async def _serve_semantic(self) -> None:
        """Load the model (worker thread), build the semantic index, then follow every keyword index build."""
        try:
            # abandon_on_cancel: loading and embedding touch nothing shared, so shutdown need not wait for them.
            self._embedder = await anyio.to_thread.run_sync(self._load_model, abandon_on_cancel=True)
        except SemanticUnavailable as exc:
            self._semantic_state, self._semantic_reason = "disabled", exc.reason
            self._semantic_changed.set()
            log.warning("wiki.semantic_disabled", backend=self._name, reason=exc.reason)
            # The wiki stays READY (its other tools work); the reason is its last error, and every semantic call's
            # step says it too.
            self._set_status(dataclasses.replace(self._status, last_error=f"semantic search disabled: {exc.reason}"))
            return
        log.info("wiki.semantic_model", backend=self._name, model=self._embedder.source, seconds=self._embedder.load_s)
        while True:
            seen = self._generation
            index = self._index
            if index is not None:
                with map_wiki_errors(self._name):
                    await self._build_semantic(index)
            await self.wait_index_generation(seen + 1)

    async def _fresh_semantic(self, index: _Index) -> None:
        """Make the semantic snapshot follow ``index`` (embedding only the pages that changed).

        Raises:
            BackendThinResult: the model is loading or could not load, or the first build is not finished.
        """
        if self._semantic_state == "disabled":
            raise BackendThinResult(self._name, f"semantic search is disabled: {self._semantic_reason}")
        if self._embedder is None or self._semantic is None:
            what = "the embedding model is loading" if self._embedder is None else "the sections are being embedded"
            raise BackendThinResult(self._name, f"semantic search is not ready yet: {what}")
        if self._semantic.source is not index:
            await self._build_semantic(index)

    async def _build_semantic(self, index: _Index) -> None:
        async with self._semantic_lock:
            newest = self._index if self._index is not None else index  # an index is only ever replaced by a newer one
            previous = self._semantic
            if previous is not None and previous.source is newest:
                return
            embedder = self._embedder
            assert embedder is not None
            generation = self._generation
            semantic = await anyio.to_thread.run_sync(
                build_semantic, embedder, newest, previous, abandon_on_cancel=True
            )
            self._semantic, self._semantic_generation = semantic, generation
            self._semantic_state = "ready"
            self._semantic_changed.set()
            self._semantic_changed = anyio.Event()
            log.debug(
                "wiki.semantic_indexed",
                backend=self._name,
                sections=len(semantic.sections),
                embedded=semantic.embedded,
                seconds=semantic.build_s,
            )

    # ------------------------------------------------------------------ extras

    def statistics(self) -> WikiStatistics:
        index = self._index
        return WikiStatistics(
            generation=self._generation,
            pages=len(index.pages) if index else 0,
            bytes=index.total_bytes if index else 0,
            dirty=self._indexed_changes != self._changes,
            watching=self._watching,
            last_build_s=self._last_build_s,
            semantic=f"disabled: {self._semantic_reason}"
            if self._semantic_state == "disabled"
            else self._semantic_state,
            semantic_sections=len(self._semantic.sections) if self._semantic is not None else 0,
            semantic_generation=self._semantic_generation,
            semantic_build_s=self._semantic.build_s if self._semantic is not None else 0.0,
            model_load_s=self._embedder.load_s if self._embedder is not None else 0.0,
        )

    async def wait_index_generation(self, generation: int) -> None:
        """Wait until the index has been built at least ``generation`` times (see ``statistics().generation``)."""
        while self._generation < generation:
            await self._generation_changed.wait()

    async def wait_semantic(self, generation: int) -> None:
        """Wait until the semantic index follows index generation ``generation`` or more, or semantic search is off
        or disabled (see ``statistics().semantic``)."""
        while self._semantic_state in ("loading", "ready") and self._semantic_generation < generation:
            await self._semantic_changed.wait()

    def estimates(self) -> Mapping[str, int]:
        return self.measure() if self._status.state is BackendState.READY else {}

    def measure(self) -> dict[str, int]:
        """Estimate the output size, in tokens, of ``wiki_index`` and ``wiki_read_all`` (default arguments).

        Tokens are estimated as ``ceil(bytes / 4)`` of the UTF-8 text the tool returns (the usual rule of thumb for
        English text with BPE tokenizers; code and non-Latin scripts cost more). ``wiki_read_all`` counts its headers
        and pages up to its default cap. Uses the current index; before ``run`` has built one, it builds one now
        (blocking, and not kept).
        """
        index = self._index if self._index is not None else _build_index(self._root_real)
        listing = _index_listing(index, None)
        listing_bytes = len(listing[0].encode("utf-8")) if listing else 0
        read_all = len(self._read_all_header(index).encode("utf-8"))
        for page in index.pages.values():
            read_all += len(self._page_header(page).encode("utf-8")) + page.size + 1
        read_all = min(read_all, self._read_all_max_bytes)
        return {"wiki_index": math.ceil(listing_bytes / 4), "wiki_read_all": math.ceil(read_all / 4)}

    # ------------------------------------------------------------------ index lifecycle

    async def _fresh_index(self) -> _Index:
        if not self._watching:
            self._changes += 1  # nothing tells us about changes: every call sees a fresh walk
        if self._index is not None and self._indexed_changes == self._changes:
            return self._index
        async with self._build_lock:
            if self._index is None or self._indexed_changes != self._changes:
                seen = self._changes
                changed, self._changed_paths = self._changed_paths, set()
                previous = self._index.parsed if self._index is not None else None
                began = time.perf_counter()
                try:
                    with map_wiki_errors(self._name):
                        index = await anyio.to_thread.run_sync(_build_index, self._root_real, previous, changed)
                except BaseException:
                    self._changed_paths |= changed
                    raise
                self._last_build_s = time.perf_counter() - began
                self._index, self._indexed_changes = index, seen
                self._generation += 1
                self._generation_changed.set()
                self._generation_changed = anyio.Event()
                log.debug("wiki.indexed", backend=self._name, pages=len(index.pages), seconds=self._last_build_s)
            assert self._index is not None
            return self._index

    def _open_watcher(self) -> RustNotify:
        """Start watching the root (natively, else by polling). Blocking."""
        if not self._root.exists():
            raise _CannotWatch(f"wiki root {self._root} does not exist")
        if not self._root.is_dir():
            raise _CannotWatch(f"wiki root {self._root} is not a directory")
        self._root_real = self._root.resolve()
        watched = [str(self._root_real)]
        try:
            return RustNotify(watched, False, False, _WATCH_POLL_DELAY_MS, True, True)
        except (OSError, RuntimeError) as native:
            log.warning("wiki.watch_polling", backend=self._name, reason=str(native))
            try:
                return RustNotify(watched, False, True, _WATCH_POLL_DELAY_MS, True, True)
            except (OSError, RuntimeError) as exc:
                raise _CannotWatch(f"cannot watch wiki root {self._root}: {native}") from exc

    async def _watch(self, notify: RustNotify) -> tuple[bool, str]:
        """Rebuild the index after each relevant batch of changes until the root vanishes or the watcher fails.

        Returns ``(root_gone, reason)``.
        """
        stop = threading.Event()  # tells the watcher thread to return; set when this task is cancelled
        async with anyio.create_task_group() as tg:
            tg.start_soon(_set_when_cancelled, stop)
            while True:
                outcome, reason, paths = await anyio.to_thread.run_sync(self._wait_for_change, notify, stop)
                if outcome == "stop":  # we are being cancelled: let the pending cancellation land
                    await anyio.sleep_forever()
                elif outcome == "changed":
                    self._changed_paths |= paths
                    self._changes += 1
                    await self._fresh_index()
                else:
                    break
            tg.cancel_scope.cancel()
        return outcome == "gone", reason

    def _wait_for_change(
        self, notify: RustNotify, stop: threading.Event
    ) -> tuple[Literal["changed", "stop", "gone", "error"], str, set[str]]:
        """Block until a change that matters to the index: ``(outcome, reason, changed relative paths)``."""
        while True:
            try:
                raw = notify.watch(_WATCH_DEBOUNCE_MS, _WATCH_STEP_MS, 0, stop)
            except RuntimeError as exc:
                return "error", f"file watching failed: {exc}", set()
            if raw == "stop":
                return "stop", "", set()
            if isinstance(raw, str):
                continue
            if not self._root.is_dir():
                return "gone", f"wiki root {self._root} no longer exists", set()
            paths = {rel for _, path in raw if (rel := self._relevant(path)) is not None}
            if paths:
                return "changed", "", paths

    def _relevant(self, path: str) -> str | None:
        """The changed path relative to the root if it can matter to the index, else None."""
        try:
            parts = Path(path).relative_to(self._root_real).parts
        except ValueError:
            return ""
        if any(part.startswith(".") or part in EXCLUDED_DIRS for part in parts):
            return None
        # A page, a folder, or something deleted (maybe a folder); not an existing non-page file.
        if not parts or _is_page_name(parts[-1]) or not os.path.isfile(path):
            return "/".join(parts)
        return None

    # ------------------------------------------------------------------ tools

    def _specs(self) -> dict[str, _Tool]:
        default, read_all = self._default_max_bytes, self._read_all_max_bytes
        path_arg = {"type": "string", "minLength": 1, "maxLength": 4096}
        search_schema = _search_schema("What to look for.")
        return {
            "wiki_index": _Tool(
                types.Tool(
                    name="wiki_index",
                    title="Wiki index",
                    description=(
                        "List the wiki's pages, one line each: path — title (size). Cheap: call it first when you "
                        f"don't know what the wiki holds. Wikis over {INDEX_FULL_LISTING_MAX_PAGES} pages are "
                        "summarised as folders with page counts and first pages; pass folder to list one in full."
                    ),
                    input_schema=_schema(
                        {
                            "folder": {
                                "type": "string",
                                "maxLength": 4096,
                                "description": 'List only this folder, recursively (e.g. "notes/projects"; '
                                '"." = top-level pages). Omit for the whole wiki.',
                            }
                        }
                    ),
                    output_schema=_INDEX_OUTPUT,
                    annotations=_READ_ONLY,
                ),
                self._wiki_index,
                blocking=False,
            ),
            "files_read": _Tool(
                types.Tool(
                    name="files_read",
                    title="Read a wiki file",
                    description=(
                        "Read one file by its path relative to the wiki root (as listed by the index or a search): "
                        "the first max_bytes bytes, with a note if truncated. Use when you know the path."
                    ),
                    input_schema=_schema(
                        {
                            "path": {**path_arg, "description": 'Relative to the wiki root, e.g. "notes/a.md".'},
                            "max_bytes": _max_bytes(
                                default, "Most bytes of the file to return (a note says when it was cut)."
                            ),
                        },
                        required=["path"],
                    ),
                    annotations=_READ_ONLY,
                ),
                self._files_read,
                blocking=True,
            ),
            "files_neighbors": _Tool(
                types.Tool(
                    name="files_neighbors",
                    title="Read a page and its links",
                    description=(
                        "Read a page plus every page it links to and every page linking to it ([[wikilinks]] and "
                        "relative markdown links), each under a path header, capped at max_bytes; broken links are "
                        "listed. Use after a search hit to expand it into its context."
                    ),
                    input_schema=_schema(
                        {
                            "path": {**path_arg, "description": "The page's path, file name or title."},
                            "max_bytes": _max_bytes(
                                default, "Cap on the whole output in bytes; a note names the pages cut or left out."
                            ),
                        },
                        required=["path"],
                    ),
                    annotations=_READ_ONLY,
                ),
                self._files_neighbors,
                blocking=True,
            ),
            "wiki_read_all": _Tool(
                types.Tool(
                    name="wiki_read_all",
                    title="Read the whole wiki",
                    description=(
                        "Read every page of the wiki under path headers, capped at max_bytes (a note says how much "
                        "was left out). Expensive: only for audit-style questions on a client with a large context."
                    ),
                    input_schema=_schema(
                        {
                            "max_bytes": _max_bytes(
                                read_all, "Cap on the whole output in bytes; a note says how much was left out."
                            )
                        }
                    ),
                    annotations=_READ_ONLY,
                ),
                self._wiki_read_all,
                blocking=True,
            ),
            "wiki_search": _Tool(
                types.Tool(
                    name="wiki_search",
                    title="Keyword search",
                    description=(
                        "Keyword search (BM25) over page titles and bodies; exact words, not meaning. Returns a JSON "
                        "array of {path, title, score, line, snippet}, best first."
                    ),
                    input_schema=_search_schema("Keywords."),
                    output_schema=_SEARCH_OUTPUT,
                    annotations=_READ_ONLY,
                ),
                self._wiki_search,
                blocking=True,
            ),
            "wiki_vector_search": _Tool(
                types.Tool(
                    name="wiki_vector_search",
                    title="Semantic search",
                    description=(
                        "Semantic search over the wiki's sections (a static embedding model, offline): finds "
                        "passages by meaning, not exact words. Returns a JSON array of {file, title, line, score, "
                        "snippet}, best first; file is a path files_read and files_neighbors take."
                    ),
                    input_schema=search_schema,
                    output_schema=_SECTION_OUTPUT,
                    annotations=_READ_ONLY,
                ),
                self._wiki_vector_search,
                blocking=True,
                semantic=True,
            ),
            "wiki_hybrid_search": _Tool(
                types.Tool(
                    name="wiki_hybrid_search",
                    title="Hybrid search",
                    description=(
                        "Hybrid search over the wiki's sections: keyword (BM25) and semantic rankings fused by "
                        "reciprocal rank fusion, so both exact words and meaning count. Returns a JSON array of "
                        "{file, title, line, score, snippet}, best first."
                    ),
                    input_schema=search_schema,
                    output_schema=_SECTION_OUTPUT,
                    annotations=_READ_ONLY,
                ),
                self._wiki_hybrid_search,
                blocking=True,
                semantic=True,
            ),
        }

    def _wiki_index(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        folder: str | None = args["folder"]
        if folder is not None:
            folder = folder.strip().strip("/") or None
            if folder is not None and folder != ".":
                folder = posixpath.normpath(folder)
        listing = _index_listing(index, folder)
        if listing is None:
            folders = sorted({posixpath.dirname(p) for p in index.pages} - {""}, key=str.casefold)
            near = difflib.get_close_matches(folder or "", folders, n=_SUGGESTIONS, cutoff=0.4)
            hint = f" Nearest folders: {', '.join(near)}." if near else " List folders with wiki_index (no folder)."
            return _error_result(f"No pages in folder {folder!r}.{hint}")
        return _text_result(*listing)

    def _files_read(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        path: str = args["path"].strip()
        refusal = _refuse_path(path)
        if refusal is not None:
            return _error_result(refusal)
        limit: int = args["max_bytes"]
        try:
            fd = _open_existing(index.root, path)
            if fd is None and not path.lower().endswith(PAGE_SUFFIXES):
                for suffix in PAGE_SUFFIXES:
                    fd = _open_existing(index.root, path + suffix)
                    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
                        os.close(fd)  # a folder named like a page: not what an extension-less path means
                        fd = None
                    if fd is not None:
                        break
            if fd is None:
                return _not_found(index, "file", path)
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                if stat.S_ISDIR(mode):
                    return _error_result(f"{path!r} is a folder; list it with wiki_index(folder={path!r}).")
                return _error_result(f"Refused path {path!r}: not a regular file.")
            data, size = _read_fd(fd, limit)
        except OutsideRoot:
            return _error_result(f"Refused path {path!r}: it resolves outside the wiki root (through a symbolic link).")
        except OSError as exc:
            return _error_result(f"Could not read {path!r}: {exc.strerror or type(exc).__name__}.")
        if size <= limit:
            return _text_result(data.decode("utf-8", errors="replace"))
        text = _complete_utf8(data).decode("utf-8", errors="replace")
        note = (
            f"\n[truncated: showed the first {len(data):,} of {size:,} bytes of {path}; "
            "call files_read with a larger max_bytes for more]"
        )
        return _text_result(text + note)

    def _page_header(self, page: _Page, relation: str = "") -> str:
        return f"==> {page.path} — {page.title}{relation} <==\n"

    def _read_all_header(self, index: _Index) -> str:
        size = _human(index.total_bytes)
        return f"Wiki: {_count(len(index.pages), 'page')}, {size}. Each page follows its ==> path <== header.\n\n"

    def _files_neighbors(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        query: str = args["path"]
        if "\0" in query or is_absolute_path(query.strip()) or contains_path_traversal(query.strip()):
            return _error_result(_refuse_path(query.strip()) or f"Refused path {query!r}.")
        path = _find_page(index, query)
        if path is None:
            return _not_found(index, "page", query)
        page = index.pages[path]
        outgoing = index.outgoing.get(path, ())
        inbound = index.inbound.get(path, ())
        broken = index.broken.get(path, ())
        out = _Capped(args["max_bytes"])
        summary = [
            f"{path} — {page.title}: links to {_count(len(outgoing), 'page')}, linked from {len(inbound):,}"
            + (f", {_count(len(broken), 'broken link')}." if broken else ".")
        ]
        if outgoing:
            summary.append("Links to: " + ", ".join(outgoing))
        if inbound:
            summary.append("Linked from: " + ", ".join(inbound))
        if broken:
            summary.append("Broken links: " + ", ".join(broken))
        out.add("\n".join(summary) + "\n\n")
        out.add_page(index.root, page, self._page_header(page))
        both = set(outgoing) & set(inbound)
        for neighbor in dict.fromkeys([*outgoing, *inbound]):
            relation = (
                " (links both ways)" if neighbor in both else " (linked)" if neighbor in outgoing else " (links here)"
            )
            out.add_page(index.root, index.pages[neighbor], self._page_header(index.pages[neighbor], relation))
        hint = "Read a page with files_read, or raise max_bytes."
        return _text_result(out.text() + out.note(args["max_bytes"], hint))

    def _wiki_read_all(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        out = _Capped(args["max_bytes"])
        out.add(self._read_all_header(index))
        for page in index.pages.values():
            out.add_page(index.root, page, self._page_header(page))
        hint = "Search, then read neighbors, or raise max_bytes."
        return _text_result(out.text() + out.note(args["max_bytes"], hint))

    def _wiki_search(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        terms = _tokens(args["query"])
        results: list[dict[str, Any]] = []
        for doc, score in index.bm25.search(terms, args["limit"]):
            path = index.order[doc]
            line, snippet = _snippet(index, path, set(terms))
            title = index.pages[path].title
            results.append({"path": path, "title": title, "score": round(score, 4), "line": line, "snippet": snippet})
        text = "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in results) + "\n]" if results else "[]"
        return _text_result(text, {"results": results})

    def _semantic_answer(self, args: dict[str, Any], hybrid: bool) -> types.CallToolResult:
        semantic, embedder = self._semantic, self._embedder
        assert semantic is not None and embedder is not None  # call_tool checked
        query: str = args["query"]
        if hybrid:
            ranked = semantic.hybrid(embedder, query, args["limit"])
        else:
            ranked = semantic.vector(embedder, query, args["limit"])
        results = [semantic.result(i, score, query) for i, score in ranked]
        text = "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in results) + "\n]" if results else "[]"
        return _text_result(text, {"results": results})

    def _wiki_vector_search(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        del index  # served from the semantic snapshot call_tool made current
        return self._semantic_answer(args, hybrid=False)

    def _wiki_hybrid_search(self, index: _Index, args: dict[str, Any]) -> types.CallToolResult:
        del index
        return self._semantic_answer(args, hybrid=True)


class _CannotWatch(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


async def _set_when_cancelled(flag: threading.Event) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        flag.set()
