"""Issue 30 item 4: through the gateway, an upstream learns who is calling, by token exchange (RFC 8693).

The upstream is the official SDK's server as a resource server of its own: it publishes protected resource metadata
naming the authorization server and verifies every JWT itself (PyJWT, the AS's JWKS, ``aud`` its own URL). The
authorization server is a development AS on its own port whose policy lets the client ``gateway`` exchange tokens
of alice and carol (not bob) for that upstream only. The gateway trusts the same AS for its own callers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from mcp_lossless.client import BearerToken, Client, RemoteError
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.core.errors import UPSTREAM_FAILED
from mcp_lossless.devauth import DevAuthServer, ExchangeRule
from mcp_lossless.gateway import ClientCredentialsFromEnv, TokenExchangeFromEnv, UpstreamConfig, create_gateway
from mcp_lossless.server.auth import JwtVerifier, StaticJwks
from mcp_lossless.server.config import ServerConfig
from tests.support.processes import free_port
from tests.support.upstreams import SdkHttpUpstream
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

pytestmark = pytest.mark.anyio

SECRET_ENV = "MCP_LOSSLESS_TEST_EXCHANGE_SECRET"
STARTUP_SECONDS = 120


@dataclass
class Exchanging:
    mcp: str
    upstream: SdkHttpUpstream
    authority: DevAuthServer

    def token(self, subject: str) -> str:
        """A caller's token for the gateway, holding the upstream's scope and one the upstream never needs."""
        return self.authority.mint(
            subject=subject, client_id="dev-client", audience=[self.mcp], scopes=["notes", "admin"]
        )

    def received(self, method: str) -> list[dict[str, Any]]:
        """The claims of the token each ``method`` request reached the upstream with (it verified them already)."""
        entries = [m for m in self.upstream.messages() if m["method"] == method]
        return [_claims(m["authorization"]) | {"raw": m["authorization"]} for m in entries]


def _claims(authorization: str) -> dict[str, Any]:
    scheme, _, token = authorization.partition(" ")
    assert scheme == "Bearer"
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


@pytest.fixture(scope="module")
def exchanging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exchanging]:
    as_sock, sock = loopback_socket(), loopback_socket()
    issuer = f"{base_url(as_sock)}/as"
    mcp = f"{base_url(sock)}/mcp"
    seen = Path(tmp_path_factory.mktemp("jwt")) / "seen.jsonl"
    upstream = SdkHttpUpstream(free_port(), seen, issuer=issuer, scopes="notes")
    authority = DevAuthServer(
        issuer,
        resources=[upstream.url],
        aggregate=mcp,
        clients={"gateway": "gateway-secret"},
        exchange={"gateway": ExchangeRule.of([upstream.url], subjects=["alice", "carol"])},
    )
    exchange = TokenExchangeFromEnv(ClientCredentialsFromEnv("gateway", SECRET_ENV))
    notes = UpstreamConfig(
        name="notes", url=upstream.url, auth=exchange, allow=frozenset({"lookup"}), scopes={"*": ("notes",)}
    )
    config = ServerConfig(port=sock.getsockname()[1], store="memory", issuer=issuer)
    gateway = create_gateway(config, [notes], verifier=JwtVerifier(issuer, StaticJwks(authority.keys)))
    os.environ[SECRET_ENV] = "gateway-secret"
    try:
        with serve_app(authority, sock=as_sock):
            upstream.start()
            try:
                with serve_app(gateway, sock=sock, lifespan="on", startup_timeout=STARTUP_SECONDS):
                    yield Exchanging(mcp, upstream, authority)
            finally:
                upstream.stop()
    finally:
        os.environ.pop(SECRET_ENV, None)


async def test_each_call_reaches_the_upstream_as_its_caller_with_the_gateway_as_actor(
    exchanging: Exchanging, http: httpx.AsyncClient
) -> None:
    alice, carol = exchanging.token("alice"), exchanging.token("carol")
    async with ModernClient(exchanging.mcp, auth=BearerToken(alice), http=http) as client:
        for key in ("a", "b"):
            result = await client.call_tool("notes_lookup", {"key": key, "steps": 1, "delay_ms": 0})
            assert result.raw["content"][0]["text"] == f"value of {key}"
    async with Client(exchanging.mcp, auth=BearerToken(carol), http=http) as legacy:  # a 2025-11-25 caller
        result = await legacy.call_tool("notes_lookup", {"key": "c", "steps": 1, "delay_ms": 0})
        assert result.raw["content"][0]["text"] == "value of c"

    calls = exchanging.received("tools/call")
    assert [c["sub"] for c in calls] == ["alice", "alice", "carol"]
    for claims in calls:
        assert claims["aud"] == exchanging.upstream.url
        assert claims["act"] == {"sub": "gateway"}
        assert claims["client_id"] == "gateway"
        assert claims["scope"] == "notes"  # what the tool needs: the caller's "admin" stayed behind
        assert claims["raw"] not in (f"Bearer {alice}", f"Bearer {carol}")
    assert calls[0]["raw"] == calls[1]["raw"]  # alice's second call reused her exchanged token
    assert calls[1]["raw"] != calls[2]["raw"]
    # What the gateway asks on nobody's behalf (its handshake, its tool list) carries its own identity.
    own = exchanging.received("tools/list")
    assert own and all(c["sub"] == "gateway" and "act" not in c for c in own)


async def test_a_caller_the_authorization_server_will_not_exchange_for_gets_an_explicit_error(
    exchanging: Exchanging, http: httpx.AsyncClient
) -> None:
    seen = len(exchanging.upstream.messages())
    async with ModernClient(exchanging.mcp, auth=BearerToken(exchanging.token("bob")), http=http) as client:
        with pytest.raises(RemoteError) as refused:
            await client.call_tool("notes_lookup", {"key": "b", "steps": 1, "delay_ms": 0})
    assert refused.value.code == UPSTREAM_FAILED
    assert refused.value.data == {"reason": "exchange_refused", "upstream": "notes", "mayHaveRun": False}
    assert "may not act for subject 'bob'" in refused.value.message
    assert len(exchanging.upstream.messages()) == seen  # the upstream saw no request for bob's call
