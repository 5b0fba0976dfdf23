"""The stream protocols the SDK's dispatcher reads and writes (its ``ReadStream`` and ``WriteStream``), around a
``receive`` or ``send`` and an ``aclose``: for the gateway's own streams, which hand messages on without a memory
stream or a task between (front/stdio.py, front/server.py, front/http/transport.py)."""

from __future__ import annotations

from typing import Generic, Self, TypeVar

import anyio

__all__ = ["ReadEnd", "WriteEnd"]

T = TypeVar("T")


class ReadEnd(Generic[T]):
    """A read stream: iterated, and closed on leaving ``async with``, through ``receive`` and ``aclose``."""

    async def receive(self) -> T:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class WriteEnd(Generic[T]):
    """A write stream, closed on leaving ``async with``, through ``send`` and ``aclose``."""

    async def send(self, item: T, /) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
