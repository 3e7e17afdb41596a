"""2025-03-26 batches: handled in time linear in their length, and bounded by ``max_batch`` (issue 11, H2).

In process (``httpx.ASGITransport``, the real app and memory store), so the time measured is the server's own
CPU time, not the load of a shared machine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from mcp_lossless.server.app import LosslessApp, create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.mcp_http import parse_sse

pytestmark = pytest.mark.anyio
URL = "http://127.0.0.1:8000/mcp"


async def served(config: ServerConfig) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    app: LosslessApp = create_app(config)
    await app.startup()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60) as http:
            hello = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-03-26",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            }
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
            answer = await http.post(URL, content=orjson.dumps(hello), headers=headers)
            assert answer.status_code == 200
            headers |= {"mcp-session-id": answer.headers["mcp-session-id"], "mcp-protocol-version": "2025-03-26"}
            yield http, headers
    finally:
        await app.shutdown()


@pytest.fixture
async def large() -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    config = ServerConfig(issuer=None, store="memory", max_batch=20_000, max_body_bytes=4 * 1024 * 1024)
    async for pair in served(config):
        yield pair


@pytest.fixture
async def default() -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    async for pair in served(ServerConfig(issuer=None, store="memory")):
        yield pair


def pings(count: int) -> bytes:
    return orjson.dumps([{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(count)])


async def test_a_batch_of_20000_pings_is_answered_whole_in_under_a_second(
    large: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    http, headers = large
    body = pings(20_000)
    started = time.process_time()
    answer = await http.post(URL, content=body, headers=headers)
    spent = time.process_time() - started
    assert answer.status_code == 200
    ids = [e.message["id"] for e in parse_sse(answer.text) if e.message is not None and "result" in e.message]
    assert sorted(ids) == list(range(20_000))
    assert spent < 1.0, f"20,000 pings took {spent:.2f} s of CPU (quadratic again?)"


async def test_a_batch_above_max_batch_is_refused_at_once_naming_the_limit(
    default: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    http, headers = default
    assert ServerConfig().max_batch == 1000
    at_limit = await http.post(URL, content=pings(1000), headers=headers)
    assert at_limit.status_code == 200
    over = await http.post(URL, content=pings(1001), headers=headers)
    assert over.status_code == 400
    error = over.json()["error"]
    assert error["code"] == -32044 and "max_batch" in error["message"] and "1001" in error["message"]
    assert error["data"] == {"limit": "max_batch", "maximum": 1000}


async def test_a_batch_repeating_an_id_answers_each_repeat_with_an_error_and_completes(
    default: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    http, headers = default
    batch = [{"jsonrpc": "2.0", "id": i % 3, "method": "ping"} for i in range(6)] + [
        {"jsonrpc": "2.0", "id": "x", "method": "ping"}
    ]
    answer = await http.post(URL, content=orjson.dumps(batch), headers=headers)
    assert answer.status_code == 200
    messages = [e.message for e in parse_sse(answer.text) if e.message is not None]
    assert [m["id"] for m in messages if "result" in m] == ["x"]
    assert sorted(m["id"] for m in messages if "error" in m) == [0, 0, 1, 1, 2, 2]
    assert all("already in use" in m["error"]["message"] for m in messages if "error" in m)
