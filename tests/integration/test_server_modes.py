"""JSON response mode, an external issuer verified over real JWKS HTTP, and the structured resume log."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest

from mcp_lossless.devauth import DevAuthServer
from mcp_lossless.server import ServerConfig, create_app
from mcp_lossless.server.observability import JsonFormatter
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def external() -> Iterator[tuple[str, str]]:
    """A separate authorization server process-alike on its own port, and our server trusting it by URL."""
    as_sock = loopback_socket()
    issuer = f"{base_url(as_sock)}/issuer"
    sock = loopback_socket()
    port = sock.getsockname()[1]
    app = create_app(ServerConfig(port=port, store="memory", issuer=issuer, json_response=True))
    canonical = f"http://127.0.0.1:{port}/mcp"
    authz = DevAuthServer(
        issuer,
        resources=[f"{canonical}/tools/search", f"{canonical}/tools/fetch"],
        aggregate=canonical,
        clients={"ext": "ext-secret"},
    )
    with serve_app(authz, sock=as_sock), serve_app(app, sock=sock, lifespan="on") as url:
        yield url, base_url(as_sock)


async def test_external_issuer_and_json_responses(external: tuple[str, str], http: httpx.AsyncClient) -> None:
    url, as_base = external
    form = {
        "grant_type": "client_credentials",
        "client_id": "ext",
        "client_secret": "ext-secret",
        "resource": f"{url}/mcp",
    }
    token = (await http.post(f"{as_base}/issuer/token", data=form)).json()["access_token"]
    peer = Peer(http, url, token)
    await peer.initialize()
    response = await http.post(
        peer.url, headers=peer.headers(), content=json.dumps(call(1, "fetch", url="j", steps=2, delay_ms=0))
    )
    assert response.headers["content-type"] == "application/json"
    assert response.json()["result"]["content"][0]["text"] == "contents of j: 1 bytes"
    prm = (await http.get(f"{url}/.well-known/oauth-protected-resource/mcp")).json()
    assert prm["authorization_servers"] == [f"{as_base}/issuer"]
    forged = await http.post(peer.url, headers=peer.headers(token=token[:-4] + "AAAA"), content=b"{}")
    assert forged.status_code == 401


async def test_resume_decisions_are_logged_one_line_each_without_tokens(
    server_url: str, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    mcp = f"{server_url}/mcp"
    token = await dev_token(http, server_url, mcp)
    peer = Peer(http, server_url, token)
    await peer.initialize()
    read = await peer.post(call(1, "fetch", url="l", steps=1, delay_ms=0))
    narrowed = await dev_token(http, server_url, f"{mcp}/tools/search")
    with caplog.at_level(logging.INFO, logger="mcp_lossless"):
        assert (await peer.resume(read.ids[0], token=narrowed)).status == 403
        assert (await peer.resume(read.ids[0])).status == 200
        assert (await peer.resume("garbage")).status == 400
    lines = [JsonFormatter().format(r) for r in caplog.records if r.getMessage() == "resume"]
    decisions = [json.loads(line) for line in lines]
    assert [(d["decision"], d.get("reason")) for d in decisions] == [
        ("refused", "insufficient_audience"),
        ("replay", None),
        ("rejected", "malformed"),
    ]
    assert decisions[0]["missing"] == [f"{mcp}/tools/fetch"] and decisions[0]["cursor"] == read.ids[0]
    text = "\n".join(lines) + caplog.text
    assert token not in text and narrowed not in text and peer.session_id not in text
