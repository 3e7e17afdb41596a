"""Who may ask the development AS for tokens: configured, built-in public, registered and CIMD clients.

Four kinds of client, one lookup:

- *configured* confidential clients (``--dev-client ID:SECRET``), which never expire;
- *built-in* public clients (``dev-public``): PKCE only, any loopback redirect URI;
- *registered* clients (RFC 7591 dynamic registration): public or confidential, bounded in number and
  expiring, redirect URIs fixed at registration;
- *metadata-document* clients (Client ID Metadata Documents): the ``client_id`` is an HTTPS URL whose
  JSON document names the client and its redirect URIs; fetched on use, cached briefly.

Redirect URIs are parsed strictly (RFC 3986, no userinfo, no backslash, loopback hosts only) before any
comparison, because parsers disagree on the rest: ``http://evil.example\\@127.0.0.1/cb`` is loopback to
Python's ``urlsplit`` and ``evil.example`` to every browser. A registered URI matches exactly, except
that a loopback one matches on any port (RFC 8252 §7.3).
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from .grants import OAuthError

MAX_REGISTRATIONS = 100
REGISTRATION_TTL = 24 * 3600.0
MAX_DOCUMENTS = 100
DOCUMENT_TTL = 300.0
MAX_DOCUMENT_BYTES = 64 * 1024
DOCUMENT_TIMEOUT = 5.0
MAX_REDIRECT_URIS = 10
MAX_URI_LENGTH = 2048
AUTH_FAILED = "client authentication failed"
"""The one answer for an unknown client and a wrong secret: the token endpoint is no client-id oracle."""

_PATH_CHAR = r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2}"
_REDIRECT = re.compile(
    r"(?P<scheme>https?)://(?P<host>127\.0\.0\.1|localhost|\[::1\])(?::(?P<port>[0-9]{1,5}))?"
    rf"(?P<path>/(?:{_PATH_CHAR})*)?(?P<query>\?(?:{_PATH_CHAR}|\?)*)?"
)
"""An absolute http(s) URI on a loopback host with only RFC 3986 characters: no userinfo, no fragment."""

GRANT_TYPES = frozenset({"authorization_code", "refresh_token", "client_credentials"})
TOKEN_AUTH_METHODS = frozenset({"none", "client_secret_basic", "client_secret_post"})


@dataclass(frozen=True, slots=True)
class RedirectUri:
    """A strictly parsed loopback redirect URI; ``port`` is ignored when comparing (RFC 8252 §7.3)."""

    scheme: str
    host: str
    port: int | None
    rest: str

    def matches(self, other: RedirectUri) -> bool:
        return (self.scheme, self.host, self.rest) == (other.scheme, other.host, other.rest)


def parse_redirect_uri(uri: str) -> RedirectUri:
    """The parsed URI, or ``invalid_request`` naming why it is refused."""
    if len(uri) > MAX_URI_LENGTH:
        raise OAuthError("invalid_request", f"redirect_uri longer than {MAX_URI_LENGTH} characters")
    match = _REDIRECT.fullmatch(uri)
    if match is None:
        raise OAuthError(
            "invalid_request",
            "redirect_uri must be an http(s) URI on a loopback host (127.0.0.1, localhost, [::1]) with no "
            "userinfo, backslash, fragment or characters outside RFC 3986",
        )
    port = match["port"]
    if port is not None and not 0 < int(port) < 65536:
        raise OAuthError("invalid_request", "redirect_uri port out of range on the loopback host")
    rest = (match["path"] or "") + (match["query"] or "")
    return RedirectUri(match["scheme"], match["host"], int(port) if port else None, rest)


@dataclass(frozen=True, slots=True)
class KnownClient:
    """A client as the AS knows it. ``redirect_uris`` empty: any loopback URI (built-in public clients)."""

    client_id: str
    secret: str | None
    redirect_uris: tuple[RedirectUri, ...] = ()
    grant_types: frozenset[str] = GRANT_TYPES
    expires_at: float | None = None
    name: str | None = None

    @property
    def public(self) -> bool:
        return self.secret is None

    def check_redirect(self, uri: str) -> None:
        parsed = parse_redirect_uri(uri)
        if self.redirect_uris and not any(parsed.matches(known) for known in self.redirect_uris):
            raise OAuthError("invalid_request", "redirect_uri is not registered for this client")

    def check_grant(self, grant_type: str) -> None:
        if grant_type == "client_credentials" and self.public:
            raise OAuthError("unauthorized_client", "public clients cannot use client_credentials")
        if grant_type not in self.grant_types:
            raise OAuthError("unauthorized_client", f"grant_type {grant_type!r} is not registered for this client")


def _redirects(value: Any) -> tuple[RedirectUri, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_REDIRECT_URIS:
        raise OAuthError("invalid_redirect_uri", f"redirect_uris must list 1 to {MAX_REDIRECT_URIS} URIs")
    out = []
    for uri in value:
        if not isinstance(uri, str):
            raise OAuthError("invalid_redirect_uri", "each redirect URI must be a string")
        try:
            out.append(parse_redirect_uri(uri))
        except OAuthError as exc:
            raise OAuthError("invalid_redirect_uri", exc.description) from None
    return tuple(out)


def _string_list(metadata: Mapping[str, Any], name: str, default: list[str]) -> list[str]:
    value = metadata.get(name, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise OAuthError("invalid_client_metadata", f"{name} must be a list of strings")
    return value


def is_metadata_document_id(client_id: str) -> bool:
    return client_id.startswith(("https://", "http://"))


class ClientRegistry:
    """Every client of one development AS."""

    def __init__(
        self,
        configured: Mapping[str, str],
        public: Collection[str],
        *,
        clock: Callable[[], float],
        http_metadata_documents: bool = False,
        max_registrations: int = MAX_REGISTRATIONS,
        registration_ttl: float = REGISTRATION_TTL,
    ) -> None:
        self._fixed: dict[str, KnownClient] = {cid: KnownClient(cid, secret) for cid, secret in configured.items()}
        no_secret = GRANT_TYPES - {"client_credentials"}
        self._fixed.update({cid: KnownClient(cid, None, grant_types=no_secret) for cid in public})
        self._clock = clock
        self._http_documents = http_metadata_documents
        """Tests only: accept ``http://`` metadata-document URLs on loopback hosts."""
        self._max_registrations = max_registrations
        self._registration_ttl = registration_ttl
        self._registered: OrderedDict[str, KnownClient] = OrderedDict()
        self._documents: OrderedDict[str, KnownClient] = OrderedDict()

    async def find(self, client_id: str) -> KnownClient | None:
        fixed = self._fixed.get(client_id)
        if fixed is not None:
            return fixed
        if is_metadata_document_id(client_id):
            return await self._document_client(client_id)
        registered = self._registered.get(client_id)
        if registered is None or self._expired(registered):
            return None
        return registered

    async def authenticate(self, client_id: str, secret: str | None) -> KnownClient:
        """The client, when ``secret`` is right for it (``None`` for public ones); else ``invalid_client``."""
        try:
            client = await self.find(client_id)
        except OAuthError:
            client = None
        expected = client.secret if client is not None else None
        if client is None or (expected is None) != (secret is None):
            raise OAuthError("invalid_client", AUTH_FAILED, 401)
        if expected is not None and not hmac.compare_digest((secret or "").encode(), expected.encode()):
            raise OAuthError("invalid_client", AUTH_FAILED, 401)
        return client

    def _expired(self, client: KnownClient) -> bool:
        return client.expires_at is not None and client.expires_at <= self._clock()

    # -- RFC 7591 dynamic registration --------------------------------------------------------------

    def register(self, metadata: Any) -> dict[str, Any]:
        """Register a client from its metadata; the RFC 7591 §3.2.1 response body."""
        if not isinstance(metadata, dict):
            raise OAuthError("invalid_client_metadata", "the registration request must be a JSON object")
        method = metadata.get("token_endpoint_auth_method", "client_secret_basic")
        if method not in TOKEN_AUTH_METHODS:
            raise OAuthError(
                "invalid_client_metadata", f"token_endpoint_auth_method must be one of {sorted(TOKEN_AUTH_METHODS)}"
            )
        grant_types = _string_list(metadata, "grant_types", ["authorization_code", "refresh_token"])
        unknown = set(grant_types) - GRANT_TYPES
        if unknown or not grant_types:
            raise OAuthError(
                "invalid_client_metadata", f"grant_types must be a non-empty subset of {sorted(GRANT_TYPES)}"
            )
        if method == "none" and "client_credentials" in grant_types:
            raise OAuthError(
                "invalid_client_metadata", "a public client (auth method none) cannot use client_credentials"
            )
        redirecting = "authorization_code" in grant_types
        if redirecting:
            redirects = _redirects(metadata.get("redirect_uris"))
        elif metadata.get("redirect_uris", []) != []:
            raise OAuthError("invalid_redirect_uri", "redirect_uris are for clients of the authorization_code grant")
        else:
            redirects = ()
        response_types = _string_list(metadata, "response_types", ["code"] if redirecting else [])
        if response_types != (["code"] if redirecting else []):
            raise OAuthError("invalid_client_metadata", "response_types must be ['code'] exactly when codes are used")
        name = metadata.get("client_name")
        if name is not None and (not isinstance(name, str) or len(name) > 200):
            raise OAuthError("invalid_client_metadata", "client_name must be a string of at most 200 characters")
        self._sweep()
        if len(self._registered) >= self._max_registrations:
            raise OAuthError(
                "temporarily_unavailable",
                f"registration limit reached ({self._max_registrations} live registrations); retry later",
                503,
            )
        now = self._clock()
        client_id = "reg-" + secrets.token_urlsafe(16)
        secret = None if method == "none" else secrets.token_urlsafe(32)
        expires_at = now + self._registration_ttl
        client = KnownClient(client_id, secret, redirects, frozenset(grant_types), expires_at, name)
        self._registered[client_id] = client
        body: dict[str, Any] = {
            "client_id": client_id,
            "client_id_issued_at": int(now),
            "redirect_uris": metadata.get("redirect_uris", []),
            "grant_types": grant_types,
            "response_types": response_types,
            "token_endpoint_auth_method": method,
        }
        if secret is not None:
            body["client_secret"] = secret
            body["client_secret_expires_at"] = int(expires_at)
        if name is not None:
            body["client_name"] = name
        return body

    def _sweep(self) -> None:
        for client_id, client in list(self._registered.items()):
            if self._expired(client):
                del self._registered[client_id]

    # -- Client ID Metadata Documents ----------------------------------------------------------------

    async def _document_client(self, url: str) -> KnownClient:
        cached = self._documents.get(url)
        if cached is not None and not self._expired(cached):
            return cached
        self._check_document_url(url)
        document = await self._fetch(url)
        if document.get("client_id") != url:
            raise OAuthError("invalid_client", "the client metadata document names another client_id")
        method = document.get("token_endpoint_auth_method", "none")
        if method != "none":
            raise OAuthError(
                "invalid_client", "metadata-document clients must be public (token_endpoint_auth_method none)"
            )
        try:
            redirects = _redirects(document.get("redirect_uris"))
        except OAuthError as exc:
            raise OAuthError("invalid_client", f"client metadata document: {exc.description}") from None
        name = document.get("client_name")
        client = KnownClient(
            url,
            None,
            redirects,
            GRANT_TYPES - {"client_credentials"},
            self._clock() + DOCUMENT_TTL,
            name if isinstance(name, str) else None,
        )
        self._documents[url] = client
        self._documents.move_to_end(url)
        while len(self._documents) > MAX_DOCUMENTS:
            self._documents.popitem(last=False)
        return client

    def _check_document_url(self, url: str) -> None:
        if len(url) > MAX_URI_LENGTH:
            raise OAuthError("invalid_client", "client_id URL too long")
        https = re.fullmatch(rf"https://[A-Za-z0-9.\-]+(?::[0-9]{{1,5}})?/(?:{_PATH_CHAR})+", url)
        if https is not None:
            return
        if self._http_documents:
            try:
                parsed = parse_redirect_uri(url)
            except OAuthError:
                parsed = None
            if parsed is not None and parsed.scheme == "http" and parsed.rest not in ("", "/") and "?" not in url:
                return
        raise OAuthError("invalid_client", "a client_id URL must be https with a path, without query or fragment")

    async def _fetch(self, url: str) -> dict[str, Any]:
        try:
            async with (
                httpx.AsyncClient(timeout=DOCUMENT_TIMEOUT, follow_redirects=False) as http,
                http.stream("GET", url, headers={"accept": "application/json"}) as response,
            ):
                if response.status_code != 200:
                    raise OAuthError("invalid_client", f"client metadata document answered HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT_BYTES:
                        raise OAuthError(
                            "invalid_client", f"client metadata document exceeds {MAX_DOCUMENT_BYTES} bytes"
                        )
        except httpx.HTTPError as exc:
            raise OAuthError("invalid_client", f"client metadata document unreachable ({type(exc).__name__})") from None
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise OAuthError("invalid_client", "client metadata document is not JSON") from None
        if not isinstance(document, dict):
            raise OAuthError("invalid_client", "client metadata document is not a JSON object")
        return document
