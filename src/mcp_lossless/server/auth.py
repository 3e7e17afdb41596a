"""Bearer token verification: JWT access tokens (signature checked with joserfc) and opaque tokens (RFC 7662
introspection).

Only *who* the token speaks for, *which* resources it names and *which* scopes it carries are decided here;
whether that covers a given call is the audience policy's job. Real providers shape their access tokens
differently (a ``typ`` of ``JWT`` or ``at+jwt``, the client in ``client_id``, ``azp``, ``appid`` or ``cid``, scopes
in ``scope`` or ``scp``, as a string or a list): a :class:`TokenProfile` names one shape, chosen in config.
A verified token is cached by its SHA-256 digest (never the token itself) until it expires, so a client that
repeats its token pays a dict lookup, not a signature check or a round trip.
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
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote_plus, urlsplit, urlunsplit

import anyio
import httpx
import orjson
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet

from ..core.dpop import ProofRefusal, bound_key
from ..core.principal import Grant, Principal
from ..core.resources import audience_of
from .errors import ServerError

logger = logging.getLogger(__name__)

ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt"})
"""RFC 9068 §2.1: the ``typ`` that tells an access token from an ID token or any other JWT."""

SUPPORTED_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"})
"""Asymmetric algorithms only: ``none`` and the HMAC family would let a public key act as a secret."""

CALLER: ContextVar[tuple[Grant, str] | None] = ContextVar("mcp_lossless_caller", default=None)
"""The grant and access token of the request being served, seen by every task it starts: what a gateway's
upstream call exchanges for a token of its own (RFC 8693, :mod:`~..gateway.exchange`). Set by the transport once
the token is accepted; held only for the request's own work, never stored or logged."""
MAX_TOKEN_LENGTH = 16 * 1024
MAX_HEADER_SEGMENT = 1024
MAX_JWKS_BYTES = 1024 * 1024


class InvalidToken(ServerError):
    """401 ``invalid_token``; ``description`` is short, safe to send to a client, never holds the token."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class VerifierUnavailable(Exception):
    """The token could not be judged (the introspection endpoint is down or refuses us): 503, not the
    client's fault, so no ``invalid_token`` that would send it to re-authorize for nothing."""


@dataclass(frozen=True, slots=True)
class TokenProfile:
    """How one provider shapes its access tokens.

    ``header_types``: the JOSE ``typ`` values that mark an access token (lowercase; ``None``: no ``typ``).
    Where that is the generic ``JWT``, ``payload_type`` (Keycloak's ``typ: Bearer`` claim) or the audience
    check is what keeps an ID token out. ``client_claims`` and ``scope_claims`` are read in order; the
    scopes of every present scope claim are united. ``scope_lists``: a scope claim may be a JSON list.
    """

    name: str
    header_types: frozenset[str | None]
    client_claims: tuple[str, ...]
    scope_claims: tuple[str, ...]
    scope_lists: bool = True
    payload_type: str | None = None


PROFILES: dict[str, TokenProfile] = {
    # RFC 9068 as oidc-provider, our dev AS and Auth0's "RFC 9068" dialect issue it.
    "rfc9068": TokenProfile("rfc9068", ACCESS_TOKEN_TYPES, ("client_id", "azp"), ("scope",), scope_lists=False),
    # Keycloak: typ JWT (at+jwt when the client opts in), azp always, client_id on service-account tokens.
    "keycloak": TokenProfile(
        "keycloak", ACCESS_TOKEN_TYPES | {"jwt"}, ("client_id", "azp"), ("scope",), payload_type="Bearer"
    ),
    # Auth0's default dialect: typ JWT, azp, aud often a list (the API and /userinfo).
    "auth0": TokenProfile("auth0", ACCESS_TOKEN_TYPES | {"jwt"}, ("client_id", "azp"), ("scope",)),
    # Microsoft Entra ID: typ JWT; v2.0 tokens name the client in azp, v1.0 in appid; delegated permissions
    # in scp (a space-separated string), application permissions (client credentials) in roles (a list).
    "entra": TokenProfile("entra", frozenset({"jwt"}), ("azp", "appid"), ("scp", "roles")),
    # Okta custom authorization servers: no typ at all, the client in cid, scp as a list.
    "okta": TokenProfile("okta", ACCESS_TOKEN_TYPES | {"jwt", None}, ("cid", "client_id"), ("scp", "scope")),
}
"""Every profile by the name ``token_profile`` selects."""


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


def _client_id(claims: Mapping[str, Any], profile: TokenProfile) -> str:
    for name in profile.client_claims:
        value = claims.get(name)
        if value is not None:
            if not isinstance(value, str) or not value:
                raise InvalidToken(f"claim {name!r} is not a string")
            return value
    raise InvalidToken(f"claim {profile.client_claims[0]!r} is missing or not a string")


def _scopes(claims: Mapping[str, Any], profile: TokenProfile) -> frozenset[str]:
    out: set[str] = set()
    for name in profile.scope_claims:
        value = claims.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            out.update(value.split())
        elif profile.scope_lists and isinstance(value, list) and all(isinstance(v, str) for v in value):
            out.update(v for v in value if v)
        else:
            kind = "a string or a list of strings" if profile.scope_lists else "a string"
            raise InvalidToken(f"claim {name!r} is not {kind}")
    return frozenset(out)


def _audience(claims: Mapping[str, Any], aliases: Mapping[str, str]) -> frozenset[str]:
    aud = claims.get("aud")
    if not ((isinstance(aud, str) and aud) or (isinstance(aud, list) and aud and all(isinstance(a, str) for a in aud))):
        raise InvalidToken("claim 'aud' is missing or not a string or list of strings")
    values = [aud] if isinstance(aud, str) else aud
    return audience_of([aliases.get(value, value) for value in values])


def grant_from_claims(
    claims: Mapping[str, Any],
    *,
    issuer: str,
    profile: TokenProfile,
    now: float,
    leeway: float,
    audience_aliases: Mapping[str, str] | None = None,
    introspected: bool = False,
) -> Grant:
    """The one place a token's claims (a JWT payload or an introspection answer) become a :class:`Grant`.

    An introspection answer (RFC 7662 §2.2) may leave out ``iss``, ``exp`` and ``sub``; a JWT may not. A JWT's
    ``typ`` claim is checked where the profile needs it to tell an access token from an ID token; an
    introspection answer is about an access token already (``token_type_hint``, ``active``).
    """
    if claims.get("iss", issuer if introspected else None) != issuer:
        raise InvalidToken("wrong issuer")
    if not introspected and profile.payload_type is not None and claims.get("typ") != profile.payload_type:
        raise InvalidToken(f"claim 'typ' must be {profile.payload_type!r} (an access token, not an ID token)")
    exp = _numeric_date(claims, "exp")
    if exp is None and not introspected:
        raise InvalidToken("claim 'exp' is missing")
    if exp is not None and now >= exp + leeway:
        raise InvalidToken("token expired")
    nbf = _numeric_date(claims, "nbf")
    if nbf is not None and nbf > now + leeway:
        raise InvalidToken("token not yet valid (nbf)")
    iat = _numeric_date(claims, "iat")
    if iat is not None and iat > now + leeway:
        raise InvalidToken("token issued in the future (iat)")
    audience = _audience(claims, audience_aliases or {})
    client_id = _client_id(claims, profile)
    # RFC 9068 §2.2: for a client acting on its own behalf ``sub`` is the client; introspection may omit it.
    subject = client_id if introspected and "sub" not in claims else _required_string(claims, "sub")
    # RFC 9449 §6: a bound token (a JWT's or an introspection answer's cnf.jkt) is usable only with a proof by
    # that key; a cnf this server cannot check is refused rather than taken as unbound.
    jkt = bound_key(claims)
    if isinstance(jkt, ProofRefusal):
        raise InvalidToken(jkt.description)
    return Grant(
        principal=Principal(issuer=issuer, subject=subject, client_id=client_id),
        audience=audience,
        expires_at=exp,
        scopes=_scopes(claims, profile),
        jkt=jkt,
    )


class GrantCache:
    """Verified grants by the SHA-256 digest of their token, least recently used evicted past ``size``."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        self._size = size
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[Grant, float]] = OrderedDict()

    @staticmethod
    def key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()

    def get(self, key: bytes) -> tuple[Grant, bool] | None:
        """The cached grant and whether its entry still lives; an entry past its time is dropped."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() >= entry[1]:
            del self._entries[key]
            return entry[0], False
        self._entries.move_to_end(key)
        return entry[0], True

    def put(self, key: bytes, grant: Grant, until: float) -> None:
        self._entries[key] = (grant, until)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class JwtVerifier:
    """JWT access tokens from one issuer, shaped as ``profile`` says (RFC 9068 by default), keys from ``keys``,
    verified results cached by digest. ``audience_aliases`` maps an ``aud`` value that is not a resource URI
    (Entra's application id, a Keycloak client) to the resource it stands for."""

    def __init__(
        self,
        issuer: str,
        keys: JwksSource,
        *,
        algorithms: Collection[str] = ("RS256", "ES256", "PS256"),
        leeway: float = 30.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.time,
        profile: TokenProfile = PROFILES["rfc9068"],
        audience_aliases: Mapping[str, str] | None = None,
    ) -> None:
        unsupported = set(algorithms) - SUPPORTED_ALGORITHMS
        if unsupported or not algorithms:
            raise ValueError(f"algorithms must be a non-empty subset of {sorted(SUPPORTED_ALGORITHMS)}")
        self.issuer = issuer
        self._keys = keys
        self._algorithms = frozenset(algorithms)
        self._registry = jws.JWSRegistry(algorithms=sorted(self._algorithms), strict_check_header=False)
        self._leeway = leeway
        self._cache = GrantCache(cache_size, clock)
        self._clock = clock
        self.profile = profile
        self._aliases = dict(audience_aliases or {})

    async def verify(self, token: str) -> Grant:
        if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidToken("token is not a string of at most 16 KiB")
        digest = GrantCache.key(token)
        cached = self._cache.get(digest)
        if cached is not None:
            grant, live = cached
            if not live:
                raise InvalidToken("token expired")
            return grant
        grant = await self._verify_uncached(token)
        until = math.inf if grant.expires_at is None else grant.expires_at + self._leeway
        self._cache.put(digest, grant, until)
        return grant

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
        if typ is not None and not isinstance(typ, str):
            raise InvalidToken("header 'typ' is not a string")
        if (typ.lower() if typ is not None else None) not in self.profile.header_types:
            if self.profile.header_types == ACCESS_TOKEN_TYPES:
                raise InvalidToken("header 'typ' must be 'at+jwt' (RFC 9068)")
            raise InvalidToken(f"header 'typ' {typ!r} is not an access token type of profile {self.profile.name!r}")
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise InvalidToken(f"algorithm {alg!r} is not allowed")
        return header

    def _grant_from(self, claims: dict[str, Any]) -> Grant:
        return grant_from_claims(
            claims,
            issuer=self.issuer,
            profile=self.profile,
            now=self._clock(),
            leeway=self._leeway,
            audience_aliases=self._aliases,
        )


INTROSPECTION_AUTH_METHODS = ("client_secret_basic", "client_secret_post")


class IntrospectionVerifier:
    """Opaque access tokens judged by the authorization server's RFC 7662 introspection endpoint.

    The server authenticates to the endpoint as a client of its own (``client_secret_basic`` or
    ``client_secret_post``). An active answer is cached by the token's digest until the token's ``exp`` or
    ``cache_seconds``, whichever is sooner: a revoked token is refused within ``cache_seconds``. At most
    ``concurrency`` introspections run at once, so a flood of made-up tokens cannot turn the server into an
    amplifier against its authorization server. An endpoint that is down or refuses our credentials makes
    the request 503 (:class:`VerifierUnavailable`), not 401.
    """

    def __init__(
        self,
        issuer: str,
        endpoint: str,
        client_id: str,
        client_secret: str,
        *,
        http: httpx.AsyncClient,
        auth_method: str = "client_secret_basic",
        profile: TokenProfile = PROFILES["rfc9068"],
        audience_aliases: Mapping[str, str] | None = None,
        leeway: float = 30.0,
        cache_seconds: float = 60.0,
        cache_size: int = 10_000,
        concurrency: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if auth_method not in INTROSPECTION_AUTH_METHODS:
            raise ValueError(f"introspection auth method must be one of {', '.join(INTROSPECTION_AUTH_METHODS)}")
        self.issuer = issuer
        self.endpoint = endpoint
        self._client = (client_id, client_secret)
        self._auth_method = auth_method
        self._http = http
        self.profile = profile
        self._aliases = dict(audience_aliases or {})
        self._leeway = leeway
        self._cache_seconds = cache_seconds
        self._cache = GrantCache(cache_size, clock)
        self._limit = anyio.Semaphore(concurrency)
        self._clock = clock
        self.calls = 0
        """Introspection requests sent: the cache's effect, observable."""

    async def verify(self, token: str) -> Grant:
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidToken("token is not a string of at most 16 KiB")
        digest = GrantCache.key(token)
        cached = self._cache.get(digest)
        if cached is not None and cached[1]:
            return cached[0]
        answer = await self._introspect(token)
        if answer.get("active") is not True:
            raise InvalidToken("token is not active (introspection)")
        now = self._clock()
        grant = grant_from_claims(
            answer,
            issuer=self.issuer,
            profile=self.profile,
            now=now,
            leeway=self._leeway,
            audience_aliases=self._aliases,
            introspected=True,
        )
        until = now + self._cache_seconds
        if grant.expires_at is not None:
            until = min(until, grant.expires_at + self._leeway)
        self._cache.put(digest, grant, until)
        return grant

    async def _introspect(self, token: str) -> Mapping[str, Any]:
        form = {"token": token, "token_type_hint": "access_token"}
        client_id, secret = self._client
        auth: httpx.BasicAuth | None = None
        if self._auth_method == "client_secret_basic":
            # RFC 6749 §2.3.1: both parts form-urlencoded before base64 (httpx encodes the pair as given).
            auth = httpx.BasicAuth(quote_plus(client_id), quote_plus(secret))
        else:
            form |= {"client_id": client_id, "client_secret": secret}
        async with self._limit:
            self.calls += 1
            try:
                response = await self._http.post(
                    self.endpoint, data=form, auth=auth if auth is not None else httpx.USE_CLIENT_DEFAULT,
                    headers={"accept": "application/json"},
                )  # fmt: skip
            except httpx.HTTPError as exc:
                logger.warning("introspection at %s failed: %s", self.endpoint, type(exc).__name__)
                raise VerifierUnavailable(f"introspection endpoint unreachable ({type(exc).__name__})") from None
        if response.status_code != 200 or len(response.content) > MAX_JWKS_BYTES:
            logger.warning("introspection at %s answered HTTP %d", self.endpoint, response.status_code)
            raise VerifierUnavailable(f"introspection endpoint answered HTTP {response.status_code}")
        try:
            answer = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise VerifierUnavailable("introspection endpoint answered something other than a JSON object")
        return answer


class RoutingVerifier:
    """JWT-shaped tokens to ``jwt`` (checked locally), every other token to ``opaque`` (introspection).

    Providers that issue both keep one verifier each; oidc-provider, for one, refuses to introspect a JWT.
    """

    def __init__(self, jwt: TokenVerifier, opaque: TokenVerifier) -> None:
        self._jwt = jwt
        self._opaque = opaque

    async def verify(self, token: str) -> Grant:
        if token.count(".") == 2 and token.startswith("eyJ"):
            return await self._jwt.verify(token)
        return await self._opaque.verify(token)
