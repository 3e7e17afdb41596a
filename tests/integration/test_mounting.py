"""The server mounted inside a user's Starlette or FastAPI app, served by a real uvicorn.

A mounted ASGI app gets no lifespan events of its own: the host app passes ``mcp.lifespan`` (alone or inside
its own lifespan). Without it every request is a 503 that says what to do, never a 500.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from mcp_lossless.client import Client, McpClientError, OAuth
from mcp_lossless.server.app import NOT_STARTED, LosslessApp, create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio


def lossless_for(port: int) -> LosslessApp:
    return create_app(ServerConfig(port=port, store="memory"))


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


async def call_with_progress(base: str) -> tuple[str, list[float]]:
    progress: list[float] = []
    async with Client(f"{base}/mcp", auth=OAuth("dev-client", "dev-secret")) as client:
        result = await client.call_tool(
            "fetch", {"url": "https://example.com/x", "steps": 3, "delay_ms": 10},
            on_progress=lambda update: progress.append(update.progress), timeout=20,
        )  # fmt: skip
    return result.text, progress


async def test_mounted_in_starlette_with_its_lifespan() -> None:
    sock = loopback_socket()
    mcp = lossless_for(sock.getsockname()[1])
    host = Starlette(routes=[Route("/health", health), Mount("/", app=mcp)], lifespan=mcp.lifespan)
    with serve_app(host, sock=sock, lifespan="on") as base:
        text, progress = await call_with_progress(base)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{base}/health")).json() == {"ok": True}
            prm = await http.get(f"{base}/.well-known/oauth-protected-resource/mcp")
    assert text == "contents of https://example.com/x: 21 bytes"
    assert progress == [1, 2, 3]
    assert prm.status_code == 200 and prm.json()["resource"] == f"{base}/mcp"
    assert not mcp.started, "the host's shutdown stopped the server too"


async def test_mounted_in_fastapi_inside_the_apps_own_lifespan() -> None:
    sock = loopback_socket()
    mcp = lossless_for(sock.getsockname()[1])
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        events.append("app up")
        async with mcp.lifespan(app):
            events.append(f"mcp started={mcp.started}")
            yield
        events.append(f"mcp started={mcp.started}")

    api = FastAPI(lifespan=lifespan)

    @api.get("/health")
    async def api_health() -> dict[str, Any]:
        return {"ok": True}

    api.mount("/", mcp)
    with serve_app(api, sock=sock, lifespan="on") as base:
        text, progress = await call_with_progress(base)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{base}/health")).json() == {"ok": True}
    assert text == "contents of https://example.com/x: 21 bytes"
    assert progress == [1, 2, 3]
    assert events == ["app up", "mcp started=True", "mcp started=False"]


@pytest.mark.parametrize("path", ["/mcp", "/.well-known/oauth-protected-resource/mcp", "/dev-as/token"])
async def test_mounted_without_its_lifespan_answers_503_that_says_why(path: str) -> None:
    sock = loopback_socket()
    mcp = lossless_for(sock.getsockname()[1])
    host = Starlette(routes=[Mount("/", app=mcp)])
    with serve_app(host, sock=sock, lifespan="on") as base:
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{base}{path}", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert response.status_code == 503
    assert response.json() == {"error": "not_started", "error_description": NOT_STARTED}
    assert "lifespan=app.lifespan" in NOT_STARTED


async def test_client_error_when_the_mounted_server_was_not_started() -> None:
    """Our own client reports the 503's text, not a protocol mystery."""
    sock = loopback_socket()
    host = Starlette(routes=[Mount("/", app=lossless_for(sock.getsockname()[1]))])
    with serve_app(host, sock=sock, lifespan="on") as base, pytest.raises(McpClientError) as failure:
        async with Client(f"{base}/mcp", auth=OAuth("dev-client", "dev-secret")) as client:
            await client.call_tool("search", {"query": "q"}, timeout=10)
    assert NOT_STARTED in failure.value.reason
