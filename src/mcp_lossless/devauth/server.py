"""The embedded development authorization server, so mcp-lossless runs with nothing else installed.

A raw ASGI app serving RFC 8414 metadata, a JWKS, ``/authorize`` (code + PKCE S256) and ``/token``
(client_credentials, authorization_code, refresh_token) with RFC 8707 resource indicators, issuing
RFC 9068 JWT access tokens. Switches imitate the behaviours a client must survive from real ASes:
``single_audience`` (oidc-provider: one audience per token) and ``least_privilege`` (refresh narrows
exactly). All state is in memory.
"""

from __future__ import annotations

import binascii
import hmac
import re
import secrets
import time
from base64 import b64decode
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus, urlencode, urlsplit, urlunsplit

from joserfc.jwk import KeySet

from ..asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, respond, respond_json
from .consent import consent_page, error_page
from .forms import Params, form_params, optional, query_params, required
from .grants import GrantStore, Issue, OAuthError, ResourceRules
from .keys import SigningKeys

NO_STORE = ((b"cache-control", b"no-store"), (b"pragma", b"no-cache"))
HTML = b"text/html; charset=utf-8"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
S256_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")
GRANT_TYPES = ("authorization_code", "client_credentials", "refresh_token")


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
        auto_approve: bool = True,
        token_ttl: int = 600,
        refresh_ttl: int = 86400,
        clock: Callable[[], float] = time.time,
        signing: SigningKeys | None = None,
    ) -> None:
        self.issuer = issuer
        self.path_prefix = urlsplit(issuer).path.rstrip("/")
        self._base = issuer.rstrip("/")
        self.rules = ResourceRules(
            resources, aggregate, least_privilege=least_privilege, single_audience=single_audience
        )
        self._clients = dict(clients)
        self._public_clients = frozenset(public_clients)
        self._auto_approve = auto_approve
        self._token_ttl = token_ttl
        self._clock = clock
        self._signing = signing if signing is not None else SigningKeys()
        """Fresh per process, or shared (``SigningKeys.shared``) by replicas that must accept each other's tokens."""
        self._store = GrantStore(self.rules, refresh_ttl=refresh_ttl, clock=clock)
        self.jwks_requests = 0
        """How often the JWKS was served: lets tests prove a verifier does not fetch it in a storm."""
        self._metadata_paths = frozenset(
            {
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
            "grant_types_supported": list(GRANT_TYPES),
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
            "authorization_response_iss_parameter_supported": True,
        }

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
    ) -> str:
        """A signed access token as the token endpoint would issue it (tests use this directly)."""
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
            client_id = self._authenticate(scope, params)
            issue = self._grant(client_id, params)
        except OAuthError as err:
            await _oauth_error(send, err)
            return
        body: dict[str, Any] = {
            "access_token": self.mint(
                subject=issue.subject,
                client_id=issue.client_id,
                audience=issue.audience,
                scopes=issue.scope.split(),
            ),
            "token_type": "Bearer",
            "expires_in": self._token_ttl,
        }
        if issue.scope:
            body["scope"] = issue.scope
        if issue.refresh_token is not None:
            body["refresh_token"] = issue.refresh_token
        await respond_json(send, 200, body, NO_STORE)

    def _grant(self, client_id: str, params: Params) -> Issue:
        grant_type = required(params, "grant_type")
        requested = self.rules.parse(params.get("resource", []))
        scope = optional(params, "scope")
        if grant_type == "client_credentials":
            if client_id in self._public_clients:
                raise OAuthError("unauthorized_client", "public clients cannot use client_credentials")
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
                public_client=client_id in self._public_clients,
            )
        if grant_type == "refresh_token":
            return self._store.refresh(
                required(params, "refresh_token"), client_id=client_id, requested=requested, scope=scope
            )
        raise OAuthError("unsupported_grant_type", f"grant_type {grant_type!r} is not supported")

    def _authenticate(self, scope: Scope, params: Params) -> str:
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
        expected = self._clients.get(client_id)
        if expected is not None:
            if secret is None or not hmac.compare_digest(secret.encode(), expected.encode()):
                raise OAuthError("invalid_client", "client authentication failed", 401)
        elif client_id not in self._public_clients or secret is not None:
            raise OAuthError("invalid_client", f"unknown client {client_id!r}", 401)
        return client_id

    # -- authorization endpoint -------------------------------------------------------------------

    async def _authorize(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            params = query_params(scope) if scope["method"] == "GET" else await form_params(scope, receive)
            client_id = required(params, "client_id")
            redirect_uri = required(params, "redirect_uri")
            if client_id not in self._clients and client_id not in self._public_clients:
                raise OAuthError("invalid_request", f"unknown client_id {client_id!r}")
            _check_redirect_uri(redirect_uri)
        except OAuthError as err:
            await respond(send, 400, error_page(err.description), HTML, NO_STORE)
            return
        state = params.get("state", [None])[0]
        try:
            request = self._authorization_request(params, client_id, redirect_uri)
            decision = optional(params, "decision")
            if decision is None and not self._auto_approve:
                page = consent_page(f"{self._base}/authorize", params, client_id, request.subject, request.resources)
                await respond(send, 200, page, HTML, NO_STORE)
                return
            location = self._decide(request, decision)
        except OAuthError as err:
            location = _with_query(
                redirect_uri,
                {"error": err.error, "error_description": err.description, "state": state, "iss": self.issuer},
            )
        await respond(send, 302, b"", None, ((b"location", location.encode()), *NO_STORE))

    def _authorization_request(self, params: Params, client_id: str, redirect_uri: str) -> _AuthorizationRequest:
        if optional(params, "response_type") != "code":
            raise OAuthError("unsupported_response_type", "response_type must be 'code'")
        challenge = required(params, "code_challenge")
        if optional(params, "code_challenge_method") != "S256":
            raise OAuthError("invalid_request", "PKCE with code_challenge_method=S256 is required")
        if not S256_CHALLENGE.fullmatch(challenge):
            raise OAuthError("invalid_request", "code_challenge must be 43 base64url characters (S256)")
        return _AuthorizationRequest(
            client_id=client_id,
            redirect_uri=redirect_uri,
            state=optional(params, "state"),
            challenge=challenge,
            subject=optional(params, "login_hint") or "dev-user",
            resources=self.rules.parse(params.get("resource", [])) or (self.rules.aggregate,),
            scope=" ".join((optional(params, "scope") or "").split()),
        )

    def _decide(self, request: _AuthorizationRequest, decision: str | None) -> str:
        """The redirect location: a fresh code on approval (or auto-approval), else an OAuthError."""
        if decision == "deny":
            raise OAuthError("access_denied", "the resource owner denied the request")
        if decision not in (None, "approve"):
            raise OAuthError("invalid_request", "decision must be 'approve' or 'deny'")
        code = self._store.issue_code(
            client_id=request.client_id,
            redirect_uri=request.redirect_uri,
            challenge=request.challenge,
            subject=request.subject,
            resources=request.resources,
            scope=request.scope,
        )
        return _with_query(request.redirect_uri, {"code": code, "state": request.state, "iss": self.issuer})


@dataclass(frozen=True, slots=True)
class _AuthorizationRequest:
    client_id: str
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


def _check_redirect_uri(uri: str) -> None:
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK_HOSTS or parts.fragment:
        raise OAuthError("invalid_request", "redirect_uri must be a loopback http(s) URI without a fragment")


def _with_query(uri: str, params: Mapping[str, str | None]) -> str:
    parts = urlsplit(uri)
    added = urlencode({k: v for k, v in params.items() if v is not None})
    query = f"{parts.query}&{added}" if parts.query else added
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


async def _oauth_error(send: Send, err: OAuthError) -> None:
    headers: list[tuple[bytes, bytes]] = list(NO_STORE)
    if err.status == 401:
        headers.append((b"www-authenticate", b'Basic realm="mcp-lossless dev-as"'))
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
