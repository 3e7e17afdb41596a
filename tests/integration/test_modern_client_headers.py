"""Our 2026-07-28 client mirrors a tool's ``x-mcp-header`` parameters, against our server, which refuses a call
whose ``Mcp-Param-*`` header is missing or differs from the body (-32020); a tool published with a malformed
annotation is left out of the list and never called (real loopback HTTP, memory store)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mcp_lossless.client import OAuth, ProtocolViolation
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolRegistry
from tests.support.recording import RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

ROUTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "priority": {"type": "integer", "x-mcp-header": "Priority"},
        "dry": {"type": "boolean", "x-mcp-header": "Dry"},
        "query": {"type": "string"},
    },
    "required": ["region", "query"],
}
MALFORMED: dict[str, Any] = {"type": "object", "properties": {"data": {"type": "object", "x-mcp-header": "Data"}}}


def tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(input_schema=ROUTED)
    async def routed(region: str, query: str, priority: int = 0, dry: bool | None = None) -> str:
        """Mirrors region, priority and dry into headers the server checks against the body."""
        return f"{query} in {region} at {priority} dry={dry}"

    @registry.tool(input_schema=MALFORMED)
    async def malformed(data: dict[str, Any]) -> str:
        """Marks an object parameter: no client may mirror it."""
        return "ran"

    return registry


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, RecordingTransport, httpx.AsyncClient]]:
    sock = loopback_socket()
    config = ServerConfig(port=sock.getsockname()[1], store="memory", dev_clients={"dev-client": "dev-secret"})
    with serve_app(create_app(config, tools()), sock=sock, lifespan="on") as base:
        recorder = RecordingTransport()
        async with httpx.AsyncClient(transport=recorder, timeout=10) as http:
            yield f"{base}/mcp", recorder, http


async def test_mirrored_parameters_reach_our_server_as_headers_that_match_the_body(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, _, http = served
    async with ModernClient(url, auth=OAuth("dev-client", "dev-secret"), http=http) as client:
        plain = await client.call_tool("routed", {"region": "us-west1", "query": "q", "priority": 7, "dry": False})
        unsafe = await client.call_tool("routed", {"region": " Zürich\n", "query": "q", "dry": None})
    assert plain.text == "q in us-west1 at 7 dry=False"
    assert unsafe.text == "q in  Zürich\n at 0 dry=None", "sent in the base64 form, decoded by the server"


async def test_a_tool_with_a_malformed_annotation_is_left_out_and_never_called(
    served: tuple[str, RecordingTransport, httpx.AsyncClient],
) -> None:
    url, recorder, http = served
    async with ModernClient(url, auth=OAuth("dev-client", "dev-secret"), http=http) as client:
        assert [tool.name for tool in await client.list_tools()] == ["routed"]
        with pytest.raises(ProtocolViolation, match=r"malformed is not called: .*data: x-mcp-header on type 'object'"):
            await client.call_tool("malformed", {"data": {}})
    calls = [e for e in recorder.to("/mcp") if (e.sent_json() or {}).get("method") == "tools/call"]
    assert calls == [], "nothing was sent for the excluded tool"
