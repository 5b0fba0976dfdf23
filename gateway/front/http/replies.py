"""The answers the HTTP edge writes itself, in front of or instead of the SDK: ``reply`` sends one whole JSON answer
(status, ``Content-Type: application/json``, its length, any further headers, the body) on an ASGI ``send``,
``respond`` one whole answer of any body (an empty one by default), and ``rpc_error`` is the JSON-RPC error document
such an answer carries. The guard's refusals, the body check, the caller limits, the session manager and the
2026-07-28 entry answer through them. JSON is written compact, as the SDK and starlette write it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.types import Send

__all__ = ["dumps", "reply", "respond", "rpc_error"]


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error answering ``request_id`` (None: the request's id is not known); ``data`` only when given."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def dumps(document: Mapping[str, Any]) -> bytes:
    """``document`` as compact JSON."""
    return json.dumps(document, separators=(",", ":")).encode()


async def reply(
    send: Send, status: int, document: Mapping[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Send ``document`` as the whole answer, with ``status`` and ``headers`` after the content type and length."""
    await respond(send, status, dumps(document), [(b"content-type", b"application/json"), *headers])


async def respond(send: Send, status: int, body: bytes = b"", headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Send ``body`` as the whole answer, with ``status``, its length and ``headers``."""
    head = [(b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
