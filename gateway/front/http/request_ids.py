"""Request ids in flight per session at ``/mcp`` (``InFlight``): the body check (body.py) claims a session-era
request's id before the SDK sees it and refuses a duplicate, and the session manager (sessions.py) tells it of each
session's answers and ends, so an id is free again only once nothing can route an answer to it.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.shared.dispatcher import coerce_request_id
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.types import Scope

from gateway.front.scope import caller_of

__all__ = ["RELEASE_GRACE_S", "InFlight", "Key", "in_flight_key"]

RELEASE_GRACE_S = 1.0
"""How long a request reusing an in-flight id waits for that request to end before it is refused: a client may
reuse an id as soon as it has read the answer, which reaches it a moment before the answering POST has ended."""

Key = tuple[str | None, str, str | int]


class _Claim:
    """One claimed id: set ``ended`` when it is free again."""

    __slots__ = ("answered", "ended", "gone")

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.answered = False  # the SDK produced its answer (resume.py's session view told us)
        self.gone = False  # its session ended


class InFlight:
    """The request ids in flight per session, so that a duplicate is refused before the SDK sees it.

    The SDK keys a session's requests by id (the transport's streams by ``str(id)``, the dispatcher's table by
    ``coerce_request_id``, so ``7`` and ``"7"`` are one id), and a second request with the id takes over the first's
    answer stream, so the first would never be answered; refused, the second leaves the first to go on. A reuse of an
    id whose POST is just ending waits for it (``RELEASE_GRACE_S``).

    An id is claimed when its POST is handed to the SDK and released when that POST's ASGI call ends, however it
    ends: its answer sent, the request cancelled (the session era answers a cancelled request on its stream), the
    session ended or deleted (the SDK closes the session's streams), the SDK refused it (any status but 200). Holding
    the id until the POST has ended, not just until its answer was written, matters: the SDK's transport drops the
    stream of whatever request holds the id when the old POST finishes, so a reuse in between would hang.

    A POST that ends while its request goes on — the client went away, or the SSE stream was closed for it to
    resume later — keeps its id *held* until the SDK produces the request's answer (``answered``, from the session's
    event view, resume.py: every answer passes through it, to a stream or to no one) or its session ends
    (``session_ended``, from ``CallerSessions``): the SDK keys the request by its id until then, and routes its answer
    to whatever stream has that id, so a reuse would be handed the abandoned request's answer. A hold is bounded by
    the call's own timeout (``servers.<name>.timeout_s``: the gateway answers a timed-out call), by a cancellation
    (answered -32800), and by its session's end (DELETE, idle timeout, eviction); it holds only while something will
    end it, so only when ``answers_known`` (the session manager feeds ``answered``) is it kept at all.
    Keys are (caller, session id, the SDK's correlation id): another caller naming this session id has keys of its
    own (and the SDK answers it 404), and the stateless era (told, as the SDK tells it, by the protocol version
    header; each POST its own exchange) is not tracked. The table holds one entry per POST being served and per
    request the SDK is still working on, so it cannot outlive the sessions that hold them.
    """

    def __init__(self) -> None:
        self._ids: dict[Key, _Claim] = {}
        self._sessions: dict[str, set[Key]] = {}  # session id -> its claimed keys
        self._held: set[Key] = set()  # keys whose POST ended while the SDK still works on the request
        self.answers_known = False
        """True once something calls ``answered`` for every answer the SDK produces (``CallerSessions``)."""

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def held(self) -> int:
        """Ids held for requests whose POST ended before their answer."""
        return len(self._held)

    async def claim(self, key: Key) -> bool:
        """Claim ``key``, waiting up to ``RELEASE_GRACE_S`` for its holder to end; False if it is still held."""
        held = self._ids.get(key)
        if held is not None:
            with anyio.move_on_after(RELEASE_GRACE_S):
                await held.ended.wait()
            if key in self._ids:  # still held, or taken by another request that waited too
                return False
        self._ids[key] = _Claim()
        self._sessions.setdefault(key[1], set()).add(key)
        return True

    def release(self, key: Key, *, pending: bool = False) -> None:
        """The POST of ``key`` ended; ``pending``: the SDK took the request and may not have answered it yet."""
        claim = self._ids[key]
        if pending and self.answers_known and not (claim.answered or claim.gone):
            self._held.add(key)
        else:
            self._drop(key)

    def answered(self, session: str, request_id: str | int) -> None:
        """The SDK produced the answer to ``request_id`` (its correlation id) on ``session``."""
        for key in [k for k in self._sessions.get(session, ()) if k[2] == request_id]:
            if key in self._held:
                self._drop(key)
            else:
                self._ids[key].answered = True

    def session_ended(self, session: str) -> None:
        """``session`` ended: its held ids are free, and those of POSTs still ending are not held."""
        for key in list(self._sessions.get(session, ())):
            if key in self._held:
                self._drop(key)
            else:
                self._ids[key].gone = True

    def _drop(self, key: Key) -> None:
        self._ids.pop(key).ended.set()
        self._held.discard(key)
        keys = self._sessions[key[1]]
        keys.discard(key)
        if not keys:
            del self._sessions[key[1]]


def in_flight_key(decoded: dict[str, Any], scope: Scope, headers: Headers) -> Key | None:
    """The in-flight key of a session-era request (its id already checked to be a string or an integer), else None."""
    if "method" not in decoded or "id" not in decoded:
        return None  # a notification or a response: the SDK answers 202 and correlates no answer stream by it
    session, version = headers.get("mcp-session-id"), headers.get("mcp-protocol-version")
    if session is None or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
        # initialize, or the stateless era (which the SDK tells by this header alone, as here): each POST is its
        # own exchange, and nothing else can share its id
        return None
    return (caller_of(scope).name, session, coerce_request_id(decoded["id"]))
