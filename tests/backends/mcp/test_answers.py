"""The answer limit's line cutter and answer sniffing (gateway/backends/answers.py), in memory, on exact bytes."""

from __future__ import annotations

import json

import pytest

from gateway.backends.mcp.answers import LineLimit, Oversized, answer_too_large, answered_id, replace_line


def _run(limit: int, chunks: list[bytes]) -> list[bytes | Oversized]:
    lines = LineLimit(limit)
    out: list[bytes | Oversized] = []
    for chunk in chunks:
        out.extend(lines.feed(chunk))
    out.extend(lines.flush())
    return out


def _passed(items: list[bytes | Oversized]) -> bytes:
    return b"".join(item for item in items if isinstance(item, bytes))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_lines_within_the_limit_pass_unchanged_whatever_the_chunking(size: int) -> None:
    stream = b'{"a":1}\n\n{"bb":22}\n' + b"x" * 10 + b"\nend"
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    items = _run(10, chunks)
    assert _passed(items) == stream
    assert not [item for item in items if isinstance(item, Oversized)]


@pytest.mark.parametrize("size", [1, 4, 5, 100])
def test_a_line_over_the_limit_is_dropped_with_its_size_and_edges_and_its_neighbours_pass(size: int) -> None:
    stream = b"short\n" + b"H" * 3 + b"y" * 20 + b"T" * 3 + b"\nnext\n"
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    items = _run(10, chunks)
    assert _passed(items) == b"short\nnext\n"
    dropped = [item for item in items if isinstance(item, Oversized)]
    assert dropped == [Oversized(26, b"HHH" + b"y" * 20 + b"TTT", b"HHH" + b"y" * 20 + b"TTT")]
    assert items.index(dropped[0]) < len(items) - 1  # in stream order: before "next"


def test_an_oversized_line_at_the_end_of_the_stream_is_reported_by_flush() -> None:
    items = _run(4, [b"ok\n", b"0123456789"])
    assert items == [b"ok\n", Oversized(10, b"0123456789", b"0123456789")]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}', (True, 7)),  # Python SDK order
        (b'{"result":{"content":[{"id":3}]},"jsonrpc":"2.0","id":"r-9"}', (True, "r-9")),  # TypeScript SDK order
        (b'{"jsonrpc":"2.0","error":{"code":1,"message":"m"},"id":12}', (True, 12)),
        (b'{"jsonrpc":"2.0","method":"notifications/message","params":{"id":4}}', (False, None)),
        (b'{"jsonrpc":"2.0","id":5,"method":"sampling/createMessage","params":{}}', (False, None)),
        (b'{"result":{"items":[{"id":3}]}}', (True, None)),  # an answer whose id is not at either edge
    ],
)
def test_an_answer_and_its_id_are_read_from_the_edges_of_the_message(
    message: bytes, expected: tuple[bool, object]
) -> None:
    assert answered_id(message[:40], message[-40:]) == expected


def test_an_oversized_sse_answer_becomes_an_error_event_for_its_request() -> None:
    data = b'data: {"result":{"text":"' + b"x" * 100 + b'"},"jsonrpc":"2.0","id":3}\r'
    line = replace_line(Oversized(len(data), data[:512], data[-512:]), 50, sse=True)
    assert line is not None and line.startswith(b"data: ")
    error = json.loads(line[len(b"data: ") :])
    assert error["id"] == 3 and error["error"]["code"] == -32050
    assert answer_too_large(error["error"]["data"]) == (len(data) - len(b"data: ") - 1, 50)


def test_an_oversized_notification_is_dropped_unless_it_is_on_a_requests_own_stream() -> None:
    note = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + b"x" * 100 + b'"}}'
    item = Oversized(len(note), note, note)
    assert replace_line(item, 50, sse=False) is None
    on_post = replace_line(item, 50, sse=False, request_id=8)
    assert on_post is not None and json.loads(on_post)["id"] == 8


def test_the_cutter_agrees_with_a_plain_split_on_random_streams_and_chunkings() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        limit = rng.randint(1, 40)
        lines = [bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 60))) for _ in range(rng.randint(1, 8))]
        stream = b"\n".join(lines) + b"\n"
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 10))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        expected: list[bytes | int] = [line + b"\n" if len(line) <= limit else len(line) for line in lines]
        got: list[bytes | int] = []
        for item in _run(limit, chunks):
            if isinstance(item, Oversized):
                got.append(item.size)
            else:
                got.extend(piece + b"\n" for piece in item.split(b"\n")[:-1])
        assert got == expected, (limit, lines, cuts)
