"""A transport's receive stream, watched: ``WatchedReceiveStream`` tells its owner the moment the connection ends.

The SDK's ``ClientSession`` reads the stream and says nothing when it ends; the backend must know at once, to mark the
session lost and fail its calls in flight with the reason (failures.py ``Life``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
from mcp.shared.message import SessionMessage

__all__ = ["WatchedReceiveStream"]


class WatchedReceiveStream:
    """Wraps the transport's receive stream and fires ``on_eof`` when the connection ends (zero-copy); ``screen``, when
    given, sees every message first and may replace it (lists.py ``screen_lists``)."""

    def __init__(self, inner: Any, on_eof: Callable[[], None], screen: Callable[[Any], Any] | None = None) -> None:
        self._inner = inner
        self._on_eof = on_eof
        self._screen = screen

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_eof()
            raise
        return item if self._screen is None else self._screen(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> WatchedReceiveStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> WatchedReceiveStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
