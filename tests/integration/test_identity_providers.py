"""Access tokens shaped as real identity providers document them, verified by the profile chosen in config, and
opaque tokens through a real RFC 7662 introspection endpoint.

Each shape follows the provider's own documentation of its access tokens: Keycloak (header ``typ: JWT``, claim
``typ: Bearer``, ``azp``, ``aud`` a list with ``account``), Auth0 (default dialect: ``typ: JWT``, ``azp``, ``aud``
the API and ``/userinfo``; RFC 9068 dialect: ``at+jwt``, ``client_id``), Microsoft Entra ID (``typ: JWT``; v2.0:
``azp``, ``aud`` the application id, ``scp`` a string; v1.0: ``appid``; app-only: ``roles`` a list), Okta (no
``typ``, ``cid``, ``scp`` a list) and oidc-provider (RFC 9068). The provider is a loopback HTTP server
(discovery, JWKS, introspection); the MCP server is ours under uvicorn, started with ``issuer`` and
``token_profile`` as a deployment would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.server.app import create_app
from mcp_lossless.server.auth import (
    PROFILES,
    IntrospectionVerifier,
    InvalidToken,
    JwtVerifier,
    RemoteJwks,
    VerifierUnavailable,
    discover_jwks_uri,
)
from mcp_lossless.server.config import ServerConfig
from tests.support.identity_provider import LoopbackProvider, loopback_provider
from tests.support.mcp_http import Peer, call
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

TENANT = "8eaef023-2b34-4da1-9baa-8bc8c9d6a490"
ENTRA_APP = "6e74172b-be56-4843-9ff4-e66a39bb12e3"
"""The MCP server's application (client) id in Entra: v2.0 tokens carry it as ``aud``."""
ENTRA_CLIENT = "0b8a7c2e-6d3f-4e51-9a47-3c1d2e5f6a7b"
INTROSPECTOR = ("mcp-server", "introspection secret/+&")


@dataclass(frozen=True)
class Shape:
    """One provider's access token: where its issuer lives, its header, its claims, the grant they mean."""

    profile: str
    issuer_path: str
    header: dict[str, Any]
    claims: Callable[[str, str, int], dict[str, Any]]
    """(issuer, canonical MCP URI, now) → claims."""
    subject: str
    client_id: str
    scopes: frozenset[str]
    token_audience: str | None = None


SHAPES: dict[str, Shape] = {
    "keycloak": Shape(
        "keycloak",
        "/realms/mcp",
        {"typ": "JWT"},
        lambda iss, mcp, now: {
            "exp": now + 300, "iat": now, "jti": "onrtac:6f1c", "iss": iss, "aud": [mcp, "account"],
            "sub": "f1c4f64e-2c0c-4cda-8c9f-9f3f8f3a2b0e", "typ": "Bearer", "azp": "mcp-cli", "sid": "4c0a3a8a",
            "acr": "1", "allowed-origins": ["/*"], "realm_access": {"roles": ["default-roles-mcp"]},
            "scope": "openid profile email tools:fetch", "email_verified": True, "preferred_username": "ada",
        },
        "f1c4f64e-2c0c-4cda-8c9f-9f3f8f3a2b0e", "mcp-cli", frozenset({"openid", "profile", "email", "tools:fetch"}),
    ),
    "keycloak-service-account": Shape(
        "keycloak",
        "/realms/mcp",
        {"typ": "JWT"},
        lambda iss, mcp, now: {
            "exp": now + 300, "iat": now, "jti": "trrtcc:312e", "iss": iss, "aud": mcp, "sub": "5a1d-sa",
            "typ": "Bearer", "azp": "mcp-batch", "client_id": "mcp-batch", "scope": "tools:search tools:fetch",
            "clientHost": "127.0.0.1", "preferred_username": "service-account-mcp-batch",
        },
        "5a1d-sa", "mcp-batch", frozenset({"tools:search", "tools:fetch"}),
    ),
    "auth0": Shape(
        "auth0",
        "/",  # Auth0's issuer is its domain with a trailing slash
        {"typ": "JWT"},
        lambda iss, mcp, now: {
            "iss": iss, "sub": "auth0|123456", "aud": [mcp, f"{iss}userinfo"], "azp": "my_client_id",
            "exp": now + 86400, "iat": now, "scope": "openid profile tools:fetch",
            "permissions": ["tools:fetch"],
        },
        "auth0|123456", "my_client_id", frozenset({"openid", "profile", "tools:fetch"}),
    ),
    "auth0-rfc9068": Shape(
        "auth0",
        "/",
        {"typ": "at+jwt"},
        lambda iss, mcp, now: {
            "iss": iss, "sub": "auth0|123456", "aud": [mcp, f"{iss}userinfo"], "client_id": "my_client_id",
            "exp": now + 86400, "iat": now, "jti": "73WakrfVbNJBaAmhQtEeDv", "scope": "openid tools:fetch",
        },
        "auth0|123456", "my_client_id", frozenset({"openid", "tools:fetch"}),
    ),
    "entra-v2": Shape(
        "entra",
        f"/{TENANT}/v2.0",
        {"typ": "JWT", "x5t": "provider-key-1"},
        lambda iss, mcp, now: {
            "aud": ENTRA_APP, "iss": iss, "iat": now, "nbf": now, "exp": now + 3600, "aio": "AXQAi/8T",
            "azp": ENTRA_CLIENT, "azpacr": "1", "name": "Ada Lovelace", "oid": "690222be-ff1a-4d56-abd1-7e4f7d38e474",
            "preferred_username": "ada@contoso.example", "rh": "I", "scp": "tools.search tools.fetch",
            "sub": "HKZpfaHyWadeOouYlitjrI-KffTm222X5rrV3xDqfKQ", "tid": TENANT, "uti": "fqiBqXLPj0eQa82S",
            "ver": "2.0",
        },
        "HKZpfaHyWadeOouYlitjrI-KffTm222X5rrV3xDqfKQ", ENTRA_CLIENT, frozenset({"tools.search", "tools.fetch"}),
        token_audience=ENTRA_APP,
    ),
    "entra-v1-app-only": Shape(
        "entra",
        f"/{TENANT}/v2.0",
        {"typ": "JWT", "x5t": "provider-key-1"},
        lambda iss, mcp, now: {
            "aud": ENTRA_APP, "iss": iss, "iat": now, "nbf": now, "exp": now + 3600, "appid": ENTRA_CLIENT,
            "appidacr": "1", "idtyp": "app", "oid": "2f1d0c3b", "roles": ["tools.fetch"], "sub": "2f1d0c3b",
            "tid": TENANT, "ver": "1.0",
        },
        "2f1d0c3b", ENTRA_CLIENT, frozenset({"tools.fetch"}),
        token_audience=ENTRA_APP,
    ),
    "okta": Shape(
        "okta",
        "/oauth2/default",
        {},  # Okta's access tokens carry only kid and alg
        lambda iss, mcp, now: {
            "ver": 1, "jti": "AT.MNAoEQ_jbKqoinrQo1D0XKjMX28U5d7ZszBceot7-Ts", "iss": iss, "aud": "api://default",
            "sub": "ada@example.com", "iat": now, "exp": now + 3600, "cid": "0oa1b2c3d4", "uid": "00u1a2b3c4",
            "scp": ["openid", "tools:fetch"], "auth_time": now - 60,
        },
        "ada@example.com", "0oa1b2c3d4", frozenset({"openid", "tools:fetch"}),
        token_audience="api://default",
    ),
    "oidc-provider": Shape(
        "rfc9068",
        "",
        {"typ": "at+jwt"},
        lambda iss, mcp, now: {
            "jti": "hFZ3x", "sub": "alice", "iat": now, "exp": now + 600, "scope": "tools:fetch",
            "client_id": "mcp-app", "iss": iss, "aud": mcp,
        },
        "alice", "mcp-app", frozenset({"tools:fetch"}),
    ),
}  # fmt: skip


def server_for(provider: LoopbackProvider, profile: str, token_audience: str | None, **extra: Any) -> Any:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = ServerConfig(
        port=port, store="memory", issuer=provider.issuer, token_profile=profile, token_audience=token_audience,
        **extra,
    )  # fmt: skip
    return serve_app(create_app(config), sock=sock, lifespan="on"), f"http://127.0.0.1:{port}/mcp"


async def search_result(base: str, token: str) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        peer = Peer(http, base, token)
        await peer.initialize()
        answer = await peer.post(call(1, "search", query="q", steps=1, delay_ms=0))
    [message] = [m for m in answer.messages if m.get("id") == 1]
    text: str = message["result"]["content"][0]["text"]
    return text


@pytest.mark.parametrize("name", SHAPES)
async def test_provider_token_is_verified_by_its_profile_and_served(name: str) -> None:
    shape = SHAPES[name]
    with loopback_provider(shape.issuer_path) as provider:
        running, canonical = server_for(provider, shape.profile, shape.token_audience)
        now = int(time.time())
        token = provider.sign(shape.claims(provider.issuer, canonical, now), **shape.header)
        async with httpx.AsyncClient(timeout=10) as http:
            jwks = RemoteJwks(await discover_jwks_uri(provider.issuer, http), http=http)
            aliases = {shape.token_audience: canonical} if shape.token_audience else {}
            verifier = JwtVerifier(provider.issuer, jwks, profile=PROFILES[shape.profile], audience_aliases=aliases)
            grant = await verifier.verify(token)
            assert grant == Grant(
                Principal(provider.issuer, shape.subject, shape.client_id),
                audience=grant.audience,
                expires_at=grant.expires_at,
                scopes=shape.scopes,
            )
            assert canonical in grant.audience
            assert grant.expires_at is not None and grant.expires_at > now
            if shape.header.get("typ") != "at+jwt":
                strict = JwtVerifier(provider.issuer, jwks, audience_aliases=aliases)
                with pytest.raises(InvalidToken, match="typ"):
                    await strict.verify(token)  # why the profile exists: RFC 9068 alone refuses this token
        with running as base_url:
            assert await search_result(base_url, token) == "search results for 'q': 3 documents"


async def test_keycloak_id_and_refresh_tokens_are_not_access_tokens() -> None:
    """Keycloak signs ID, refresh and access tokens alike (header ``typ: JWT``); its ``typ`` claim tells them apart."""
    with loopback_provider("/realms/mcp") as provider:
        async with httpx.AsyncClient(timeout=10) as http:
            jwks = RemoteJwks(await discover_jwks_uri(provider.issuer, http), http=http)
            verifier = JwtVerifier(provider.issuer, jwks, profile=PROFILES["keycloak"])
            now = int(time.time())
            base = SHAPES["keycloak"].claims(provider.issuer, "https://mcp.example/mcp", now)
            for kind in ("ID", "Refresh", None):
                claims = {**base, "typ": kind} if kind else {k: v for k, v in base.items() if k != "typ"}
                with pytest.raises(InvalidToken, match="'typ' must be 'Bearer'"):
                    await verifier.verify(provider.sign(claims, typ="JWT"))
            assert (await verifier.verify(provider.sign(base, typ="JWT"))).principal.client_id == "mcp-cli"


@pytest.mark.parametrize(
    ("profile", "claims", "header", "message"),
    [
        ("entra", {"scp": 5}, {"typ": "JWT"}, "'scp' is not a string or a list"),
        ("okta", {"scp": ["a", 1]}, {}, "'scp' is not a string or a list"),
        ("entra", {"azp": None, "appid": None}, {"typ": "JWT"}, "'azp' is missing"),
        ("okta", {"cid": ""}, {}, "'cid' is not a string"),
        ("entra", {}, {"typ": "at+jwt+evil"}, "not an access token type of profile 'entra'"),
        ("entra", {}, {"typ": None}, "not an access token type"),
        ("okta", {"aud": None}, {}, "'aud'"),
        ("auth0", {"exp": None}, {"typ": "JWT"}, "'exp'"),
    ],
)  # fmt: skip
async def test_profile_negative_cases(
    profile: str, claims: dict[str, Any], header: dict[str, Any], message: str
) -> None:
    with loopback_provider("/p") as provider:
        async with httpx.AsyncClient(timeout=10) as http:
            jwks = RemoteJwks(await discover_jwks_uri(provider.issuer, http), http=http)
            verifier = JwtVerifier(provider.issuer, jwks, profile=PROFILES[profile])
            now = int(time.time())
            base = {"iss": provider.issuer, "sub": "s", "aud": "https://mcp.example/mcp", "exp": now + 60,
                    "iat": now, "azp": "c", "cid": "c", "scp": "a"}  # fmt: skip
            payload = {k: v for k, v in {**base, **claims}.items() if v is not None}
            with pytest.raises(InvalidToken, match=message):
                await verifier.verify(provider.sign(payload, **header))


async def test_narrower_audience_from_a_provider_is_refused_per_tool() -> None:
    """An Auth0 API per tool: a token for ``…/tools/search`` is admitted, and refused (403) for ``fetch``."""
    with loopback_provider("/") as provider:
        running, canonical = server_for(provider, "auth0", None)
        now = int(time.time())
        claims = SHAPES["auth0"].claims(provider.issuer, f"{canonical}/tools/search", now)
        token = provider.sign(claims, typ="JWT")
        with running as base_url:
            assert await search_result(base_url, token) == "search results for 'q': 3 documents"
            async with httpx.AsyncClient(timeout=10) as http:
                peer = Peer(http, base_url, token)
                await peer.initialize()
                refused = await peer.post(call(2, "fetch", url="u", steps=1, delay_ms=0))
    assert refused.status == 403
    assert f"{canonical}/tools/fetch" in refused.headers["www-authenticate"]


# ---- opaque tokens: RFC 7662 introspection ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def introspector(provider: LoopbackProvider, http: httpx.AsyncClient, **options: Any) -> IntrospectionVerifier:
    return IntrospectionVerifier(provider.issuer, provider.introspection_endpoint, *INTROSPECTOR, http=http, **options)


def opaque_answer(now: float, **overrides: Any) -> dict[str, Any]:
    answer = {"scope": "tools:search tools:fetch", "client_id": "mcp-app", "username": "ada", "token_type": "Bearer",
              "exp": int(now) + 600, "iat": int(now), "sub": "ada", "aud": "https://mcp.example/mcp"}  # fmt: skip
    answer.update(overrides)
    return {k: v for k, v in answer.items() if v is not None}


@pytest.mark.parametrize("auth_method", ["client_secret_basic", "client_secret_post"])
async def test_opaque_token_is_introspected_once_then_cached_until_exp(auth_method: str) -> None:
    clock = Clock()
    with loopback_provider("/realms/mcp") as provider:
        provider.opaque["opaque-1"] = opaque_answer(clock.now, exp=int(clock.now) + 120)
        async with httpx.AsyncClient(timeout=10) as http:
            verifier = introspector(provider, http, auth_method=auth_method, clock=clock, cache_seconds=3600, leeway=0)
            grant = await verifier.verify("opaque-1")
            assert grant.principal == Principal(provider.issuer, "ada", "mcp-app")
            assert grant.audience == frozenset({"https://mcp.example/mcp"})
            assert grant.scopes == frozenset({"tools:search", "tools:fetch"})
            assert await verifier.verify("opaque-1") == grant
            assert provider.introspections == verifier.calls == 1
            clock.now += 121  # past exp: the cache entry is gone, and so is the token
            with pytest.raises(InvalidToken, match="expired"):
                await verifier.verify("opaque-1")
            assert provider.introspections == 2


async def test_revocation_is_seen_after_the_cache_window() -> None:
    clock = Clock()
    with loopback_provider("/realms/mcp") as provider:
        provider.opaque["opaque-2"] = opaque_answer(clock.now)
        async with httpx.AsyncClient(timeout=10) as http:
            verifier = introspector(provider, http, clock=clock, cache_seconds=30)
            await verifier.verify("opaque-2")
            del provider.opaque["opaque-2"]  # revoked at the provider
            clock.now += 29
            await verifier.verify("opaque-2")  # still within the window: cached
            clock.now += 2
            with pytest.raises(InvalidToken, match="not active"):
                await verifier.verify("opaque-2")
            with pytest.raises(InvalidToken, match="not active"):
                await verifier.verify("opaque-2")
            assert provider.introspections == 3, "inactive answers are never cached as grants"


async def test_introspection_cache_is_bounded() -> None:
    clock = Clock()
    with loopback_provider("/realms/mcp") as provider:
        for name in "abc":
            provider.opaque[name] = opaque_answer(clock.now, sub=name)
        async with httpx.AsyncClient(timeout=10) as http:
            verifier = introspector(provider, http, clock=clock, cache_size=2)
            for token in ("a", "b", "a", "c"):  # b is least recently used when c arrives
                await verifier.verify(token)
            assert provider.introspections == 3
            assert (await verifier.verify("a")).principal.subject == "a"
            assert provider.introspections == 3
            assert (await verifier.verify("b")).principal.subject == "b"
            assert provider.introspections == 4


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"iss": "https://other.example"}, "wrong issuer"),
        ({"aud": None}, "'aud'"),
        ({"client_id": None}, "'client_id'"),
        ({"exp": 1}, "expired"),
        ({"scope": ["tools:fetch"]}, "'scope' is not a string"),
    ],
)
async def test_introspection_answers_are_checked_like_claims(answer: dict[str, Any], message: str) -> None:
    with loopback_provider("/realms/mcp") as provider:
        provider.opaque["t"] = opaque_answer(time.time(), **answer)
        async with httpx.AsyncClient(timeout=10) as http:
            with pytest.raises(InvalidToken, match=message):
                await introspector(provider, http).verify("t")


async def test_client_credentials_token_without_sub_is_the_client() -> None:
    with loopback_provider("/realms/mcp") as provider:
        provider.opaque["cc"] = opaque_answer(time.time(), sub=None, client_id="batch")
        async with httpx.AsyncClient(timeout=10) as http:
            grant = await introspector(provider, http).verify("cc")
    assert grant.principal == Principal(provider.issuer, "batch", "batch")


async def test_introspection_outage_or_refused_credentials_is_unavailable_not_invalid() -> None:
    with loopback_provider("/realms/mcp") as provider:
        provider.opaque["t"] = opaque_answer(time.time())
        async with httpx.AsyncClient(timeout=10) as http:
            wrong = IntrospectionVerifier(
                provider.issuer, provider.introspection_endpoint, "mcp-server", "wrong", http=http
            )
            with pytest.raises(VerifierUnavailable, match="HTTP 401"):
                await wrong.verify("t")
            provider.down = True
            with pytest.raises(VerifierUnavailable, match="HTTP 500"):
                await introspector(provider, http).verify("t")
        gone = provider.introspection_endpoint
    async with httpx.AsyncClient(timeout=2) as http:
        unreachable = IntrospectionVerifier("https://as.example", gone, *INTROSPECTOR, http=http)
        with pytest.raises(VerifierUnavailable, match="unreachable"):
            await unreachable.verify("t")


async def test_concurrent_introspections_are_bounded() -> None:
    """Twelve made-up tokens at once against a slow provider: never more than ``concurrency`` in flight."""
    with loopback_provider("/realms/mcp") as provider:
        provider.delay = 0.05  # a slow provider, so that overlapping requests overlap at its end
        async with httpx.AsyncClient(timeout=10) as http:
            verifier = introspector(provider, http, concurrency=2)

            async def attempt(token: str) -> None:
                with pytest.raises(InvalidToken, match="not active"):
                    await verifier.verify(token)

            async with anyio.create_task_group() as group:
                for i in range(12):
                    group.start_soon(attempt, f"made-up-{i}")
    assert provider.introspections == 12
    assert provider.peak_in_flight == 2


async def test_server_serves_opaque_and_jwt_tokens_side_by_side_and_answers_503_in_an_outage() -> None:
    with loopback_provider("/realms/mcp", dict([INTROSPECTOR])) as provider:
        running, canonical = server_for(
            provider,
            "keycloak",
            None,
            introspection_endpoint=provider.introspection_endpoint,
            introspection_client_id=INTROSPECTOR[0],
            introspection_client_secret=INTROSPECTOR[1],
        )
        now = int(time.time())
        provider.opaque["opaque-token-value"] = opaque_answer(now, aud=canonical)
        jwt_token = provider.sign(SHAPES["keycloak"].claims(provider.issuer, canonical, now), typ="JWT")
        with running as base_url:
            assert await search_result(base_url, "opaque-token-value") == "search results for 'q': 3 documents"
            assert await search_result(base_url, jwt_token) == "search results for 'q': 3 documents"
            assert provider.introspections == 1, "the JWT was verified locally, the opaque token's answer reused"
            async with httpx.AsyncClient(timeout=10) as http:
                unknown = await http.post(canonical, headers=Peer(http, base_url, "never-issued").headers())
                provider.down = True
                outage = await http.post(canonical, headers=Peer(http, base_url, "another-opaque").headers())
    assert unknown.status_code == 401
    assert 'error="invalid_token"' in unknown.headers["www-authenticate"]
    assert outage.status_code == 503 and outage.headers["retry-after"] == "1"
    assert "introspection endpoint answered HTTP 500" in outage.text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"token_profile": "github"}, "token_profile 'github' is not one of"),
        ({"introspection_endpoint": "http://127.0.0.1:1/i"}, "needs introspection_client_id"),
        (
            {"introspection_endpoint": "http://127.0.0.1:1/i", "introspection_client_id": "a",
             "introspection_client_secret": "b", "introspection_auth": "private_key_jwt"},
            "introspection_auth 'private_key_jwt'",
        ),
    ],
)  # fmt: skip
def test_bad_verifier_settings_are_refused_when_the_app_is_built(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_app(ServerConfig(store="memory", issuer="https://as.example", **settings))
