"""What one OAuth flow of the gateway (signin.py) goes through: ``FlowTransport``, its HTTP, and ``FlowStorage``,
the SDK's ``TokenStorage`` for it.

``FlowTransport`` fetches ``https`` only (plain ``http`` to a loopback host only with ``allow_http``; the server's own
configured URL as the file says), each connection through the egress guard (egress.py: never link-local or metadata
addresses, private ones only with ``allow_private``), each answer at most ``MAX_ANSWER_BYTES``; redirects are never
followed. A step-up flow's first request to the server meets the server's own 403 challenge again.
``read_credential`` reads what a grant presents (a workload token, an ID token) from its value or its file.
"""

from __future__ import annotations

import anyio
import httpx2
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from gateway.auth.connections import CLIENT_ROW, Connections, SignInFailed
from gateway.backends.mcp.egress import Admitting, guard
from gateway.config import DownstreamOAuth, HttpServer
from gateway.observe.logs import redactor

__all__ = ["MAX_ANSWER_BYTES", "MAX_CREDENTIAL_BYTES", "FlowStorage", "FlowTransport", "read_credential"]

MAX_ANSWER_BYTES = 256 * 1024
"""The largest answer taken from a metadata, registration or token endpoint."""
MAX_CREDENTIAL_BYTES = 64 * 1024
"""The largest credential file read (a JWT is a few KiB)."""
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class FlowTransport(httpx2.AsyncBaseTransport):
    """The flow's requests: https only (see the module docstring), through the egress guard, answers bounded."""

    def __init__(self, oauth: DownstreamOAuth, server: HttpServer, challenge: str | None = None) -> None:
        self._allow_http = oauth.allow_http
        self._server = httpx2.URL(server.url)  # the operator's own URL: as the file says (config checked it)
        self._inner = Admitting(guard(httpx2.AsyncHTTPTransport(trust_env=False)), server.allow_private)
        self._challenge = challenge

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if self._challenge is not None and url.copy_with(query=None) == self._server:
            # a step-up: the flow's first request meets the 403 the server gave the caller's call, so the SDK asks
            # for the union of what was granted and what is wanted (SEP-2350)
            headers, self._challenge = {"www-authenticate": self._challenge}, None
            return httpx2.Response(403, headers=headers, json={"error": "insufficient_scope"}, request=request)
        allowed = url.scheme == "https" or url.copy_with(query=None) == self._server
        if not allowed and not (self._allow_http and url.scheme == "http" and url.host in _LOOPBACK):
            raise SignInFailed(f"the server led the sign-in to {url.scheme}://{url.host}, which is not https")
        response = await self._inner.handle_async_request(request)
        body, size = [], 0
        try:
            async for chunk in response.stream:  # type: ignore[union-attr]
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise SignInFailed(f"{url.host} answered more than {MAX_ANSWER_BYTES} bytes during the sign-in")
                body.append(chunk)
        finally:
            await response.aclose()
        return httpx2.Response(response.status_code, headers=response.headers, content=b"".join(body), request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class FlowStorage:
    """The SDK's ``TokenStorage`` for one flow: the server's registered client from the store, tokens in memory
    (the flow stores them sealed when it completes)."""

    def __init__(self, store: Connections, backend: str, fixed: OAuthClientInformationFull | None) -> None:
        self._store, self._backend, self._fixed = store, backend, fixed
        self.tokens: OAuthToken | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        redactor.add([tokens.access_token, *([tokens.refresh_token] if tokens.refresh_token else [])])
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self._fixed is not None:
            return self._fixed
        document = await self._store.get(self._backend, CLIENT_ROW)
        return OAuthClientInformationFull.model_validate(document["client"]) if document else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if client_info.client_secret:
            redactor.add([client_info.client_secret])
        if self._fixed is None:
            await self._store.put(self._backend, CLIENT_ROW, {"client": client_info.model_dump(mode="json")}, None)


async def read_credential(value: str | None, path: str | None, key: str) -> str:
    """What a grant presents: ``value`` as configured, else the file ``path`` (``{key}_file``) read afresh now, as
    platforms rotate such files; registered with the log redactor.

    Raises:
        SignInFailed: the file cannot be read, is empty or too large (its path and the error's kind said, never its
            content).
    """
    if path is None:
        assert value is not None
        return value
    try:
        data = await anyio.Path(path).read_bytes()
        text = data.decode().strip() if len(data) <= MAX_CREDENTIAL_BYTES else None
    except (OSError, UnicodeDecodeError) as exc:
        raise SignInFailed(f"{key}_file {path} cannot be read ({type(exc).__name__})") from None
    if text is None:
        raise SignInFailed(f"{key}_file {path} is larger than {MAX_CREDENTIAL_BYTES} bytes")
    if not text:
        raise SignInFailed(f"{key}_file {path} is empty")
    redactor.add([text])
    return text
