"""Stock clients that speak 2026-07-28 against our dual-era server, and ours against the Python SDK's modern leg.

- The official Python SDK 2.3 ``Client`` in its default mode (``"auto"``: it probes ``server/discover`` first)
  and FastMCP's client (the same default) must land on 2026-07-28, not on their ``initialize`` fallback, and
  list and call tools there. A TypeScript SDK 2.x client pinned to 2026-07-28, or in its ``auto`` mode (its
  default is the legacy handshake), likewise.
- Legacy and modern clients, from both SDKs, call one server process at the same time: a rendezvous tool
  answers only once every one of them is inside it.
- Our client against a 2026-only server built from the Python SDK (its modern leg, legacy requests refused).

What the server saw is read from a recording ASGI wrapper (headers and bodies as they arrived), so "landed on
2026-07-28" is the server's view as well as the client's own report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import fastmcp
import httpx
import httpx2
import orjson
import pytest
from mcp import Client as SdkClient
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from mcp_lossless.client import Client, RequestRejected, ToolFailed
from mcp_lossless.client.modern import ModernClient, open_client
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolError, ToolRegistry
from tests.interop.peers.sdk_modern_server import modern_only_sdk_server
from tests.interop.scripted_server import Exchange, Recorder
from tests.support.mcp_http import dev_token
from tests.support.modern_http import MODERN
from tests.support.node import node_binary, ts_client_dir
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

TS_DRIVER = os.path.join(os.path.dirname(__file__), "peers", "ts_client_v2.mjs")
MEET_SECONDS = 20.0
"""How long the rendezvous tool waits for every party before it fails the call."""
CLIENTS = {"dev-client": "dev-secret"}


class Rendezvous:
    """The ``meet`` tool's shared state: each call waits inside the tool until ``parties`` calls are in."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.everyone: anyio.Event | None = None


def tools(rendezvous: Rendezvous) -> ToolRegistry:
    registry = demo_tools()

    @registry.tool()
    async def meet(ctx: ToolContext, who: str, parties: int) -> str:
        """Wait until `parties` calls (this one included) are inside this tool; name them all."""
        if rendezvous.everyone is None:
            rendezvous.everyone = anyio.Event()
        rendezvous.arrived.append(who)
        await ctx.report_progress(len(rendezvous.arrived), parties)
        if len(rendezvous.arrived) >= parties:
            rendezvous.everyone.set()
        with anyio.move_on_after(MEET_SECONDS):
            await rendezvous.everyone.wait()
        if not rendezvous.everyone.is_set():
            raise ToolError(f"{who} waited alone: only {rendezvous.arrived} arrived")
        return "met " + " ".join(sorted(rendezvous.arrived))

    return registry


@dataclass
class Served:
    base: str
    recorder: Recorder
    rendezvous: Rendezvous

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def posts(self) -> list[tuple[Exchange, dict[str, Any]]]:
        """Every MCP POST the server received with its JSON-RPC body, in arrival order (not the AS's forms)."""
        out = []
        for exchange in list(self.recorder.exchanges):
            json_body = exchange.headers.get("content-type", "").startswith("application/json")
            if exchange.method == "POST" and exchange.body and json_body:
                body = orjson.loads(bytes(exchange.body))
                if isinstance(body, dict):
                    out.append((exchange, body))
        return out


def serve(issuer: str | None) -> Iterator[Served]:
    recorder = Recorder()
    rendezvous = Rendezvous()

    def make(port: int) -> Recorder:
        config = ServerConfig(port=port, store="memory", issuer=issuer, dev_clients=CLIENTS)
        recorder.app = create_app(config, tools(rendezvous))
        return recorder

    with lossless_server(make) as base:
        yield Served(base, recorder, rendezvous)


@pytest.fixture
def open_server() -> Iterator[Served]:
    """Our server without authorization: what a literal ``Client(url)`` can talk to."""
    yield from serve(None)


@pytest.fixture
def served() -> Iterator[Served]:
    """Our server with its embedded dev AS: real signed JWTs."""
    yield from serve("dev")


class Bearer(httpx2.Auth):
    def __init__(self, token: str) -> None:
        self.token = token

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


def assert_modern_only(posts: list[tuple[Exchange, dict[str, Any]]], methods: set[str]) -> None:
    """The server saw 2026-07-28 on every request (header and ``_meta``), a probe first, no handshake, no session."""
    assert posts, "the server saw no request"
    assert posts[0][1]["method"] == "server/discover", "the client probed the modern era first"
    seen = [body.get("method") for _, body in posts]
    assert "initialize" not in seen, f"the client fell back to the legacy handshake: {seen}"
    assert methods <= set(seen), seen
    for exchange, body in posts:
        assert exchange.headers.get("mcp-protocol-version") == MODERN, (body.get("method"), exchange.headers)
        if "id" in body:
            assert body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == MODERN, body
        assert "mcp-session-id" not in exchange.headers and "mcp-session-id" not in exchange.response_headers


async def test_python_sdk_client_url_in_its_default_mode_lands_on_2026_07_28(open_server: Served) -> None:
    """``Client(url)`` exactly as its README shows it: no mode, no transport of our choosing."""
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with SdkClient(open_server.url) as client:
        assert client.protocol_version == MODERN
        assert client.server_info is not None and client.server_info.name == "mcp-lossless"
        listed = await client.list_tools()
        found = await client.call_tool(
            "search", {"query": "sdk", "steps": 2, "delay_ms": 0}, progress_callback=on_progress
        )
        fetched = await client.call_tool("fetch", {"url": "https://example.com/sdk", "steps": 1, "delay_ms": 0})
    assert [t.name for t in listed.tools] == ["search", "fetch", "meet"]
    assert found.content == [TextContent(type="text", text="search results for 'sdk': 3 documents")]
    assert progress == [1, 2], "progress on the request's own stream"
    assert not fetched.is_error and fetched.content[0].text == "contents of https://example.com/sdk: 23 bytes"
    assert_modern_only(open_server.posts(), {"tools/list", "tools/call"})


async def test_python_sdk_client_with_a_bearer_token_lands_on_2026_07_28(
    served: Served, http: httpx.AsyncClient
) -> None:
    """The default mode with the token a user's app supplies; the server verified a real JWT on each request."""
    token = await dev_token(http, served.base, served.url)
    async with (
        httpx2.AsyncClient(auth=Bearer(token), timeout=httpx2.Timeout(30)) as client_http,
        SdkClient(streamable_http_client(served.url, http_client=client_http)) as client,
    ):
        assert client.protocol_version == MODERN
        result = await client.call_tool("search", {"query": "jwt", "steps": 1, "delay_ms": 0})
    assert result.content[0].text == "search results for 'jwt': 3 documents"
    posts = served.posts()
    assert_modern_only(posts, {"tools/call"})
    assert all(e.headers["authorization"] == f"Bearer {token}" and e.status == 200 for e, _ in posts)


async def test_fastmcp_client_in_its_default_mode_lands_on_2026_07_28(served: Served, http: httpx.AsyncClient) -> None:
    token = await dev_token(http, served.base, served.url)
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with fastmcp.Client(served.url, auth=token) as client:
        assert client.protocol_version == MODERN
        listed = await client.list_tools()
        result = await client.call_tool(
            "search", {"query": "fastmcp", "steps": 3, "delay_ms": 0}, progress_handler=on_progress
        )
    assert [t.name for t in listed] == ["search", "fetch", "meet"]
    assert result.content[0].text == "search results for 'fastmcp': 3 documents"  # type: ignore[union-attr]
    assert progress == [1, 2, 3]
    assert_modern_only(served.posts(), {"tools/list", "tools/call"})


def _ts_lines(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]


async def ts_client(url: str, token: str, mode: str, tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the TypeScript SDK 2.x driver for one connection and one call; its observations, in order."""
    command = [str(node_binary()), TS_DRIVER, url, mode, tool, json.dumps(arguments)]
    env = {**os.environ, "MCP_TS_CLIENT": str(ts_client_dir()), "MCP_TOKEN": token}
    with anyio.fail_after(MEET_SECONDS + 30):
        done = await anyio.run_process(command, env=env, check=False)
    report = f"rc {done.returncode}\n{done.stdout.decode()}\n{done.stderr.decode()[-3000:]}"
    assert done.returncode == 0, report
    lines = _ts_lines(done.stdout)
    assert lines and lines[-1]["event"] == "closed", report
    return lines


def _event(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == kind]


@pytest.mark.parametrize("mode", [MODERN, "auto"], ids=["pinned", "auto"])
async def test_ts_client_2x_pinned_or_probing_lands_on_2026_07_28_and_calls(
    served: Served, http: httpx.AsyncClient, mode: str
) -> None:
    ts_client_dir()  # install before the server's clock matters
    token = await dev_token(http, served.base, served.url)
    lines = await ts_client(served.url, token, mode, "search", {"query": "ts2", "steps": 2, "delay_ms": 0})
    connected = _event(lines, "connected")[0]
    assert connected["protocol"] == MODERN and connected["era"] == "modern"
    assert connected["server"]["name"] == "mcp-lossless"
    assert _event(lines, "tools")[0]["tools"] == ["search", "fetch", "meet"]
    assert [p["progress"] for p in _event(lines, "progress")] == [1, 2]
    assert [(r["isError"], r["text"]) for r in _event(lines, "result")] == [
        (False, "search results for 'ts2': 3 documents")
    ]
    assert _event(lines, "error") == []
    assert_modern_only(served.posts(), {"tools/list", "tools/call"})


async def test_legacy_and_modern_clients_call_one_process_at_the_same_time(
    served: Served, http: httpx.AsyncClient
) -> None:
    """Four stock clients, two eras, one process: each call returns only once all four are inside the tool."""
    ts_client_dir()
    token = await dev_token(http, served.base, served.url)
    parties = ["py-legacy", "py-modern", "ts-legacy", "ts-modern"]
    expected = "met " + " ".join(sorted(parties))
    eras: dict[str, str] = {}
    texts: dict[str, str] = {}

    async def python(who: str, mode: str) -> None:
        async with (
            httpx2.AsyncClient(auth=Bearer(token), timeout=httpx2.Timeout(MEET_SECONDS + 10)) as client_http,
            SdkClient(streamable_http_client(served.url, http_client=client_http), mode=mode) as client,
        ):
            eras[who] = client.protocol_version
            result = await client.call_tool("meet", {"who": who, "parties": len(parties)})
            texts[who] = result.content[0].text if isinstance(result.content[0], TextContent) else ""

    async def typescript(who: str, mode: str) -> None:
        lines = await ts_client(served.url, token, mode, "meet", {"who": who, "parties": len(parties)})
        eras[who] = _event(lines, "connected")[0]["protocol"]
        texts[who] = "".join(r["text"] for r in _event(lines, "result")) or str(_event(lines, "error"))

    async with anyio.create_task_group() as group:
        group.start_soon(python, "py-legacy", "legacy")
        group.start_soon(python, "py-modern", "auto")
        group.start_soon(typescript, "ts-legacy", "legacy")
        group.start_soon(typescript, "ts-modern", MODERN)
    assert texts == dict.fromkeys(parties, expected), "every call saw all four inside the tool at once"
    assert eras["py-modern"] == eras["ts-modern"] == MODERN
    assert eras["py-legacy"] == eras["ts-legacy"] == "2025-11-25"
    posts = served.posts()
    initializes = [e for e, body in posts if body.get("method") == "initialize"]
    assert len(initializes) == 2 and all("mcp-session-id" in e.response_headers for e in initializes)
    meets = [(e, b) for e, b in posts if b.get("method") == "tools/call"]
    modern = [e for e, b in meets if "io.modelcontextprotocol/protocolVersion" in b["params"].get("_meta", {})]
    legacy = [e for e, b in meets if "mcp-session-id" in e.headers]
    assert len(modern) == 2 and len(legacy) == 2
    assert all(
        e.headers["mcp-protocol-version"] == MODERN and "mcp-session-id" not in e.response_headers for e in modern
    )


async def test_our_client_lists_and_calls_tools_on_the_python_sdk_modern_only_server() -> None:
    """The Python SDK's 2026-07-28 leg, with its legacy leg refused: our client needs no handshake to work."""
    with modern_only_sdk_server() as sdk:
        async with httpx.AsyncClient(timeout=10) as client_http, open_client(sdk.url, http=client_http) as client:
            assert isinstance(client, ModernClient)
            listed = await client.list_tools()
            steps: list[float] = []
            counted = await client.call_tool("count", {"n": 3}, on_progress=lambda u: steps.append(u.progress))
            with pytest.raises(ToolFailed, match="on purpose"):
                await client.call_tool("broken")
        seen = list(sdk.requests)
    assert [t.name for t in listed] == ["count", "broken"]
    assert counted.text == "counted to 3" and steps == [1, 2, 3]
    assert seen[0] == ("server/discover", MODERN)
    assert {m for m, _ in seen} == {"server/discover", "tools/list", "tools/call"}
    assert all(version == MODERN for _, version in seen), "every request at 2026-07-28"
    assert sdk.refused == 0, "nothing needed the legacy leg"


async def test_the_modern_only_sdk_server_really_refuses_the_legacy_handshake() -> None:
    """The peer above is 2026-only: our legacy client cannot use it, so the test above proves the modern leg."""
    with modern_only_sdk_server() as sdk, pytest.raises(RequestRejected, match="initialize refused with HTTP 400"):
        async with Client(sdk.url, timeout=10):
            pass
    assert sdk.refused >= 1
