"""The gateway's upstream pool (``gateway.pool.UpstreamPool``) against a real uvicorn server on loopback: keep-alive
reuse of one connection, a response not read to its end never carries another request, a connection the
server closed is not reused, and aiohttp's failures arrive as the httpx errors the clients handle."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from mcp_lossless.gateway.pool import UpstreamPool
from tests.support.processes import free_port
from tests.support.uvicorn_server import read_body, serve_app

pytestmark = pytest.mark.anyio


def echo_app() -> Any:
    """Answers each request with its method, body and the client port it came from (one port: one connection)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"] == "/close":  # answer, then close the connection (as a server past its keep-alive)
            headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]
        else:
            headers = [(b"content-type", b"text/plain")]
        port = scope["client"][1]
        text = f"{scope['method']} {body.decode()} {port}".encode()
        if scope["path"] == "/long":
            text += b" " + b"x" * 200_000
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": text})

    return app


async def answer(pool: UpstreamPool, url: str, body: bytes | None = None) -> tuple[int, str, Mapping[str, str]]:
    async with pool.stream("POST" if body is not None else "GET", url, content=body, headers={"x-t": "1"}) as r:
        return r.status_code, (await r.aread()).decode(), r.headers


async def test_one_connection_is_reused_and_a_closed_or_unfinished_one_is_not() -> None:
    with serve_app(echo_app()) as base:
        async with UpstreamPool() as pool:
            status, first, headers = await answer(pool, f"{base}/a", b"one")
            assert status == 201 and first.startswith("POST one ") and headers.get("content-type") == "text/plain"
            assert headers.get("Content-Type") == "text/plain", "headers are looked up whatever the case"
            _, second, _ = await answer(pool, f"{base}/a", b"two")
            assert second.split()[-1] == first.split()[-1], "the second request went on the same connection"

            _, closing, _ = await answer(pool, f"{base}/close", b"")
            _, after_close, _ = await answer(pool, f"{base}/a", b"three")
            assert after_close.split()[-1] != closing.split()[-1], "a connection the server closed is not reused"

            async with pool.stream("GET", f"{base}/long", headers={}) as unfinished:
                assert unfinished.status_code == 201
                async for chunk in unfinished.aiter_bytes():
                    unfinished_port = chunk.split()[1].decode()  # "GET  <port> xxx…": leave the rest unread
                    break
            assert unfinished_port == after_close.split()[-1], "the kept-alive connection carried it"
            _, fresh, _ = await answer(pool, f"{base}/a", b"four")
            assert fresh.split()[-1] != unfinished_port, "a response not read to its end closed its connection"
            _, again, _ = await answer(pool, f"{base}/a", b"five")
            assert again.split()[-1] == fresh.split()[-1], "the fresh connection is kept alive in turn"


async def test_failures_are_the_httpx_errors_the_clients_handle() -> None:
    async with UpstreamPool(connect_timeout=2) as pool:
        with pytest.raises(httpx.ConnectError):
            await answer(pool, f"http://127.0.0.1:{free_port()}/mcp", b"{}")
        with pytest.raises(httpx.UnsupportedProtocol):
            await answer(pool, "ftp://127.0.0.1/mcp", b"{}")


async def test_a_response_broken_mid_body_is_a_transport_error_never_a_connect_error() -> None:
    """The request arrived (it may have run): the clients must not take the breakage for an unsent request."""

    async def half_an_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"20\r\nevent: message\r\ndata: {}\r\n\r\n")  # a chunk announced longer than what follows
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(half_an_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, UpstreamPool() as pool:
        with pytest.raises(httpx.TransportError) as broken:
            async with pool.stream("POST", f"http://127.0.0.1:{port}/mcp", content=b"{}", headers={}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    pass
        assert not isinstance(broken.value, httpx.ConnectError)
