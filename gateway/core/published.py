"""A failure told in the client's terms: a downstream that refuses a call names its own tool ("Invalid arguments
for tool search_nodes"), which the client may know by another name (``tools.rename``, a naming prefix, a route). In
an error answer (``isError``) and in a JSON-RPC error passed through, where the text names the downstream's tool as
a tool ("tool search_nodes", "tool 'search_nodes'"), the published name stands instead. Nothing else of the answer
changes, and an answer that is no error passes untouched."""

from __future__ import annotations

import re
from collections.abc import Sequence

import mcp_types as types

from gateway.errors import BackendRpcError
from gateway.ledger.records import AuditStep

__all__ = ["error_as_published", "result_as_published"]


def result_as_published(
    result: types.CallToolResult, published: str, steps: Sequence[AuditStep]
) -> types.CallToolResult:
    """``result`` with the served provider's tool named as ``published`` in its text, when it is an error answer."""
    local = _served(steps)
    if not result.is_error or local is None or local == published:
        return result
    content = [
        block.model_copy(update={"text": _renamed(block.text, local, published)})
        if isinstance(block, types.TextContent)
        else block
        for block in result.content
    ]
    return result.model_copy(update={"content": content})


def error_as_published(error: BackendRpcError, published: str, steps: Sequence[AuditStep]) -> BackendRpcError:
    """A lone provider's JSON-RPC error whose message names the tool as ``published``."""
    local = _served(steps)
    if local is None or local == published:
        return error
    return BackendRpcError(error.backend, error.code, _renamed(error.message, local, published), error.data)


def _served(steps: Sequence[AuditStep]) -> str | None:
    """The downstream's own name of the tool that answered: the last step's (``backend/tool``)."""
    return steps[-1].provider.partition("/")[2] or None if steps else None


def _renamed(text: str, local: str, published: str) -> str:
    named = re.compile(r"(\btool\s+['\"`]?)" + re.escape(local) + r"(?![\w.-])", re.IGNORECASE)
    return named.sub(lambda match: match.group(1) + published, text)
