"""The wiki's tools by name: what each publishes (schemas.py) joined to the handler that answers it (handlers.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from gateway.backends.wiki import handlers
from gateway.backends.wiki.handlers import SemanticView
from gateway.backends.wiki.index import _Index
from gateway.backends.wiki.schemas import published
from gateway.inputs import ArgumentValidator

__all__ = ["WikiTool", "tool_specs"]

Handler = Callable[[_Index, dict[str, Any]], types.CallToolResult]


@dataclass(frozen=True, slots=True)
class WikiTool:
    """One tool: what is published, the check of its arguments, and the handler that answers it."""

    tool: types.Tool
    arguments: ArgumentValidator
    handler: Handler
    blocking: bool  # reads files: runs in a worker thread
    semantic: bool = False  # needs the semantic index (the handler reads it through the SemanticView)


def tool_specs(default: int, read_all: int, semantic: SemanticView) -> dict[str, WikiTool]:
    """Every tool the wiki can expose, by name in listing order: ``default`` caps ``files_read`` and
    ``files_neighbors``, ``read_all`` caps ``wiki_read_all``, and ``semantic`` gives the semantic tools the snapshot
    ``call_tool`` made current."""
    answers: dict[str, tuple[Handler, bool, bool]] = {  # name: (handler, blocking, semantic)
        "wiki_index": (handlers.wiki_index, False, False),
        "files_read": (handlers.files_read, True, False),
        "files_neighbors": (handlers.files_neighbors, True, False),
        "wiki_read_all": (handlers.wiki_read_all, True, False),
        "wiki_search": (handlers.wiki_search, True, False),
        "wiki_vector_search": (functools.partial(handlers.semantic_search, semantic, hybrid=False), True, True),
        "wiki_hybrid_search": (functools.partial(handlers.semantic_search, semantic, hybrid=True), True, True),
    }
    return {
        name: WikiTool(tool, ArgumentValidator(tool.input_schema), *answers[name])
        for name, tool in published(default, read_all).items()
    }
