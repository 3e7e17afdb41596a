"""A loopback identity provider for verifier tests: OpenID discovery, a JWKS and an RFC 7662 introspection
endpoint, served over real HTTP by uvicorn.

Real providers publish their metadata at ``{issuer}/.well-known/openid-configuration`` (Keycloak's
``/realms/NAME``, Entra's ``/TENANT/v2.0``, Okta's ``/oauth2/default``); this one does the same and answers
404 at the RFC 8414 path-inserted URLs, so the server's discovery walks the same way it does against them.
Tokens are signed by the test with :attr:`LoopbackProvider.key` in whatever shape the provider documents.
Introspection authenticates its caller (``client_secret_basic`` or ``client_secret_post``), answers
``{"active": false}`` for anything it did not issue or has revoked, and counts its calls.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from mcp_lossless.asgi import Receive, Scope, Send, headers, read_body, respond_json
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app


class LoopbackProvider:
    def __init__(self, base: str, issuer_path: str, clients: dict[str, str]) -> None:
        self.issuer = base + issuer_path
        self.key = RSAKey.generate_key(2048, parameters={"kid": "provider-key-1", "use": "sig"})
        self.clients = clients
        """Who may introspect: client id → secret."""
        self.opaque: dict[str, dict[str, Any]] = {}
        """Opaque tokens this provider issued and their introspection answers (without ``active``)."""
        self.introspections = 0
        self.down = False
        """When set, introspection answers 500 (an outage)."""
        self.delay = 0.0
        """Seconds each introspection takes (a slow provider), so that concurrent calls are seen overlapping."""
        self.in_flight = 0
        self.peak_in_flight = 0
        root = issuer_path.rstrip("/")  # Auth0's issuer is the origin with a slash
        self._discovery = f"{root}/.well-known/openid-configuration"
        self._jwks = f"{root}/keys"
        self._introspect = f"{root}/introspect"
        self.introspection_endpoint = base + self._introspect

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        """A JWT over ``claims`` with this provider's key; ``header`` adds or (with ``None``) removes fields."""
        head = {"alg": "RS256", "kid": self.key.kid, **header}
        head = {k: v for k, v in head.items() if v is not None}
        return jwt.encode(head, claims, self.key, algorithms=["RS256"], default_type=None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == self._discovery:
            await respond_json(
                send,
                200,
                {
                    "issuer": self.issuer,
                    "jwks_uri": self.issuer.rstrip("/") + "/keys",
                    "introspection_endpoint": self.introspection_endpoint,
                },
            )
        elif path == self._jwks:
            await respond_json(send, 200, KeySet([self.key]).as_dict(private=False))
        elif path == self._introspect and scope["method"] == "POST":
            await self._introspection(scope, receive, send)
        else:
            await respond_json(send, 404, {"error": "not_found"})

    async def _introspection(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.introspections += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            await self._answer(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        form = dict(parse_qsl((await read_body(receive, 65536)).decode()))
        if self.down:
            await respond_json(send, 500, {"error": "server_error"})
            return
        client = self._client(headers(scope).get(b"authorization"), form)
        if client is None or self.clients.get(client[0]) != client[1]:
            await respond_json(send, 401, {"error": "invalid_client"})
            return
        answer = self.opaque.get(form.get("token", ""))
        await respond_json(send, 200, {"active": True, **answer} if answer is not None else {"active": False})

    @staticmethod
    def _client(authorization: bytes | None, form: dict[str, str]) -> tuple[str, str] | None:
        if authorization is not None and authorization.lower().startswith(b"basic "):
            pair = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = pair.partition(":")
            return unquote_plus(client_id), unquote_plus(secret)
        if "client_id" in form and "client_secret" in form:
            return form["client_id"], form["client_secret"]
        return None


@contextmanager
def loopback_provider(issuer_path: str, clients: dict[str, str] | None = None) -> Iterator[LoopbackProvider]:
    sock = loopback_socket()
    provider = LoopbackProvider(base_url(sock), issuer_path, clients or {"mcp-server": "introspection secret/+&"})
    with serve_app(provider, sock=sock, lifespan="off"):
        yield provider
