"""Bearer token verification: RFC 9068 JWT access tokens, signature checked with joserfc.

Only *who* the token speaks for and *which* resources it names are decided here; whether that audience
covers a given call is the audience policy's job. A verified token is cached by its SHA-256 digest (never
the token itself) until it expires, so a client that repeats its token pays a dict lookup, not a
signature check.
"""

from __future__ import annotations

import binascii
import hashlib
import logging
import math
import time
from base64 import urlsafe_b64decode
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx
import orjson
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet

from ..core.principal import Grant, Principal
from ..core.resources import audience_of
from .errors import ServerError

logger = logging.getLogger(__name__)

ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt"})
"""RFC 9068 §2.1: the ``typ`` that tells an access token from an ID token or any other JWT."""

SUPPORTED_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"})
"""Asymmetric algorithms only: ``none`` and the HMAC family would let a public key act as a secret."""

MAX_TOKEN_LENGTH = 16 * 1024
MAX_HEADER_SEGMENT = 1024
MAX_JWKS_BYTES = 1024 * 1024


class InvalidToken(ServerError):
    """401 ``invalid_token``; ``description`` is short, safe to send to a client, never holds the token."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class TokenVerifier(Protocol):
    async def verify(self, token: str) -> Grant: ...


class JwksSource(Protocol):
    async def key_for(self, kid: str | None) -> Key | None:
        """The verification key named ``kid`` (a token without ``kid``: the only key, if there is one)."""
        ...


def _pick(keys: Mapping[str, Key], kid: str | None) -> Key | None:
    if kid is None:
        return next(iter(keys.values())) if len(keys) == 1 else None
    return keys.get(kid)


def _signing_keys(key_set: KeySet) -> dict[str, Key]:
    return {key.kid: key for key in key_set.keys if key.kid is not None and key.get("use") in (None, "sig")}


class StaticJwks:
    """Keys held in process, e.g. the embedded development authorization server's."""

    def __init__(self, key_set: KeySet) -> None:
        self._keys = _signing_keys(key_set)

    async def key_for(self, kid: str | None) -> Key | None:
        return _pick(self._keys, kid)


class RemoteJwks:
    """An authorization server's JWKS fetched over HTTP and kept for ``ttl`` seconds.

    An unknown ``kid`` (a rotated key) triggers a refetch, but at most once per ``cooldown`` so that tokens
    with made-up kids cannot turn the verifier into a request amplifier. Concurrent misses wait for one
    shared fetch. A failed fetch keeps the keys already known.
    """

    def __init__(
        self,
        jwks_uri: str,
        *,
        http: httpx.AsyncClient | None = None,
        ttl: float = 300,
        cooldown: float = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.jwks_uri = jwks_uri
        self._http = http
        self._ttl = ttl
        self._cooldown = cooldown
        self._clock = clock
        self._keys: dict[str, Key] = {}
        self._fetched_at = -math.inf
        self._attempted_at = -math.inf
        self._attempts = 0
        self._lock = anyio.Lock()

    async def key_for(self, kid: str | None) -> Key | None:
        key = _pick(self._keys, kid)
        now = self._clock()
        stale = now - self._fetched_at >= self._ttl
        if (key is None or stale) and now - self._attempted_at >= self._cooldown:
            await self._refresh(self._attempts)
            key = _pick(self._keys, kid)
        return key

    async def _refresh(self, attempts_seen: int) -> None:
        async with self._lock:
            if self._attempts != attempts_seen:
                return  # another task fetched while this one waited
            self._attempts += 1
            self._attempted_at = self._clock()
            try:
                document = await self._fetch()
                keys = _signing_keys(KeySet.import_key_set(document))
            except (httpx.HTTPError, JoseError, ValueError, TypeError, KeyError) as exc:
                logger.warning("JWKS fetch from %s failed: %s", self.jwks_uri, type(exc).__name__)
                return
            self._keys = keys
            self._fetched_at = self._attempted_at

    async def _fetch(self) -> Any:
        if self._http is None:
            async with httpx.AsyncClient(timeout=10) as http:
                return await _get_json(http, self.jwks_uri)
        return await _get_json(self._http, self.jwks_uri)


async def _get_json(http: httpx.AsyncClient, url: str) -> Any:
    """GET a JSON document of bounded size; raises ``httpx.HTTPError`` or ``ValueError``."""
    async with http.stream("GET", url, headers={"accept": "application/json"}) as response:
        response.raise_for_status()
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_JWKS_BYTES:
                raise ValueError(f"document at {url} exceeds {MAX_JWKS_BYTES} bytes")
    return orjson.loads(body)


class DiscoveryError(ServerError):
    pass


def metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 §3.1 path-inserted OAuth metadata first, then OpenID discovery (inserted, appended)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(p: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, p, "", ""))

    urls = [at("/.well-known/oauth-authorization-server" + path)]
    if path:
        urls += [at("/.well-known/openid-configuration" + path), at(path + "/.well-known/openid-configuration")]
    else:
        urls.append(at("/.well-known/openid-configuration"))
    return urls


async def discover_jwks_uri(issuer: str, http: httpx.AsyncClient) -> str:
    """The ``jwks_uri`` of ``issuer``'s metadata; the metadata must name the same issuer (RFC 8414 §3.3)."""
    failures: list[str] = []
    for url in metadata_urls(issuer):
        try:
            metadata = await _get_json(http, url)
        except (httpx.HTTPError, ValueError) as exc:
            failures.append(f"{url}: {type(exc).__name__}")
            continue
        if not isinstance(metadata, dict):
            failures.append(f"{url}: not a JSON object")
            continue
        if metadata.get("issuer") != issuer:
            raise DiscoveryError(f"metadata at {url} names issuer {metadata.get('issuer')!r}, expected {issuer!r}")
        jwks_uri = metadata.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri:
            raise DiscoveryError(f"metadata at {url} has no jwks_uri")
        return jwks_uri
    raise DiscoveryError(f"no authorization server metadata for {issuer}: " + "; ".join(failures))


def _b64decode(segment: str) -> bytes:
    return urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def _numeric_date(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidToken(f"claim {name!r} is not a NumericDate")
    return float(value)


def _required_string(claims: Mapping[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidToken(f"claim {name!r} is missing or not a string")
    return value


class JwtVerifier:
    """RFC 9068 access tokens from one issuer, keys from ``keys``, verified results cached by digest."""

    def __init__(
        self,
        issuer: str,
        keys: JwksSource,
        *,
        algorithms: Collection[str] = ("RS256", "ES256", "PS256"),
        leeway: float = 30.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        unsupported = set(algorithms) - SUPPORTED_ALGORITHMS
        if unsupported or not algorithms:
            raise ValueError(f"algorithms must be a non-empty subset of {sorted(SUPPORTED_ALGORITHMS)}")
        self.issuer = issuer
        self._keys = keys
        self._algorithms = frozenset(algorithms)
        self._registry = jws.JWSRegistry(algorithms=sorted(self._algorithms), strict_check_header=False)
        self._leeway = leeway
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, Grant] = OrderedDict()
        self._clock = clock

    async def verify(self, token: str) -> Grant:
        if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidToken("token is not a string of at most 16 KiB")
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        cached = self._cache.get(digest)
        if cached is not None:
            if self._expired(cached.expires_at):
                del self._cache[digest]
                raise InvalidToken("token expired")
            self._cache.move_to_end(digest)
            return cached
        grant = await self._verify_uncached(token)
        self._cache[digest] = grant
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return grant

    def _expired(self, exp: float | None) -> bool:
        return exp is not None and self._clock() >= exp + self._leeway

    async def _verify_uncached(self, token: str) -> Grant:
        header = self._parse_header(token)
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("header 'kid' is not a string")
        key = await self._keys.key_for(kid)
        if key is None:
            raise InvalidToken(f"no verification key for kid {kid!r}")
        try:
            payload = jws.deserialize_compact(token, key, registry=self._registry).payload or b""
        except (JoseError, ValueError, TypeError) as exc:
            raise InvalidToken(f"signature rejected ({type(exc).__name__})") from None
        try:
            claims = orjson.loads(payload)
        except ValueError:
            raise InvalidToken("payload is not JSON") from None
        if not isinstance(claims, dict):
            raise InvalidToken("payload is not a JSON object")
        return self._grant_from(claims)

    def _parse_header(self, token: str) -> dict[str, Any]:
        segments = token.split(".")
        if len(segments) != 3:
            raise InvalidToken("not a JWS compact serialization (expected 3 segments)")
        if len(segments[0]) > MAX_HEADER_SEGMENT:
            raise InvalidToken("JOSE header too large")
        try:
            header = orjson.loads(_b64decode(segments[0]))
        except (binascii.Error, ValueError):
            raise InvalidToken("JOSE header is not base64url-encoded JSON") from None
        if not isinstance(header, dict):
            raise InvalidToken("JOSE header is not a JSON object")
        typ = header.get("typ")
        if not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES:
            raise InvalidToken("header 'typ' must be 'at+jwt' (RFC 9068)")
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise InvalidToken(f"algorithm {alg!r} is not allowed")
        return header

    def _grant_from(self, claims: dict[str, Any]) -> Grant:
        if claims.get("iss") != self.issuer:
            raise InvalidToken("wrong issuer")
        now = self._clock()
        exp = _numeric_date(claims, "exp")
        if exp is None:
            raise InvalidToken("claim 'exp' is missing")
        if self._expired(exp):
            raise InvalidToken("token expired")
        nbf = _numeric_date(claims, "nbf")
        if nbf is not None and nbf > now + self._leeway:
            raise InvalidToken("token not yet valid (nbf)")
        iat = _numeric_date(claims, "iat")
        if iat is not None and iat > now + self._leeway:
            raise InvalidToken("token issued in the future (iat)")
        aud = claims.get("aud")
        if not (
            (isinstance(aud, str) and aud) or (isinstance(aud, list) and aud and all(isinstance(a, str) for a in aud))
        ):
            raise InvalidToken("claim 'aud' is missing or not a string or list of strings")
        subject = _required_string(claims, "sub")
        client_id = claims.get("client_id", claims.get("azp"))
        if not isinstance(client_id, str) or not client_id:
            raise InvalidToken("claim 'client_id' is missing or not a string")
        scope = claims.get("scope", "")
        if not isinstance(scope, str):
            raise InvalidToken("claim 'scope' is not a string")
        return Grant(
            principal=Principal(issuer=self.issuer, subject=subject, client_id=client_id),
            audience=audience_of(aud),
            expires_at=exp,
            scopes=frozenset(scope.split()),
        )
