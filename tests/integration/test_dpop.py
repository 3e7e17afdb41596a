"""DPoP end to end (RFC 9449, SEP-1932): real HTTP on loopback, real signed tokens and proofs.

The seed scenario with DPoP-bound tokens: a ``fetch`` call with progress is cut after its first events; the
resume by the key holder (with a covering token) gets the rest exactly once; the same ``Last-Event-ID`` and
token from anyone without the key is refused with a DPoP challenge and no event; a replayed proof is refused.
Then the attack battery's token cases repeated with bound tokens, server nonces, ``require_dpop``, and our own
client (both eras) obtaining and presenting bound tokens with nonce retries at the AS and the server.

Proofs in the raw-HTTP tests are built here with joserfc, not with the client's builder.
"""

from __future__ import annotations

import secrets
import time
import uuid
from base64 import urlsafe_b64decode
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
from joserfc import jws
from joserfc.jwk import ECKey

from mcp_lossless.client import Client, OAuth
from mcp_lossless.client.dpop import DpopFlow, DpopKey
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.client.oauth import parse_challenges
from mcp_lossless.core.dpop import access_token_hash
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.interop.peers.sdk_resumable_server import sdk_resumable_server
from tests.support.mcp_http import Peer, StreamRead, call
from tests.support.processes import free_port
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

CLIENTS = {"dev-client": "dev-secret"}


def make_server(**settings: Any) -> Iterator[str]:
    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS, retry_ms=200, **settings))

    with lossless_server(make) as url:
        yield url


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """Bearer and DPoP tokens both taken (the default)."""
    yield from make_server()


@pytest.fixture(scope="module")
def nonce_url() -> Iterator[str]:
    """Server nonces required, at the dev AS and at the MCP endpoint."""
    yield from make_server(dpop_nonce=True)


@pytest.fixture(scope="module")
def required_url() -> Iterator[str]:
    """``require_dpop``: bound tokens only."""
    yield from make_server(require_dpop=True)


def proof(
    key: ECKey,
    method: str,
    url: str,
    token: str | None = None,
    *,
    header: dict[str, Any] | None = None,
    **claims: Any,
) -> str:
    head: dict[str, Any] = {"typ": "dpop+jwt", "alg": "ES256", "jwk": key.as_dict(private=False), **(header or {})}
    body: dict[str, Any] = {"jti": secrets.token_urlsafe(12), "htm": method, "htu": url, "iat": int(time.time())}
    if token is not None:
        body["ath"] = access_token_hash(token)
    body.update(claims)
    return jws.serialize_compact(head, orjson.dumps({k: v for k, v in body.items() if v is not None}), key)


async def bound_token(http: httpx.AsyncClient, base: str, key: ECKey, *resources: str, nonce: str | None = None) -> str:
    """A client-credentials token of the dev AS bound to ``key`` (asserts ``token_type: DPoP`` and ``cnf.jkt``)."""
    form = [("grant_type", "client_credentials"), ("client_id", "dev-client"), ("client_secret", "dev-secret")]
    form += [("resource", r) for r in resources]
    endpoint = f"{base}/dev-as/token"
    headers = {"content-type": "application/x-www-form-urlencoded", "dpop": proof(key, "POST", endpoint, nonce=nonce)}
    response = await http.post(endpoint, content=urlencode(form), headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["token_type"] == "DPoP"
    token: str = response.json()["access_token"]
    assert claims_of(token)["cnf"] == {"jkt": key.thumbprint()}
    return token


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = orjson.loads(urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


class DpopPeer(Peer):
    """A raw-HTTP peer presenting its token as ``Authorization: DPoP`` with a fresh proof by ``key`` per request."""

    def __init__(self, http: httpx.AsyncClient, base: str, token: str, key: ECKey, **kwargs: Any) -> None:
        super().__init__(http, base, token, **kwargs)
        self.key = key
        self.method = "POST"
        self.last_proof = ""

    def headers(self, token: str | None = None, **extra: str) -> dict[str, str]:
        out = super().headers(token, **extra)
        value = out["authorization"].removeprefix("Bearer ")
        self.last_proof = proof(self.key, self.method, self.url, value)
        return {**out, "authorization": f"DPoP {value}", "dpop": self.last_proof, **extra}

    async def resume(
        self, last_event_id: str, *, token: str | None = None, stop_after: int | None = None
    ) -> StreamRead:
        self.method = "GET"
        try:
            return await super().resume(last_event_id, token=token, stop_after=stop_after)
        finally:
            self.method = "POST"


def dpop_challenge(read: StreamRead | httpx.Response) -> Any:
    """The DPoP challenge of a 401 (there must be one, with ``algs``)."""
    challenges = [c for c in parse_challenges(read.headers.get("www-authenticate")) if c.scheme == "dpop"]
    assert len(challenges) == 1, read.headers.get("www-authenticate")
    assert "ES256" in challenges[0].algs
    return challenges[0]


async def test_the_seed_scenario_with_bound_tokens(server_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{server_url}/mcp"
    key, thief_key = ECKey.generate_key("P-256"), ECKey.generate_key("P-256")
    token = await bound_token(http, server_url, key, mcp)
    peer = DpopPeer(http, server_url, token, key)
    await peer.initialize()
    first = await peer.post(call(7, "fetch", progress="f", url="https://example.com/a", steps=4), stop_after=2)
    assert first.status == 200 and len(first.ids) == 2
    cursor = first.ids[-1]

    # The stolen token and event id, without the key: as a bearer token, and with the thief's own proof.
    thief = Peer(http, server_url, token)
    thief.session_id = peer.session_id
    as_bearer = await thief.resume(cursor)
    assert as_bearer.status == 401 and as_bearer.events == []
    assert dpop_challenge(as_bearer).error == "invalid_token"
    thief_proof = DpopPeer(http, server_url, token, thief_key)
    thief_proof.session_id = peer.session_id
    swapped = await thief_proof.resume(cursor)
    assert swapped.status == 401 and swapped.events == []
    assert dpop_challenge(swapped).error == "invalid_token"

    # The key holder, with a new token covering the call: the rest, exactly once.
    peer.token = await bound_token(http, server_url, key, mcp)
    rest = await peer.resume(cursor)
    assert rest.status == 200
    used = dict(authorization=f"DPoP {peer.token}", dpop=peer.last_proof)
    assert set(first.ids).isdisjoint(rest.ids) and len(rest.ids) == len(set(rest.ids))
    progress = [m["params"]["progress"] for r in (first, rest) for m in r.messages if "method" in m]
    assert progress == [1, 2, 3, 4]
    (result,) = [m for m in rest.messages if m.get("id") == 7]
    assert result["result"]["content"][0]["text"].startswith("contents of https://example.com/a")

    # The proof that resume used, replayed with its token: refused, nothing delivered.
    replay_headers = {**peer.headers(), **used, "last-event-id": cursor, "accept": "text/event-stream"}
    replay_headers.pop("content-type")
    async with http.stream("GET", mcp, headers=replay_headers) as replayed:
        body = await replayed.aread()
    assert replayed.status_code == 401 and b"event:" not in body and b"data:" not in body
    challenge = dpop_challenge(replayed)
    assert challenge.error == "invalid_dpop_proof" and "used before" in (challenge.description or "")


def _list(peer: Peer) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


ATTACKS = {
    "proof for another URL": lambda key, url, token: {"dpop": proof(key, "POST", url + "/other", token)},
    "proof for another method": lambda key, url, token: {"dpop": proof(key, "GET", url, token)},
    "stale iat": lambda key, url, token: {"dpop": proof(key, "POST", url, token, iat=int(time.time()) - 600)},
    "key swapped into the header": lambda key, url, token: {
        "dpop": proof(ECKey.generate_key("P-256"), "POST", url, token)
    },
    "private key in jwk": lambda key, url, token: {
        "dpop": proof(key, "POST", url, token, header={"jwk": key.as_dict(private=True)})
    },
    "ath for another token": lambda key, url, token: {"dpop": proof(key, "POST", url, token + "x")},
    "no proof": lambda key, url, token: {},
    "bound token as Bearer": lambda key, url, token: {
        "authorization": f"Bearer {token}",
        "dpop": proof(key, "POST", url, token),
    },
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_attack_battery_with_bound_tokens(attack: str, server_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{server_url}/mcp"
    key = ECKey.generate_key("P-256")
    peer = DpopPeer(http, server_url, await bound_token(http, server_url, key, mcp), key)
    await peer.initialize()
    assert peer.token is not None
    headers = {**peer.headers(), "dpop": "", **ATTACKS[attack](key, mcp, peer.token)}
    headers = {k: v for k, v in headers.items() if v}
    response = await http.post(mcp, content=orjson.dumps(_list(peer)), headers=headers)
    assert response.status_code == 401, response.text
    assert "tools" not in response.text
    assert dpop_challenge(response).error in {"invalid_token", "invalid_dpop_proof"}
    ok = await http.post(mcp, content=orjson.dumps(_list(peer)), headers=peer.headers())
    assert ok.status_code == 200 and "fetch" in ok.text, "the key holder is still served"


async def test_two_proof_headers_are_refused(server_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{server_url}/mcp"
    key = ECKey.generate_key("P-256")
    token = await bound_token(http, server_url, key, mcp)
    message = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "ping"})
    headers = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
        ("authorization", f"DPoP {token}"),
        ("dpop", proof(key, "POST", mcp, token)),
        ("dpop", proof(key, "POST", mcp, token)),
    ]
    response = await http.post(mcp, content=message, headers=headers)
    assert response.status_code == 401 and dpop_challenge(response).error == "invalid_dpop_proof"


async def test_an_unbound_token_is_still_a_bearer_token_by_default(server_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{server_url}/mcp"
    from tests.support.mcp_http import dev_token

    token = await dev_token(http, server_url, mcp)
    assert "cnf" not in claims_of(token)
    peer = Peer(http, server_url, token)
    await peer.initialize()
    key = ECKey.generate_key("P-256")
    as_dpop = DpopPeer(http, server_url, token, key)
    response = await http.post(mcp, content=orjson.dumps(_list(peer)), headers=as_dpop.headers())
    assert response.status_code == 401 and dpop_challenge(response).error == "invalid_token"
    metadata = (await http.get(f"{server_url}/.well-known/oauth-protected-resource/mcp")).json()
    assert metadata["dpop_signing_alg_values_supported"][0] == "ES256"
    assert "dpop_bound_access_tokens_required" not in metadata
    as_metadata = (await http.get(f"{server_url}/.well-known/oauth-authorization-server/dev-as")).json()
    assert "ES256" in as_metadata["dpop_signing_alg_values_supported"]


async def test_require_dpop_refuses_bearer_tokens_and_says_so(required_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{required_url}/mcp"
    from tests.support.mcp_http import dev_token

    metadata = (await http.get(f"{required_url}/.well-known/oauth-protected-resource/mcp")).json()
    assert metadata["dpop_bound_access_tokens_required"] is True
    assert metadata["dpop_signing_alg_values_supported"] == ["ES256", "EdDSA", "PS256", "RS256"]
    missing = await http.post(mcp, content=b"{}", headers={"content-type": "application/json"})
    assert missing.status_code == 401
    assert [c.scheme for c in parse_challenges(missing.headers["www-authenticate"])] == ["dpop"]
    bearer = Peer(http, required_url, await dev_token(http, required_url, mcp))
    refused = await bearer.post({"jsonrpc": "2.0", "id": 0, "method": "ping"})
    assert refused.status == 401
    assert dpop_challenge(refused).error == "invalid_token"
    key = ECKey.generate_key("P-256")
    peer = DpopPeer(http, required_url, await bound_token(http, required_url, key, mcp), key)
    assert (await peer.initialize())["serverInfo"]["name"] == "mcp-lossless"


async def test_server_nonces_at_the_as_and_the_endpoint(nonce_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{nonce_url}/mcp"
    key = ECKey.generate_key("P-256")
    endpoint = f"{nonce_url}/dev-as/token"
    form = urlencode({"grant_type": "client_credentials", "client_id": "dev-client", "client_secret": "dev-secret"})
    headers = {"content-type": "application/x-www-form-urlencoded", "dpop": proof(key, "POST", endpoint)}
    challenged = await http.post(endpoint, content=form, headers=headers)
    assert challenged.status_code == 400 and challenged.json()["error"] == "use_dpop_nonce"
    as_nonce = challenged.headers["dpop-nonce"]
    token = await bound_token(http, nonce_url, key, mcp, nonce=as_nonce)

    peer = DpopPeer(http, nonce_url, token, key)
    message = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "ping"})
    first = await http.post(mcp, content=message, headers=peer.headers())
    assert first.status_code == 401 and dpop_challenge(first).error == "use_dpop_nonce"
    rs_nonce = first.headers["dpop-nonce"]
    wrong = {**peer.headers(), "dpop": proof(key, "POST", mcp, token, nonce="made-up")}
    assert (await http.post(mcp, content=message, headers=wrong)).status_code == 401
    right = {**peer.headers(), "dpop": proof(key, "POST", mcp, token, nonce=rs_nonce)}
    answered = await http.post(mcp, content=message, headers=right)
    assert answered.status_code == 400 and "Mcp-Session-Id" in answered.text, "past authorization: no session yet"


@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.parametrize("nonces", [False, True])
async def test_our_client_gets_and_presents_bound_tokens(
    era: str, nonces: bool, server_url: str, nonce_url: str
) -> None:
    """Automatic: the dev AS advertises ES256, so the client asks for a bound token and proves on every request,
    a progress-reporting call included; with nonces it retries once at the AS and once at the server."""
    url = f"{nonce_url if nonces else server_url}/mcp"
    auth = OAuth("dev-client", "dev-secret")
    progress: list[float] = []
    if era == "legacy":
        async with Client(url, auth=auth) as client:
            result = await client.call_tool(
                "fetch", {"url": "u", "steps": 3}, on_progress=lambda p: progress.append(p.progress)
            )
    else:
        async with ModernClient(url, auth=auth) as modern:
            result = await modern.call_tool(
                "fetch", {"url": "u", "steps": 3}, on_progress=lambda p: progress.append(p.progress)
            )
    assert result.content[0]["text"].startswith("contents of u")
    if era == "legacy":
        assert progress == [1, 2, 3]
    assert auth.dpop_key is not None
    tokens = auth._tokens
    assert tokens and all(t.dpop for t in tokens)
    assert all(claims_of(t.value)["cnf"]["jkt"] == auth.dpop_key.thumbprint for t in tokens)
    flow = auth.request_auth()
    assert flow is not None
    if nonces:
        assert auth._token_flow is not None and auth._token_flow.nonce_retries >= 1
        assert isinstance(flow, DpopFlow) and flow.nonce_retries >= 1


async def test_a_client_told_not_to_use_dpop_gets_bearer_tokens(server_url: str) -> None:
    auth = OAuth("dev-client", "dev-secret", dpop=False)
    async with Client(f"{server_url}/mcp", auth=auth) as client:
        await client.call_tool("search", {"query": "q"})
    assert auth.dpop_key is None and auth.request_auth() is None
    assert all("cnf" not in claims_of(t.value) for t in auth._tokens)


async def test_a_bound_token_refused_with_a_bearer_challenge_alone_is_asked_for_again_as_a_bearer_token() -> None:
    """An AS that advertises DPoP (ours) in front of a resource that only knows Bearer (the official SDK's server):
    the client asked for bound tokens, and asked again after each 401, until "still refused after 2 fresh
    grants". A 401 with no ``DPoP`` challenge to a bound token means the resource takes none: bearer tokens."""
    with sdk_resumable_server() as peer:
        auth = OAuth("dev-client", "dev-secret")
        async with ModernClient(peer.url, auth=auth) as client:
            await client.discover()
            tools = await client.list_tools()
    assert {tool.name for tool in tools} == {"search", "fetch"}
    assert auth._tokens and all(not t.dpop and "cnf" not in claims_of(t.value) for t in auth._tokens)


def test_a_given_key_is_used() -> None:
    key = ECKey.generate_key("P-256")
    auth = OAuth("c", "s", dpop=DpopKey(key))
    assert auth.dpop_key is not None and auth.dpop_key.thumbprint == key.thumbprint()


@pytest.fixture(scope="module")
def replicas(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """Two servers on one redis-server (one prefix), one dev-keys file and one public URL: (canonical, a, b)."""
    store = f"{redis_url}?prefix=dpop-{uuid.uuid4().hex[:12]}"
    keys = str(tmp_path_factory.mktemp("dpop") / "dev-keys.json")
    canonical = f"http://127.0.0.1:{free_port()}/mcp"

    def make(port: int) -> object:
        config = ServerConfig(port=port, store=store, dev_clients=CLIENTS, dev_keys=keys, public_url=canonical)
        return create_app(config)

    with lossless_server(make) as a, lossless_server(make) as b:
        yield canonical, a, b


async def test_a_proof_replayed_to_another_redis_replica_is_refused(
    replicas: tuple[str, str, str], http: httpx.AsyncClient
) -> None:
    canonical, a, b = replicas
    key = ECKey.generate_key("P-256")
    form = [("grant_type", "client_credentials"), ("client_id", "dev-client"), ("client_secret", "dev-secret")]
    endpoint = f"{canonical.removesuffix('/mcp')}/dev-as/token"  # the AS's issuer is the canonical origin
    headers = {"content-type": "application/x-www-form-urlencoded", "dpop": proof(key, "POST", endpoint)}
    issued = await http.post(f"{a}/dev-as/token", content=urlencode(form), headers=headers)
    assert issued.status_code == 200 and issued.json()["token_type"] == "DPoP", issued.text
    token = issued.json()["access_token"]
    message = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
    )
    sent = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "authorization": f"DPoP {token}",
        "dpop": proof(key, "POST", canonical, token),
    }
    first = await http.post(f"{a}/mcp", content=message, headers=sent)
    assert first.status_code == 200, first.text
    replayed = await http.post(f"{b}/mcp", content=message, headers=sent)
    assert replayed.status_code == 401
    challenge = dpop_challenge(replayed)
    assert challenge.error == "invalid_dpop_proof" and "used before" in (challenge.description or "")
    fresh = {**sent, "dpop": proof(key, "POST", canonical, token)}
    assert (await http.post(f"{b}/mcp", content=message, headers=fresh)).status_code == 200
