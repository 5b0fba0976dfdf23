"""The answers the router makes itself: every provider failed, a fault of the gateway's, and a provider's refusal of
its arguments told in the client's terms."""

from __future__ import annotations

import mcp_types as types

from gateway.core.catalog import Provider
from gateway.errors import InvalidArguments, quote
from gateway.ledger.records import AuditStep

__all__ = ["failure_result", "fault", "refusal", "refused"]


def failure_result(name: str, steps: list[AuditStep]) -> types.CallToolResult:
    if not steps:
        text = f"Tool {name!r} has no available provider right now."
    else:
        parts = [f"{s.provider}{f' [{s.variant}]' if s.variant else ''}: {s.outcome} ({s.reason})" for s in steps]
        text = f"Tool {name!r} failed: every provider failed. " + "; ".join(parts)
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def fault(name: str, exc: Exception) -> types.CallToolResult:
    text = (
        f"Tool {quote(name)} failed: the gateway hit an unexpected error ({type(exc).__name__}) while serving this "
        "call; other calls are not affected."
    )
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def refused(exc: InvalidArguments, published: str, provider: Provider) -> types.CallToolResult:
    """A backend's refusal of its own tool's arguments, told in the client's terms: the published tool (renamed,
    prefixed or a route) and argument."""
    return refusal(InvalidArguments(published, provider.published_argument(exc.argument), exc.message))


def refusal(exc: InvalidArguments) -> types.CallToolResult:
    """Arguments refused, as the tool result a client shows its model."""
    return types.CallToolResult(content=[types.TextContent(text=str(exc))], is_error=True)
