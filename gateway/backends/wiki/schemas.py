"""What each wiki tool publishes: its title, description, input and output schemas, as data.

``published(default, read_all)`` gives every tool's definition, with the two configured caps as the ``max_bytes``
defaults. The input schemas are strict (``additionalProperties: false``, bounds, defaults) and the only check a call's
arguments pass (``gateway.inputs.ArgumentValidator``); every node has a single ``type``, a nullable value is written
as ``anyOf``, for clients that map schemas onto single-type dialects.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

__all__ = ["INDEX_FULL_LISTING_MAX_PAGES", "MAX_BYTES_LIMIT", "published"]

INDEX_FULL_LISTING_MAX_PAGES = 300
"""Above this many pages ``wiki_index`` summarises folders instead of listing every page (it must stay cheap)."""
MAX_BYTES_LIMIT = 10_000_000
"""Upper bound of every ``max_bytes`` argument (raised to the configured default if that is larger)."""

_READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
_NOT_BLANK = r"\S"

_TITLES_AND_DESCRIPTIONS = {
    "wiki_index": (
        "Wiki index",
        "List the wiki's pages, one line each: path — title (size). Cheap: call it first when you don't know what "
        f"the wiki holds. Wikis over {INDEX_FULL_LISTING_MAX_PAGES} pages are summarised as folders with page counts "
        "and first pages; pass folder to list one in full.",
    ),
    "files_read": (
        "Read a wiki file",
        "Read one file by its path relative to the wiki root (as listed by the index or a search): the first "
        "max_bytes bytes, with a note if truncated. Use when you know the path.",
    ),
    "files_neighbors": (
        "Read a page and its links",
        "Read a page plus every page it links to and every page linking to it ([[wikilinks]] and relative markdown "
        "links), each under a path header, capped at max_bytes; broken links are listed. Use after a search hit to "
        "expand it into its context.",
    ),
    "wiki_read_all": (
        "Read the whole wiki",
        "Read every page of the wiki under path headers, capped at max_bytes (a note says how much was left out). "
        "Expensive: only for audit-style questions on a client with a large context.",
    ),
    "wiki_search": (
        "Keyword search",
        "Keyword search (BM25) over page titles and bodies; exact words, not meaning. Returns a JSON array of "
        "{path, title, score, line, snippet}, best first.",
    ),
    "wiki_vector_search": (
        "Semantic search",
        "Semantic search over the wiki's sections (a static embedding model, offline): finds passages by meaning, "
        "not exact words. Returns a JSON array of {file, title, line, score, snippet}, best first; file is a path "
        "files_read and files_neighbors take.",
    ),
    "wiki_hybrid_search": (
        "Hybrid search",
        "Hybrid search over the wiki's sections: keyword (BM25) and semantic rankings fused by reciprocal rank "
        "fusion, so both exact words and meaning count. Returns a JSON array of {file, title, line, score, "
        "snippet}, best first.",
    ),
}
"""Every tool the wiki can expose, in the order they are listed."""

_FOLDER = {
    "type": "string",
    "maxLength": 4096,
    "description": 'List only this folder, recursively (e.g. "notes/projects"; "." = top-level pages). Omit for the '
    "whole wiki.",
}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 50, "default": 10, "description": "Most results to return."}
_READ_CAP = "Most bytes of the file to return (a note says when it was cut)."
_PAGES_CAP = "Cap on the whole output in bytes; a note names the pages cut or left out."
_ALL_CAP = "Cap on the whole output in bytes; a note says how much was left out."

_INDEX_OUTPUT = {
    "type": "object",
    "properties": {
        "total_pages": {"type": "integer"},
        "total_bytes": {"type": "integer"},
        "folder": {"anyOf": [{"type": "string"}, {"type": "null"}]},
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
    kinds = {path_key: "string", "title": "string", "line": "integer", "score": "number", "snippet": "string"}
    hit = {"type": "object", "properties": {key: {"type": kind} for key, kind in kinds.items()}, "required": [*kinds]}
    return {"type": "object", "properties": {"results": {"type": "array", "items": hit}}, "required": ["results"]}


_OUTPUTS = {
    "wiki_index": _INDEX_OUTPUT,
    "wiki_search": _hits_output("path"),
    "wiki_vector_search": _hits_output("file"),
    "wiki_hybrid_search": _hits_output("file"),
}


def published(default: int, read_all: int) -> dict[str, types.Tool]:
    """Every tool's definition by name, in listing order: ``default`` is the ``max_bytes`` default of ``files_read``
    and ``files_neighbors``, ``read_all`` that of ``wiki_read_all``."""
    inputs = _inputs(default, read_all)
    tools: dict[str, types.Tool] = {}
    for name, (title, description) in _TITLES_AND_DESCRIPTIONS.items():
        fields: dict[str, Any] = {"title": title, "description": description, "input_schema": inputs[name]}
        if name in _OUTPUTS:
            fields["output_schema"] = _OUTPUTS[name]
        tools[name] = types.Tool(name=name, annotations=_READ_ONLY, **fields)
    return tools


def _inputs(default: int, read_all: int) -> dict[str, dict[str, Any]]:
    def search(query: str) -> dict[str, Any]:
        text = {"type": "string", "minLength": 1, "maxLength": 1000, "pattern": _NOT_BLANK, "description": query}
        return _object({"query": text, "limit": _LIMIT}, required=["query"])

    def path_and_cap(path: str, cap: int, cap_description: str) -> dict[str, Any]:
        path_arg = {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": _NOT_BLANK, "description": path}
        return _object({"path": path_arg, "max_bytes": _max_bytes(cap, cap_description)}, required=["path"])

    return {
        "wiki_index": _object({"folder": _FOLDER}),
        "files_read": path_and_cap('Relative to the wiki root, e.g. "notes/a.md".', default, _READ_CAP),
        "files_neighbors": path_and_cap("The page's path, file name or title.", default, _PAGES_CAP),
        "wiki_read_all": _object({"max_bytes": _max_bytes(read_all, _ALL_CAP)}),
        "wiki_search": search("Keywords."),
        "wiki_vector_search": search("What to look for."),
        "wiki_hybrid_search": search("What to look for."),
    }


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _max_bytes(default: int, description: str) -> dict[str, Any]:
    maximum = max(MAX_BYTES_LIMIT, default)
    return {"type": "integer", "minimum": 1, "maximum": maximum, "default": default, "description": description}
