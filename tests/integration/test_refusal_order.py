"""A request that fails several checks gets the first refusal in the protocol's order (ADR 0010), in process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig

pytestmark = pytest.mark.anyio
URL = "http://127.0.0.1:8000/mcp"
BOTH = "application/json, text/event-stream"
JSON = "application/json"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServerConfig(issuer=None, store="memory", max_batch=2, max_body_bytes=4096))
    await app.startup()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            yield client
    finally:
        await app.shutdown()


async def status(http: httpx.AsyncClient, body: bytes, method: str = "POST", **headers: str) -> tuple[int, object]:
    answer = await http.request(method, URL, content=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
    error = answer.json().get("error") if answer.content else None
    return answer.status_code, error["code"] if isinstance(error, dict) else error


PING = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
NOT_RPC = orjson.dumps([{"jsonrpc": "1.0"}] * 3)
FUTURE_META = {
    "io.modelcontextprotocol/protocolVersion": "2099-01-01",
    "io.modelcontextprotocol/clientCapabilities": {},
}
FUTURE = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": FUTURE_META}})
"""A modern request at a revision nobody serves (ADR 0012: 2026-07-28 itself is served by the modern leg)."""


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        (b"x" * 5000, {"accept": "text/html", "content_type": "text/plain"}, (406, -32600)),  # Accept first
        (b"x" * 5000, {"accept": BOTH, "content_type": "text/plain"}, (415, -32600)),  # then Content-Type
        (b"{" + b"x" * 5000, {"accept": BOTH, "content_type": JSON}, (413, -32044)),  # then size
        (b"{", {"accept": BOTH, "content_type": JSON, "mcp_protocol_version": "2026-07-28"}, (400, -32700)),
        (NOT_RPC, {"accept": BOTH, "content_type": JSON}, (400, -32044)),  # batch length before shape
        (PING, {"accept": BOTH, "content_type": JSON, "mcp_protocol_version": "2026-07-28"}, (400, -32602)),
        (FUTURE, {"accept": BOTH, "content_type": JSON, "mcp_protocol_version": "2099-01-01"}, (400, -32022)),
        (PING, {"accept": BOTH, "content_type": JSON, "mcp_session_id": "gone"}, (404, -32600)),
    ],
)
async def test_the_first_failing_check_answers(
    http: httpx.AsyncClient, body: bytes, headers: dict[str, str], expected: tuple[int, int]
) -> None:
    assert await status(http, body, **headers) == expected


async def test_a_batch_over_the_limit_is_refused_for_its_length_before_its_messages_are_looked_at(
    http: httpx.AsyncClient,
) -> None:
    answer = await http.post(URL, content=NOT_RPC, headers={"accept": BOTH, "content-type": JSON})
    assert answer.json()["error"]["data"] == {"limit": "max_batch", "maximum": 2}


async def test_get_checks_the_revision_before_the_session(http: httpx.AsyncClient) -> None:
    headers = {"accept": "text/event-stream", "mcp_protocol_version": "2026-07-28", "mcp_session_id": "gone"}
    assert await status(http, b"", "GET", **headers) == (400, -32022)
    assert await status(http, b"", "GET", accept="application/json") == (406, -32600)
    assert await status(http, b"", "PUT") == (405, -32600)
