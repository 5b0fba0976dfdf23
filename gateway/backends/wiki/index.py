"""The index of a markdown folder, built by pure, blocking functions: pages, titles, links and BM25 postings.

``_build_index`` walks the root (pages are ``*.md`` and ``*.markdown``; hidden names, ``node_modules`` and
``graphify-out`` skipped; a link to a folder not followed, a linked page kept only inside the root) into one
immutable ``_Index``, reusing the parse of every page unchanged since the previous build (semantic.py cuts its
sections from the same parse). Wikilinks and relative markdown links are resolved, broken ones recorded.

Confinement: nothing under the root is opened by path. ``_open_in_root`` walks a path one component at a time, each
opened relative to its parent's descriptor with ``O_NOFOLLOW``, and follows a symbolic link only by walking its
target from the root, refused if it would leave it; the walk of the tree opens folders the same way. So a folder
swapped for a link to the outside while the wiki reads can make a read fail, never reach the outside.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

import yaml

from gateway.search.ranking import Bm25 as _Bm25

PAGE_SUFFIXES = (".md", ".markdown")
EXCLUDED_DIRS = frozenset({"node_modules", "graphify-out"})
_INDEX_MAX_BYTES_PER_PAGE = 4_000_000  # links and terms past this point of a (pathological) page are not indexed

_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # safe_load's loader, in C when libyaml is there
_WORD = re.compile(r"\w+")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S | re.M)
_FENCED_CODE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_HEADING = re.compile(r"^#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
_WIKILINK = re.compile(r"\[\[([^\[\]\n]+)\]\]")
_MD_LINK = re.compile(r"\[[^\]\n]*\]\(\s*(<[^>\n]+>|[^)\s]+)(?:\s+[^)\n]*)?\)")
_REF_DEFINITION = re.compile(r"^[ ]{0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]+>|\S+)", re.M)
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_ASSET_SUFFIX = re.compile(r"^\.[A-Za-z0-9]{1,5}$")


@dataclass(frozen=True, slots=True)
class _Page:
    path: str  # relative to the root, '/'-separated
    title: str
    size: int  # bytes on disk


_Stamp = tuple[int, int, int]  # (mtime_ns, size, inode)
_Link = tuple[Literal["wiki", "md"], str]


@dataclass(frozen=True, slots=True)
class _Parsed:
    """What one page contributes to the index; kept so an unchanged page is not read again."""

    page: _Page
    stamp: _Stamp
    links: tuple[_Link, ...]
    counts: Counter[str]
    text: str  # the decoded page (up to _INDEX_MAX_BYTES_PER_PAGE), for the semantic index's sections


@dataclass(slots=True)
class _Index:
    """One immutable snapshot of the wiki (``listings`` is a cache filled on demand)."""

    root: Path  # resolved
    pages: dict[str, _Page]  # in listing order
    outgoing: dict[str, tuple[str, ...]]
    inbound: dict[str, tuple[str, ...]]
    broken: dict[str, tuple[str, ...]]
    by_path: dict[str, str]  # lower-cased path, with and without suffix -> path
    by_stem: dict[str, list[str]]
    by_title: dict[str, list[str]]
    bm25: _Bm25
    order: list[str]  # doc id -> path
    total_bytes: int
    parsed: dict[str, _Parsed]  # reused by the next build for pages that did not change
    listings: dict[str | None, tuple[str, dict[str, Any]]] = field(default_factory=dict)


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _strip_suffix(path: str) -> str:
    lower = path.lower()
    for suffix in PAGE_SUFFIXES:
        if lower.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _is_page_name(name: str) -> bool:
    return name.lower().endswith(PAGE_SUFFIXES) and not name.startswith(".")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO must not hang the open
_MAX_LINKS = 40  # symbolic links followed in one path, as Linux allows (then ELOOP)
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})  # how O_NOFOLLOW reports a link (Linux, BSD)


class OutsideRoot(PermissionError):
    """The path, or a symbolic link on it, leads out of the wiki root."""

    def __init__(self) -> None:
        super().__init__(errno.EACCES, "it resolves outside the wiki root (through a symbolic link)")


def _open_in_root(root: Path | str, path: str) -> int:
    """Open ``path`` (relative to ``root``, ``/``-separated) without ever leaving ``root``: a descriptor of the file
    or folder it names, opened for reading. The caller closes it.

    Every component is opened relative to its parent's descriptor with ``O_NOFOLLOW``, so no link is followed by the
    kernel; a link met is read and its target walked from the folder holding it (an absolute target from the root,
    if it lies under it). ``..`` steps back to the folder walked before, never above the root. So a folder swapped
    for a link while we walk makes the open fail or stay inside, never reach the outside.

    Raises:
        OutsideRoot: the path or a link on it leaves the root.
        OSError: not found, not a folder, a link loop (ELOOP), permissions.
    """
    root_text = os.fspath(root)
    todo = [part for part in reversed(path.split("/")) if part not in ("", ".")]
    stack = [os.open(root_text, _DIR_FLAGS & ~os.O_NOFOLLOW)]  # the root itself may be reached through a link
    links = 0
    try:
        while todo:
            part = todo.pop()
            if part == "..":
                if len(stack) == 1:
                    raise OutsideRoot()
                os.close(stack.pop())
                continue
            if part in ("", "."):
                continue
            try:
                fd = os.open(part, _DIR_FLAGS if todo else _FILE_FLAGS, dir_fd=stack[-1])
            except OSError as exc:
                if exc.errno not in _LINK_ERRNOS:
                    raise
                try:
                    target = os.readlink(part, dir_fd=stack[-1])
                except OSError:
                    raise exc from None  # not a link: e.g. a file where a folder was expected
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
                if target.startswith("/"):
                    inside = os.path.relpath(target, root_text)
                    if inside == ".." or inside.startswith("../") or not os.path.isabs(root_text):
                        raise OutsideRoot() from None
                    while len(stack) > 1:
                        os.close(stack.pop())
                    target = inside
                todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                continue
            stack.append(fd)
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


def _walk(root: Path) -> list[tuple[str, _Stamp]]:
    """Every page under ``root`` with its stamp (no directory symlinks followed, nothing escaping the root).

    Each folder is opened relative to its parent's descriptor with ``O_NOFOLLOW`` (a folder swapped for a link
    meanwhile is skipped, not listed); a linked page is admitted only if ``_open_in_root`` reaches it. Depth first,
    holding one descriptor per level (not one per folder waiting its turn).
    """
    found: list[tuple[str, _Stamp]] = []
    try:
        top = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return found
    frames: list[tuple[int, str, list[str]]] = []  # (folder descriptor, its path, subfolders still to walk)
    try:
        frames.append((top, "", []))
        frames[-1][2].extend(_list_folder(root, top, "", found))
        while frames:
            fd, rel, pending = frames[-1]
            if not pending:
                os.close(frames.pop()[0])
                continue
            name = pending.pop()
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a link since it was listed
            frames.append((child, f"{rel}{name}/", []))
            frames[-1][2].extend(_list_folder(root, child, f"{rel}{name}/", found))
    finally:
        for fd, _, _ in frames:
            os.close(fd)
    found.sort(key=lambda item: (item[0].casefold(), item[0]))
    return found


def _list_folder(root: Path, fd: int, rel: str, found: list[tuple[str, _Stamp]]) -> list[str]:
    """Add the pages of the folder open on ``fd`` to ``found``; its subfolders to walk, in reverse order."""
    subfolders: list[str] = []
    try:
        with os.scandir(fd) as entries:
            listed = list(entries)
    except OSError:
        return subfolders
    for entry in listed:
        name = entry.name
        if name.startswith(".") or not _utf8_name(name):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if name not in EXCLUDED_DIRS:
                    subfolders.append(name)
            elif _is_page_name(name) and entry.is_symlink():
                page = _open_in_root(root, f"{rel}{name}")
                try:
                    st = os.fstat(page)
                finally:
                    os.close(page)
                if stat.S_ISREG(st.st_mode):
                    found.append((f"{rel}{name}", (st.st_mtime_ns, st.st_size, st.st_ino)))
            elif _is_page_name(name) and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                found.append((f"{rel}{name}", (st.st_mtime_ns, st.st_size, st.st_ino)))
        except OSError:
            continue
    subfolders.reverse()
    return subfolders


def _utf8_name(name: str) -> bool:
    """False for a file name that is not valid UTF-8 (Python smuggles its bytes in as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_fd(fd: int, limit: int) -> tuple[bytes, int]:
    """The first ``limit`` bytes of the regular file open on ``fd`` and its size; closes ``fd``."""
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(f.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(errno.EACCES, "not a regular file")
        data = f.read(limit)
    return data, max(st.st_size, len(data))


def _read_page(root: Path, path: str, limit: int) -> tuple[bytes, int]:
    """The first ``limit`` bytes of the file at ``path`` under ``root`` and its size, opened by ``_open_in_root`` (a
    folder or page swapped for a link out of the root since it was indexed is refused, whenever the swap happens).

    Raises:
        OutsideRoot: it now resolves outside the root.
        OSError: it cannot be opened or is not a regular file.
    """
    return _read_fd(_open_in_root(root, path), limit)


def _front_matter(text: str) -> tuple[dict[str, Any], int]:
    """The parsed front matter (empty if absent or unparsable) and where the body starts."""
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, 0
    try:
        loaded = yaml.load(match.group(1), Loader=_YAML_LOADER)
    except Exception:  # front matter is user data; anything unparsable (bad YAML, bad dates) means "none"
        loaded = None
    return (loaded if isinstance(loaded, dict) else {}), match.end()


def _without_code(text: str, *, inline: bool) -> str:
    if "```" in text or "~~~" in text:
        text = _FENCED_CODE.sub("", text)
    if inline and "`" in text:
        text = _INLINE_CODE.sub("", text)
    return text


def _title(text: str, stem: str) -> str:
    """Front matter ``title``, else the first ``# `` heading outside code, else the file name."""
    meta, body = _front_matter(text)
    value = meta.get("title")
    if value is not None and not isinstance(value, dict | list) and str(value).strip():
        return " ".join(str(value).split())
    match = _HEADING.search(_without_code(text[body:] if body else text, inline=False))
    if match is not None and match.group(1).strip():
        return match.group(1).strip()
    return stem


def _raw_links(text: str) -> tuple[_Link, ...]:
    """Link targets in document order: wikilink targets (alias and heading removed) and markdown hrefs."""
    prose = _without_code(text, inline=True)
    found: list[tuple[int, Literal["wiki", "md"], str]] = []
    for match in _WIKILINK.finditer(prose):
        target = match.group(1).split("|", 1)[0].split("#", 1)[0].strip()
        if target:
            found.append((match.start(), "wiki", target))
    for pattern in (_MD_LINK, _REF_DEFINITION):
        for match in pattern.finditer(prose):
            href = match.group(1).strip("<>").strip()
            if href and not href.startswith(("#", "//")) and not _URL_SCHEME.match(href):
                found.append((match.start(), "md", href))
    found.sort(key=lambda item: item[0])
    return tuple((kind, target) for _, kind, target in found)


def _pick(candidates: Sequence[str], from_dir: str) -> str:
    """Among pages of one name, prefer the linking page's folder, then the shallowest, then listing order."""
    if len(candidates) == 1:
        return candidates[0]
    return min(candidates, key=lambda p: (posixpath.dirname(p) != from_dir, p.count("/")))


def _resolve_wikilink(index: _Index, target: str, source: str) -> str | None:
    key = _strip_suffix(target.replace("\\", "/").strip("/")).lower()
    hit = index.by_path.get(key)
    if hit is not None:
        return hit
    from_dir = posixpath.dirname(source)
    candidates = index.by_stem.get(key.rsplit("/", 1)[-1], [])
    if "/" in key:
        candidates = [c for c in candidates if _strip_suffix(c).lower().endswith("/" + key)]
    if not candidates:
        candidates = index.by_title.get(" ".join(target.lower().split()), [])
    return _pick(candidates, from_dir) if candidates else None


def _resolve_md_link(index: _Index, href: str, source: str) -> tuple[str | None, bool]:
    """``(page, is_page_link)``: a link to something that is not a page (an image, a folder) is not broken."""
    target = unquote(href.split("#", 1)[0].split("?", 1)[0])
    if not target:
        return None, False
    base = "" if target.startswith("/") else posixpath.dirname(source)
    joined = posixpath.normpath(posixpath.join(base, target.lstrip("/")))
    suffix = posixpath.splitext(joined)[1].lower()
    if joined == ".." or joined.startswith("../"):
        return None, suffix in PAGE_SUFFIXES
    hit = index.by_path.get(joined.lower())  # also finds an extension-less link to a page
    return hit, hit is not None or suffix in PAGE_SUFFIXES


def _parse(root: Path, path: str, stamp: _Stamp) -> _Parsed | None:
    try:
        data, size = _read_page(root, path, _INDEX_MAX_BYTES_PER_PAGE)
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace")
    title = _title(text, _strip_suffix(posixpath.basename(path)))
    counts = Counter(_tokens(text))
    counts.update(_tokens(title))  # the title counts once more than its occurrences in the body
    return _Parsed(_Page(path, title, size), stamp, _raw_links(text), counts, text)


def _build_index(root: Path, previous: Mapping[str, _Parsed] | None = None, changed: Set[str] = frozenset()) -> _Index:
    """Walk ``root`` and index every page. Blocking; runs in a worker thread. Never raises for one bad file.

    A page of ``previous`` is reused, not read again, when its stamp is unchanged and the watcher did not report it
    in ``changed`` (the stamp alone can miss a same-size rewrite within one mtime tick).
    """
    previous = previous or {}
    parsed: dict[str, _Parsed] = {}
    for path, stamp in _walk(root):
        old = previous.get(path)
        entry = old if old is not None and old.stamp == stamp and path not in changed else _parse(root, path, stamp)
        if entry is not None:
            parsed[path] = entry
    pages = {path: entry.page for path, entry in parsed.items()}
    raw = {path: entry.links for path, entry in parsed.items()}
    docs = [entry.counts for entry in parsed.values()]

    by_path: dict[str, str] = {}
    by_stem: dict[str, list[str]] = {}
    by_title: dict[str, list[str]] = {}
    for path, page in pages.items():
        by_path.setdefault(path.lower(), path)
        by_path.setdefault(_strip_suffix(path).lower(), path)
        by_stem.setdefault(_strip_suffix(posixpath.basename(path)).lower(), []).append(path)
        by_title.setdefault(" ".join(page.title.lower().split()), []).append(path)
    index = _Index(
        root=root,
        pages=pages,
        outgoing={},
        inbound={},
        broken={},
        by_path=by_path,
        by_stem=by_stem,
        by_title=by_title,
        bm25=_Bm25(docs),
        order=list(pages),
        total_bytes=sum(p.size for p in pages.values()),
        parsed=parsed,
    )
    inbound: dict[str, list[str]] = {}
    for path, links in raw.items():
        out: dict[str, None] = {}
        broken: dict[str, None] = {}
        for kind, target in links:
            if kind == "wiki":
                hit = _resolve_wikilink(index, target, path)
                is_page = hit is not None or not _ASSET_SUFFIX.match(posixpath.splitext(target)[1])
                label = f"[[{target}]]"
            else:
                hit, is_page = _resolve_md_link(index, target, path)
                label = target
            if hit is not None and hit != path:
                out.setdefault(hit)
            elif hit is None and is_page:
                broken.setdefault(label)
        index.outgoing[path] = tuple(out)
        index.broken[path] = tuple(broken)
        for target_path in out:
            inbound.setdefault(target_path, []).append(path)
    index.inbound = {path: tuple(sources) for path, sources in inbound.items()}
    return index
