"""The client takes any httpx transport: here ``httpx.ASGITransport`` straight into ``create_app``, no socket.

The whole stack runs in one process: the OAuth client discovers the embedded authorization server through
the app's metadata, gets a real signed token for the tool's resource, and the call's progress and result
arrive as SSE bytes the server really wrote. It documents, as httpx's own tests do, that the transport is
the caller's choice, and it is the cheapest end-to-end check there is.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mcp_lossless.client import Client, OAuth, ProgressUpdate, ProtocolViolation
from mcp_lossless.client.oauth import unverified_audience
from mcp_lossless.client.transport import DEFAULT_MAX_BODY_BYTES
from mcp_lossless.server import ServerConfig, create_app

pytestmark = pytest.mark.anyio

URL = "http://127.0.0.1:8000/mcp"


class Tokens(httpx.AsyncBaseTransport):
    """The ASGI transport, noting the bearer token of every MCP request."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.bearers: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        auth = request.headers.get("authorization", "")
        if request.url.path == "/mcp" and auth.startswith(("Bearer ", "DPoP ")):  # DPoP: our dev AS offers it
            self.bearers.append(auth.partition(" ")[2])
        return await self.inner.handle_async_request(request)


async def test_a_tool_call_through_an_asgi_transport_gets_its_progress_and_result() -> None:
    app = create_app(ServerConfig(store="memory"))
    await app.startup()
    try:
        transport = Tokens(httpx.ASGITransport(app=app))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            updates: list[ProgressUpdate] = []
            async with Client(URL, auth=OAuth("dev-client", "dev-secret"), http=http, timeout=30) as client:
                tools = {tool.name: tool for tool in await client.list_tools()}
                result = await client.call_tool(
                    "search", {"query": "lossless", "steps": 3, "delay_ms": 0}, on_progress=updates.append
                )
    finally:
        await app.shutdown()
    assert result.text == "search results for 'lossless': 3 documents"
    assert [(u.progress, u.total) for u in updates] == [(1, 3), (2, 3), (3, 3)]
    assert tools["search"].resource == f"{URL}/tools/search"
    assert transport.bearers, "the MCP requests carried no bearer token"
    audiences = [unverified_audience(token) for token in transport.bearers]
    assert all(aud is not None and (URL in aud or tools["search"].resource in aud) for aud in audiences), audiences


async def test_a_response_body_past_the_clients_bound_is_a_typed_error() -> None:
    """A server that answers ``initialize`` with more JSON than the client buffers (8 MiB) gets ProtocolViolation."""
    chunk = b" " * (1024 * 1024)

    async def endless_json(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        for _ in range(DEFAULT_MAX_BODY_BYTES // len(chunk) + 2):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"{}"})

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=endless_json)) as http:
        with pytest.raises(ProtocolViolation) as caught:
            async with Client(URL, http=http, timeout=30):
                pass
    assert "ResponseTooLarge" in caught.value.reason and str(DEFAULT_MAX_BODY_BYTES) in caught.value.reason
