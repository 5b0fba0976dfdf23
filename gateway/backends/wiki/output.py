"""A wiki tool's answer: text capped in UTF-8 bytes, cut at a character boundary, with a note naming what was cut.

``Capped`` collects a tool's output up to ``max_bytes``, reading pages from disk as they are added and recording the
pages cut or left out; ``note`` says so at the end. ``text_result`` and ``error_result`` are the two answers a
handler gives (an ``is_error`` answer is a file-level problem the model can act on, not a failure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types

from gateway.backends.wiki.index import _Page, _read_page

__all__ = ["Capped", "complete_utf8", "count", "error_result", "human", "text_result"]

_MIN_CUT_BYTES = 200  # a page that would show less than this is omitted rather than cut to a stub
_NAMED_OMITTED = 20  # omitted pages named in a note before the rest are counted


def complete_utf8(data: bytes) -> bytes:
    """Drop a trailing partial UTF-8 sequence, so a cut never ends in a replacement character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last character (or ASCII)
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return data[:-back] if need > back else data
    return data


def count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def human(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


class Capped:
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
        self.parts.append(complete_utf8(data[: self.left]).decode("utf-8"))
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
        """The note that ends a cut output (what was cut or left out, then ``hint``); "" when nothing was."""
        if not self.cut and not self.omitted:
            return ""
        parts = [f"[truncated at max_bytes={max_bytes:,}:"]
        for path, shown, size in self.cut:
            parts.append(f"{path} cut after {shown:,} of {size:,} bytes;")
        if self.omitted:
            names = ", ".join(path for path, _ in self.omitted[:_NAMED_OMITTED])
            more = f" and {len(self.omitted) - _NAMED_OMITTED:,} more" if len(self.omitted) > _NAMED_OMITTED else ""
            size = sum(s for _, s in self.omitted)
            parts.append(f"{count(len(self.omitted), 'page')} omitted ({size:,} bytes): {names}{more}.")
        parts.append(hint + "]")
        return "\n" + " ".join(parts)

    def text(self) -> str:
        return "".join(self.parts)


def text_result(text: str, structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
