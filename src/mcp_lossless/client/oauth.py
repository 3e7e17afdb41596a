"""Authorization for the client: static tokens and OAuth 2.1 with RFC 8707 resource indicators.

The session asks an :class:`Auth` for a token covering a set of resource indicators before every
request, tells it about each ``WWW-Authenticate`` challenge, and asks it to re-authorize (a fresh grant,
never a refresh: a refresh cannot widen a grant) when the server refuses a token.

:class:`OAuth` discovers the authorization server from the MCP server (RFC 9728 protected resource
metadata: a challenge's ``resource_metadata`` first, then the path-inserted, then the root well-known
URI; then RFC 8414 / OpenID Connect discovery), and obtains tokens by ``client_credentials`` or
``authorization_code`` + PKCE S256 (validating ``iss``, RFC 9207), refreshing them when it can.
Token requests are built with plain httpx so repeated ``resource`` parameters are encoded correctly.
Tokens are cached by the resources they were issued for; a token's ``aud`` is read, without trusting
it, only to notice that an authorization server narrowed what was asked for. Tokens are never logged.

When no token the client can get is known to cover a request (a single-audience authorization server
refuses several resources with ``invalid_target``; the application dropped privileges with
:meth:`OAuth.narrow`), the newest token held is presented anyway: only the server knows what a token
covers there (ours lets its own URI cover every tool), and its refusal names what is missing and
starts a re-authorization.

Without a ``client_id`` the client registers itself per authorization server (:mod:`.registration`);
scopes follow the MCP scope selection strategy (:mod:`.scopes`). An ``authorization_code`` client waits
for the server's first challenge before sending anyone to a login page: a server that needs no token
never asks, and one that does names the scope it wants. A 401 (as opposed to a 403 for more scope)
makes the next grant re-read the protected resource metadata, so a server that moved to another
authorization server is followed there with a fresh registration. Servers from before RFC 9728
(2025-03-26) get RFC 8414 discovery at their origin, then the default ``/authorize``, ``/token`` and
``/register`` endpoints there.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlencode, urlsplit

import anyio
import httpx
import orjson
from anyio.abc import ByteStream, SocketAttribute, SocketListener

from ..core.resources import InvalidResource, audience_of, canonical_resource
from ..core.token_exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from .assertions import CLIENT_ASSERTION_TYPE, JWT_BEARER, PRIVATE_KEY_JWT, JwtBearerGrant, PrivateKeyJwt
from .dpop import DpopFlow, DpopKey
from .errors import AuthorizationFailed, describe_failure, unreachable
from .registration import ClientCredentials, ClientRegistration, choose_auth_method, json_object, register_client
from .scopes import ScopeSelection

log = logging.getLogger("mcp_lossless.client.oauth")


@dataclass(frozen=True, slots=True)
class Challenge:
    """A parsed ``WWW-Authenticate`` challenge: ``Bearer`` (RFC 6750, RFC 9728 ``resource_metadata``) or ``DPoP``
    (RFC 9449 §7.1, with ``algs``).

    ``resources`` is this project's ``resource`` parameter: the indicators a new token must cover.
    """

    error: str | None = None
    description: str | None = None
    scope: str | None = None
    resource_metadata: str | None = None
    resources: tuple[str, ...] = ()
    scheme: str = "bearer"
    algs: tuple[str, ...] = ()
    dpop_offered: bool = False
    """The header holds a ``DPoP`` challenge: the resource takes DPoP-bound tokens (RFC 9449 §7.1)."""


_AUTH_TOKEN = r"[A-Za-z0-9_!#$%&'*+.^`|~-]+"
_ITEM = re.compile(rf'\s*(?:({_AUTH_TOKEN})\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))|({_AUTH_TOKEN}))\s*,?')
_SCHEMES = ("bearer", "dpop")


def parse_challenges(header: str | None) -> list[Challenge]:
    """Every ``Bearer`` and ``DPoP`` challenge in ``header`` (several headers arrive joined by commas), in order.

    A scheme is a bare token; ``name=value`` pairs belong to the scheme before them (quoted values may hold
    commas and scheme names)."""
    found: list[tuple[str, dict[str, str]]] = []
    position = 0
    text = header or ""
    while position < len(text):
        match = _ITEM.match(text, position)
        if match is None or match.end() == position:
            break
        position = match.end()
        name, quoted, bare, scheme = match.groups()
        if scheme is not None:
            found.append((scheme.lower(), {}))
        elif found and name is not None:
            value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
            found[-1][1].setdefault(name.lower(), value)
    return [
        Challenge(
            error=params.get("error"),
            description=params.get("error_description"),
            scope=params.get("scope"),
            resource_metadata=params.get("resource_metadata"),
            resources=tuple(params.get("resource", "").split()),
            scheme=scheme,
            algs=tuple(params.get("algs", "").split()),
        )
        for scheme, params in found
        if scheme in _SCHEMES
    ]


def parse_challenge(header: str | None) -> Challenge | None:
    """The challenge to act on in ``header``, or ``None`` when it has no ``Bearer`` or ``DPoP`` one: the first
    that names an error (the scheme the server judged), else the first; what it lacks (the metadata URL, the
    scope) is taken from the others, which describe the same resource."""
    challenges = parse_challenges(header)
    if not challenges:
        return None
    chosen = next((c for c in challenges if c.error is not None), challenges[0])
    metadata = chosen.resource_metadata or next((c.resource_metadata for c in challenges if c.resource_metadata), None)
    scope = chosen.scope or next((c.scope for c in challenges if c.scope), None)
    resources = chosen.resources or next((c.resources for c in challenges if c.resources), ())
    algs = next((c.algs for c in challenges if c.algs), ())
    offered = any(c.scheme == "dpop" for c in challenges)
    return Challenge(chosen.error, chosen.description, scope, metadata, resources, chosen.scheme, algs, offered)


class Auth:
    """No credentials: requests go out without ``Authorization``; a refusal cannot be repaired."""

    def bind(self, http: httpx.AsyncClient, server_url: str) -> None:
        """Called once by the client with its HTTP client and the MCP endpoint URL."""

    async def token(self, resources: frozenset[str]) -> str | None:
        """A token whose audience covers ``resources`` (empty: the server itself), or ``None``."""
        return None

    def challenged(self, challenge: Challenge) -> None:
        """Learn from a challenge (where the metadata is, which scope and resources are wanted)."""

    def request_auth(self) -> httpx.Auth | None:
        """What the transports add to every MCP request (DPoP proofs for bound tokens), or ``None``."""
        return None

    async def reauthorize(self, resources: frozenset[str], scopes: frozenset[str] = frozenset()) -> None:
        """Obtain a fresh grant covering ``resources``, asking for ``scopes`` besides what was asked before;
        raise :class:`AuthorizationFailed` if impossible."""
        raise AuthorizationFailed("the server requires authorization and the client has no credentials")


class BearerToken(Auth):
    """A fixed token from the caller; it cannot be renewed."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def token(self, resources: frozenset[str]) -> str | None:
        return self._token

    async def reauthorize(self, resources: frozenset[str], scopes: frozenset[str] = frozenset()) -> None:
        raise AuthorizationFailed("the server refused the fixed bearer token and it cannot be renewed")


# ---- discovery ---------------------------------------------------------------------------------------


def protected_resource_metadata_urls(server_url: str, challenge_url: str | None = None) -> list[str]:
    """Where to look for RFC 9728 metadata, in the order the MCP specification gives."""
    parts = urlsplit(server_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    urls = [challenge_url] if challenge_url else []
    if path:
        urls.append(f"{origin}/.well-known/oauth-protected-resource{path}")
    urls.append(f"{origin}/.well-known/oauth-protected-resource")
    return list(dict.fromkeys(urls))


def authorization_server_metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 first, then OpenID Connect discovery, with path insertion when the issuer has a path."""
    parts = urlsplit(issuer)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if not path:
        return [f"{origin}/.well-known/oauth-authorization-server", f"{origin}/.well-known/openid-configuration"]
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}/.well-known/openid-configuration{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


def legacy_authorization_server(origin: str) -> dict[str, Any]:
    """The endpoints a 2025-03-26 client assumes when a server publishes no metadata at all."""
    return {
        "issuer": origin,
        "authorization_endpoint": f"{origin}/authorize",
        "token_endpoint": f"{origin}/token",
        "registration_endpoint": f"{origin}/register",
    }


def unverified_audience(token: str) -> frozenset[str] | None:
    """The ``aud`` of a JWT, read *without* verifying it: only to detect narrowing, never to trust."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = orjson.loads(payload)
    except (ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(claims, dict) or "aud" not in claims:
        return None
    aud = claims["aud"]
    return audience_of(aud) if isinstance(aud, str | list) else None


def pkce_pair() -> tuple[str, str]:
    """A PKCE code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


# ---- grants ------------------------------------------------------------------------------------------


RedirectHandler = Callable[[str], Awaitable[str]]
"""Takes the authorization URL, has the user (or a test) visit it, returns the URL it redirected to."""


@dataclass(frozen=True, slots=True)
class AuthorizationCodeGrant:
    """``authorization_code`` with PKCE S256: ``handler`` gets the user through the authorization page."""

    redirect_uri: str
    handler: RedirectHandler
    login_hint: str | None = None


@dataclass(slots=True)
class _Token:
    value: str
    audience: frozenset[str]
    expires_at: float | None
    issued_at: float
    dpop: bool = False
    """Issued as ``token_type: DPoP``: presented as ``Authorization: DPoP`` with a proof by our key."""


@dataclass(frozen=True, slots=True)
class ExchangedToken:
    """An access token obtained by token exchange (RFC 8693) and when it expires (``None``: the AS did not say)."""

    value: str
    expires_at: float | None


class TokenEndpointError(AuthorizationFailed):
    """The authorization server answered a token request with an OAuth error.

    ``secretless`` names the caller's client when it was sent without a secret and refused as ``invalid_client``:
    most likely a confidential client used as a public one (the dev AS's ``dev-client`` through the browser),
    which no retry can fix, so the reason says what is missing.
    ``described`` is the resource the server's metadata named below the URL the client was given: a resource
    refused as ``invalid_target`` is then most likely a URL that stops short of the MCP endpoint.
    """

    def __init__(
        self, error: str, description: str, secretless: str | None = None, described: str | None = None
    ) -> None:
        reason = f"token endpoint refused: {error}: {description}"
        if secretless is not None:
            reason += f"; {secretless} was sent without a secret: a confidential client needs its secret"
        if described is not None and error == "invalid_target":
            reason += f"; the server's metadata describes {described}: is that the MCP endpoint?"
        super().__init__(reason)
        self.error = error
        self.description = description
        self.secretless = secretless


class OAuth(Auth):
    """OAuth 2.1 for one client registration against whatever AS the MCP server names.

    ``grant`` is ``"client_credentials"``, an :class:`AuthorizationCodeGrant` or a
    :class:`~.assertions.JwtBearerGrant` (workload identity, SEP-1933; an ID-JAG, SEP-990). A token is reused while
    its audience covers what a request needs and it is not about to expire (``leeway`` seconds).
    ``client_id=None`` (``authorization_code`` only) registers as ``registration`` says; ``token_auth``
    (``client_secret_basic``, ``client_secret_post`` or ``none``) defaults to what the server supports;
    ``client_key`` signs in with ``private_key_jwt`` instead of a secret (RFC 7523 §2.2).
    ``dpop``: ``None`` asks for DPoP-bound tokens when the authorization server advertises ES256 proofs (or the
    resource requires bound tokens), ``True`` or a :class:`~.dpop.DpopKey` always, ``False`` never. Proofs are
    added by httpx (:meth:`request_auth`): a client sending through a ``pool`` (the gateway's aiohttp pool)
    cannot add them and must say ``dpop=False``.
    """

    def __init__(
        self,
        client_id: str | None,
        client_secret: str | None = None,
        *,
        grant: str | AuthorizationCodeGrant | JwtBearerGrant = "client_credentials",
        scope: str | None = None,
        token_auth: str | None = None,
        client_key: PrivateKeyJwt | None = None,
        registration: ClientRegistration | None = None,
        leeway: float = 30.0,
        clock: Callable[[], float] = time.time,
        dpop: bool | DpopKey | None = None,
    ) -> None:
        if grant != "client_credentials" and not isinstance(grant, AuthorizationCodeGrant | JwtBearerGrant):
            raise ValueError("grant must be 'client_credentials', an AuthorizationCodeGrant or a JwtBearerGrant")
        if client_id is None and not isinstance(grant, AuthorizationCodeGrant):
            raise ValueError("this grant needs a client_id; only authorization_code clients register")
        if client_key is not None and client_secret is not None:
            raise ValueError("a client authenticates with a secret or with a key (private_key_jwt), not both")
        self.client_id = client_id
        self._secret = client_secret
        self._grant = grant
        self._scope = ScopeSelection(scope)
        self._token_auth = PRIVATE_KEY_JWT if client_key is not None else token_auth
        self._client_key = client_key
        self._registration = registration or ClientRegistration()
        self._registered: dict[str, ClientCredentials] = {}
        """Dynamic registrations by issuer: one authorization server's client is never shown to another."""
        self._needed = not isinstance(grant, AuthorizationCodeGrant)
        """Whether to get tokens before being asked; an authorization_code client waits for a challenge."""
        self._rediscover = False
        self._issuer_url: str | None = None
        self._legacy = False
        """No protected resource metadata: a 2025-03-26 server, whose origin is the authorization server."""
        self._leeway = leeway
        self._clock = clock
        self._http: httpx.AsyncClient | None = None
        self._server_url = ""
        self.resource: str | None = None
        """The MCP server's canonical resource (from its metadata, else its URL)."""
        self._challenge_metadata: str | None = None
        self._described: str | None = None
        """A resource below the server URL that its metadata describes (the URL likely stops short of it)."""
        self._as: dict[str, Any] | None = None
        self._tokens: list[_Token] = []
        self._refresh_token: str | None = None
        self._lock = anyio.Lock()
        self._ceiling: frozenset[str] | None = None
        """Set by :meth:`narrow`: no refresh or grant reaches beyond it until a re-authorization."""
        self.narrowed: list[tuple[frozenset[str], frozenset[str]]] = []
        """Every (asked for, granted) pair where the AS granted less than was asked: for logs and tests."""
        self._dpop = dpop is not None and dpop is not False
        """Asked for explicitly (True or a key); ``None``: used when the servers' metadata advertise it."""
        self._dpop_auto = dpop is None
        key = dpop if isinstance(dpop, DpopKey) else DpopKey(clock=clock) if dpop is not False else None
        self.dpop_key = key
        """The client's DPoP key (one per client object), ``None`` when DPoP is turned off."""
        self._token_flow = DpopFlow(key, token_requests=True) if key is not None else None
        self._resource_flow = DpopFlow(key, token_requests=False, bound=self._bound) if key is not None else None
        self._prm_requires_dpop = False
        self._bearer_only = False
        """The resource refused our bound token with a ``Bearer`` challenge alone: it takes no DPoP tokens."""

    def bind(self, http: httpx.AsyncClient, server_url: str) -> None:
        self._http = http
        self._server_url = server_url
        self.resource = canonical_resource(server_url)

    def request_auth(self) -> httpx.Auth | None:
        return self._resource_flow

    def _bound(self, value: str) -> bool:
        """Whether ``value`` is a DPoP-bound token of ours (the flow then sends it as ``DPoP`` with a proof)."""
        return any(t.dpop and t.value == value for t in self._tokens)

    def _uses_dpop(self, metadata: Mapping[str, Any]) -> bool:
        """Ask for DPoP-bound tokens: when told to, or when the authorization server advertises our algorithm
        (``dpop_signing_alg_values_supported``) or the resource requires bound tokens."""
        if self.dpop_key is None:
            return False
        if self._dpop:
            return True
        if self._bearer_only and not self._prm_requires_dpop:
            return False
        algs = metadata.get("dpop_signing_alg_values_supported")
        advertised = isinstance(algs, list) and self.dpop_key.alg in algs
        return advertised or self._prm_requires_dpop

    def challenged(self, challenge: Challenge) -> None:
        self._needed = True
        if challenge.resource_metadata and challenge.resource_metadata != self._challenge_metadata:
            self._challenge_metadata = challenge.resource_metadata
        self._scope.challenged(challenge.scope)
        if challenge.error != "insufficient_scope":
            self._rediscover = True  # the token was not accepted at all: its issuer may no longer be trusted
            if self._dpop_auto and not challenge.dpop_offered and any(t.dpop for t in self._tokens):
                # an AS that binds tokens in front of a resource that only knows Bearer (Keycloak, Okta or Auth0
                # before a server without DPoP): asked again for bound tokens, it would refuse each one
                log.info("the server refused a DPoP-bound token and offers only Bearer: asking for bearer tokens")
                self._bearer_only = True

    async def token(self, resources: frozenset[str]) -> str | None:
        async with self._lock:
            if not self._needed:
                return None
            await self._authorization_server()  # first: the metadata may name the resource to ask for
            wanted = self._wanted(resources)
            cached = self._cached(wanted)
            if cached is not None:
                return cached.value
            held = self._newest()
            if self._ceiling is not None and not wanted <= self._ceiling and held is not None:
                log.info(
                    "privileges narrowed to %s; presenting that token for %s", _names(held.audience), _names(wanted)
                )
                return held.value
            if self._refresh_token is not None:
                try:
                    refreshed = await self._refresh(wanted)
                except TokenEndpointError as exc:
                    log.info("refresh for %s failed (%s); asking for a new grant", _names(wanted), exc.error)
                else:
                    if self._covers(refreshed, wanted):
                        return refreshed.value
            try:
                return (await self._new_grant(wanted)).value
            except TokenEndpointError as exc:
                held = self._newest()
                if held is None:
                    raise
                log.info(
                    "no token for %s (%s); presenting one for %s", _names(wanted), exc.error, _names(held.audience)
                )
                return held.value

    async def reauthorize(self, resources: frozenset[str], scopes: frozenset[str] = frozenset()) -> None:
        """A fresh grant for ``resources`` and the union of the scopes asked for so far with ``scopes`` (a refresh
        cannot widen a grant); every cached token that was refused is forgotten."""
        async with self._lock:
            self._needed = True
            self._scope.challenged(" ".join(sorted(scopes)))
            if self._rediscover:
                self._rediscover = False
                self._as = None
            await self._authorization_server()
            wanted = self._wanted(resources)
            self._tokens = [t for t in self._tokens if not self._covers(t, wanted)]
            token = await self._new_grant(wanted)
            if not self._covers(token, wanted):
                raise AuthorizationFailed(
                    f"the authorization server granted {_names(token.audience)} when asked for {_names(wanted)}"
                )
            self._ceiling = None

    async def narrow(self, resources: Iterable[str]) -> None:
        """Drop privileges: a token for exactly ``resources`` replaces every token held.

        It comes from a refresh (least privilege) when the grant has a refresh token, else from a new grant.
        Until the next re-authorization nothing wider is asked for: a request that needs more presents the
        narrowed token, and the server's refusal is what starts the fresh grant.
        """
        async with self._lock:
            wanted = self._wanted(frozenset(resources))
            if self._refresh_token is not None:
                token = await self._refresh(wanted)
            else:
                token = await self._new_grant(wanted)
            self._tokens = [token]
            self._ceiling = token.audience
            log.info("privileges narrowed to %s", _names(token.audience))

    async def exchange(self, subject_token: str, scopes: Iterable[str], audience: str | None = None) -> ExchangedToken:
        """RFC 8693 token exchange: ``subject_token`` (an access token someone else presented to us) traded at the
        authorization server of the MCP server this client is bound to, for an access token for that server
        (``resource``; ``audience`` too when the AS wants a logical name) holding ``scopes``.

        The token is returned, never kept: it speaks for the subject token's user, and this client's own tokens
        (what :meth:`token` presents) must stay its own. A refusal is :class:`TokenEndpointError`.
        """
        async with self._lock:
            metadata = await self._authorization_server()
        assert self.resource is not None, "OAuth is not bound to a client yet"
        form = [
            ("grant_type", TOKEN_EXCHANGE),
            ("subject_token", subject_token),
            ("subject_token_type", ACCESS_TOKEN_TYPE),
            ("requested_token_type", ACCESS_TOKEN_TYPE),
            ("resource", self.resource),
        ]
        if audience is not None:
            form.append(("audience", audience))
        wanted = " ".join(sorted(scopes))
        if wanted:
            form.append(("scope", wanted))
        body = await self._post_token(metadata, form)
        expires_in = body.get("expires_in")
        lifetime = (
            float(expires_in) if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) else None
        )
        return ExchangedToken(str(body["access_token"]), None if lifetime is None else self._clock() + lifetime)

    # ---- token cache --------------------------------------------------------------------------------

    def _wanted(self, resources: frozenset[str]) -> frozenset[str]:
        if resources:
            return frozenset(canonical_resource(r) for r in resources)
        return frozenset({self.resource or canonical_resource(self._server_url)})

    @staticmethod
    def _covers(token: _Token, wanted: frozenset[str]) -> bool:
        """Exact coverage: a token for the whole server is not used for one tool (least privilege)."""
        return wanted <= token.audience

    def _newest(self) -> _Token | None:
        """The newest token that has not expired yet, whatever it covers (for the server to judge)."""
        alive = self._alive(0.0)
        return max(alive, key=lambda t: t.issued_at) if alive else None

    def _cached(self, wanted: frozenset[str]) -> _Token | None:
        """The newest token covering ``wanted`` that is not about to expire."""
        usable = [t for t in self._alive(self._leeway) if self._covers(t, wanted)]
        return max(usable, key=lambda t: t.issued_at) if usable else None

    def _alive(self, margin: float) -> list[_Token]:
        now = self._clock()
        self._tokens = [t for t in self._tokens if t.expires_at is None or t.expires_at > now]
        return [t for t in self._tokens if t.expires_at is None or t.expires_at - margin > now]

    # ---- token requests -----------------------------------------------------------------------------

    async def _new_grant(self, wanted: frozenset[str]) -> _Token:
        metadata = await self._authorization_server()
        if isinstance(self._grant, AuthorizationCodeGrant):
            return await self._authorization_code(metadata, self._grant, wanted)
        if isinstance(self._grant, JwtBearerGrant):
            assert self.resource is not None
            assertion = await self._grant.obtain(str(metadata.get("issuer")), self.resource, self._client())
            return await self._token_request(metadata, {"grant_type": JWT_BEARER, "assertion": assertion}, wanted)
        return await self._token_request(metadata, {"grant_type": "client_credentials"}, wanted)

    async def _refresh(self, wanted: frozenset[str]) -> _Token:
        metadata = await self._authorization_server()
        assert self._refresh_token is not None
        params = {"grant_type": "refresh_token", "refresh_token": self._refresh_token}
        return await self._token_request(metadata, params, wanted, with_scope=False)

    async def _authorization_code(
        self, metadata: Mapping[str, Any], grant: AuthorizationCodeGrant, wanted: frozenset[str]
    ) -> _Token:
        endpoint = metadata.get("authorization_endpoint")
        if not isinstance(endpoint, str):
            raise AuthorizationFailed("the authorization server metadata has no authorization_endpoint")
        verifier, challenge = pkce_pair()
        state = secrets.token_urlsafe(16)
        client = await self._credentials(metadata)
        query: list[tuple[str, str]] = [
            ("response_type", "code"),
            ("client_id", client.client_id),
            ("redirect_uri", grant.redirect_uri),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256"),
            ("state", state),
            *(("resource", r) for r in sorted(wanted)),
        ]
        scope = self._scope.current()
        if scope is not None:
            query.append(("scope", scope))
        if grant.login_hint:
            query.append(("login_hint", grant.login_hint))
        separator = "&" if urlsplit(endpoint).query else "?"
        returned = await grant.handler(endpoint + separator + urlencode(query))
        params = {k: v[0] for k, v in parse_qs(urlsplit(returned).query).items()}
        if params.get("state") != state:
            raise AuthorizationFailed("the authorization response does not carry our state")
        issuer = metadata.get("issuer")
        iss_expected = "iss" in params or metadata.get("authorization_response_iss_parameter_supported") is True
        if iss_expected and params.get("iss") != issuer:
            raise AuthorizationFailed(f"authorization response iss {params.get('iss')!r} is not {issuer!r}")
        if "error" in params:
            raise AuthorizationFailed(
                f"authorization refused: {params['error']}: {params.get('error_description', '')}"
            )
        code = params.get("code")
        if not code:
            raise AuthorizationFailed("the authorization response carries no code")
        exchange = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": grant.redirect_uri,
            "code_verifier": verifier,
        }
        return await self._token_request(metadata, exchange, wanted, with_scope=False)

    async def _token_request(
        self, metadata: Mapping[str, Any], params: Mapping[str, str], wanted: frozenset[str], with_scope: bool = True
    ) -> _Token:
        form: list[tuple[str, str]] = [*params.items(), *(("resource", r) for r in sorted(wanted))]
        scope = self._scope.current()
        if with_scope and scope is not None:
            form.append(("scope", scope))
        return self._store(await self._post_token(metadata, form), wanted)

    async def _post_token(self, metadata: Mapping[str, Any], form: list[tuple[str, str]]) -> Mapping[str, Any]:
        """One token request with this client's authentication (and a DPoP proof when tokens are bound): the
        answer's body, or :class:`TokenEndpointError`."""
        endpoint = metadata.get("token_endpoint")
        if not isinstance(endpoint, str):
            raise AuthorizationFailed("the authorization server metadata has no token_endpoint")
        headers = dict(_FORM_HEADERS)
        client = await self._credentials(metadata)
        if client.client_secret is not None and client.auth_method == "client_secret_basic":
            # RFC 6749 §2.3.1: both parts are form-urlencoded before base64.
            pair = f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        else:
            form.append(("client_id", client.client_id))
            if client.client_secret is not None and client.auth_method == "client_secret_post":
                form.append(("client_secret", client.client_secret))
            if self._client_key is not None and client.auth_method == PRIVATE_KEY_JWT:
                form.append(("client_assertion_type", CLIENT_ASSERTION_TYPE))
                form.append(("client_assertion", self._client_key.assertion(client.client_id, metadata)))
        body_bytes = urlencode(form)
        flow = self._token_flow if self._uses_dpop(metadata) else None
        auth: httpx.Auth | httpx._client.UseClientDefault = flow if flow is not None else httpx.USE_CLIENT_DEFAULT
        try:
            try:
                response = await self._client().post(endpoint, content=body_bytes, headers=headers, auth=auth)
            except _STALE_CONNECTION:
                # A pooled connection the server (or a proxy in front of it, across a restart) closed while idle
                # fails the first request sent on it. Sent once more on a fresh connection: a code or refresh token
                # the server did consume is then refused (invalid_grant), explicitly; it is never used twice.
                response = await self._client().post(endpoint, content=body_bytes, headers=headers, auth=auth)
        except httpx.HTTPError as exc:
            raise AuthorizationFailed(f"cannot reach the token endpoint {endpoint}: {describe_failure(exc)}") from exc
        body = json_object(response.content)
        if response.status_code != 200 or not isinstance(body.get("access_token"), str):
            error = str(body.get("error") or f"HTTP {response.status_code}")
            unsigned = (
                error == "invalid_client"
                and client.client_secret is None
                and self._client_key is None
                and self.client_id is not None
            )
            secretless = client.client_id if unsigned else None  # the caller's client, not a registration of ours
            raise TokenEndpointError(error, str(body.get("error_description", "")), secretless, self._described)
        return body

    def _store(self, body: Mapping[str, Any], wanted: frozenset[str]) -> _Token:
        value = str(body["access_token"])
        now = self._clock()
        expires_in = body.get("expires_in")
        audience = unverified_audience(value)
        if audience is None:
            audience = wanted  # an opaque token: the AS did not say otherwise
        elif not wanted <= audience:
            self.narrowed.append((wanted, audience))
            log.warning("token narrowed: asked for %s, granted %s", _names(wanted), _names(audience))
        token_type = body.get("token_type")
        token = _Token(
            value,
            audience,
            now + float(expires_in) if isinstance(expires_in, int | float) else None,
            now,
            dpop=isinstance(token_type, str) and token_type.lower() == "dpop" and self.dpop_key is not None,
        )
        if isinstance(body.get("refresh_token"), str):
            self._refresh_token = str(body["refresh_token"])
        self._tokens.append(token)
        return token

    async def _credentials(self, metadata: Mapping[str, Any]) -> ClientCredentials:
        """Who we are at this authorization server: the configured client, else its own registration."""
        if self.client_id is not None:
            method = self._token_auth or choose_auth_method(metadata, self._secret is not None)
            return ClientCredentials(self.client_id, self._secret, method)
        issuer = str(metadata.get("issuer"))
        known = self._registered.get(issuer)
        if known is None:
            assert isinstance(self._grant, AuthorizationCodeGrant)
            known = await register_client(self._client(), metadata, self._registration, self._grant.redirect_uri)
            self._registered[issuer] = known
        return known

    # ---- metadata -----------------------------------------------------------------------------------

    async def _authorization_server(self) -> Mapping[str, Any]:
        if self._as is not None:
            return self._as
        previous = self._issuer_url
        issuer = self._issuer_url = await self._issuer()
        if previous is not None and issuer != previous:
            log.warning("the server moved from authorization server %s to %s", previous, issuer)
            self._tokens, self._refresh_token = [], None
        for url in authorization_server_metadata_urls(issuer):
            document = await self._get_json(url)
            if document is None:
                continue
            if document.get("issuer") != issuer:
                raise AuthorizationFailed(
                    f"authorization server metadata at {url} names issuer {document.get('issuer')!r}"
                )
            self._as = document
            return document
        if self._legacy:
            self._as = legacy_authorization_server(issuer)
            return self._as
        raise AuthorizationFailed(f"no authorization server metadata for {issuer}")

    async def _issuer(self) -> str:
        for url in protected_resource_metadata_urls(self._server_url, self._challenge_metadata):
            document = await self._get_json(url)
            if document is None:
                continue
            resource = document.get("resource")
            servers = document.get("authorization_servers")
            if not isinstance(resource, str) or not self._ours(resource):
                raise AuthorizationFailed(f"protected resource metadata at {url} is for {resource!r}, not this server")
            if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
                raise AuthorizationFailed(f"protected resource metadata at {url} names no authorization server")
            theirs, mine = canonical_resource(resource), canonical_resource(self._server_url)
            covers = theirs == mine or mine.startswith(theirs + "/")
            if covers:
                self.resource = theirs  # sent exactly as published, even where it names the whole origin
            self._described = None if covers else theirs
            self._scope.advertised(document.get("scopes_supported"))
            self._prm_requires_dpop = document.get("dpop_bound_access_tokens_required") is True
            self._legacy = False
            return servers[0]
        # Servers from before RFC 9728 (2025-03-26): the MCP server's origin is the authorization server.
        self._legacy = True
        parts = urlsplit(self._server_url)
        return f"{parts.scheme}://{parts.netloc}"

    def _ours(self, resource: str) -> bool:
        """The metadata describes this MCP server, one of its tools (below its URL), or a resource above it.

        A resource above it on the same origin is what RFC 9728 has the root well-known URI describe; a
        resource on another origin (or beside this server) is someone else's.
        """
        try:
            theirs = canonical_resource(resource)
        except InvalidResource:
            return False
        mine = canonical_resource(self._server_url)
        return theirs == mine or theirs.startswith(mine + "/") or mine.startswith(theirs + "/")

    async def _get_json(self, url: str) -> dict[str, Any] | None:
        try:
            response = await self._client().get(url, headers={"Accept": "application/json"})
        except (httpx.NetworkError, httpx.TimeoutException) as exc:
            if self._issuer_url is None and urlsplit(url).netloc == urlsplit(self._server_url).netloc:
                # First contact (the handshake's discovery) and the MCP server's own origin is down, resets or is
                # silent: no token can help, and saying so is the honest outcome. Later rediscoveries keep the
                # metadata they knew.
                raise unreachable(self._server_url, exc) from exc
            log.info("metadata at %s unreachable: %r", url, exc)
            return None
        except httpx.HTTPError as exc:
            log.info("metadata at %s unreachable: %r", url, exc)
            return None
        if response.status_code != 200:
            return None
        document = json_object(response.content)
        return document or None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("OAuth is not bound to a client yet")
        return self._http


_FORM_HEADERS = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a request sent on a connection the peer had already closed fails with."""


def _names(resources: Iterable[str]) -> str:
    return " ".join(sorted(resources)) or "(nothing)"


# ---- the loopback redirect for command-line use ------------------------------------------------------


class LoopbackRedirect:
    """Receives one authorization response on ``http://127.0.0.1:<port>/callback``.

    Use ``async with LoopbackRedirect(show) as redirect:`` and pass ``AuthorizationCodeGrant(
    redirect.uri, redirect)``; ``show`` is given the authorization URL (print it, open a browser).
    """

    def __init__(self, show: Callable[[str], None], path: str = "/callback") -> None:
        self._show = show
        self._path = path
        self._listener: SocketListener | None = None
        self.uri = ""

    async def __aenter__(self) -> LoopbackRedirect:
        listeners = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        listener = listeners.listeners[0]
        assert isinstance(listener, SocketListener)
        self._listener = listener
        port = listener.extra(SocketAttribute.local_port)
        self.uri = f"http://127.0.0.1:{port}{self._path}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._listener is not None:
            await self._listener.aclose()

    async def __call__(self, authorization_url: str) -> str:
        if self._listener is None:
            raise RuntimeError("use LoopbackRedirect inside 'async with'")
        self._show(authorization_url)
        while True:
            stream = await self._listener.accept()
            async with stream:
                request = await _read_head(stream)
                target = request.split(" ", 2)[1] if request.count(" ") >= 2 else ""
                if urlsplit(target).path != self._path:
                    await stream.send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    continue
                page = b"<!doctype html><title>mcp-lossless</title><p>Done. You can close this window.</p>"
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n"
                await stream.send(head + b"Content-Length: %d\r\n\r\n" % len(page) + page)
                return f"http://127.0.0.1{target}"


async def _read_head(stream: ByteStream, limit: int = 16384) -> str:
    data = b""
    while b"\r\n" not in data and len(data) < limit:
        chunk = await stream.receive()
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0].decode("latin-1")
