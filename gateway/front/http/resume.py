"""Resumable SSE streams (SEP-1699): ``RecentEvents`` keeps the recent events of the gateway's streams, so that a
client whose connection dropped, or whose stream the gateway closed because a downstream closed its own mid-call,
picks the stream up again without losing a message. With an event store the SDK's transport opens every POST stream
with a priming event (an event id and the ``retry`` a client waits before reconnecting), numbers every event, and
answers a GET with ``Last-Event-ID`` by replaying what the stream sent after that event; a replay lets a downstream
resume waiting for it go on (front/channels.py ``Resumes``).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.dispatcher import coerce_request_id

from gateway.front.channels import Resumes

__all__ = ["RETRY_MS", "RecentEvents", "SessionEvents"]

RETRY_MS = 1000
"""The ``retry`` a client is told to wait before resuming a stream (the SSE field, in milliseconds)."""
CAPACITY = 512
"""Events kept across all streams; older ones cannot be replayed (the client then has to start over)."""
MAX_AGE_S = 30.0
"""Events older than this are dropped: a client resumes within a few ``retry`` intervals or not at all."""
MAX_BYTES = 32 * 1024 * 1024
"""Bytes of events kept across all streams (``gateway.edge.replay_bytes``)."""
MAX_STREAM_BYTES = 4 * 1024 * 1024
"""Bytes of events kept for one stream (``gateway.edge.replay_stream_bytes``)."""
SHARED_MIN_BYTES = 65536
"""A response result at least this large has its JSON kept for the next response carrying the very same values."""
_OVERHEAD = 200
"""Bytes an event costs besides its text (its entry, its number, its place in its stream's queue)."""


class RecentEvents(EventStore):
    """The recent events of every stream, in order, within a count, an age and two byte budgets; replayable after
    any of them.

    In memory: the events of the last ``max_age_s`` seconds, at most ``capacity`` of them, ``max_bytes`` across all
    streams and ``max_stream_bytes`` for any one. Resumption is for a stream that broke moments ago, not a log, and
    what one caller's answers weigh must not decide how much memory the gateway holds (200 asks for a 4 MB answer
    would otherwise park 800 MB here for half a minute). So each event is kept as its JSON text (what the transport
    sends; its size is what is counted) and parsed back only when replayed. The oldest events go first, and an event
    too large for its stream's budget is sent but not kept, together with its stream's earlier events: a resume never
    replays a stream with a hole in it (it finds its event gone and the client starts over). A large result's JSON is
    made once for the responses carrying the very same values (every caller's ``tools/list`` listing). Each session
    sees the store through its own view (``for_session``). No ``__len__``: the SDK tests the store for truth, and an
    empty store must still count as one.
    """

    def __init__(
        self,
        capacity: int = CAPACITY,
        max_age_s: float = MAX_AGE_S,
        *,
        max_bytes: int = MAX_BYTES,
        max_stream_bytes: int = MAX_STREAM_BYTES,
        resumes: Resumes | None = None,
    ) -> None:
        self.resumes = resumes
        """Told when a client resumes one of its streams (a downstream call may wait for it: SEP-1699)."""
        self._capacity = capacity
        self._max_age_s = max_age_s
        self._max_bytes = max_bytes
        self._max_stream_bytes = max_stream_bytes
        self._counter = itertools.count(1)
        # number -> (stream, the message's JSON text or None for a priming event, when, bytes counted)
        self._events: OrderedDict[int, tuple[StreamId, str | None, float, int]] = OrderedDict()
        self._streams: dict[StreamId, deque[int]] = {}
        self._stream_bytes: dict[StreamId, int] = {}
        self._bytes = 0
        self._shared: tuple[tuple[str, ...], tuple[Any, ...], str] | None = None  # a large result's keys, values, JSON
        self._sessions = itertools.count(1)

    def for_session(
        self, session_id: str | None = None, on_answer: Callable[[str | int], None] | None = None
    ) -> SessionEvents:
        """A view of this store for one new session: its own streams, the shared budgets. ``session_id``: the
        client's, told to ``Resumes`` with each stream it resumes; ``on_answer`` is told the id of every answer the
        session produces."""
        return SessionEvents(self, f"s{next(self._sessions)}/", session_id, on_answer)

    def text(self, event_id: EventId) -> str | None:
        """The JSON text kept for event ``event_id`` (None: not kept, or a priming event)."""
        try:
            kept = self._events.get(int(event_id))
        except ValueError:
            return None
        return kept[1] if kept is not None else None

    def statistics(self) -> tuple[int, int]:
        """(events kept, bytes counted)."""
        return len(self._events), self._bytes

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        number = next(self._counter)
        data = None if message is None else self._json(message)
        size = _OVERHEAD + (sys.getsizeof(data) if data is not None else 0)
        now = time.monotonic()
        if size > min(self._max_stream_bytes, self._max_bytes):
            self._forget_stream(stream_id)  # sent, not kept: a resume from before it must not skip it
        else:
            self._events[number] = (stream_id, data, now, size)
            self._streams.setdefault(stream_id, deque()).append(number)
            self._stream_bytes[stream_id] = self._stream_bytes.get(stream_id, 0) + size
            self._bytes += size
            while self._stream_bytes[stream_id] > self._max_stream_bytes:
                self._drop(self._streams[stream_id][0])
        oldest = now - self._max_age_s
        events = self._events
        while events and (len(events) > self._capacity or self._bytes > self._max_bytes):
            self._drop(next(iter(events)))
        while events and next(iter(events.values()))[2] < oldest:
            self._drop(next(iter(events)))
        return str(number)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback, *, prefix: str = ""
    ) -> StreamId | None:
        try:
            last = int(last_event_id)
        except ValueError:
            return None
        entry = self._events.get(last)
        if entry is None or not entry[0].startswith(prefix):
            return None  # unknown, evicted, or another session's: nothing to resume
        stream_id = entry[0]
        later = [n for n in self._streams.get(stream_id, ()) if n > last]
        for number in later:
            kept = self._events.get(number)
            if kept is not None and kept[1] is not None:
                message = types.jsonrpc_message_adapter.validate_json(kept[1], by_name=False)
                await send_callback(EventMessage(message, str(number)))
        return stream_id

    def _json(self, message: types.JSONRPCMessage) -> str:
        if not isinstance(message, types.JSONRPCResponse) or not isinstance(message.result, dict):
            return message.model_dump_json(by_alias=True, exclude_unset=True)
        result, head = message.result, f'{{"jsonrpc":"2.0","id":{_id_json(message.id)},"result":'
        # The transport's result is a fresh dict each time, but its values are the very objects the handler
        # returned: the same catalog listing for every tools/list. Those identical values reuse the last JSON.
        keys, values = tuple(result), tuple(result.values())
        shared = self._shared
        if shared is not None and shared[0] == keys and all(a is b for a, b in zip(shared[1], values, strict=True)):
            return f"{head}{shared[2]}}}"
        data = message.model_dump_json(by_alias=True, exclude_unset=True)
        if len(data) > SHARED_MIN_BYTES and data.startswith(head) and data.endswith("}"):
            self._shared = (keys, values, data[len(head) : -1])
        return data

    def _drop(self, number: int) -> None:
        stream_id, _, _, size = self._events.pop(number)
        queue = self._streams[stream_id]
        if queue[0] == number:
            queue.popleft()  # always so: a stream's events leave oldest first
        else:
            queue.remove(number)
        self._bytes -= size
        self._stream_bytes[stream_id] -= size
        if not queue:
            del self._streams[stream_id], self._stream_bytes[stream_id]

    def _forget_stream(self, stream_id: StreamId) -> None:
        for number in list(self._streams.get(stream_id, ())):
            self._drop(number)


class SessionEvents(EventStore):
    """One session's view of a ``RecentEvents``. The SDK names a request's stream by the request's id, and every
    session numbers its requests from 1, so in one store shared by all sessions a resume of session B's stream "2"
    would replay what session A's request 2 was sent: each session's stream names carry its own prefix, and a replay
    finds only its own streams. A replay also lets a downstream resume waiting for this client go on (``Resumes``).
    Every message the SDK sends on the session passes here first, to a stream or to no one, so ``on_answer`` learns
    of each answer (the id it answers, as the SDK correlates it) as it is produced."""

    def __init__(
        self,
        store: RecentEvents,
        prefix: str,
        session_id: str | None = None,
        on_answer: Callable[[str | int], None] | None = None,
    ) -> None:
        self._store, self._prefix, self._session_id, self._on_answer = store, prefix, session_id, on_answer

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        event_id = await self._store.store_event(self._prefix + stream_id, message)
        if message is not None:
            self.sent(message)
        return event_id

    def sent(self, message: types.JSONRPCMessage) -> None:
        """``message`` goes to its client without being stored (an answer sent as one JSON body, which no client
        resumes): ``on_answer`` learns of an answer as when it is stored."""
        if (
            self._on_answer is not None
            and isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
            and message.id is not None
        ):
            self._on_answer(coerce_request_id(message.id))

    def event_data(self, event_message: EventMessage) -> bytes:
        """What the session's transport sends for ``event_message`` (it stands in for the transport's own
        ``_create_event_data``), framed: the JSON ``store_event`` made of the message a moment before, not made again
        (a 2.4 MB ``tools/list`` was serialized twice per answer), framed as transport.py's ``frame`` frames an
        event, which the transport sends as they are. JSON text holds no line break, so it is one ``data`` line."""
        event_id = event_message.event_id
        data = self._store.text(event_id) if event_id else None
        if data is None:  # not kept (too large for its stream's budget, or evicted already): made as the SDK does
            data = event_message.message.model_dump_json(by_alias=True, exclude_unset=True)
        head = f"id: {event_id}\r\n" if event_id else ""
        return f"{head}event: message\r\ndata: {data}\r\n\r\n".encode()

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        stream = await self._store.replay_events_after(last_event_id, send_callback, prefix=self._prefix)
        if stream is None:
            return None
        stream_id = stream.removeprefix(self._prefix)
        if self._session_id is not None and self._store.resumes is not None:
            self._store.resumes.resumed(self._session_id, stream_id)  # a downstream call waiting for it goes on
        return stream_id


def _id_json(request_id: int | str) -> str:
    return str(request_id) if isinstance(request_id, int) else json.dumps(request_id, ensure_ascii=False)
