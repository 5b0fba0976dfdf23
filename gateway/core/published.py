"""A failure told in the client's terms: a downstream that refuses a call names its own tool ("Invalid arguments
for tool search_nodes"), which the client may know by another name (``tools.rename``, a naming prefix, a route). In
an error answer (``isError``) and in a JSON-RPC error passed through, where the text names the downstream's tool as
a tool ("tool search_nodes", "tool 'search_nodes'"), the published name stands instead. Nothing else of the answer
changes, and an answer that is no error passes untouched.

A lone provider that refused the call because the caller has not signed in to it (``CredentialMissing`` with a
link) is told, to a client that declares URL-mode elicitation (SEP-1036), as the JSON-RPC error -32042 carrying that
link as a URL elicitation; to any other client, as the ``isError`` answer whose text carries the link."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import mcp_types as types

from gateway.calls import Upstream
from gateway.errors import BackendError, BackendRpcError, CredentialMissing
from gateway.ledger.records import AuditStep

__all__ = ["as_url_elicitation", "error_as_published", "result_as_published"]


def as_url_elicitation(last: BackendError | None, upstream: Upstream, steps: int) -> BackendError | None:
    """``last`` as a -32042 URL elicitation error when it is a lone sign-in refusal and the client can take one
    (see the module docstring); else ``last`` as it was."""
    if not isinstance(last, CredentialMissing) or last.link is None or steps != 1:
        return last
    client = upstream.channel.client if upstream.channel is not None else None
    caps = client.capabilities if client is not None else None
    if caps is None or caps.elicitation is None or caps.elicitation.url is None:
        return last
    elicitation = types.ElicitRequestURLParams(
        message=f"Sign in to {last.backend} to use its tools: {last.reason}",
        url=last.link,
        elicitation_id=uuid.uuid4().hex,
    )
    data = types.ElicitationRequiredErrorData(elicitations=[elicitation]).model_dump(by_alias=True, exclude_none=True)
    said = f"Sign in to {last.backend} first: open {last.link}"
    return BackendRpcError(last.backend, types.URL_ELICITATION_REQUIRED, said, data)


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
