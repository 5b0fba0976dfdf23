"""The users' docs hold together: every section of docs/configuration.md is in its contents, and every link within
the docs lands on a heading that exists, one whose number is the number the link shows (``[6.5](#65-...)``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIGURATION = DOCS / "configuration.md"

_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]*)\)")
_NUMBER = re.compile(r"^(\d+(?:\.\d+)*)\.? ")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, every character but letters, digits, spaces, ``-`` and ``_``
    dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> dict[str, str]:
    """Anchor -> heading text of every heading outside code blocks (a repeated anchor gets ``-1``, ``-2``, ...)."""
    found: dict[str, str] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        anchor, n = slug(match.group(2)), 0
        while (anchor if n == 0 else f"{anchor}-{n}") in found:
            n += 1
        found[anchor if n == 0 else f"{anchor}-{n}"] = match.group(2)
    return found


def links(path: Path) -> list[tuple[int, str, str]]:
    """(line, label, target) of every markdown link outside code blocks."""
    found = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            found += [(number, label, target) for label, target in _LINK.findall(line)]
    return found


def test_the_contents_of_the_configuration_reference_list_every_section() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    contents = text.split("Contents", 1)[1].split("---", 1)[0]
    listed = [target.removeprefix("#") for _, target in _LINK.findall(contents)]
    sections = [anchor for anchor, heading in headings(CONFIGURATION).items() if re.match(r"\d+\. ", heading)]
    assert listed == sections


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_link_lands_on_a_heading_that_exists_and_bears_the_number_it_shows(doc: str) -> None:
    path = DOCS / doc
    wrong = []
    for line, label, target in links(path):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        into = (path.parent / file).resolve() if file else path
        if not into.exists():
            wrong.append(f"{doc}:{line}: [{label}]({target}): no file {file}")
            continue
        if not anchor or into.suffix != ".md":
            continue
        heading = headings(into).get(anchor)
        shown = re.fullmatch(r"(?:section )?(\d+(?:\.\d+)*)", label.strip("`"))
        if heading is None:
            wrong.append(f"{doc}:{line}: [{label}]({target}): no such heading in {into.name}")
        elif (
            shown is not None
            and not heading.startswith(f"{shown.group(1)} ")
            and not heading.startswith(f"{shown.group(1)}. ")
        ):
            wrong.append(f"{doc}:{line}: [{label}]({target}) lands on {heading!r}")
    assert wrong == []
