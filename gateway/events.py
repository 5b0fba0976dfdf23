"""Resumable SSE streams (SEP-1699): the recent events of the gateway's streams, so a client can pick one up again.

With an event store the SDK's streamable HTTP transport opens every POST stream with a priming event (an event id,
no data, and the ``retry`` interval a client waits before reconnecting), numbers every event, and answers a GET
with ``Last-Event-ID`` by replaying what the stream sent after that event. A client whose connection dropped, or
whose stream the gateway closed because the downstream closed its own mid-call (see ``backends/mcp.py``), resumes
without losing a message.

``RecentEvents`` keeps the events of the last ``max_age_s`` seconds in memory, at most ``capacity`` of them, across
all streams: resumption is for a stream that broke moments ago, not a log. It holds references to the messages the
transport already built (no copy), so its cost is a counter and a dictionary entry per event. Both bounds matter: a
``tools/list`` answer of a large catalog weighs megabytes, and a client polling it must not grow the gateway. (It has no
``__len__``: the SDK tests the store for truth, and an empty store must still count as one.)
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict

import mcp_types as types
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId

__all__ = ["RETRY_MS", "RecentEvents"]

RETRY_MS = 1000
"""The ``retry`` a client is told to wait before resuming a stream (the SSE field, in milliseconds)."""
CAPACITY = 512
"""Events kept across all streams; older ones cannot be replayed (the client then has to start over)."""
MAX_AGE_S = 30.0
"""Events older than this are dropped: a client resumes within a few ``retry`` intervals or not at all."""


class RecentEvents(EventStore):
    """The last ``capacity`` events of every stream, in order, replayable after any of them."""

    def __init__(self, capacity: int = CAPACITY, max_age_s: float = MAX_AGE_S) -> None:
        self._capacity = capacity
        self._max_age_s = max_age_s
        self._counter = itertools.count(1)
        self._events: OrderedDict[int, tuple[StreamId, types.JSONRPCMessage | None, float]] = OrderedDict()

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        number = next(self._counter)
        events = self._events
        now = time.monotonic()
        events[number] = (stream_id, message, now)
        if len(events) > self._capacity:
            events.popitem(last=False)
        oldest = now - self._max_age_s
        while events and next(iter(events.values()))[2] < oldest:
            events.popitem(last=False)
        return str(number)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        try:
            last = int(last_event_id)
        except ValueError:
            return None
        entry = self._events.get(last)
        if entry is None:
            return None  # unknown, or evicted: nothing to resume
        stream_id = entry[0]
        for number, (stream, message, _) in list(self._events.items()):
            if number > last and stream == stream_id and message is not None:
                await send_callback(EventMessage(message, str(number)))
        return stream_id
