"""Every read of the 2026-07-28 client ends within its deadline, as a typed :class:`DeadlineExceeded`: a raw ASGI
server on loopback answers ``server/discover`` and then holds every other request open without an answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import orjson
import pytest

from mcp_lossless.asgi import read_body, respond_json
from mcp_lossless.client import DeadlineExceeded
from mcp_lossless.client.modern import ModernClient
from tests.support.uvicorn_server import serve_app

pytestmark = pytest.mark.anyio


class Silent:
    """Discovers as a 2026-07-28 server; every other request is held open, unanswered, until the client leaves."""

    def __init__(self) -> None:
        self.held: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        message = orjson.loads(await read_body(receive, 1 << 20))
        if message["method"] == "server/discover":
            result = {"supportedVersions": ["2026-07-28"], "capabilities": {}, "serverInfo": {"name": "silent"}}
            await respond_json(send, 200, {"jsonrpc": "2.0", "id": message["id"], "result": result})
            return
        self.held.append(message["method"])
        while (await receive())["type"] != "http.disconnect":
            pass


@pytest.fixture
def silent() -> Iterator[tuple[str, Silent]]:
    app = Silent()
    with serve_app(app) as base:
        yield f"{base}/mcp", app


READS: dict[str, Callable[[ModernClient], Awaitable[object]]] = {
    "tools/list": lambda c: c.list_tools(timeout=0.3),
    "resources/list": lambda c: c.list_resources(timeout=0.3),
    "resources/read": lambda c: c.read_resource("test://x", timeout=0.3),
    "prompts/list": lambda c: c.list_prompts(timeout=0.3),
    "prompts/get": lambda c: c.get_prompt("p", timeout=0.3),
}


@pytest.mark.parametrize("method", sorted(READS))
async def test_a_read_the_server_never_answers_ends_at_its_deadline(silent: tuple[str, Silent], method: str) -> None:
    url, app = silent
    async with ModernClient(url, timeout=60) as client:
        await client.discover()
        with anyio.fail_after(10), pytest.raises(DeadlineExceeded, match=method):
            await READS[method](client)
    assert app.held == [method]


async def test_the_clients_own_timeout_is_the_default_deadline(silent: tuple[str, Silent]) -> None:
    url, app = silent
    async with ModernClient(url, timeout=0.3) as client:
        with anyio.fail_after(10), pytest.raises(DeadlineExceeded, match="tools/list"):
            await client.list_tools()
    assert app.held == ["tools/list"]
