"""The client's OAuth against our server and its embedded authorization server (real JWTs, real HTTP).

Discovery runs from nothing but the MCP URL; tokens are asked per tool resource; the authorization code
flow runs headless (the dev AS approves automatically and redirects); a token that expires mid-call is
refused in-band by the server, and the client re-authorizes and resumes from the same cursor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.client import AuthorizationFailed, Client, ProgressUpdate
from mcp_lossless.client.oauth import (
    AuthorizationCodeGrant,
    LoopbackRedirect,
    OAuth,
    TokenEndpointError,
    unverified_audience,
)
from mcp_lossless.client.transport import Backoff
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

CLIENTS = {"dev-client": "dev-secret"}
REDIRECT = "http://127.0.0.1:9/callback"


class Recorder:
    """Records (rpc method, bearer token) of every POST to the MCP endpoint, and every resume GET."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.posts: list[tuple[str | None, str | None]] = []
        self.resumes: list[tuple[str | None, str | None]] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/mcp":
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        token = headers.get("authorization", "").removeprefix("Bearer ").removeprefix("DPoP ") or None
        if scope["method"] == "GET":
            with self._lock:
                self.resumes.append((headers.get("last-event-id"), token))
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] != "http.request":
                return message  # e.g. http.disconnect, which a server may await after the body
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                parsed = orjson.loads(body) if body else {}
                with self._lock:
                    self.posts.append((parsed.get("method") if isinstance(parsed, dict) else None, token))
            return message

        await self.app(scope, recording_receive, send)

    def tokens_for(self, method: str) -> list[str | None]:
        with self._lock:
            return [token for m, token in self.posts if m == method]


def serve_lossless(**config: Any) -> Any:
    """Our server, built for the loopback port it listens on (its canonical URI includes the port)."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    app = Recorder(
        create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS, auto_approve=True, **config))
    )
    return app, serve_app(app, sock=sock), f"{base_url(sock)}/mcp"


@pytest.fixture(scope="module")
def lossless() -> Iterator[tuple[str, Recorder]]:
    app, server, url = serve_lossless(retry_ms=100)
    with server:
        yield url, app


async def headless(authorization_url: str) -> str:
    """What a browser does with the auto-approving dev AS: follow to the redirect, report where it went."""
    async with httpx.AsyncClient() as http:
        response = await http.get(authorization_url)
    assert response.status_code == 302, response.text
    return response.headers["location"]


def fast(url: str, auth: OAuth) -> Client:
    return Client(url, auth=auth, timeout=15, backoff=Backoff(initial=0.05, maximum=0.5))


@pytest.mark.anyio
async def test_client_credentials_discovery_and_per_tool_tokens(lossless: tuple[str, Recorder]) -> None:
    url, recorder = lossless
    auth = OAuth("dev-client", "dev-secret")
    updates: list[ProgressUpdate] = []
    async with fast(url, auth) as client:
        tools = {t.name: t for t in await client.list_tools()}
        result = await client.call_tool("search", {"query": "q", "steps": 2, "delay_ms": 0}, on_progress=updates.append)
    assert tools["search"].resource == f"{url}/tools/search"
    assert tools["search"].idempotent
    assert result.text.startswith("search results for 'q'")
    assert [u.progress for u in updates] == [1, 2]
    (init_token,) = recorder.tokens_for("initialize")[-1:]
    call_token = recorder.tokens_for("tools/call")[-1]
    assert init_token is not None and call_token is not None
    assert unverified_audience(init_token) == frozenset({url})
    assert unverified_audience(call_token) == frozenset({f"{url}/tools/search"}), (
        "least privilege: the tool's own resource"
    )
    assert auth.narrowed == []


@pytest.mark.anyio
async def test_authorization_code_with_pkce_and_iss(lossless: tuple[str, Recorder]) -> None:
    url, recorder = lossless
    seen: list[str] = []

    async def handler(authorization_url: str) -> str:
        seen.append(authorization_url)
        return await headless(authorization_url)

    auth = OAuth("dev-public", grant=AuthorizationCodeGrant(REDIRECT, handler))
    async with fast(url, auth) as client:
        result = await client.call_tool("fetch", {"url": "https://example.com/x", "steps": 1, "delay_ms": 0})
    assert result.text.startswith("contents of https://example.com/x")
    query = parse_qs(urlsplit(seen[0]).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["resource"] == [url]
    # The fetch token came from a refresh of that one grant (no second trip through the browser), asking
    # for fetch; this AS (not in least-privilege mode) keeps the server's own URI in the audience too.
    assert len(seen) == 1
    assert f"{url}/tools/fetch" in (unverified_audience(recorder.tokens_for("tools/call")[-1] or "") or ())


@pytest.mark.anyio
async def test_a_confidential_client_used_without_its_secret_is_told_what_is_missing(
    lossless: tuple[str, Recorder],
) -> None:
    """``dev-client`` through the browser, no secret: the code exchange is ``invalid_client``, and the reason says
    the client was sent without a secret (not only "client authentication failed")."""
    url, _ = lossless
    auth = OAuth("dev-client", grant=AuthorizationCodeGrant(REDIRECT, headless))
    with pytest.raises(TokenEndpointError) as refused:
        async with fast(url, auth):
            pass
    assert refused.value.error == "invalid_client" and refused.value.secretless == "dev-client"
    assert refused.value.reason.endswith("dev-client was sent without a secret: a confidential client needs its secret")


@pytest.mark.anyio
async def test_authorization_response_from_another_issuer_is_refused(lossless: tuple[str, Recorder]) -> None:
    url, _ = lossless

    async def mix_up(authorization_url: str) -> str:
        location = urlsplit(await headless(authorization_url))
        query = {k: v[0] for k, v in parse_qs(location.query).items()}
        query["iss"] = "https://attacker.example"
        return urlunsplit(location._replace(query=urlencode(query)))

    auth = OAuth("dev-public", grant=AuthorizationCodeGrant(REDIRECT, mix_up))
    with pytest.raises(AuthorizationFailed, match="iss"):
        async with fast(url, auth):
            pass


@pytest.mark.anyio
async def test_token_expiring_mid_call_is_refused_in_band_then_reauthorized_and_resumed() -> None:
    """The server stops delivering when the stream's token expires (post-commit refusal, no SSE id).

    The client re-authorizes with a fresh grant and resumes from the same cursor: the call ends with its
    true result, each progress value exactly once.
    """
    app, server, url = serve_lossless(retry_ms=50, token_ttl=1, leeway_seconds=0)
    updates: list[float] = []
    with server:
        auth = OAuth("dev-client", "dev-secret", leeway=0)
        async with fast(url, auth) as client:
            with anyio.fail_after(20):
                result = await client.call_tool(
                    "fetch",
                    {"url": "https://example.com/slow", "steps": 5, "delay_ms": 400},
                    on_progress=lambda u: updates.append(u.progress),
                )
    assert result.text.startswith("contents of https://example.com/slow")
    assert updates == [1, 2, 3, 4, 5]
    assert app.resumes, "the refusal must have made the client resume"
    call_token = app.tokens_for("tools/call")[-1]
    assert all(cursor is not None and token not in (None, call_token) for cursor, token in app.resumes)


@pytest.mark.anyio
async def test_metadata_for_another_resource_stops_authorization() -> None:
    """RFC 9728 §3.3: metadata whose ``resource`` is not this server must not be used."""
    as_requests: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path.startswith("/.well-known/oauth-protected-resource"):
            body = {"resource": "https://evil.example.com/mcp", "authorization_servers": ["https://evil.example.com"]}
            status = 200
        else:
            if path != "/mcp":
                as_requests.append(path)
            body, status = {"error": "invalid_token"}, 401
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": orjson.dumps(body)})

    with serve_app(app) as base, pytest.raises(AuthorizationFailed, match="evil"):
        async with fast(f"{base}/mcp", OAuth("dev-client", "dev-secret")):
            pass
    assert as_requests == []


@pytest.mark.anyio
async def test_loopback_redirect_receives_the_authorization_response(lossless: tuple[str, Recorder]) -> None:
    """The CLI's flow: the user's browser visits the URL and is redirected to a listener on 127.0.0.1."""
    url, _ = lossless
    shown = anyio.Event()
    shown_urls: list[str] = []
    pages: list[str] = []

    def show(authorization_url: str) -> None:
        shown_urls.append(authorization_url)
        shown.set()

    async def browser() -> None:
        await shown.wait()
        async with httpx.AsyncClient(follow_redirects=True) as http:
            page = await http.get(shown_urls[0])
        pages.append(page.text)

    async with LoopbackRedirect(show) as redirect, anyio.create_task_group() as tg:
        tg.start_soon(browser)
        auth = OAuth("dev-public", grant=AuthorizationCodeGrant(redirect.uri, redirect))
        async with fast(url, auth) as client:
            result = await client.call_tool("search", {"query": "loop", "steps": 1, "delay_ms": 0})
    assert result.text.startswith("search results for 'loop'")
    assert redirect.uri.startswith("http://127.0.0.1:")
    assert "You can close this window" in pages[0]


class FirstTokenTooNarrow(OAuth):
    """Hands out a token for ``search`` the first time a ``fetch`` token is wanted (a stale cache, say)."""

    def __init__(self, search: str, fetch: str) -> None:
        super().__init__("dev-client", "dev-secret")
        self._search, self._fetch = search, fetch
        self.handed_narrow = False

    async def token(self, resources: frozenset[str]) -> str | None:
        if resources == {self._fetch} and not self.handed_narrow:
            self.handed_narrow = True
            return await super().token(frozenset({self._search}))
        return await super().token(resources)


@pytest.mark.anyio
async def test_403_on_a_call_steps_up_and_sends_the_same_request_again(lossless: tuple[str, Recorder]) -> None:
    url, recorder = lossless
    auth = FirstTokenTooNarrow(f"{url}/tools/search", f"{url}/tools/fetch")
    async with fast(url, auth) as client:
        before = len(recorder.tokens_for("tools/call"))
        result = await client.call_tool("fetch", {"url": "https://example.com/s", "steps": 1, "delay_ms": 0})
    assert auth.handed_narrow
    assert result.text.startswith("contents of https://example.com/s")
    first, second = recorder.tokens_for("tools/call")[before:]
    assert unverified_audience(first or "") == frozenset({f"{url}/tools/search"})
    assert unverified_audience(second or "") == frozenset({f"{url}/tools/fetch"})
