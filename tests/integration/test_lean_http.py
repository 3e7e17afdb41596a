"""The gateway's upstream pool (``client.lean.LeanHttp``) against a real uvicorn server on loopback: keep-alive
reuse of one connection, a response not read to its end never carries another request, a connection the
server closed is not reused, and httpcore's failures arrive as the httpx errors the clients handle."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mcp_lossless.client.lean import LeanHttp
from tests.support.processes import free_port
from tests.support.uvicorn_server import serve_app

pytestmark = pytest.mark.anyio


def echo_app() -> Any:
    """Answers each request with its method, body and the client port it came from (one port: one connection)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
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


async def answer(lean: LeanHttp, url: str, body: bytes | None = None) -> tuple[int, str, dict[str, str]]:
    async with lean.stream("POST" if body is not None else "GET", url, content=body, headers={"x-t": "1"}) as r:
        return r.status_code, (await r.aread()).decode(), dict(r.headers)


async def test_one_connection_is_reused_and_a_closed_or_unfinished_one_is_not() -> None:
    with serve_app(echo_app()) as base:
        async with LeanHttp() as lean:
            status, first, headers = await answer(lean, f"{base}/a", b"one")
            assert status == 201 and first.startswith("POST one ") and headers["content-type"] == "text/plain"
            _, second, _ = await answer(lean, f"{base}/a", b"two")
            assert second.split()[-1] == first.split()[-1], "the second request went on the same connection"

            _, closing, _ = await answer(lean, f"{base}/close", b"")
            _, after_close, _ = await answer(lean, f"{base}/a", b"three")
            assert after_close.split()[-1] != closing.split()[-1], "a connection the server closed is not reused"

            async with lean.stream("GET", f"{base}/long", headers={}) as unfinished:
                assert unfinished.status_code == 201
                async for chunk in unfinished.aiter_bytes():
                    unfinished_port = chunk.split()[1].decode()  # "GET  <port> xxx…": leave the rest unread
                    break
            assert unfinished_port == after_close.split()[-1], "the kept-alive connection carried it"
            _, fresh, _ = await answer(lean, f"{base}/a", b"four")
            assert fresh.split()[-1] != unfinished_port, "a response not read to its end closed its connection"
            _, again, _ = await answer(lean, f"{base}/a", b"five")
            assert again.split()[-1] == fresh.split()[-1], "the fresh connection is kept alive in turn"


async def test_failures_are_the_httpx_errors_the_clients_handle() -> None:
    async with LeanHttp(connect_timeout=2) as lean:
        with pytest.raises(httpx.ConnectError):
            await answer(lean, f"http://127.0.0.1:{free_port()}/mcp", b"{}")
        with pytest.raises(httpx.UnsupportedProtocol):
            await answer(lean, "ftp://127.0.0.1/mcp", b"{}")
