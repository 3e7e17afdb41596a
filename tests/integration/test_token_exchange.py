"""RFC 8693 token exchange over real HTTP: the development AS's grant and policy, and the gateway's exchanging
credentials (:class:`~mcp_lossless.gateway.exchange.TokenExchange`) with their cache, against that AS."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import jwt
import pytest

from mcp_lossless.asgi import Receive, Scope, Send, respond_json
from mcp_lossless.client import OAuth
from mcp_lossless.core.token_exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from mcp_lossless.devauth import DevAuthServer, ExchangeRule
from mcp_lossless.gateway.exchange import ExchangeRefused, TokenExchange, needing
from mcp_lossless.server.auth import CALLER, JwtVerifier, StaticJwks
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

pytestmark = pytest.mark.anyio

GATEWAY = "https://gateway.example/mcp"
CLIENTS = {"gateway": "gateway-secret", "other": "other-secret"}


class Deployment:
    def __init__(self, authority: DevAuthServer, upstream: str) -> None:
        self.authority = authority
        self.upstream = upstream
        self.token_endpoint = f"{authority.issuer}/token"

    def subject_token(
        self, subject: str = "alice", scopes: tuple[str, ...] = ("notes", "admin"), ttl: int = 600
    ) -> str:
        return self.authority.mint(subject=subject, client_id="app", audience=[GATEWAY], scopes=scopes, ttl=ttl)

    async def exchange(self, http: httpx.AsyncClient, client: str = "gateway", **form: str) -> httpx.Response:
        params = {
            "grant_type": TOKEN_EXCHANGE,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "resource": self.upstream,
            **form,
        }
        return await http.post(self.token_endpoint, data=params, auth=(client, CLIENTS[client]))


def metadata_of(upstream: str, issuer: str) -> Any:
    """An upstream that only publishes its protected resource metadata (RFC 9728): all the exchange needs of it."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        document = {"resource": upstream, "authorization_servers": [issuer]}
        await respond_json(send, 200, document)

    return app


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    as_sock, up_sock = loopback_socket(), loopback_socket()
    issuer, upstream = f"{base_url(as_sock)}/as", f"{base_url(up_sock)}/mcp"
    authority = DevAuthServer(
        issuer,
        resources=[upstream],
        aggregate=GATEWAY,
        clients=CLIENTS,
        exchange={"gateway": ExchangeRule.of([upstream], subjects=["alice", "carol"])},
    )
    with serve_app(authority, sock=as_sock), serve_app(metadata_of(upstream, issuer), sock=up_sock):
        yield Deployment(authority, upstream)


def claims_of(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


async def test_the_exchanged_token_speaks_for_the_subject_with_the_client_as_actor(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    subject = deployment.subject_token(ttl=120)
    answer = await deployment.exchange(http, subject_token=subject, scope="notes")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["issued_token_type"] == ACCESS_TOKEN_TYPE and body["token_type"] == "Bearer"
    claims = claims_of(body["access_token"])
    assert (claims["sub"], claims["aud"], claims["act"]) == ("alice", deployment.upstream, {"sub": "gateway"})
    assert claims["client_id"] == "gateway" and claims["scope"] == "notes"
    assert claims["exp"] <= claims_of(subject)["exp"] and body["expires_in"] <= 120  # no longer than the subject's
    verified = await JwtVerifier(deployment.authority.issuer, StaticJwks(deployment.authority.keys)).verify(
        body["access_token"]
    )
    assert verified.audience == frozenset({deployment.upstream}) and verified.principal.subject == "alice"


@pytest.mark.parametrize(
    ("client", "form", "error", "says"),
    [
        ("other", {}, "unauthorized_client", "may not exchange tokens"),
        ("gateway", {"subject": "bob"}, "invalid_grant", "may not act for subject 'bob'"),
        ("gateway", {"scope": "notes write"}, "invalid_scope", "scope not granted: write"),
        ("gateway", {"resource": "https://elsewhere.example/mcp"}, "invalid_target", "may not exchange for"),
        ("gateway", {"subject_token_type": "urn:ietf:params:oauth:token-type:id_token"}, "invalid_request", ""),
        ("gateway", {"requested_token_type": "urn:ietf:params:oauth:token-type:refresh_token"}, "invalid_request", ""),
        ("gateway", {"expired": "yes"}, "invalid_grant", "expired"),
        ("gateway", {"forged": "yes"}, "invalid_grant", "subject_token"),
    ],
)
async def test_what_the_policy_does_not_allow_is_refused(
    deployment: Deployment, http: httpx.AsyncClient, client: str, form: dict[str, str], error: str, says: str
) -> None:
    form = dict(form)
    subject = deployment.subject_token(form.pop("subject", "alice"), ttl=-60 if form.pop("expired", "") else 600)
    if form.pop("forged", ""):
        subject = DevAuthServer("https://other.example/as", resources=[], aggregate=GATEWAY, clients={}).mint(
            subject="alice", client_id="app", audience=[GATEWAY], scopes=["notes"]
        )
    answer = await deployment.exchange(http, client, subject_token=subject, **form)
    assert answer.status_code == 400
    assert answer.json()["error"] == error and says in answer.json()["error_description"]


@pytest.fixture
async def exchanging(
    deployment: Deployment, http: httpx.AsyncClient
) -> AsyncIterator[tuple[TokenExchange, list[float]]]:
    """The gateway's credentials for the upstream, on a clock the test moves, with room for two cached tokens."""
    offset = [0.0]
    auth = TokenExchange(
        "notes", OAuth("gateway", "gateway-secret", dpop=False), size=2, clock=lambda: time.time() + offset[0]
    )
    auth.bind(http, deployment.upstream)
    yield auth, offset


async def as_caller(deployment: Deployment, subject: str) -> str:
    token = deployment.subject_token(subject)
    grant = await JwtVerifier(deployment.authority.issuer, StaticJwks(deployment.authority.keys)).verify(token)
    CALLER.set((grant, token))
    return token


async def test_exchanged_tokens_are_cached_per_caller_and_scopes_bounded_and_until_they_expire(
    deployment: Deployment, exchanging: tuple[TokenExchange, list[float]]
) -> None:
    auth, offset = exchanging
    with needing(("notes",)):
        await as_caller(deployment, "alice")
        results: list[str | None] = []

        async def ask() -> None:
            results.append(await auth.token(frozenset()))

        async with anyio.create_task_group() as tg:  # concurrent first calls share one exchange
            for _ in range(4):
                tg.start_soon(ask)
        assert len(set(results)) == 1 and auth.exchanges == 1
        first = results[0]
        assert first is not None and claims_of(first)["sub"] == "alice"
        assert await auth.token(frozenset()) == first and auth.exchanges == 1
        with needing(()):  # other scopes: another token
            assert await auth.token(frozenset()) != first and auth.exchanges == 2
        await as_caller(deployment, "carol")
        carol = await auth.token(frozenset())
        assert carol is not None and claims_of(carol)["sub"] == "carol" and auth.exchanges == 3
        await as_caller(deployment, "alice")  # alice's "notes" token was the least recent of the two kept
        assert await auth.token(frozenset()) != first and auth.exchanges == 4
        offset[0] = 600 - 29  # within 30 s of its expiry: exchanged again
        await auth.token(frozenset())
        assert auth.exchanges == 5
        await auth.reauthorize(frozenset())  # the upstream refused it: the next one is fresh
        await auth.token(frozenset())
        assert auth.exchanges == 6


async def test_a_refused_exchange_names_the_upstream_and_nothing_falls_back(
    deployment: Deployment, exchanging: tuple[TokenExchange, list[float]]
) -> None:
    auth, _ = exchanging
    await as_caller(deployment, "bob")
    with pytest.raises(ExchangeRefused) as refused:
        await auth.token(frozenset())
    assert "for upstream 'notes': invalid_grant: client 'gateway' may not act for subject 'bob'" in refused.value.reason
    CALLER.set(None)  # outside any caller's request: the gateway's own client_credentials token
    own = await auth.token(frozenset())
    assert own is not None and claims_of(own)["sub"] == "gateway" and "act" not in claims_of(own)
