"""The embedded development authorization server, so mcp-lossless runs with nothing else installed.

A raw ASGI app serving RFC 8414 metadata, a JWKS, ``/authorize`` (code + PKCE S256, with a consent step),
``/token`` (client_credentials, authorization_code, refresh_token, and RFC 8693 token exchange under a policy,
:mod:`.exchange`) with RFC 8707 resource indicators, and
``/register`` (RFC 7591), issuing RFC 9068 JWT access tokens. Clients are configured, built in
(``dev-public``), registered, or named by a Client ID Metadata Document URL (:mod:`.clients`). Switches
imitate the behaviours a client must survive from real ASes: ``single_audience`` (oidc-provider: one
audience per token) and ``least_privilege`` (refresh narrows exactly). All state is in memory and bounded.
"""

from __future__ import annotations

import binascii
import hashlib
import re
import secrets
import time
from base64 import b64decode
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus, urlencode, urlsplit, urlunsplit

import orjson
from joserfc.jwk import KeySet

from ..asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, read_body, respond, respond_json
from ..core.dpop import ALGORITHMS as DPOP_ALGORITHMS
from ..core.dpop import NONCE_PERIOD, ProofRefusal, ReplayCache, accepted_nonces, server_nonce, verify_proof
from ..core.token_exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from .clients import GRANT_TYPES, ClientRegistry, KnownClient
from .consent import BROWSER_COOKIE, PAGE_HEADERS, PendingConsents, consent_page, error_page
from .exchange import ExchangePolicy, ExchangeRule
from .forms import MAX_BODY, Params, form_params, optional, query_params, required
from .grants import GrantStore, Issue, OAuthError, ResourceRules
from .keys import SigningKeys

NO_STORE = ((b"cache-control", b"no-store"), (b"pragma", b"no-cache"))
HTML = b"text/html; charset=utf-8"
S256_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")
MAX_SUBJECT = 200
_COOKIE_VALUE = re.compile(r"[A-Za-z0-9_-]{20,64}")


class DevAuthServer:
    """An OAuth 2.1 authorization server for development and tests (ASGI app)."""

    def __init__(
        self,
        issuer: str,
        *,
        resources: Callable[[], Collection[str]] | Collection[str],
        aggregate: str,
        clients: Mapping[str, str],
        public_clients: Collection[str] = ("dev-public",),
        least_privilege: bool = False,
        single_audience: bool = False,
        auto_approve: bool = False,
        token_ttl: int = 600,
        refresh_ttl: int = 8 * 3600,
        clock: Callable[[], float] = time.time,
        signing: SigningKeys | None = None,
        http_metadata_documents: bool = False,
        max_registrations: int = 100,
        dpop_nonce: bool = False,
        dpop_window: float = 60.0,
        exchange: Mapping[str, ExchangeRule] | None = None,
    ) -> None:
        """``auto_approve`` skips the consent page (the subject is then ``login_hint`` or ``dev-user``): for
        loopback development and tests only. ``http_metadata_documents`` accepts ``http://`` client ID
        metadata document URLs on loopback hosts (tests). ``dpop_nonce``: a token request's DPoP proof must carry
        a nonce of this AS (RFC 9449 §8); ``dpop_window``: how far a proof's ``iat`` may be off the clock.
        ``exchange``: the token-exchange policy, by exchanging client (none: the grant is not offered)."""
        self.issuer = issuer
        self.path_prefix = urlsplit(issuer).path.rstrip("/")
        self._base = issuer.rstrip("/")
        self.rules = ResourceRules(
            resources, aggregate, least_privilege=least_privilege, single_audience=single_audience
        )
        self._clients = ClientRegistry(
            clients,
            public_clients,
            clock=clock,
            http_metadata_documents=http_metadata_documents,
            max_registrations=max_registrations,
        )
        self._auto_approve = auto_approve
        self._consents: PendingConsents[_AuthorizationRequest] = PendingConsents(clock)
        self._secure_cookie = urlsplit(issuer).scheme == "https"
        self._token_ttl = token_ttl
        self._clock = clock
        self._signing = signing if signing is not None else SigningKeys()
        """Fresh per process, or shared (``SigningKeys.shared``) by replicas that must accept each other's tokens."""
        self._store = GrantStore(self.rules, refresh_ttl=refresh_ttl, clock=clock)
        self._dpop_window = dpop_window
        self._dpop_nonce_key = secrets.token_bytes(32) if dpop_nonce else None
        self._dpop_replays = ReplayCache(10_000, clock)
        self._exchange = ExchangePolicy(exchange or {}, self._own_token)
        self.jwks_requests = 0
        """How often the JWKS was served: lets tests prove a verifier does not fetch it in a storm."""
        self._metadata_paths = frozenset(
            {
                self.path_prefix,  # the issuer URL itself, which `serve` prints: what a curious user opens first
                "/.well-known/oauth-authorization-server" + self.path_prefix,
                "/.well-known/openid-configuration" + self.path_prefix,
                self.path_prefix + "/.well-known/openid-configuration",
            }
        )
        self.metadata: dict[str, Any] = {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self._base}/authorize",
            "token_endpoint": f"{self._base}/token",
            "jwks_uri": f"{self._base}/jwks",
            "grant_types_supported": sorted({*GRANT_TYPES, *([TOKEN_EXCHANGE] if self._exchange else [])}),
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
            "authorization_response_iss_parameter_supported": True,
            "registration_endpoint": f"{self._base}/register",
            "client_id_metadata_document_supported": True,
            "dpop_signing_alg_values_supported": list(DPOP_ALGORITHMS),
        }

    def _own_token(self, token: str) -> Mapping[str, Any]:
        """The claims of an access token this AS issued and that has not expired (a token exchange's subject
        token), else ``invalid_grant``."""
        claims = self._signing.verified(token)
        if claims is None or claims.get("iss") != self.issuer:
            raise OAuthError("invalid_grant", "subject_token is not an access token of this authorization server")
        expires = claims.get("exp")
        if not isinstance(expires, int | float) or expires <= self._clock():
            raise OAuthError("invalid_grant", "subject_token expired")
        return claims

    @property
    def keys(self) -> KeySet:
        """The public verification keys (old generations included), e.g. for ``StaticJwks``."""
        return self._signing.public

    def rotate_keys(self) -> None:
        """Sign with a fresh key pair from now on; the old keys stay published."""
        self._signing.rotate()

    def current_kid(self, alg: str = "RS256") -> str:
        return self._signing.current_kid(alg)

    def handles(self, path: str) -> bool:
        """Whether a request path belongs to this AS (for mounting it inside another app)."""
        return path in self._metadata_paths or path.startswith(self.path_prefix + "/")

    def mint(
        self,
        *,
        subject: str,
        client_id: str,
        audience: Sequence[str],
        ttl: int | None = None,
        scopes: Collection[str] = (),
        alg: str = "RS256",
        jkt: str | None = None,
        actor: str | None = None,
    ) -> str:
        """A signed access token as the token endpoint would issue it (tests use this directly); ``jkt`` binds it
        to a DPoP key (``cnf.jkt``, RFC 9449 §6.1); ``actor`` is the client acting for ``subject`` (``act``)."""
        now = int(self._clock())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject,
            "client_id": client_id,
            "aud": audience[0] if len(audience) == 1 else list(audience),
            "iat": now,
            "nbf": now,
            "exp": now + (self._token_ttl if ttl is None else ttl),
            "jti": secrets.token_urlsafe(16),
        }
        if scopes:
            claims["scope"] = " ".join(scopes)
        if jkt is not None:
            claims["cnf"] = {"jkt": jkt}
        if actor is not None:
            claims["act"] = {"sub": actor}
        return self._signing.sign(claims, alg)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            try:
                await self._route(scope, receive, send)
            except BodyTooLarge:
                await _oauth_error(send, OAuthError("invalid_request", "request body exceeds 64 KiB", 413))
            except ClientGone:
                return

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in self._metadata_paths:
            if method != "GET":
                await _not_allowed(send, b"GET")
            else:
                await respond_json(send, 200, self.metadata)
        elif path == f"{self.path_prefix}/jwks":
            if method != "GET":
                await _not_allowed(send, b"GET")
            else:
                self.jwks_requests += 1
                await respond_json(send, 200, self._signing.jwks())
        elif path == f"{self.path_prefix}/token":
            if method != "POST":
                await _not_allowed(send, b"POST")
            else:
                await self._token(scope, receive, send)
        elif path == f"{self.path_prefix}/register":
            if method != "POST":
                await _not_allowed(send, b"POST")
            else:
                await self._register(scope, receive, send)
        elif path == f"{self.path_prefix}/authorize":
            if method not in ("GET", "POST"):
                await _not_allowed(send, b"GET, POST")
            else:
                await self._authorize(scope, receive, send)
        else:
            await respond_json(send, 404, {"error": "not_found", "error_description": f"no endpoint at {path}"})

    # -- token endpoint ---------------------------------------------------------------------------

    async def _token(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            params = await form_params(scope, receive)
            jkt = self._dpop_proof(scope)
            client = await self._authenticate(scope, params)
            issue = await self._grant(client, params, jkt)
        except OAuthError as err:
            await _oauth_error(send, err)
            return
        ttl = self._token_ttl
        if issue.not_after is not None:
            ttl = min(ttl, int(issue.not_after - self._clock()))
        body: dict[str, Any] = {
            "access_token": self.mint(
                subject=issue.subject,
                client_id=issue.client_id,
                audience=issue.audience,
                ttl=ttl,
                scopes=issue.scope.split(),
                jkt=jkt,
                actor=issue.actor,
            ),
            "token_type": "Bearer" if jkt is None else "DPoP",
            "expires_in": ttl,
        }
        if issue.actor is not None:
            body["issued_token_type"] = ACCESS_TOKEN_TYPE
        if issue.scope:
            body["scope"] = issue.scope
        if issue.refresh_token is not None:
            body["refresh_token"] = issue.refresh_token
        await respond_json(send, 200, body, NO_STORE)

    def _dpop_proof(self, scope: Scope) -> str | None:
        """The thumbprint of the token request's DPoP key (RFC 9449 §5), ``None`` without a ``DPoP`` header; a bad
        proof is ``invalid_dpop_proof``, one without this AS's current nonce ``use_dpop_nonce`` (§8)."""
        proofs = [value for name, value in scope["headers"] if name.lower() == b"dpop"]
        if not proofs:
            return None
        if len(proofs) > 1:
            raise OAuthError("invalid_dpop_proof", "exactly one DPoP header is allowed")
        now = self._clock()
        key = self._dpop_nonce_key
        nonces = None if key is None else accepted_nonces(key, NONCE_PERIOD, now)
        endpoint = f"{self._base}/token"
        result = verify_proof(
            proofs[0].decode("latin-1"), "POST", endpoint, None, now, nonces, window=self._dpop_window
        )
        if isinstance(result, ProofRefusal):
            if result.error == "use_dpop_nonce" and key is not None:
                raise OAuthError("use_dpop_nonce", result.description, nonce=server_nonce(key, NONCE_PERIOD, now))
            raise OAuthError("invalid_dpop_proof", result.description)
        identity = hashlib.sha256(f"{result.jkt}\0{result.jti}".encode()).digest()[:20]
        if not self._dpop_replays.first_use(identity, result.iat + self._dpop_window + 1):
            raise OAuthError("invalid_dpop_proof", "this DPoP proof was used before (jti seen)")
        return result.jkt

    async def _grant(self, client: KnownClient, params: Params, jkt: str | None = None) -> Issue:
        grant_type = required(params, "grant_type")
        if grant_type == TOKEN_EXCHANGE and self._exchange:
            if client.public:
                raise OAuthError(
                    "unauthorized_client", "a public client cannot exchange tokens: the actor authenticates"
                )
            exchanged = self._exchange.exchange(client.client_id, params)
            return Issue(
                exchanged.subject,
                exchanged.actor,
                exchanged.audience,
                exchanged.scope,
                actor=exchanged.actor,
                not_after=exchanged.expires_at,
            )
        if grant_type not in GRANT_TYPES:
            raise OAuthError("unsupported_grant_type", f"grant_type {grant_type!r} is not supported")
        client.check_grant(grant_type)
        client_id = client.client_id
        requested = self.rules.parse(params.get("resource", []))
        scope = optional(params, "scope")
        if grant_type == "client_credentials":
            audience = requested or (self.rules.aggregate,)
            self.rules.check_single(audience)
            return Issue(client_id, client_id, audience, " ".join((scope or "").split()))
        if grant_type == "authorization_code":
            return self._store.exchange_code(
                required(params, "code"),
                client_id=client_id,
                redirect_uri=required(params, "redirect_uri"),
                verifier=required(params, "code_verifier"),
                requested=requested,
                scope=scope,
                public_client=client.public,
                jkt=jkt,
            )
        return self._store.refresh(
            required(params, "refresh_token"), client_id=client_id, requested=requested, scope=scope, jkt=jkt
        )

    async def _authenticate(self, scope: Scope, params: Params) -> KnownClient:
        """RFC 6749 §2.3: HTTP Basic or form credentials for confidential clients, bare client_id else."""
        authorization = header(scope, b"authorization")
        form_id, form_secret = optional(params, "client_id"), optional(params, "client_secret")
        secret: str | None
        if authorization is not None and authorization[:6].lower() == "basic ":
            if form_secret is not None:
                raise OAuthError("invalid_request", "use exactly one client authentication method")
            client_id, secret = _basic_credentials(authorization[6:])
            if form_id is not None and form_id != client_id:
                raise OAuthError("invalid_request", "client_id differs from the HTTP Basic credentials")
        elif form_id is not None:
            client_id, secret = form_id, form_secret
        else:
            raise OAuthError("invalid_client", "client authentication required", 401)
        return await self._clients.authenticate(client_id, secret)

    # -- registration endpoint (RFC 7591) -----------------------------------------------------------

    async def _register(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = (header(scope, b"content-type") or "").split(";")[0].strip().lower()
        try:
            if content_type != "application/json":
                raise OAuthError("invalid_client_metadata", "the registration request must be application/json")
            try:
                metadata = orjson.loads(await read_body(receive, MAX_BODY))
            except orjson.JSONDecodeError:
                raise OAuthError("invalid_client_metadata", "the registration request is not JSON") from None
            body = self._clients.register(metadata)
        except OAuthError as err:
            await _oauth_error(send, err)
            return
        await respond_json(send, 201, body, NO_STORE)

    # -- authorization endpoint -------------------------------------------------------------------

    async def _authorize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """GET: validate the request, then auto-approve or show the consent page. POST: the page's decision."""
        if scope["method"] == "POST":
            await self._consent_decision(scope, receive, send)
            return
        try:
            params = query_params(scope)
            client_id = required(params, "client_id")
            redirect_uri = required(params, "redirect_uri")
            client = await self._clients.find(client_id)
            if client is None:
                raise OAuthError("invalid_request", f"unknown client_id {client_id!r}")
            client.check_redirect(redirect_uri)
        except OAuthError as err:
            await respond(send, 400, error_page(err.description), HTML, (*NO_STORE, *PAGE_HEADERS))
            return
        state = params.get("state", [None])[0]
        try:
            request = self._authorization_request(params, client, redirect_uri)
            if not self._auto_approve:
                await self._show_consent(scope, send, request)
                return
            location = self._approve(request, request.subject, request.resources)
        except OAuthError as err:
            location = self._error_location(redirect_uri, state, err)
        await respond(send, 302, b"", None, ((b"location", location.encode()), *NO_STORE))

    def _authorization_request(self, params: Params, client: KnownClient, redirect_uri: str) -> _AuthorizationRequest:
        if optional(params, "response_type") != "code":
            raise OAuthError("unsupported_response_type", "response_type must be 'code'")
        client.check_grant("authorization_code")
        challenge = required(params, "code_challenge")
        if optional(params, "code_challenge_method") != "S256":
            raise OAuthError("invalid_request", "PKCE with code_challenge_method=S256 is required")
        if not S256_CHALLENGE.fullmatch(challenge):
            raise OAuthError("invalid_request", "code_challenge must be 43 base64url characters (S256)")
        return _AuthorizationRequest(
            client_id=client.client_id,
            client_name=client.name or client.client_id,
            redirect_uri=redirect_uri,
            state=optional(params, "state"),
            challenge=challenge,
            subject=(optional(params, "login_hint") or "dev-user")[:MAX_SUBJECT],
            resources=self.rules.parse(params.get("resource", [])) or (self.rules.aggregate,),
            scope=" ".join((optional(params, "scope") or "").split()),
        )

    async def _show_consent(self, scope: Scope, send: Send, request: _AuthorizationRequest) -> None:
        """Park the request and show it; the browser gets a cookie binding the page to it (CSRF)."""
        known = _cookie(scope, BROWSER_COOKIE)
        browser = known if known is not None else secrets.token_urlsafe(24)
        consent_id, csrf = self._consents.park(request, browser)
        offered = [(r, True) for r in request.resources]
        if self.rules.aggregate in request.resources:  # the owner may narrow the whole server to some tools
            offered += [(t, False) for t in sorted(self.rules.tools()) if t not in request.resources]
        page = consent_page(
            f"{self._base}/authorize",
            consent_id,
            csrf,
            request.client_name,
            request.subject,
            tuple(offered),
            request.scope,
        )
        headers = [*NO_STORE, *PAGE_HEADERS]
        if known is None:
            secure = "; Secure" if self._secure_cookie else ""
            cookie = f"{BROWSER_COOKIE}={browser}; Path={self.path_prefix or '/'}; HttpOnly; SameSite=Strict{secure}"
            headers.append((b"set-cookie", cookie.encode()))
        await respond(send, 200, page, HTML, headers)

    async def _consent_decision(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            origin = header(scope, b"origin")
            issuer = urlsplit(self.issuer)
            if origin is not None and origin != f"{issuer.scheme}://{issuer.netloc}":
                raise OAuthError("invalid_request", "the consent form was posted from another origin")
            params = await form_params(scope, receive)
            request = self._consents.take(
                required(params, "consent"), required(params, "csrf"), _cookie(scope, BROWSER_COOKIE)
            )
        except OAuthError as err:
            await respond(send, 400, error_page(err.description), HTML, (*NO_STORE, *PAGE_HEADERS))
            return
        try:
            decision = required(params, "decision")
            if decision == "deny":
                raise OAuthError("access_denied", "the resource owner denied the request")
            if decision != "approve":
                raise OAuthError("invalid_request", "decision must be 'approve' or 'deny'")
            subject = (optional(params, "subject") or "").strip()
            if not subject or len(subject) > MAX_SUBJECT:
                raise OAuthError("invalid_request", f"sign in as a subject of 1 to {MAX_SUBJECT} characters")
            chosen = self.rules.parse(params.get("resource", []))
            if not chosen:
                raise OAuthError("access_denied", "the resource owner approved no resource")
            self.rules.check_within(chosen, request.resources)
            location = self._approve(request, subject, chosen)
        except OAuthError as err:
            location = self._error_location(request.redirect_uri, request.state, err)
        await respond(send, 302, b"", None, ((b"location", location.encode()), *NO_STORE))

    def _approve(self, request: _AuthorizationRequest, subject: str, resources: tuple[str, ...]) -> str:
        """The redirect location with a fresh code for ``resources`` (all or some of those requested)."""
        code = self._store.issue_code(
            client_id=request.client_id,
            redirect_uri=request.redirect_uri,
            challenge=request.challenge,
            subject=subject,
            resources=resources,
            scope=request.scope,
            narrowed=set(resources) != set(request.resources),
        )
        return _with_query(request.redirect_uri, {"code": code, "state": request.state, "iss": self.issuer})

    def _error_location(self, redirect_uri: str, state: str | None, err: OAuthError) -> str:
        return _with_query(
            redirect_uri,
            {"error": err.error, "error_description": err.description, "state": state, "iss": self.issuer},
        )


@dataclass(frozen=True, slots=True)
class _AuthorizationRequest:
    client_id: str
    client_name: str
    redirect_uri: str
    state: str | None
    challenge: str
    subject: str
    resources: tuple[str, ...]
    scope: str


def _basic_credentials(encoded: str) -> tuple[str, str]:
    """RFC 6749 §2.3.1: client id and secret are form-urlencoded before base64."""
    try:
        decoded = b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise OAuthError("invalid_client", "malformed HTTP Basic credentials", 401) from None
    client_id, colon, secret = decoded.partition(":")
    if not colon:
        raise OAuthError("invalid_client", "malformed HTTP Basic credentials", 401)
    return unquote_plus(client_id), unquote_plus(secret)


def _cookie(scope: Scope, name: str) -> str | None:
    """A cookie this AS set (its values are base64url): anything else counts as absent."""
    for part in (header(scope, b"cookie") or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and _COOKIE_VALUE.fullmatch(value):
            return value
    return None


def _with_query(uri: str, params: Mapping[str, str | None]) -> str:
    parts = urlsplit(uri)
    added = urlencode({k: v for k, v in params.items() if v is not None})
    query = f"{parts.query}&{added}" if parts.query else added
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


async def _oauth_error(send: Send, err: OAuthError) -> None:
    headers: list[tuple[bytes, bytes]] = list(NO_STORE)
    if err.status == 401:
        headers.append((b"www-authenticate", b'Basic realm="mcp-lossless dev-as"'))
    if err.nonce is not None:
        headers.append((b"dpop-nonce", err.nonce.encode("ascii")))
    await respond_json(send, err.status, {"error": err.error, "error_description": err.description}, headers)


async def _not_allowed(send: Send, allow: bytes) -> None:
    body = {"error": "invalid_request", "error_description": "method not allowed"}
    await respond_json(send, 405, body, ((b"allow", allow),))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
