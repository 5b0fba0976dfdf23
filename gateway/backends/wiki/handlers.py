"""The wiki tools' handlers: each a pure function of one index snapshot and its checked arguments.

A handler reads pages from disk through the index's root (``index._open_in_root``, never following a link out of
it) and turns every file-level problem (not found, refused, unreadable) into an ``is_error`` answer, naming the
nearest pages when a name is not found. Its output is capped in UTF-8 bytes (output.py). ``estimate_tokens`` is what
the listing and the whole-wiki read cost, for the catalog.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import stat
from collections.abc import Callable, Sequence
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
from gateway.backends.wiki.output import Capped, complete_utf8, count, error_result, human, text_result
from gateway.backends.wiki.schemas import INDEX_FULL_LISTING_MAX_PAGES
from gateway.backends.wiki.semantic import Embedder, SemanticIndex
from gateway.inputs import did_you_mean

__all__ = [
    "estimate_tokens",
    "files_neighbors",
    "files_read",
    "SemanticView",
    "semantic_search",
    "wiki_index",
    "wiki_read_all",
    "wiki_search",
]

_SUMMARY_MAX_FOLDERS = 60  # a summary coarsens folders to their parents until at most this many remain
_SUMMARY_FIRST_PAGES = 3
_SUGGESTIONS = 5
_SNIPPET_CHARS = 300

SemanticView = Callable[[], tuple[SemanticIndex, Embedder]]
"""The semantic snapshot and the model to embed a query with, as the backend holds them when the call runs."""


def wiki_index(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    folder: str | None = args.get("folder")
    if folder is not None:
        folder = folder.strip().strip("/") or None
        if folder is not None and folder != ".":
            folder = posixpath.normpath(folder)
    listing = _index_listing(index, folder)
    if listing is None:
        folders = sorted({posixpath.dirname(p) for p in index.pages} - {""}, key=str.casefold)
        near = did_you_mean(folder or "", folders, most=_SUGGESTIONS, cutoff=0.4)
        hint = f" Nearest folders: {', '.join(near)}." if near else " List folders with wiki_index (no folder)."
        return error_result(f"No pages in folder {folder!r}.{hint}")
    return text_result(*listing)


def files_read(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    path: str = args["path"].strip()
    refusal = _refuse_path(path)
    if refusal is not None:
        return error_result(refusal)
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
                return error_result(f"{path!r} is a folder; list it with wiki_index(folder={path!r}).")
            return error_result(f"Refused path {path!r}: not a regular file.")
        data, size = _read_fd(fd, limit)
    except OutsideRoot:
        return error_result(f"Refused path {path!r}: it resolves outside the wiki root (through a symbolic link).")
    except OSError as exc:
        return error_result(f"Could not read {path!r}: {exc.strerror or type(exc).__name__}.")
    if size <= limit:
        return text_result(data.decode("utf-8", errors="replace"))
    text = complete_utf8(data).decode("utf-8", errors="replace")
    note = (
        f"\n[truncated: showed the first {len(data):,} of {size:,} bytes of {path}; "
        "call files_read with a larger max_bytes for more]"
    )
    return text_result(text + note)


def page_header(page: _Page, relation: str = "") -> str:
    """The header a page's content follows in ``files_neighbors`` and ``wiki_read_all``."""
    return f"==> {page.path} — {page.title}{relation} <==\n"


def read_all_header(index: _Index) -> str:
    """The first line of ``wiki_read_all``."""
    size = human(index.total_bytes)
    return f"Wiki: {count(len(index.pages), 'page')}, {size}. Each page follows its ==> path <== header.\n\n"


def files_neighbors(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    query: str = args["path"]
    if "\0" in query or is_absolute_path(query.strip()) or contains_path_traversal(query.strip()):
        return error_result(_refuse_path(query.strip()) or f"Refused path {query!r}.")
    path = _find_page(index, query)
    if path is None:
        return _not_found(index, "page", query)
    page = index.pages[path]
    outgoing = index.outgoing.get(path, ())
    inbound = index.inbound.get(path, ())
    broken = index.broken.get(path, ())
    out = Capped(args["max_bytes"])
    summary = [
        f"{path} — {page.title}: links to {count(len(outgoing), 'page')}, linked from {len(inbound):,}"
        + (f", {count(len(broken), 'broken link')}." if broken else ".")
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
    return text_result(out.text() + out.note(args["max_bytes"], hint))


def wiki_read_all(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    out = Capped(args["max_bytes"])
    out.add(read_all_header(index))
    for page in index.pages.values():
        out.add_page(index.root, page, page_header(page))
    hint = "Search, then read neighbors, or raise max_bytes."
    return text_result(out.text() + out.note(args["max_bytes"], hint))


def wiki_search(index: _Index, args: dict[str, Any]) -> types.CallToolResult:
    terms = _tokens(args["query"])
    results: list[dict[str, Any]] = []
    for doc, score in index.bm25.search(terms, args["limit"]):
        path = index.order[doc]
        line, snippet = _snippet(index, path, set(terms))
        title = index.pages[path].title
        results.append({"path": path, "title": title, "score": round(score, 4), "line": line, "snippet": snippet})
    return _hits_result(results)


def semantic_search(
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
    return _hits_result(results)


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


def _hits_result(results: list[dict[str, Any]]) -> types.CallToolResult:
    """A search's answer: a JSON array, one hit a line, and the hits as ``results``."""
    text = "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in results) + "\n]" if results else "[]"
    return text_result(text, {"results": results})


def _suggest(index: _Index, query: str) -> list[str]:
    """Up to five existing pages whose file name or title equals or is closest to ``query``'s.

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
        for close in did_you_mean(key, table, most=_SUGGESTIONS, cutoff=0.6):
            found += table[close]
    return list(dict.fromkeys(found))[:_SUGGESTIONS]


def _not_found(index: _Index, what: str, query: str) -> types.CallToolResult:
    suggestions = _suggest(index, query)
    if suggestions:
        return error_result(f"No {what} {query!r} in the wiki. Nearest pages: {', '.join(suggestions)}.")
    return error_result(
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
        lines = [f"{count(len(pages), 'page')}{where}, {human(size)}. One per line: path — title (size)."]
        for page in pages:
            lines.append(f"{page.path} — {page.title} ({human(page.size)})")
            structured["pages"].append({"path": page.path, "title": page.title, "size": page.size})
    else:
        groups = _group(pages, None)
        depth = max(p.path.count("/") for p in pages)
        while len(groups) > _SUMMARY_MAX_FOLDERS and depth > 1:
            depth -= 1
            groups = _group(pages, depth)
        structured["summarised"] = True
        lines = [
            f"{len(pages):,} pages, {human(size)}, in {count(len(groups), 'folder')} (too many pages to list). "
            'Call wiki_index with folder="<folder>" to list one folder in full ("." = top-level pages).'
        ]
        for key, members in sorted(groups.items(), key=lambda kv: (kv[0] != "", kv[0].casefold())):
            label = f"{key}/" if key else "."
            first = members[:_SUMMARY_FIRST_PAGES]
            examples = ", ".join(f'{p.path.rsplit("/", 1)[-1]} "{p.title}"' for p in first)
            more = ", …" if len(members) > len(first) else ""
            total = sum(p.size for p in members)
            lines.append(f"{label} — {count(len(members), 'page')} ({human(total)}): {examples}{more}")
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
