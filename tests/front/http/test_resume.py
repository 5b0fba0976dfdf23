"""The resumable-stream event store (gateway/events.py): bounded in events, age and bytes, per stream and in total,
and never replaying a stream with a hole in it."""

from __future__ import annotations

import anyio
import mcp_types as types
import pytest
from mcp.server.streamable_http import EventMessage, EventStore, StreamableHTTPServerTransport
from sse_starlette.event import ensure_bytes

from gateway.front.http.resume import RecentEvents

pytestmark = pytest.mark.anyio

KB = 1024


def answer(request_id: int, text: str) -> types.JSONRPCResponse:
    return types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result={"content": [{"type": "text", "text": text}]})


async def replay(store: EventStore, after: str) -> tuple[str | None, list[tuple[str | None, types.JSONRPCMessage]]]:
    sent: list[tuple[str | None, types.JSONRPCMessage]] = []

    async def collect(event: EventMessage) -> None:
        sent.append((event.event_id, event.message))

    with anyio.fail_after(5):
        stream = await store.replay_events_after(after, collect)
    return stream, sent


async def test_a_stream_replays_exactly_what_it_sent_after_the_event_named() -> None:
    store = RecentEvents()
    priming = await store.store_event("s1", None)
    first = await store.store_event("s1", answer(1, "one"))
    await store.store_event("s2", answer(2, "other stream"))
    second = await store.store_event("s1", answer(3, "three"))
    stream, sent = await replay(store, priming)
    assert stream == "s1"
    assert sent == [(first, answer(1, "one")), (second, answer(3, "three"))]


async def test_the_bytes_kept_across_all_streams_stay_within_the_total_budget() -> None:
    store = RecentEvents(max_bytes=1000 * KB, max_stream_bytes=1000 * KB)
    for i in range(200):  # 200 callers' streams, 100 kB each: 20 MB sent
        await store.store_event(f"s{i}", answer(i, "x" * (100 * KB)))
    events, kept = store.statistics()
    assert kept <= 1000 * KB and events == 9  # the newest nine fit
    stream, sent = await replay(store, "1")  # the oldest: gone, the client starts over
    assert (stream, sent) == (None, [])


async def test_one_stream_is_held_to_its_own_budget_and_leaves_the_others_alone() -> None:
    store = RecentEvents(max_bytes=10_000 * KB, max_stream_bytes=350 * KB)  # three of them fit
    other = await store.store_event("quiet", answer(0, "small"))
    ids = [await store.store_event("loud", answer(i, "y" * (100 * KB))) for i in range(1, 11)]
    stream, sent = await replay(store, ids[-3])
    assert stream == "loud" and [event_id for event_id, _ in sent] == ids[-2:]
    assert await replay(store, ids[0]) == (None, [])  # evicted from the front: no hole, just gone
    assert (await replay(store, other))[0] == "quiet"


async def test_an_event_too_large_to_keep_is_not_kept_and_takes_its_streams_earlier_events_along() -> None:
    store = RecentEvents(max_bytes=10_000 * KB, max_stream_bytes=500 * KB)
    before = await store.store_event("s", answer(1, "small"))
    huge = await store.store_event("s", answer(2, "z" * (600 * KB)))
    after = await store.store_event("s", answer(3, "small again"))
    assert await replay(store, before) == (None, [])  # a replay from here would skip the huge one: refused
    assert await replay(store, huge) == (None, [])
    assert await store.store_event("s", answer(4, "last")) and (await replay(store, after))[1][0][1] == answer(
        4, "last"
    )


async def test_a_large_result_shared_by_many_responses_is_serialised_once_and_replayed_exactly() -> None:
    listing = {"tools": [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(3000)]}
    store = RecentEvents(max_bytes=100_000 * KB, max_stream_bytes=100_000 * KB)
    first = await store.store_event("a", None)
    await store.store_event("a", types.JSONRPCResponse(jsonrpc="2.0", id=7, result=listing))
    second = await store.store_event("b", None)
    await store.store_event("b", types.JSONRPCResponse(jsonrpc="2.0", id="req-\u00e9", result=listing))
    for priming, request_id in ((first, 7), (second, "req-\u00e9")):
        _, [(_, message)] = await replay(store, priming)
        assert message == types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=listing)


async def test_each_sessions_view_replays_its_own_stream_of_an_id_and_nothing_of_another_sessions() -> None:
    store = RecentEvents()
    mine, other = store.for_session(), store.for_session()
    priming = await mine.store_event("5", None)  # the SDK names a request's stream by its id, in every session
    theirs = await other.store_event("5", answer(5, "the other session's"))
    own = await mine.store_event("5", answer(5, "mine"))
    assert await replay(mine, priming) == ("5", [(own, answer(5, "mine"))])
    assert await replay(other, priming) == (None, [])  # another session's event id names nothing here
    assert await replay(mine, theirs) == (None, [])
    assert store.statistics()[0] == 3  # one store, one budget


async def test_a_sessions_view_tells_of_every_answer_it_stores_by_the_id_the_sdk_correlates_and_of_nothing_else() -> (
    None
):
    told: list[str | int] = []
    view = RecentEvents().for_session(on_answer=told.append)
    await view.store_event("7", None)  # a priming event
    progress = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params={"progress": 1})
    await view.store_event("7", progress)
    await view.store_event("7", answer(7, "seven"))
    error = types.JSONRPCError(jsonrpc="2.0", id="07", error=types.ErrorData(code=-32800, message="Request cancelled"))
    await view.store_event("07", error)
    await view.store_event("x", types.JSONRPCError(jsonrpc="2.0", id="x", error=types.ErrorData(code=-1, message="")))
    assert told == [7, 7, "x"]  # "07" is 7 to the SDK's dispatcher (coerce_request_id)


async def test_what_a_session_sends_is_the_json_its_store_made_framed_as_sse_starlette_frames_it() -> None:
    """The SDK's transport serialized each message again for the wire after the store had (a 2.4 MB ``tools/list``,
    twice per answer); a session's view now hands over the store's own text, framed in the very bytes the SDK and
    sse-starlette would have sent."""
    store = RecentEvents(max_stream_bytes=100 * KB)
    view = store.for_session("sid")

    def framed_by_the_sdk(event: EventMessage) -> bytes:
        return ensure_bytes(StreamableHTTPServerTransport._create_event_data(None, event), "\r\n")  # type: ignore[arg-type]

    listing = answer(7, "tool " * 4000 + "line\nbreak")
    event_id = await view.store_event("7", listing)
    assert view.event_data(EventMessage(listing, event_id)) == framed_by_the_sdk(EventMessage(listing, event_id))
    kept = store.text(event_id)
    assert kept is not None and kept.encode() in view.event_data(EventMessage(listing, event_id))
    too_large = answer(8, "z" * (200 * KB))  # sent, not kept: made as the SDK makes it
    large_id = await view.store_event("8", too_large)
    assert store.text(large_id) is None
    assert view.event_data(EventMessage(too_large, large_id)) == framed_by_the_sdk(EventMessage(too_large, large_id))
    assert view.event_data(EventMessage(listing, None)) == framed_by_the_sdk(EventMessage(listing, None))
