"""Each upstream's start line counts in words a person reads: ``1 client, 1 tool``, ``4 clients, 2 tools``."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator

import orjson
import pytest

from mcp_lossless.gateway import UpstreamConfig
from mcp_lossless.gateway.http import HttpUpstream
from mcp_lossless.gateway.stdio import StdioUpstream
from mcp_lossless.gateway.upstream import UpstreamFailure, counted
from mcp_lossless.server import ToolContext, ToolRegistry, create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio
WAIT = 60

ONE_TOOL_CHILD = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message.get("method")
    if method == "initialize":
        info = {"name": "one", "version": "1"}
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": info}
    elif method == "tools/list":
        result = {"tools": [{"name": "only", "inputSchema": {"type": "object"}}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


def one_tool() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool()
    async def only(ctx: ToolContext) -> str:
        """The one tool."""
        return "only"

    return tools


@pytest.fixture(scope="module")
def one_tool_server() -> Iterator[str]:
    app = lambda port: create_app(ServerConfig(port=port, store="memory", issuer=None), one_tool())  # noqa: E731
    with lossless_server(app) as url:
        yield f"{url}/mcp"


def start_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"upstream {name}: ")]


def test_counts_are_singular_for_one() -> None:
    assert [counted(n, "tool") for n in (0, 1, 2)] == ["0 tools", "1 tool", "2 tools"]


@pytest.mark.parametrize(
    ("era", "sessions", "expected"),
    [("auto", 4, "modern era, 1 client, 1 tool"), ("legacy", 1, "legacy era, 1 client, 1 tool"),
     ("legacy", 2, "legacy era, 2 clients, 1 tool")],
)  # fmt: skip
async def test_an_http_upstreams_start_line(
    one_tool_server: str, caplog: pytest.LogCaptureFixture, era: str, sessions: int, expected: str
) -> None:
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    upstream = HttpUpstream(UpstreamConfig(name="one", url=one_tool_server, era=era, sessions=sessions))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(WAIT):
            await upstream.start(lambda: None)
    finally:
        await upstream.close()
    assert f"upstream one: {expected}" in start_lines(caplog, "one")


async def test_a_stdio_upstreams_start_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp_lossless.gateway")
    config = UpstreamConfig(name="child", command=(sys.executable, "-c", ONE_TOOL_CHILD), era="legacy")
    upstream = StdioUpstream(config)
    try:
        async with asyncio.timeout(WAIT):
            await upstream.start(lambda: None)
    finally:
        await upstream.close()
    lines = [line for line in start_lines(caplog, "child") if " ready, " in line]
    assert lines and lines[0].endswith("legacy era (configured), 1 tool"), lines


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def failure_to_start(config: UpstreamConfig) -> UpstreamFailure:
    upstream = HttpUpstream(config)
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(UpstreamFailure) as failed:
                await upstream.start(lambda: None)
    finally:
        await upstream.close()
    return failed.value


async def start_failure(handler: Handler, era: str) -> tuple[UpstreamFailure, int]:
    """How an HTTP upstream served by ``handler`` (a raw socket peer) fails to start, and the peer's port."""
    listener = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        config = UpstreamConfig(name="peer", url=f"http://127.0.0.1:{port}/mcp", era=era)  # type: ignore[arg-type]
        return await failure_to_start(config), port
    finally:
        listener.close()


@pytest.mark.parametrize("era", ["auto", "legacy", "modern"])
async def test_an_upstream_that_hangs_up_is_described_in_words(era: str) -> None:
    """An upstream that accepts and closes at once: the failure a client and the log see says what happened, not
    an exception's repr."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    failure, _ = await start_failure(hang_up, era)
    assert "the server broke off the HTTP exchange" in failure.detail, failure.detail
    assert "Error(" not in failure.detail, failure.detail


async def test_a_modern_upstream_whose_listing_stream_ends_early_is_described_in_words() -> None:
    """``server/discover`` is answered, the ``tools/list`` stream ends before its answer: the failure names the
    request and what happened in words."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        request = orjson.loads(await reader.readexactly(length))
        if request["method"] == "server/discover":
            result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
            body = orjson.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body))
            writer.write(b"connection: close\r\n\r\n" + body)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    failure, port = await start_failure(answer, "modern")
    assert failure.detail == (
        f"tools/list to http://127.0.0.1:{port}/mcp failed: "
        "the server broke off the HTTP exchange: the response stream ended before its answer"
    )


async def test_an_upstream_asking_for_a_token_names_the_missing_auth_setting() -> None:
    """An upstream that requires authorization (ours with its dev authorization server), configured without
    ``auth``: the failure names the upstream and the setting, not only "the client has no credentials"."""
    app = lambda port: create_app(ServerConfig(port=port, store="memory"), one_tool())  # noqa: E731
    with lossless_server(app) as url:
        failure = await failure_to_start(UpstreamConfig(name="guarded", url=f"{url}/mcp"))
    assert failure.reason == "unauthorized"
    assert "upstream 'guarded' requires authorization" in failure.detail, failure.detail
    assert "auth = { bearer_env" in failure.detail, failure.detail
