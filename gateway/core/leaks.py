"""Credentials in flight: each backend's ``secrets`` policy (else ``gateway.secrets``) applied to the arguments a
call sends it and the answer it gives (gateway/observe/credentials.py finds them).

* ``record``: both pass untouched; each finding joins the call's ledger row as kind, place and action, never the
  value;
* ``redact``: each credential is replaced by ``[redacted KIND]`` before it leaves the gateway, in the arguments sent
  downstream and in the answer sent to the client;
* ``block``: arguments that carry one are refused (``InvalidArguments`` naming the argument and the kind, so the
  router answers as for any refused argument, nothing sent); an answer that carries one is withheld, the client
  told where and which kind;
* ``off``: nothing is scanned.

The ledger's argument previews are redacted whatever the policy (core/record.py), as log lines and step reasons are
(observe/logs.py): a credential reaches the client or the downstream only under ``record`` or ``off``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types

from gateway.config import Federation, SecretsMode
from gateway.core.record import CallRecord
from gateway.errors import InvalidArguments
from gateway.observe.credentials import Finding, redact, redact_value, scan_value

__all__ = ["Leaks"]

CallFn = Callable[..., Awaitable[types.CallToolResult]]
"""A backend's ``call_tool``: ``(tool, arguments, **options) -> CallToolResult``."""

_ACTION = {"record": "recorded", "redact": "redacted", "block": "blocked"}


class Leaks:
    """The secrets policy of every backend, read from the current configuration at each call (none: ``off``)."""

    def __init__(self, config: Callable[[], Federation] | None = None) -> None:
        self._config = config

    def mode(self, backend: str) -> SecretsMode:
        """``backend``'s policy: its own ``secrets``, else ``gateway.secrets``."""
        if self._config is None:
            return "off"
        config = self._config()
        own = config.servers.get(backend) or config.adapters.get(backend)
        return own.secrets if own is not None and own.secrets is not None else config.gateway.secrets

    def guard(self, record: CallRecord, backend: str, call: CallFn) -> CallFn:
        """``call`` (a backend's ``call_tool``) under ``backend``'s policy, its findings noted on ``record``.

        Raises (from the returned function):
            InvalidArguments: under ``block``, an argument carries a credential; nothing was sent.
        """
        mode = self.mode(backend)
        if mode == "off":
            return call

        async def guarded(tool: str, arguments: dict[str, Any], **options: Any) -> types.CallToolResult:
            found = scan_value(arguments, "arguments")
            _note(record, found, mode)
            if found and mode == "block":
                first = found[0]
                argument = first.location.removeprefix("arguments").lstrip(".")
                why = f"it carries a credential ({first.kind}); {backend}'s secrets policy blocks it, nothing was sent"
                raise InvalidArguments(tool, argument, why)
            if found and mode == "redact":
                arguments = redact_value(arguments)
            result = await call(tool, arguments, **options)
            return _answer(record, backend, mode, result)

        return guarded


def _note(record: CallRecord, found: list[Finding], mode: str) -> None:
    record.secrets.extend((f.kind, f.location, _ACTION[mode]) for f in found)


def _answer(record: CallRecord, backend: str, mode: str, result: types.CallToolResult) -> types.CallToolResult:
    """The answer under the policy: as it is, redacted, or withheld."""
    found = _scan_result(result)
    _note(record, found, mode)
    if not found or mode == "record":
        return result
    if mode == "block":
        where = ", ".join(str(f) for f in found[:3])
        text = (
            f"The answer of tool {record.name!r} was withheld: it carries a credential ({where}), and {backend}'s "
            "secrets policy blocks it."
        )
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
    content = [_redacted_block(block) for block in result.content]
    structured = redact_value(result.structured_content) if result.structured_content is not None else None
    return result.model_copy(update={"content": content, "structured_content": structured})


def _scan_result(result: types.CallToolResult) -> list[Finding]:
    found: list[Finding] = []
    for i, block in enumerate(result.content):
        text = _text_of(block)
        if text is not None:
            found += scan_value(text, f"result.content[{i}].text")
    if result.structured_content is not None:
        found += scan_value(result.structured_content, "result.structuredContent")
    return found


def _text_of(block: Any) -> str | None:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource) and isinstance(block.resource, types.TextResourceContents):
        return block.resource.text
    return None


def _redacted_block(block: Any) -> Any:
    if isinstance(block, types.TextContent):
        return block.model_copy(update={"text": redact(block.text)})
    if isinstance(block, types.EmbeddedResource) and isinstance(block.resource, types.TextResourceContents):
        resource = block.resource.model_copy(update={"text": redact(block.resource.text)})
        return block.model_copy(update={"resource": resource})
    return block
