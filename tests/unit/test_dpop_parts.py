"""The DPoP parts around the pure verifier: replay cache, server nonces, challenge parsing, the client's flow
(against httpx.MockTransport: no sockets, no sleeps) and the dev AS's refresh binding."""

from __future__ import annotations

from base64 import urlsafe_b64decode
from typing import Any

import httpx
import orjson
import pytest
from joserfc.jwk import ECKey

from mcp_lossless.client.dpop import DpopFlow, DpopKey
from mcp_lossless.client.oauth import parse_challenge, parse_challenges
from mcp_lossless.core.dpop import (
    Proof,
    ReplayCache,
    accepted_nonces,
    access_token_hash,
    server_nonce,
    verify_proof,
)
from mcp_lossless.devauth.grants import GrantStore, OAuthError, ResourceRules, s256

NOW = 1_800_000_000.0


def claims(proof: str) -> dict[str, Any]:
    payload = proof.split(".")[1]
    decoded: dict[str, Any] = orjson.loads(urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


# -- replay cache ------------------------------------------------------------------------------------


def test_replay_cache_refuses_a_second_use_until_the_entry_expires() -> None:
    now = [NOW]
    cache = ReplayCache(10, lambda: now[0])
    assert cache.first_use(b"a", NOW + 61)
    assert not cache.first_use(b"a", NOW + 61)
    now[0] = NOW + 62
    assert cache.first_use(b"a", NOW + 123), "past its window a proof is refused by its iat anyway"


def test_replay_cache_is_bounded_and_drops_expired_entries_first() -> None:
    now = [NOW]
    cache = ReplayCache(3, lambda: now[0])
    for key in (b"1", b"2", b"3", b"4"):
        assert cache.first_use(key, NOW + 60)
    assert len(cache) == 3
    assert cache.first_use(b"1", NOW + 60), "the oldest was evicted at the bound"
    now[0] = NOW + 61
    assert cache.first_use(b"5", NOW + 121)
    assert len(cache) == 1, "expired entries leave as new ones arrive"


# -- server nonces -----------------------------------------------------------------------------------


def test_nonces_change_per_period_and_the_previous_one_stays_good() -> None:
    key = b"k" * 32
    current = server_nonce(key, 300, NOW)
    assert current in accepted_nonces(key, 300, NOW)
    assert current in accepted_nonces(key, 300, NOW + 300), "one period later it is the previous nonce"
    assert current not in accepted_nonces(key, 300, NOW + 600)
    assert server_nonce(b"j" * 32, 300, NOW) != current, "another key, other nonces"
    assert len(current) == 24


# -- challenges --------------------------------------------------------------------------------------


def test_bearer_and_dpop_challenges_joined_by_a_comma() -> None:
    header = (
        'Bearer resource_metadata="https://s/prm", '
        'DPoP error="invalid_token", error_description="present it as \'DPoP\', not Bearer, x=y", '
        'algs="ES256 EdDSA", resource_metadata="https://s/prm"'
    )
    bearer, dpop = parse_challenges(header)
    assert (bearer.scheme, bearer.error, bearer.resource_metadata) == ("bearer", None, "https://s/prm")
    assert (dpop.scheme, dpop.error, dpop.algs) == ("dpop", "invalid_token", ("ES256", "EdDSA"))
    assert dpop.description == "present it as 'DPoP', not Bearer, x=y"
    chosen = parse_challenge(header)
    assert chosen is not None and chosen.scheme == "dpop" and chosen.error == "invalid_token"


def test_a_dpop_only_challenge_is_acted_on_and_basic_is_not() -> None:
    chosen = parse_challenge('DPoP resource_metadata="https://s/prm"')
    assert chosen is not None and chosen.resource_metadata == "https://s/prm"
    assert parse_challenge('Basic realm="x"') is None


# -- the client's flow -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_bound_token_goes_as_dpop_with_a_fresh_proof_and_one_nonce_retry() -> None:
    key = DpopKey(clock=lambda: NOW)
    seen: list[httpx.Headers] = []  # copies: a retry sends the same request object with new headers

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.copy())
        if "dpop" in request.headers and "nonce" not in claims(request.headers["dpop"]):
            challenge = 'DPoP error="use_dpop_nonce", algs="ES256"'
            return httpx.Response(401, headers={"www-authenticate": challenge, "dpop-nonce": "n-1"})
        return httpx.Response(200, json={})

    flow = DpopFlow(key, token_requests=False, bound=lambda token: token == "bound")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        done = await http.get("https://S.example:443/mcp?x=1", headers={"authorization": "Bearer bound"}, auth=flow)
        assert done.status_code == 200
        again = await http.get("https://s.example/mcp", headers={"authorization": "Bearer bound"}, auth=flow)
        assert again.status_code == 200
        plain = await http.get("https://s.example/mcp", headers={"authorization": "Bearer other"}, auth=flow)
    assert len(seen) == 4 and flow.nonce_retries == 1, "the nonce is remembered for the next request"
    first, retried, second, unbound = seen
    assert first["authorization"] == "DPoP bound" == retried["authorization"]
    one, two = claims(first["dpop"]), claims(retried["dpop"])
    assert one["jti"] != two["jti"] and two["nonce"] == "n-1" and claims(second["dpop"])["nonce"] == "n-1"
    assert one["htu"] == "https://s.example/mcp" and one["htm"] == "GET" and one["ath"] == access_token_hash("bound")
    assert "dpop" not in unbound and unbound["authorization"] == "Bearer other"
    verified = verify_proof(retried["dpop"], "GET", "https://s.example/mcp", "bound", NOW, {"n-1"})
    assert verified == Proof(key.thumbprint, two["jti"], NOW)
    assert plain.status_code == 200


@pytest.mark.anyio
async def test_a_token_request_gets_a_proof_without_ath_and_a_400_nonce_is_retried_once() -> None:
    key = DpopKey(ECKey.generate_key("P-256"), clock=lambda: NOW)
    seen: list[tuple[httpx.Headers, bytes]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.copy(), request.content))
        return httpx.Response(400, headers={"dpop-nonce": f"n-{len(seen)}"}, json={"error": "use_dpop_nonce"})

    flow = DpopFlow(key, token_requests=True)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        refused = await http.post("https://as.example/token", content=b"grant_type=x", auth=flow)
    assert refused.status_code == 400 and len(seen) == 2, "retried once, not in a loop"
    assert [claims(headers["dpop"]).get("nonce") for headers, _ in seen] == [None, "n-1"]
    assert all("ath" not in claims(headers["dpop"]) for headers, _ in seen)
    assert seen[1][1] == b"grant_type=x"


def test_a_key_must_be_a_private_p256_key() -> None:
    with pytest.raises(ValueError, match="private EC P-256"):
        DpopKey(ECKey.import_key(ECKey.generate_key("P-256").as_dict(private=False)))
    with pytest.raises(ValueError, match="private EC P-256"):
        DpopKey(ECKey.generate_key("P-384"))


# -- the dev AS: a public client's refresh token is bound to its key ---------------------------------

AGGREGATE = "https://mcp.example/mcp"
VERIFIER = "v" * 43


def test_a_public_clients_refresh_needs_the_same_key() -> None:
    store = GrantStore(
        ResourceRules([], AGGREGATE, least_privilege=False, single_audience=False), refresh_ttl=100, clock=lambda: NOW
    )
    code = store.issue_code(
        client_id="c",
        redirect_uri="http://127.0.0.1/cb",
        challenge=s256(VERIFIER),
        subject="s",
        resources=(AGGREGATE,),
        scope="",
    )
    issue = store.exchange_code(
        code,
        client_id="c",
        redirect_uri="http://127.0.0.1/cb",
        verifier=VERIFIER,
        requested=(),
        scope=None,
        public_client=True,
        jkt="key-a",
    )
    assert issue.refresh_token is not None
    for other in (None, "key-b"):
        with pytest.raises(OAuthError, match="bound to a DPoP key"):
            store.refresh(issue.refresh_token, client_id="c", requested=(), scope=None, jkt=other)
    refreshed = store.refresh(issue.refresh_token, client_id="c", requested=(), scope=None, jkt="key-a")
    assert refreshed.refresh_token is not None and refreshed.refresh_token != issue.refresh_token
