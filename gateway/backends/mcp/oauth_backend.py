"""A streamable HTTP server the gateway signs in to as an OAuth client (``auth: {oauth: ...}``): ``OAuthBackend``.

An ``McpBackend`` whose sessions carry OAuth tokens (signin.py). Each caller's calls go on the caller's own session
with the caller's own token (``per: caller``; lanes.py), or on the shared session with the gateway's own
(``per: gateway``). The shared session opens with the gateway's token, or with the token of the caller who signed in
last. Each caller's own session, opened at their sign-in, lists what that caller sees (``caller_lists``;
core/policies.py hides the rest from them); ``tools()`` is the union, so every tool some caller may call is routable.
Before anyone has signed in the shared session does not open: the backend is failed with the sign-in link as its
reason, and waits for a sign-in (told at once when it happens in this process, within ``connections.WATCH_S`` through
another replica, looked for every ``SIGN_IN_RECHECK_S`` in any case). It ends when its token does, or when that caller
is signed out, and opens again at once with a fresh token: not counted as a flap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import _AsyncGeneratorContextManager
from typing import IO, Any

import anyio
import mcp_types as types
from anyio.abc import TaskStatus
from mcp.client.session import ClientSession, MessageHandlerFnT

from gateway.auth.connections import OPEN_CALLER
from gateway.auth.credentials import NoCredential
from gateway.backends.base import BackendState, CallerLists, ProgressFn
from gateway.backends.mcp.failures import Life, ResponseRecorder
from gateway.backends.mcp.lists import list_each
from gateway.backends.mcp.relay import InFlight
from gateway.backends.mcp.session import McpBackend
from gateway.backends.mcp.signin import GATEWAY_ROW, SignIn
from gateway.calls import NO_UPSTREAM, Upstream
from gateway.config import HttpServer
from gateway.errors import BackendRpcError, CredentialMissing

__all__ = ["SIGN_IN_RECHECK_S", "OAuthBackend", "OAuthCredentials"]

MAX_LISTING_TRIES = 4
"""Callers' tokens tried, the latest first, for the shared session before it waits for a sign-in."""

SIGN_IN_RECHECK_S = 60.0
"""How often a shared session waiting for a first sign-in looks again, should it not be told (the store's watch
tells it of sign-ins through other replicas)."""


class OAuthCredentials:
    """A ``per: caller`` server's per-caller session headers (lanes.py): its ``headers`` and the caller's
    ``Authorization: Bearer`` token from ``SignIn``."""

    def __init__(self, signin: SignIn, headers: dict[str, str]) -> None:
        self._signin = signin
        self._headers = headers

    def gateway_headers(self) -> dict[str, str]:
        return dict(self._headers)

    async def for_caller(self, caller: str | None, subject_token: str | None) -> tuple[dict[str, str], float | None]:
        """Raises: NoCredential: the caller has not signed in (the message carries the link)."""
        token, lifetime = await self._signin.token(caller or "")
        return {**self._headers, "Authorization": f"Bearer {token}"}, lifetime


class OAuthBackend(McpBackend):
    """See the module docstring."""

    def __init__(self, name: str, config: HttpServer, *, signin: SignIn, **options: Any) -> None:
        headers = dict(config.headers)
        credentials = OAuthCredentials(signin, headers) if signin.per_caller else None
        super().__init__(name, config, credentials=credentials, **options)
        self._signin = signin
        self._headers = headers
        self._shared_headers: dict[str, str] | None = None
        self._lifetime: float | None = None
        self._listing_as: str | None = None
        self._signed_in = anyio.Event()
        self._token_ended = False
        signin.on_stepped_up = self._stepped_up
        self._shared_recorder: ResponseRecorder | None = None
        self._caller_tools: dict[str, tuple[types.Tool, ...]] = {}  # what each caller's own session lists
        self._shared_names: frozenset[str] = frozenset()
        if signin.per_caller:
            self._lanes.list_caller = self._caller_listed

    @property
    def signin(self) -> SignIn:
        return self._signin

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as flows:  # the sign-ins' flows run here, and end with the backend
            self._signin.attach(flows)
            try:
                await super().run(task_status=task_status)
            finally:
                self._signin.attach(None)

    # -- what each caller sees ---------------------------------------------------------------------------------------

    async def _caller_listed(self, caller: str, session: ClientSession) -> None:
        """``caller``'s own session opened, or said its tools changed: what it lists is what they see of this server
        (``caller_lists``); a change is told to the listeners (the catalog is rebuilt; only the callers whose view
        changed hear of it)."""
        listed = (await list_each(session, ("tools",), self.capabilities, self._config))["tools"]
        if self._caller_tools.get(caller) != listed:
            self._caller_tools[caller] = listed
            self._retell()

    def _retell(self) -> None:
        """Tell the listeners the tools changed (the catalog is rebuilt), when the server is serving."""
        if self._status.state is BackendState.READY:
            self._ready(since=self._status.since)

    def tools(self) -> Sequence[types.Tool]:
        """The shared session's tools, then those only callers' own sessions list (each name once): every tool some
        caller may call is routable; ``caller_lists`` says who sees which."""
        shared = super().tools()
        if not self._caller_tools:
            return shared
        seen, merged = {tool.name for tool in shared}, list(shared)
        for caller in sorted(self._caller_tools):
            for tool in self._caller_tools[caller]:
                if tool.name not in seen:
                    seen.add(tool.name)
                    merged.append(tool)
        return tuple(merged)

    def caller_lists(self) -> CallerLists | None:
        if not self._signin.per_caller:
            return None
        shared = super().tools()
        if shared:  # while the shared session is down, what it listed last (the catalog keeps listing those)
            self._shared_names = frozenset(t.name for t in shared)
        callers = {c: frozenset(t.name for t in tools) for c, tools in self._caller_tools.items()}
        return CallerLists(self._shared_names, callers)

    def serves(self, caller: str | None) -> bool:
        """Also while the shared session is down: a caller whose own session opened (and listed) is served on it."""
        return super().serves(caller) or (self._signin.per_caller and (caller or "") in self._caller_tools)

    def _stepped_up(self, row: str) -> None:
        """``row``'s token now has more scope: the session that carried the narrower one ends (the caller's own, or
        for the gateway's identity the shared one) and opens again with it."""
        if row != GATEWAY_ROW:
            self._close_caller(row, "its caller signed in with more scope")
        elif not self._life.lost.is_set():
            self._token_ended = True
            self._life.mark_lost("its token got more scope (opened again with it)")

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> types.CallToolResult:
        """The base's; with the gateway's own identity, a call the server refused for want of scope (403
        ``insufficient_scope``) makes the gateway take a token with that scope at once (``SignIn.step_up``), and the
        caller is told to call again (the call was refused, never run)."""
        try:
            return await super().call_tool(tool, arguments, variant=variant, progress=progress, upstream=upstream)
        except BackendRpcError:
            recorder, challenge = self._shared_recorder, None
            if recorder is not None:
                challenge, recorder.challenge = recorder.challenge, None
            if self._signin.per_caller or challenge is None or not await self._signin.step_up(GATEWAY_ROW, challenge):
                raise
        raise CredentialMissing(
            self._name,
            f"server {self._name} wanted more access for {tool} than the gateway's token had: the gateway has taken a "
            "token with it, call again",
        )

    async def _send(
        self,
        request: Any,
        result_type: Any,
        progress: ProgressFn | None,
        upstream: Upstream,
        *,
        per_client: bool,
        on: ClientSession | None = None,
    ) -> Any:
        """The base's; a caller's request the server refused for want of scope (403 ``insufficient_scope``) is
        answered with the sign-in that asks for more, when one can help (``SignIn.step_up``)."""
        try:
            return await super()._send(request, result_type, progress, upstream, per_client=per_client, on=on)
        except BackendRpcError:
            caller = upstream.caller.name or ""
            challenge = self._lanes.take_challenge(caller) if self._signin.per_caller else None
            if challenge is None or not await self._signin.step_up(caller, challenge):
                raise
        link = self._signin.link
        raise CredentialMissing(
            self._name,
            f"server {self._name} wants more access than caller {caller or 'anonymous'} granted it: open {link} in a "
            "browser to sign in again, then call again",
            link=link,
        )

    async def _session_lifetime(self, on_first_outcome: Callable[[], None]) -> None:
        """The base's, with a token (``_take_token``); a token the server answered 401 is forgotten
        (``SignIn.refused``): the next connection takes another caller's, or waits for a sign-in, instead of
        presenting it again."""
        if not await self._take_token(on_first_outcome):
            return
        # a 401 counts against this lifetime's token alone: never one an earlier session's recorder kept
        self._shared_recorder, caller = None, self._listing_as
        try:
            await super()._session_lifetime(on_first_outcome)
        finally:
            recorder = self._shared_recorder
            if recorder is not None and recorder.status == 401 and caller is not None:
                recorder.clear()
                with anyio.CancelScope(shield=True):
                    await self._signin.refused(caller)

    async def _take_token(self, on_first_outcome: Callable[[], None]) -> bool:
        """Find the shared session's token; False, after waiting for a sign-in, when there is none."""
        signin, caller, tried = self._signin, "", list[str]()
        try:
            while True:
                if signin.per_caller:  # the caller who signed in last; one whose sign-in ran out, the one before
                    latest = await signin.latest(exclude=tried)
                    if latest is None:
                        raise NoCredential(f"no caller has signed in to it yet: open {signin.link} to sign in")
                    caller = latest
                try:
                    token, self._lifetime = await signin.token(caller)
                    break
                except NoCredential:
                    tried.append(caller)
                    if not signin.per_caller or len(tried) >= MAX_LISTING_TRIES:
                        raise
        except NoCredential as exc:
            self._fail(str(exc))
            on_first_outcome()
            self._signed_in = anyio.Event()
            with anyio.move_on_after(SIGN_IN_RECHECK_S):
                await self._signed_in.wait()
            return False
        self._listing_as = caller
        self._shared_headers = {**self._headers, "Authorization": f"Bearer {token}"}
        return True

    def _connect(
        self,
        life: Life,
        recorder: ResponseRecorder,
        stderr: IO[bytes],
        *,
        inflight: InFlight,
        offered: types.ClientCapabilities | None = None,
        headers: Mapping[str, str] | None = None,
        message_handler: MessageHandlerFnT | None = None,
        shared: bool = False,
        twin: bool = False,
    ) -> _AsyncGeneratorContextManager[ClientSession]:
        """The base's, with the shared session's headers carrying its token, on its twin too (a
        connection with no headers of its own: a caller's own session brings theirs)."""
        if shared:
            self._shared_recorder = recorder  # its calls' 403 challenges (call_tool)
        return super()._connect(
            life,
            recorder,
            stderr,
            inflight=inflight,
            offered=offered,
            headers=self._shared_headers if shared or headers is None else headers,
            message_handler=message_handler,
            shared=shared,
            twin=twin,
        )

    @property
    def _lazy(self) -> bool:
        """No handshake session opened later: a call's 403 challenge is read off the shared session's answers."""
        return False

    async def _serve(self, session: ClientSession, life: Life) -> None:
        with anyio.move_on_after(self._lifetime if self._lifetime is not None else math.inf):
            await super()._serve(session, life)
        if not life.lost.is_set():
            self._token_ended = True
            life.mark_lost("its token expired (opened again with a fresh one)")

    def _lost(self, life: Life, detail: str, *, uptime: float, failure: Exception | None) -> None:
        if self._token_ended:  # its token ran out or its caller was signed out: opened again at once, not a flap
            self._token_ended, uptime = False, math.inf
        super()._lost(life, detail, uptime=uptime, failure=failure)

    def _close_caller(self, row: str, reason: str) -> None:
        """End the session of the caller whose token is stored as ``row`` (the open gateway's is the unnamed one)."""
        for caller in {row, "" if row == OPEN_CALLER else row}:
            self._lanes.close_caller(caller, reason)

    def connection_changed(self, caller: str, removed: bool) -> None:
        """``caller`` signed in, or was signed out (``removed``): a shared session waiting for a token tries again;
        a signed-out caller's own session ends now, and the shared session if it used their token."""
        self._signed_in.set()
        lane = "" if caller == OPEN_CALLER else caller
        if not removed:  # their own session lists what they see (opened now, not at their first call)
            if self._signin.per_caller:
                self._lanes.open_caller(lane)
            return
        if self._caller_tools.pop(lane, None) is not None:
            self._retell()
        self._close_caller(caller, "its caller was signed out")
        if self._listing_as == caller and not self._life.lost.is_set():
            self._token_ended = True
            self._life.mark_lost(f"signed out: open {self._signin.link} to sign in")
