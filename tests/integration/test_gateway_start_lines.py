"""Each upstream's start line counts in words a person reads: ``1 client, 1 tool``, ``4 clients, 2 tools``."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator

import pytest

from mcp_lossless.gateway import UpstreamConfig
from mcp_lossless.gateway.http import HttpUpstream
from mcp_lossless.gateway.stdio import StdioUpstream
from mcp_lossless.gateway.upstream import counted
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
