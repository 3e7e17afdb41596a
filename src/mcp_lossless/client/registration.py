"""Who the client is at an authorization server, and how it authenticates at the token endpoint.

MCP 2025-11-25 gives the order: credentials the application was given; else a client ID metadata
document (the ``client_id`` is an HTTPS URL describing the client) when the authorization server
advertises ``client_id_metadata_document_supported``; else dynamic client registration (RFC 7591) at its
``registration_endpoint``. A registration belongs to the authorization server that issued it and is
never presented to another one (SEP-2352).

The token endpoint authentication method is the one a registration response names, else the best one
the server lists in ``token_endpoint_auth_methods_supported`` (RFC 8414's default: ``client_secret_basic``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from .errors import AuthorizationFailed, describe_failure

log = logging.getLogger("mcp_lossless.client.registration")

CLIENT_SECRET_BASIC = "client_secret_basic"
CLIENT_SECRET_POST = "client_secret_post"
PUBLIC = "none"
AUTH_METHODS = (CLIENT_SECRET_BASIC, CLIENT_SECRET_POST, PUBLIC)
"""Best first: a secret binds the code exchange to this registration; a public client proves nothing."""
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    """A client identity at one authorization server; ``auth_method`` is one of :data:`AUTH_METHODS`, or
    ``private_key_jwt`` for a configured client with a key (:class:`~.assertions.PrivateKeyJwt`)."""

    client_id: str
    client_secret: str | None
    auth_method: str


@dataclass(frozen=True, slots=True)
class ClientRegistration:
    """How to get a client ID where the application has none.

    ``metadata_url`` is the HTTPS URL of this client's metadata document (used where the authorization
    server supports them); otherwise the client registers dynamically as ``client_name``.
    """

    client_name: str = "mcp-lossless"
    metadata_url: str | None = None

    def __post_init__(self) -> None:
        if self.metadata_url is not None:
            parts = urlsplit(self.metadata_url)
            if parts.scheme != "https" or not parts.netloc or parts.path in ("", "/"):
                raise ValueError(f"a client ID metadata document URL must be https with a path: {self.metadata_url!r}")


def supported_auth_methods(metadata: Mapping[str, Any]) -> list[str]:
    methods = metadata.get("token_endpoint_auth_methods_supported")
    if isinstance(methods, list) and methods and all(isinstance(m, str) for m in methods):
        return list(methods)
    return [CLIENT_SECRET_BASIC]


def choose_auth_method(metadata: Mapping[str, Any], has_secret: bool) -> str:
    """How a client with (or without) a secret authenticates at this server's token endpoint."""
    if has_secret:
        supported = supported_auth_methods(metadata)
        for method in (CLIENT_SECRET_BASIC, CLIENT_SECRET_POST):
            if method in supported:
                return method
    return PUBLIC


async def register_client(
    http: httpx.AsyncClient, metadata: Mapping[str, Any], registration: ClientRegistration, redirect_uri: str
) -> ClientCredentials:
    """A client identity for an ``authorization_code`` client at the server ``metadata`` describes."""
    issuer = metadata.get("issuer")
    if registration.metadata_url is not None and metadata.get("client_id_metadata_document_supported") is True:
        return ClientCredentials(registration.metadata_url, None, PUBLIC)
    endpoint = metadata.get("registration_endpoint")
    if not isinstance(endpoint, str):
        raise AuthorizationFailed(
            f"no client_id for {issuer!r}: it supports neither dynamic registration nor client metadata documents"
        )
    supported = supported_auth_methods(metadata)
    requested = next((m for m in AUTH_METHODS if m in supported), PUBLIC)
    body = {
        "client_name": registration.client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": requested,
        "application_type": _application_type(redirect_uri),
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    try:
        response = await http.post(endpoint, content=orjson.dumps(body), headers=headers)
    except httpx.HTTPError as exc:
        raise AuthorizationFailed(
            f"cannot reach the registration endpoint {endpoint}: {describe_failure(exc)}"
        ) from exc
    answer = json_object(response.content)
    client_id = answer.get("client_id")
    if response.status_code not in (200, 201) or not isinstance(client_id, str) or not client_id:
        error = answer.get("error") or f"HTTP {response.status_code}"
        description = answer.get("error_description", "")
        raise AuthorizationFailed(f"dynamic client registration refused: {error}: {description}")
    secret = answer.get("client_secret") if isinstance(answer.get("client_secret"), str) else None
    method = answer.get("token_endpoint_auth_method")
    if not isinstance(method, str):
        method = requested if secret is not None else PUBLIC
    log.info("registered as client %s at %s (%s)", client_id, issuer, method)
    return ClientCredentials(client_id, secret, method)


def _application_type(redirect_uri: str) -> str:
    """OpenID Connect registration's ``application_type``: loopback and custom-scheme redirects are native apps."""
    parts = urlsplit(redirect_uri)
    return "native" if parts.scheme not in ("http", "https") or parts.hostname in _LOOPBACK else "web"


def json_object(raw: bytes) -> dict[str, Any]:
    """An authorization server's JSON object answer; ``{}`` for any other body (callers say what is missing)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
