"""Acceptance 1 of the client issue: the seed scenario from the client's side, against our server.

Our server with its embedded authorization server in least-privilege mode, behind a proxy that can drop
connections. The client authorizes by code + PKCE, runs ``search`` and ``fetch`` as one 2025-03-26
JSON-RPC batch (one stream) under a token for both that it got by a real refresh; mid-call it narrows
to ``search`` (another real refresh, which the least-privilege AS answers with ``aud`` = search only),
the connection drops, the resume with the narrowed token is refused with a 403 challenge, the client
re-authorizes for search + fetch with a fresh grant and resumes from the same cursor. What the client
received, and under which token, is taken from a recording wrapper around its real HTTP transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx
import pytest

from mcp_lossless.client import Client, ProgressUpdate, ToolCall, ToolResult
from mcp_lossless.client.oauth import AuthorizationCodeGrant, OAuth, parse_challenge, unverified_audience
from mcp_lossless.client.transport import Backoff
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.proxy import CuttingProxy
from tests.support.recording import Exchange, RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

REDIRECT = "http://127.0.0.1:9/callback"
STEPS = 8
DELAY_MS = 100
RESUME_AFTER = 0.4
"""The client waits this long before resuming (a 2025-03-26 stream carries no ``retry:`` to go by): by then the
tools have buffered events, fetch's among them, so the server refuses the whole replay before committing (a
403) rather than in-band at the next live event."""


@dataclass
class Setup:
    url: str
    proxy: CuttingProxy
    recorder: RecordingTransport
    http: httpx.AsyncClient


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    """Our server (least-privilege dev AS) behind the proxy; its canonical URI is the proxy's."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    async with CuttingProxy(port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        config = ServerConfig(
            port=port,
            public_url=url,
            store="memory",
            least_privilege=True,
            auto_approve=True,
            retry_ms=int(RESUME_AFTER * 1000),
            dev_clients={"dev-client": "dev-secret"},
        )
        recorder = RecordingTransport()
        with serve_app(create_app(config), sock=sock, lifespan="on"):
            async with httpx.AsyncClient(transport=recorder, timeout=httpx.Timeout(10, read=60)) as http:
                yield Setup(url, proxy, recorder, http)


async def approve(authorization_url: str) -> str:
    """The browser's part with the auto-approving dev AS: one GET, then report where it redirected."""
    async with httpx.AsyncClient() as browser:
        response = await browser.get(authorization_url)
    assert response.status_code == 302, response.text
    return str(response.headers["location"])


def token_responses(recorder: RecordingTransport) -> list[tuple[dict[str, list[str]], str]]:
    """(form sent, access token received) for every successful token request, in order."""
    out = []
    for exchange in recorder.to("/dev-as/token"):
        body = exchange.received_json()
        if exchange.status == 200 and isinstance(body, dict):
            out.append((parse_qs(exchange.sent.decode()), str(body["access_token"])))
    return out


def events_of(exchange: Exchange, wire_id: object) -> list[dict[str, Any]]:
    """What the call with ``wire_id`` produced, as received in ``exchange``: its progress and its result.

    A refusal naming the call (``DELIVERY_REFUSED``) is not something the call produced.
    """
    return [
        m
        for m in exchange.messages()
        if (m.get("id") == wire_id and "result" in m) or (m.get("params") or {}).get("progressToken") == wire_id
    ]


async def test_narrowed_mid_call_refused_then_reauthorized_and_resumed_each_result_exactly_once(setup: Setup) -> None:
    url, recorder = setup.url, setup.recorder
    search_resource, fetch_resource = f"{url}/tools/search", f"{url}/tools/fetch"
    auth = OAuth("dev-client", "dev-secret", grant=AuthorizationCodeGrant(REDIRECT, approve))
    progress: dict[str, list[float]] = {"search": [], "fetch": []}
    both_running = anyio.Event()
    narrowed = anyio.Event()
    fetch_after_narrowing: list[float] = []

    def on(tool: str) -> Any:
        def record(update: ProgressUpdate) -> None:
            progress[tool].append(update.progress)
            if tool == "fetch" and narrowed.is_set():
                fetch_after_narrowing.append(update.progress)
            if min(len(progress["search"]), len(progress["fetch"])) >= 2:
                both_running.set()

        return record

    calls = [
        ToolCall("search", {"query": "lossless", "steps": STEPS, "delay_ms": DELAY_MS}, on("search")),
        ToolCall("fetch", {"url": "https://example.com/a", "steps": STEPS, "delay_ms": DELAY_MS}, on("fetch")),
    ]
    client = Client(
        url,
        auth=auth,
        http=setup.http,
        protocol_version="2025-03-26",
        timeout=30,
        backoff=Backoff(initial=RESUME_AFTER, maximum=1.0),
    )
    outcomes: list[Any] = []
    with anyio.fail_after(60):
        async with client:
            await client.list_tools()
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    outcomes.extend(await client.call_tools(calls))

                tg.start_soon(run)
                await both_running.wait()
                await auth.narrow([search_resource])
                narrowed.set()
                assert setup.proxy.cut_all() >= 1

    # Both calls end with their true results, each exactly once, every progress value exactly once.
    search, fetch = outcomes
    assert isinstance(search, ToolResult) and search.text == "search results for 'lossless': 3 documents"
    assert isinstance(fetch, ToolResult) and fetch.text == "contents of https://example.com/a: 21 bytes"
    assert progress == {"search": list(range(1, STEPS + 1)), "fetch": list(range(1, STEPS + 1))}

    # The batch: one POST carrying both calls, under a token for both that came from a refresh.
    mcp = recorder.to("/mcp")
    (batch,) = [e for e in mcp if e.method == "POST" and isinstance(e.sent_json(), list)]
    fetch_id = batch.sent_json()[1]["id"]
    assert [m["params"]["name"] for m in batch.sent_json()] == ["search", "fetch"]
    assert batch.audience == {search_resource, fetch_resource}
    tokens = token_responses(recorder)
    (wide_form,) = [form for form, token in tokens if token == batch.token]
    assert wide_form["grant_type"] == ["refresh_token"]

    # The narrowing: a real refresh asking for search alone, answered with aud = search only.
    (narrow_form, narrow_token) = next(
        (form, token) for form, token in tokens if unverified_audience(token) == {search_resource}
    )
    assert narrow_form["grant_type"] == ["refresh_token"] and narrow_form["resource"] == [search_resource]

    # The resume with the narrowed token is refused before any event, with a challenge naming fetch.
    resumes = [e for e in mcp if e.method == "GET"]
    refused = [e for e in resumes if e.token == narrow_token]
    assert refused and all(e.status == 403 for e in refused)
    challenge = parse_challenge(refused[0].headers.get("www-authenticate"))
    assert challenge is not None and challenge.error == "insufficient_scope"
    assert fetch_resource in challenge.resources
    for exchange in refused:
        assert exchange.headers["content-type"].startswith("application/json"), "no event stream at all"
        body = exchange.received_json()
        assert body["error"] == "replay_refused" and body["resumable"] is True
        assert body["lastEventId"] == exchange.last_event_id and body["requiredResources"] == [fetch_resource]

    # Then a fresh grant (authorization code, not a refresh) for search + fetch, and a resume from the same cursor.
    fresh = [
        token
        for form, token in tokens
        if form["grant_type"] == ["authorization_code"] and {search_resource, fetch_resource} <= set(form["resource"])
    ]
    assert len(fresh) == 1
    resumed = [e for e in resumes if e.token == fresh[0]]
    assert resumed and resumed[0].status == 200
    assert resumed[0].last_event_id == refused[0].last_event_id
    assert resumed[0].number > refused[-1].number

    # No fetch event ever reached the client over a connection whose token did not cover fetch, and none was
    # handed to the caller between the narrowing and the fresh grant except what the wide token had received.
    for exchange in mcp:
        if events_of(exchange, fetch_id):
            assert fetch_resource in exchange.audience or url in exchange.audience, exchange.number
        if exchange.token == narrow_token:
            assert events_of(exchange, fetch_id) == []
    received_before_cut = {
        m["params"]["progress"] for e in mcp if e.token == batch.token for m in events_of(e, fetch_id) if "params" in m
    }
    assert set(fetch_after_narrowing) - received_before_cut <= {
        m["params"]["progress"] for e in resumed for m in events_of(e, fetch_id) if "params" in m
    }
    assert auth.narrowed == []


async def test_a_client_preferring_2025_11_25_never_sends_2026_07_28(setup: Setup) -> None:
    """Our server refuses 2026-07-28 with a 400; the client offers 2025-11-25 and keeps to what was agreed."""
    with pytest.raises(ValueError, match="2026-07-28"):
        Client(setup.url, protocol_version="2026-07-28")
    async with Client(setup.url, auth=OAuth("dev-client", "dev-secret"), http=setup.http, timeout=20) as client:
        result = await client.call_tool("search", {"query": "v", "steps": 1, "delay_ms": 0})
        assert client.server.protocol_version == "2025-11-25"
    assert result.text == "search results for 'v': 3 documents"
    mcp = setup.recorder.to("/mcp")
    (initialize,) = [e for e in mcp if (e.sent_json() or {}).get("method") == "initialize"]
    assert initialize.sent_json()["params"]["protocolVersion"] == "2025-11-25"
    assert all(b"2026-07-28" not in e.sent for e in mcp)
    assert {e.protocol_version for e in mcp if e is not initialize} == {"2025-11-25"}
