"""A 2026-only server built from the official Python SDK (``mcp`` 2.3): its modern leg, its legacy leg refused.

The SDK's Streamable HTTP app is dual-era; a guard in front of it answers every request that is not a
2026-07-28 one (``initialize``, a legacy ``MCP-Protocol-Version``, none at all, GET, DELETE) the way a
modern-only server does: HTTP 400 with ``-32022`` listing only 2026-07-28. It notes the method and version
of each request it lets through, so a test can tell the SDK's modern leg served every one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from tests.support.uvicorn_server import serve_app

MODERN = "2026-07-28"


def sdk_server() -> MCPServer:
    server = MCPServer("sdk-modern-peer")

    @server.tool()
    async def count(n: int, ctx: Context) -> str:
        """Count to n, reporting each step."""
        for step in range(1, n + 1):
            await ctx.report_progress(step, n, f"step {step}/{n}")
        return f"counted to {n}"

    @server.tool()
    async def broken() -> str:
        """Always fails."""
        raise ToolError("the tool failed on purpose")

    return server


@dataclass
class ModernOnly:
    """ASGI guard: 2026-07-28 requests to ``/mcp`` reach the SDK's app; any other request there gets the
    modern-only refusal."""

    app: Any
    requests: list[tuple[str, str]] = field(default_factory=list)
    refused: int = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/mcp":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        version = headers.get("mcp-protocol-version", "")
        if scope["method"] != "POST" or version != MODERN:
            self.refused += 1
            body = orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {
                        "code": -32022,
                        "message": "Unsupported protocol version",
                        "data": {"supported": [MODERN], "requested": version or None},
                    },
                }
            )
            await send(
                {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("method"), str):
            self.requests.append((parsed["method"], headers.get("mcp-protocol-version", "")))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@dataclass
class SdkPeer:
    base: str
    guard: ModernOnly

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    @property
    def requests(self) -> list[tuple[str, str]]:
        return self.guard.requests

    @property
    def refused(self) -> int:
        return self.guard.refused


@contextmanager
def modern_only_sdk_server() -> Iterator[SdkPeer]:
    guard = ModernOnly(sdk_server().streamable_http_app())
    with serve_app(guard, lifespan="on") as base:
        yield SdkPeer(base, guard)
