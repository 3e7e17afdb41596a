"""JWT assertions in OAuth (RFC 7523): signing in as a client with a private key, and grants that are a JWT.

Three of the MCP authorization extensions rest on them:

- ``private_key_jwt`` client authentication (SEP-1046's client credentials, RFC 7523 §2.2): the client proves it
  holds its key with a short-lived JWT (``iss`` = ``sub`` = its client id, ``aud`` = the authorization server)
  instead of a shared secret (:class:`PrivateKeyJwt`);
- workload identity federation (SEP-1933): the platform's token for the workload (a Kubernetes service account
  token, a cloud's identity token) *is* the grant, sent as ``assertion`` with the ``jwt-bearer`` grant type
  (:class:`JwtBearerGrant` with a fixed JWT or a function reading the current one);
- enterprise-managed authorization (SEP-990): the user's ID token from the enterprise IdP is exchanged there
  (RFC 8693) for an identity assertion authorization grant (ID-JAG) naming this authorization server and the MCP
  server, which is then the ``jwt-bearer`` assertion (:class:`JwtBearerGrant` with :class:`IdJagFromIdp`).

The assertions are the caller's; nothing here checks their claims (the authorization server does).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode

import httpx
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey

from ..core.token_exchange import ID_JAG_TOKEN_TYPE, ID_TOKEN_TYPE, TOKEN_EXCHANGE
from .errors import AuthorizationFailed, describe_failure
from .registration import json_object

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
"""RFC 7523 §2.1: the ``grant_type`` whose grant is the JWT in ``assertion``."""
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
"""RFC 7523 §2.2: the ``client_assertion_type`` of a client authenticating with a JWT."""
PRIVATE_KEY_JWT = "private_key_jwt"
ASSERTION_SECONDS = 60
"""How long a client assertion is valid: it is made for one request."""
_KEY_TYPES: dict[str, type[Key]] = {"ES": ECKey, "RS": RSAKey, "PS": RSAKey, "Ed": OKPKey}


class PrivateKeyJwt:
    """The client's signing key for ``private_key_jwt`` (a PEM private key, ``alg`` one the AS accepts).

    ``audience``: what the assertion's ``aud`` names; ``issuer`` (the authorization server's issuer identifier,
    as RFC 7523bis and the MCP extension ask; Keycloak takes it too) or ``token_endpoint`` (Okta and Entra ID
    want the token endpoint's URL)."""

    def __init__(
        self,
        private_key_pem: str,
        alg: str = "ES256",
        *,
        audience: Literal["issuer", "token_endpoint"] = "issuer",
        clock: Callable[[], float] = time.time,
    ) -> None:
        kind = _KEY_TYPES.get(alg[:2])
        if kind is None:
            raise ValueError(f"unsupported client assertion algorithm {alg!r}")
        try:
            self._key = kind.import_key(private_key_pem)
        except (JoseError, ValueError) as exc:
            raise ValueError(f"not a private {alg} key: {exc}") from None
        if not self._key.is_private:
            raise ValueError("a client assertion needs the private key")
        self.alg = alg
        self._audience = audience
        self._clock = clock

    def assertion(self, client_id: str, metadata: Mapping[str, Any]) -> str:
        """A fresh client assertion for a token request to the AS ``metadata`` describes."""
        audience = metadata.get("issuer" if self._audience == "issuer" else "token_endpoint")
        if not isinstance(audience, str):
            raise AuthorizationFailed(f"the authorization server metadata has no {self._audience}")
        now = int(self._clock())
        claims = {
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "iat": now,
            "exp": now + ASSERTION_SECONDS,
            "jti": secrets.token_urlsafe(16),
        }
        return jwt.encode({"alg": self.alg, "typ": "JWT"}, claims, self._key, algorithms=[self.alg])


AssertionSource = Callable[[str, str, httpx.AsyncClient], Awaitable[str]]
"""Gives the grant's JWT for (the authorization server's issuer, the MCP server's resource, the HTTP client)."""


@dataclass(frozen=True, slots=True)
class JwtBearerGrant:
    """The ``jwt-bearer`` grant (RFC 7523 §2.1): ``assertion`` is the JWT, or what obtains it anew for each grant
    (a workload token file that the platform rotates, an ID-JAG from the IdP). A refused grant is not retried
    with another grant type: the error is the outcome."""

    assertion: str | AssertionSource

    async def obtain(self, issuer: str, resource: str, http: httpx.AsyncClient) -> str:
        if isinstance(self.assertion, str):
            return self.assertion
        return await self.assertion(issuer, resource, http)


@dataclass(frozen=True, slots=True)
class IdJagFromIdp:
    """SEP-990's first step: the user's ``id_token`` exchanged at the enterprise IdP's token endpoint (RFC 8693) for
    an ID-JAG whose ``audience`` is the MCP server's authorization server and whose ``resource`` is the MCP
    server, authenticating as the IdP client ``client_id`` (with ``client_secret`` when it has one)."""

    token_endpoint: str
    id_token: str
    client_id: str
    client_secret: str | None = None

    async def __call__(self, issuer: str, resource: str, http: httpx.AsyncClient) -> str:
        form = [
            ("grant_type", TOKEN_EXCHANGE),
            ("requested_token_type", ID_JAG_TOKEN_TYPE),
            ("subject_token", self.id_token),
            ("subject_token_type", ID_TOKEN_TYPE),
            ("audience", issuer),
            ("resource", resource),
            ("client_id", self.client_id),
        ]
        if self.client_secret is not None:
            form.append(("client_secret", self.client_secret))
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        try:
            response = await http.post(self.token_endpoint, content=urlencode(form), headers=headers)
        except httpx.HTTPError as exc:
            raise AuthorizationFailed(
                f"cannot reach the IdP at {self.token_endpoint}: {describe_failure(exc)}"
            ) from exc
        body = json_object(response.content)
        token = body.get("access_token")
        if response.status_code != 200 or not isinstance(token, str):
            error = body.get("error") or f"HTTP {response.status_code}"
            raise AuthorizationFailed(f"the IdP refused the ID-JAG: {error}: {body.get('error_description', '')}")
        if body.get("issued_token_type") != ID_JAG_TOKEN_TYPE:
            raise AuthorizationFailed(f"the IdP issued {body.get('issued_token_type')!r}, not an ID-JAG")
        return token
