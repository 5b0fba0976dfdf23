"""The wiki's tools: what each publishes (schema, description, annotations) and the handler that answers it.

A handler is a pure function of one index snapshot (backends/wiki_index.py) and its validated arguments; it reads
pages from disk through that index's root (``wiki_index._open_in_root``, never following a link out of it) and turns
every file-level problem (not found, refused, unreadable) into an ``is_error`` answer. Every output is capped in
UTF-8 bytes and cut at a character boundary, with a note naming what was cut or left out. ``validate`` checks a
call's arguments against the tool's flat schema (``InvalidArguments`` names the argument). The index's lifecycle
(watching, rebuilding, the semantic snapshot) is the backend's, in backends/wiki.py.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import posixpath
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.shared.path_security import contains_path_traversal, is_absolute_path

from gateway.backends.wiki.index import (
    _INDEX_MAX_BYTES_PER_PAGE,
    _WORD,
    PAGE_SUFFIXES,
    OutsideRoot,
    _Index,
    _open_in_root,
    _Page,
    _read_fd,
    _read_page,
    _resolve_wikilink,
    _strip_suffix,
    _tokens,
)
from gateway.backends.wiki.semantic import Embedder, SemanticIndex
from gateway.errors import InvalidArguments

__all__ = [
    "INDEX_FULL_LISTING_MAX_PAGES",
    "MAX_BYTES_LIMIT",
    "SemanticView",
    "WikiTool",
    "estimate_tokens",
    "tool_specs",
    "validate",
]

INDEX_FULL_LISTING_MAX_PAGES = 300
"""Above this many pages ``wiki_index`` summarises folders instead of listing every page (it must stay cheap)."""
MAX_BYTES_LIMIT = 10_000_000
"""Upper bound of every ``max_bytes`` argument (raised to the configured default if that is larger)."""
_SUMMARY_MAX_FOLDERS = 60  # a summary coarsens folders to their parents until at most this many remain
_SUMMARY_FIRST_PAGES = 3
_MIN_CUT_BYTES = 200  # a page that would show less than this is omitted rather than cut to a stub
_SUGGESTIONS = 5
_SNIPPET_CHARS = 300


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


# --------------------------------------------------------------------------------------------------- the tools


@dataclass(frozen=True, slots=True)
class WikiTool:
    """One tool: what is published, and the handler that answers it from an index and validated arguments."""

    tool: types.Tool
    handler: Callable[[_Index, dict[str, Any]], types.CallToolResult]
    blocking: bool  # reads files: runs in a worker thread
    semantic: bool = False  # needs the semantic index (the handler reads it through the SemanticView)


SemanticView = Callable[[], tuple[SemanticIndex, Embedder]]
"""The semantic snapshot and the model to embed a query with, as the backend holds them when the call runs."""


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
        "folder": {"anyOf": [{"type": "string"}, {"type": "null"}]},  # one type per node: portable to more clients
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


def validate(tool: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
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


def _path_reader(
    name: str,
    title: str,
    description: str,
    *,
    path: str,
    max_bytes: dict[str, Any],
    handler: Callable[[_Index, dict[str, Any]], types.CallToolResult],
) -> WikiTool:
    """A read-only tool that reads files (in a worker thread) from a required ``path`` and an optional
    ``max_bytes``; ``path`` and ``max_bytes`` are those arguments' descriptions and schema."""
    path_arg = {"type": "string", "minLength": 1, "maxLength": 4096, "description": path}
    schema = _schema({"path": path_arg, "max_bytes": max_bytes}, required=["path"])
    tool = types.Tool(name=name, title=title, description=description, input_schema=schema, annotations=_READ_ONLY)
    return WikiTool(tool, handler, blocking=True)


def tool_specs(default: int, read_all: int, semantic: SemanticView) -> dict[str, WikiTool]:
    """Every tool the wiki can expose, by name: ``default`` caps ``files_read`` and ``files_neighbors``, ``read_all``
    caps ``wiki_read_all``, and ``semantic`` gives the semantic tools the snapshot ``call_tool`` made current."""
    search_schema = _search_schema("What to look for.")
    return {
        "wiki_index": WikiTool(
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
            _wiki_index,
            blocking=False,
        ),
        "files_read": _path_reader(
            "files_read",
            "Read a wiki file",
            "Read one file by its path relative to the wiki root (as listed by the index or a search): the first "
            "max_bytes bytes, with a note if truncated. Use when you know the path.",
            path='Relative to the wiki root, e.g. "notes/a.md".',
            max_bytes=_max_bytes(default, "Most bytes of the file to return (a note says when it was cut)."),
            handler=_files_read,
        ),
        "files_neighbors": _path_reader(
            "files_neighbors",
            "Read a page and its links",
            "Read a page plus every page it links to and every page linking to it ([[wikilinks]] and relative "
            "markdown links), each under a path header, capped at max_bytes; broken links are listed. Use after a "
            "search hit to expand it into its context.",
            path="The page's path, file name or title.",
            max_bytes=_max_bytes(default, "Cap on the whole output in bytes; a note names the pages cut or left out."),
            handler=_files_neighbors,
        ),
        "wiki_read_all": WikiTool(
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
            _wiki_read_all,
            blocking=True,
        ),
        "wiki_search": WikiTool(
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
            _wiki_search,
            blocking=True,
        ),
        "wiki_vector_search": WikiTool(
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
            functools.partial(_semantic_search, semantic, hybrid=False),
            blocking=True,
            semantic=True,
        ),
        "wiki_hybrid_search": WikiTool(
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
            functools.partial(_semantic_search, semantic, hybrid=True),
            blocking=True,
            semantic=True,
        ),
    }


def _wiki_index(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
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


def _files_read(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
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


def page_header(page: _Page, relation: str = "") -> str:
    """The header a page's content follows in ``files_neighbors`` and ``wiki_read_all``."""
    return f"==> {page.path} — {page.title}{relation} <==\n"


def read_all_header(index: _Index) -> str:
    """The first line of ``wiki_read_all``."""
    size = _human(index.total_bytes)
    return f"Wiki: {_count(len(index.pages), 'page')}, {size}. Each page follows its ==> path <== header.\n\n"


def _files_neighbors(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
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
    out.add_page(index.root, page, page_header(page))
    both = set(outgoing) & set(inbound)
    for neighbor in dict.fromkeys([*outgoing, *inbound]):
        relation = (
            " (links both ways)" if neighbor in both else " (linked)" if neighbor in outgoing else " (links here)"
        )
        out.add_page(index.root, index.pages[neighbor], page_header(index.pages[neighbor], relation))
    hint = "Read a page with files_read, or raise max_bytes."
    return _text_result(out.text() + out.note(args["max_bytes"], hint))


def _wiki_read_all(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    out = _Capped(args["max_bytes"])
    out.add(read_all_header(index))
    for page in index.pages.values():
        out.add_page(index.root, page, page_header(page))
    hint = "Search, then read neighbors, or raise max_bytes."
    return _text_result(out.text() + out.note(args["max_bytes"], hint))


def _wiki_search(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    terms = _tokens(args["query"])
    results: list[dict[str, Any]] = []
    for doc, score in index.bm25.search(terms, args["limit"]):
        path = index.order[doc]
        line, snippet = _snippet(index, path, set(terms))
        title = index.pages[path].title
        results.append({"path": path, "title": title, "score": round(score, 4), "line": line, "snippet": snippet})
    text = "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in results) + "\n]" if results else "[]"
    return _text_result(text, {"results": results})


def _semantic_search(
    semantic: SemanticView, index: _Index, args: dict[str, Any], *, hybrid: bool
) -> types.CallToolResult:
    del index  # served from the semantic snapshot call_tool made current
    snapshot, embedder = semantic()
    query: str = args["query"]
    if hybrid:
        ranked = snapshot.hybrid(embedder, query, args["limit"])
    else:
        ranked = snapshot.vector(embedder, query, args["limit"])
    results = [snapshot.result(i, score, query) for i, score in ranked]
    text = "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in results) + "\n]" if results else "[]"
    return _text_result(text, {"results": results})


def estimate_tokens(index: _Index, read_all_max_bytes: int) -> dict[str, int]:
    """The output size, in tokens, of ``wiki_index`` and ``wiki_read_all`` (default arguments) over ``index``.

    Tokens are estimated as ``ceil(bytes / 4)`` of the UTF-8 text the tool returns (the usual rule of thumb for
    English text with BPE tokenizers; code and non-Latin scripts cost more). ``wiki_read_all`` counts its headers
    and pages up to its default cap ``read_all_max_bytes``.
    """
    listing = _index_listing(index, None)
    listing_bytes = len(listing[0].encode("utf-8")) if listing else 0
    read_all = len(read_all_header(index).encode("utf-8"))
    for page in index.pages.values():
        read_all += len(page_header(page).encode("utf-8")) + page.size + 1
    read_all = min(read_all, read_all_max_bytes)
    return {"wiki_index": math.ceil(listing_bytes / 4), "wiki_read_all": math.ceil(read_all / 4)}
