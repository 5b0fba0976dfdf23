"""The gateway as an OAuth 2.1 resource server (MCP authorization; RFC 9728, RFC 6750 section 3, RFC 8707).

``ResourceServer(settings)`` owns what the HTTP guard needs and nothing of HTTP itself: the Protected Resource
Metadata document and the paths it is served at, the ``WWW-Authenticate`` challenges, and ``verify(token)``, which
turns a JWT access token into a ``Caller`` or raises ``Refusal`` (401 ``invalid_token``, 403
``insufficient_scope``, 503 when an issuer's keys cannot be had). A token is accepted only when its ``alg`` is on the
allow-list, its ``iss`` is a configured issuer, its signature verifies with a key from that issuer's JWKS, its
``aud`` names the gateway's resource URI, ``exp``/``nbf``/``iat`` hold within the leeway, and it carries the required
scopes. Each issuer's keys (``_IssuerKeys``) are fetched once and reused: a request whose key is cached never waits;
a token naming an unknown ``kid`` refetches them at most once per ``jwks_refresh_min_s``, concurrent askers share
that one fetch, and every fetch is bounded by ``fetch_timeout_s``. A verified token is remembered (``_TokenCache``,
by its SHA-256 digest, never the token itself; least recently used out first, at most ``token_cache_size``) for at
most ``token_cache_s``, so its next requests skip the signature check; a remembered token answers only while the
clock at that request is before its ``exp`` and while its issuer's keys are fresh and still hold the very key that
verified it (a key removed from the JWKS forgets the tokens it signed at once). Only a token that passed every check
is remembered: a refused one costs its full check every time and never takes a place. A token is never logged,
stored or echoed; the caller it names is ``ISSUER-NAME:SUBJECT`` (a static token's name cannot contain ``:``).
``statistics()`` counts the tokens asked about by result (``VERIFICATION_RESULTS``), the keys fetched and what the
cache holds, for ``/status`` and ``/metrics``: counts only, never a token, a digest or a claim.

PyJWT does the JOSE work (signature, algorithm binding to the key, registered claims); the keys are fetched here
with httpx2 because PyJWT's own ``PyJWKClient`` fetches with blocking urllib.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import jwt
import structlog

from gateway.calls import Caller
from gateway.config import OAuth, OAuthIssuer

__all__ = [
    "VERIFICATION_RESULTS",
    "Refusal",
    "ResourceServer",
    "TokenCacheStatistics",
    "VerifierStatistics",
]

log = structlog.get_logger("gateway.auth.oauth")

METADATA_PATH = "/.well-known/oauth-protected-resource"
MAX_DOCUMENT_BYTES = 512 * 1024
"""An issuer's metadata or JWKS larger than this is refused (a real one is a few KiB)."""
MAX_CALLER_CHARS = 256
FAILED_FETCH_RETRY_S = 2.0
"""After a failed fetch an issuer is asked again at most this often (callers meanwhile are answered at once)."""
VERIFICATION_RESULTS = ("cached", "verified", "refused", "unavailable")
"""What became of a token asked about: accepted from the cache, accepted after the full check, refused (401 or 403),
or not judged because its issuer's keys could not be had (503)."""


class Refusal(Exception):
    """A token the gateway does not accept, with the answer the client is owed (status, RFC 6750 error code)."""

    def __init__(self, status: int, error: str | None, description: str, scope: str | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.error = error
        self.description = description
        self.scope = scope

    def __repr__(self) -> str:
        return f"Refusal(status={self.status}, error={self.error!r}, description={self.description!r})"


def _invalid(description: str) -> Refusal:
    return Refusal(401, "invalid_token", description)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _IssuerKeys:
    """One issuer's signing keys: fetched on first use, reused until ``jwks_ttl_s``, refetched early (rate-limited)
    when a token names a key not among them. One fetch at a time; callers whose key is cached never wait on it."""

    def __init__(self, name: str, spec: OAuthIssuer, settings: OAuth) -> None:
        self.name = name
        self.spec = spec
        self.settings = settings
        self.on_change: Callable[[], None] | None = None
        """Called when a fetch changed the key set (a key added, removed or replaced)."""
        self._jwks_uri = spec.jwks_uri
        self._keys: dict[str | None, dict[str, Any]] = {}
        self._parsed: dict[tuple[str | None, str], jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._last_unknown_refresh = -float("inf")
        self._failed_at = -float("inf")
        self._lock = anyio.Lock()
        self.fetches = 0

    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        """The verification key for a token's ``kid`` and ``alg``.

        Raises:
            Refusal: no such key (after at most one rate-limited refetch), or the keys cannot be fetched.
        """
        if kid in self._keys and (self._fresh(time.monotonic()) or self._lock.locked()):
            return self._parse(kid, alg)  # the common case; a stale key serves while someone else refreshes
        async with self._lock:
            now = time.monotonic()
            if self._fresh(now):
                if kid not in self._keys and now - self._last_unknown_refresh >= self.settings.jwks_refresh_min_s:
                    self._last_unknown_refresh = now
                    log.info("oauth.jwks_refresh", issuer=self.name, reason="unknown key id")
                    await self._refresh()
            elif now - self._failed_at >= FAILED_FETCH_RETRY_S:
                await self._refresh()
        if kid in self._keys:
            return self._parse(kid, alg)
        if self._fetched_at is None or self._failed_at > self._fetched_at:
            raise Refusal(503, None, f"the signing keys of issuer {self.name} cannot be fetched now")
        raise _invalid(f"the token is signed with a key issuer {self.name} does not publish")

    def _fresh(self, now: float) -> bool:
        return self._fetched_at is not None and now - self._fetched_at <= self.settings.jwks_ttl_s

    async def _refresh(self) -> None:
        """Fetch the keys; on failure keep the ones held (a stale key beats refusing every caller) and note when."""
        try:
            with anyio.fail_after(self.settings.fetch_timeout_s):
                keys = await self._fetch()
        except (TimeoutError, _FetchError) as exc:
            self._failed_at = time.monotonic()
            log.warning("oauth.jwks_unavailable", issuer=self.name, reason=str(exc) or "timed out")
            return
        # An unchanged key keeps its object, so what was verified with it stays verified (``holds``).
        keys = {kid: held if (held := self._keys.get(kid)) == jwk else jwk for kid, jwk in keys.items()}
        changed = keys.keys() != self._keys.keys() or any(keys[kid] is not self._keys[kid] for kid in keys)
        self._keys = keys
        self._fetched_at = time.monotonic()
        if changed:
            self._parsed = {}
            if self.on_change is not None:
                self.on_change()

    def published(self, kid: str | None) -> dict[str, Any] | None:
        """The key the issuer publishes under ``kid`` now (the very object, for ``holds``)."""
        return self._keys.get(kid)

    def holds(self, kid: str | None, jwk: dict[str, Any] | None) -> bool:
        """Whether the keys are fresh and ``jwk`` is still the one published under ``kid``."""
        return jwk is not None and self._keys.get(kid) is jwk and self._fresh(time.monotonic())

    def _parse(self, kid: str | None, alg: str) -> jwt.PyJWK:
        found = self._parsed.get((kid, alg))
        if found is not None:
            return found
        jwk = self._keys[kid]
        if jwk.get("alg") not in (None, alg):
            raise _invalid("the token's algorithm is not the one its key is published for")
        try:
            parsed = jwt.PyJWK(jwk, algorithm=alg)
        except jwt.PyJWTError:
            raise _invalid("the token's algorithm does not fit its key") from None
        self._parsed[(kid, alg)] = parsed
        return parsed

    async def _fetch(self) -> dict[str | None, dict[str, Any]]:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=self.settings.fetch_timeout_s) as http:
            if self._jwks_uri is None:
                self._jwks_uri = await self._discover(http)
            document = await _get_json(http, self._jwks_uri)
        self.fetches += 1
        raw = document.get("keys")
        if not isinstance(raw, list):
            raise _FetchError(f"{self._jwks_uri} is not a JWK set (no `keys` list)")
        keys: dict[str | None, dict[str, Any]] = {}
        for jwk in raw:
            if (
                not isinstance(jwk, dict)
                or jwk.get("use", "sig") != "sig"
                or jwk.get("kty") not in ("RSA", "EC", "OKP")
            ):
                continue  # encryption keys and symmetric keys never verify an access token
            kid = jwk.get("kid")
            keys[kid if isinstance(kid, str) else None] = jwk
        if None in keys and len(keys) > 1:
            del keys[None]  # a key without kid is usable only when it is the only key
        log.info("oauth.jwks_fetched", issuer=self.name, keys=len(keys))
        return keys

    async def _discover(self, http: httpx2.AsyncClient) -> str:
        """The issuer's ``jwks_uri`` from its metadata: RFC 8414 (path inserted), then OpenID Connect Discovery
        (inserted, then appended), as the MCP specification orders them. The metadata must name the same issuer."""
        issuer = self.spec.issuer
        parts = urlsplit(issuer)
        origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
        candidates = [f"{origin}/.well-known/oauth-authorization-server{path}"]
        candidates.append(f"{origin}/.well-known/openid-configuration{path}")
        if path:
            candidates.append(f"{origin}{path}/.well-known/openid-configuration")
        problems = []
        for url in candidates:
            try:
                metadata = await _get_json(http, url)
            except _FetchError as exc:
                problems.append(str(exc))
                continue
            if metadata.get("issuer") != issuer:
                raise _FetchError(f"{url} names another issuer than {issuer}")
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise _FetchError(f"{url} has no jwks_uri")
            return jwks_uri
        raise _FetchError("no metadata found: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class TokenCacheStatistics:
    """The verified-token cache now: its settings, the tokens it holds, and its counts since start."""

    ttl_s: float
    limit: int  # token_cache_size
    entries: int  # tokens remembered now
    hits: int  # requests answered from the cache
    misses: int  # requests it could not answer (not held, or no longer valid): each was checked in full
    evicted: int  # tokens dropped to make room (least recently used)
    forgotten: int  # tokens dropped at once because their issuer stopped publishing the key that verified them


@dataclass(frozen=True, slots=True)
class VerifierStatistics:
    """What the resource server did since start: tokens by result (every one of ``VERIFICATION_RESULTS``), key set
    fetches by issuer name, and the cache (None when ``token_cache_s`` is 0)."""

    verifications: Mapping[str, int]
    key_fetches: Mapping[str, int]
    token_cache: TokenCacheStatistics | None


@dataclass(frozen=True, slots=True)
class _Verified:
    """A token that passed every check, as remembered under its digest."""

    principal: Caller
    keys: _IssuerKeys
    kid: str | None
    jwk: dict[str, Any] | None  # the key that verified it (the very object its issuer's keys hold)
    expires: float  # the token's ``exp``, by the wall clock (as PyJWT reads it)
    until: float  # time.monotonic() past which the token is verified again (``token_cache_s``)


class _TokenCache:
    """Verified tokens by the SHA-256 digest of the token, least recently used first, at most ``size``.

    An entry answers only while the wall clock at that moment is before the token's ``exp`` (not the clock when it was
    remembered), the cache's own deadline has not passed, and its issuer's keys are fresh and still hold the key that
    verified it; otherwise it is dropped and the token is verified in full again (which applies the leeway as ever).
    """

    def __init__(self, ttl_s: float, size: int) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._entries: OrderedDict[bytes, _Verified] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.forgotten = 0

    def get(self, digest: bytes) -> Caller | None:
        entry = self._entries.get(digest)
        if entry is None:
            self.misses += 1
            return None
        if time.time() < entry.expires and time.monotonic() < entry.until and entry.keys.holds(entry.kid, entry.jwk):
            self._entries.move_to_end(digest)
            self.hits += 1
            return entry.principal
        del self._entries[digest]
        self.misses += 1
        return None

    def put(self, digest: bytes, entry: _Verified) -> None:
        if entry.expires <= time.time():
            return  # accepted within the leeway only: not remembered
        self._entries[digest] = entry
        self._entries.move_to_end(digest)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
            self.evicted += 1

    def forget_unheld(self, keys: _IssuerKeys) -> None:
        """Drop the tokens of ``keys``'s issuer whose key it no longer publishes (called when its key set changed)."""
        for digest in [d for d, e in self._entries.items() if e.keys is keys and not keys.holds(e.kid, e.jwk)]:
            del self._entries[digest]
            self.forgotten += 1

    def statistics(self) -> TokenCacheStatistics:
        return TokenCacheStatistics(
            self.ttl_s, self.size, len(self._entries), self.hits, self.misses, self.evicted, self.forgotten
        )


class _FetchError(Exception):
    """An issuer's document could not be had (network, status, size or JSON)."""


async def _get_json(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    """An issuer's JSON document, read at most ``MAX_DOCUMENT_BYTES`` (after decompression) into memory: the read
    stops, and the connection closes, as soon as the body passes the limit."""
    try:
        async with http.stream("GET", url, headers={"accept": "application/json", **_ENCODINGS}) as response:
            if response.status_code != 200:
                raise _FetchError(f"GET {url} answered HTTP {response.status_code}")
            body = await _bounded_body(response, url)
    except httpx2.HTTPError as exc:
        raise _FetchError(f"GET {url} failed: {type(exc).__name__}") from exc
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise _FetchError(f"GET {url} answered something that is not JSON") from exc
    if not isinstance(document, dict):
        raise _FetchError(f"GET {url} answered JSON that is not an object")
    return document


_ENCODINGS = {"accept-encoding": "gzip, deflate"}
"""What an issuer may compress its documents with: the two the gateway decodes itself, bounded (``_bounded_body``)."""


async def _bounded_body(response: httpx2.Response, url: str) -> bytes:
    """The body, decoded here rather than by httpx2 (which expands a whole received chunk at once: 64 KiB of gzip may
    become 64 MiB), never holding more than ``MAX_DOCUMENT_BYTES`` + 1 decoded bytes."""
    too_large = _FetchError(f"GET {url} answered more than {MAX_DOCUMENT_BYTES} bytes")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_DOCUMENT_BYTES:  # refused unread
        raise too_large
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    decoder: Any = None
    if encoding in ("gzip", "x-gzip"):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        decoder = zlib.decompressobj()
    elif encoding not in ("", "identity"):
        raise _FetchError(f"GET {url} answered in an encoding the gateway does not read ({encoding})")
    body = bytearray()
    async for raw in response.aiter_raw():
        if decoder is None:
            body += raw
        else:
            try:
                body += decoder.decompress(raw, MAX_DOCUMENT_BYTES + 1 - len(body))
            except zlib.error as exc:
                raise _FetchError(f"GET {url} answered a body that does not decompress ({encoding})") from exc
            if decoder.unconsumed_tail:  # more output than the room left: over the limit
                raise too_large
        if len(body) > MAX_DOCUMENT_BYTES:
            raise too_large
    return bytes(body)


class ResourceServer:
    """Validates JWT access tokens for the gateway's resource and describes it (RFC 9728)."""

    def __init__(self, settings: OAuth, *, name: str = "mcp-gateway") -> None:
        self.settings = settings
        self.name = name
        cache = _TokenCache(settings.token_cache_s, settings.token_cache_size) if settings.token_cache_s > 0 else None
        self.token_cache = cache
        """Verified tokens remembered; None when ``token_cache_s`` is 0."""
        self._issuers = {}
        for issuer_name, spec in settings.issuers.items():
            keys = _IssuerKeys(issuer_name, spec, settings)
            if cache is not None:
                keys.on_change = partial(cache.forget_unheld, keys)
            self._issuers[spec.issuer] = (issuer_name, spec, keys)
        self._results = dict.fromkeys(VERIFICATION_RESULTS, 0)
        parts = urlsplit(settings.resource)
        suffix = parts.path.rstrip("/")
        self.metadata_url = f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{suffix}"
        """Where the metadata is, as the challenges name it: the RFC 9728 form, the resource's path appended."""
        self.metadata_paths = tuple(dict.fromkeys([f"{METADATA_PATH}{suffix}", METADATA_PATH]))
        """The paths that serve it: the path-suffixed form and the root form clients fall back to."""
        self.scopes_supported = (
            settings.scopes_supported if settings.scopes_supported is not None else settings.required_scopes
        )

    def metadata(self) -> dict[str, Any]:
        """The Protected Resource Metadata document (RFC 9728 section 2)."""
        document: dict[str, Any] = {
            "resource": self.settings.resource,
            "authorization_servers": [spec.issuer for spec in self.settings.issuers.values()],
            "bearer_methods_supported": ["header"],
            "resource_signing_alg_values_supported": list(self.settings.algorithms),
            "resource_name": self.name,
        }
        if self.scopes_supported:
            document["scopes_supported"] = list(self.scopes_supported)
        return document

    def challenge(self, refusal: Refusal | None = None) -> str:
        """The ``WWW-Authenticate`` value: with no refusal, the one for a request that carried no token."""
        params = [f"resource_metadata={_quoted(self.metadata_url)}"]
        if refusal is not None and refusal.error is not None:
            params.insert(0, f"error={_quoted(refusal.error)}")
            params.append(f"error_description={_quoted(refusal.description)}")
        scope = refusal.scope if refusal is not None and refusal.scope else " ".join(self.settings.required_scopes)
        if scope:
            params.append(f"scope={_quoted(scope)}")
        return "Bearer " + ", ".join(params)

    def statistics(self) -> VerifierStatistics:
        """Tokens by result, each issuer's key set fetches and the cache, since start (counts only)."""
        cache = self.token_cache
        return VerifierStatistics(
            verifications=dict(self._results, cached=cache.hits if cache is not None else 0),
            key_fetches={name: keys.fetches for name, _, keys in self._issuers.values()},
            token_cache=cache.statistics() if cache is not None else None,
        )

    async def verify(self, token: str) -> Caller:
        """The caller a JWT access token speaks for.

        Raises:
            Refusal: the token is not accepted (the answer to give is on it).
        """
        cache = self.token_cache
        digest = None
        if cache is not None:
            digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
            remembered = cache.get(digest)
            if remembered is not None:
                return remembered
        try:
            principal = await self._verify(token, cache, digest)
        except Refusal as refusal:
            self._results["unavailable" if refusal.status == 503 else "refused"] += 1
            raise
        self._results["verified"] += 1
        return principal

    async def _verify(self, token: str, cache: _TokenCache | None, digest: bytes | None) -> Caller:
        """``verify`` in full: every check, then the principal is remembered (with the cache on)."""
        header, unverified = _peek(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.settings.algorithms:
            raise _invalid("the token is signed with an algorithm this gateway does not accept")
        iss = unverified.get("iss")
        found = self._issuers.get(iss) if isinstance(iss, str) else None
        if found is None:
            raise _invalid("the token was not issued by an issuer this gateway trusts")
        name, spec, keys = found
        kid = header.get("kid")
        kid = kid if isinstance(kid, str) else None
        key = await keys.key(kid, alg)
        jwk = keys.published(kid)  # no await from here on: the key that verifies is the one remembered
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=spec.audience or self.settings.resource,
                issuer=spec.issuer,
                leeway=self.settings.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise _invalid("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise _invalid("the token is not valid yet") from None
        except jwt.InvalidAudienceError:
            raise _invalid("the token was not issued for this resource (its audience is another)") from None
        except jwt.InvalidSignatureError:
            raise _invalid("the token's signature does not verify") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _invalid(f"the token has no {exc.claim!r} claim") from None
        except jwt.PyJWTError:
            raise _invalid("the token is invalid") from None
        subject = claims.get(spec.caller_claim)
        if isinstance(subject, int) and not isinstance(subject, bool):
            subject = str(subject)
        if not isinstance(subject, str) or not subject or len(subject) > MAX_CALLER_CHARS:
            raise _invalid(f"the token names no caller (claim {spec.caller_claim!r})")
        scopes = _scopes(claims)
        missing = [scope for scope in self.settings.required_scopes if scope not in scopes]
        if missing:
            wanted = sorted(set(self.settings.required_scopes) | (scopes & set(self.scopes_supported)))
            raise Refusal(
                403, "insufficient_scope", f"the token lacks the scope {' '.join(missing)}", scope=" ".join(wanted)
            )
        principal = Caller(
            name=f"{name}:{subject}",
            issuer=spec.issuer,
            subject=subject,
            scopes=frozenset(scopes),
            claims=claims,
        )
        if cache is not None and digest is not None:
            until = time.monotonic() + cache.ttl_s
            cache.put(digest, _Verified(principal, keys, kid, jwk, float(claims["exp"]), until))
        return principal


def _peek(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A JWS's header and payload, unverified: only to pick the issuer and the key. ``jwt.decode`` then parses and
    checks the whole token itself (PyJWT's own unverified decode costs as much as the verification: it validates
    every base64 character in Python, so it is not used twice).

    Raises:
        Refusal: not three base64url segments whose first two are JSON objects.
    """
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise ValueError("not a JWS in compact form")
        header, payload = (json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))) for part in parts[:2])
    except (ValueError, UnicodeDecodeError):  # binascii.Error and json.JSONDecodeError are ValueErrors
        raise _invalid("the token is not a JWT access token") from None
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise _invalid("the token is not a JWT access token")
    return header, payload


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """A token's scopes: ``scope`` (space-separated, RFC 9068) or ``scp`` (a list or a string, as some IdPs write)."""
    value = claims.get("scope", claims.get("scp"))
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(item for item in value if isinstance(item, str))
    return frozenset()
