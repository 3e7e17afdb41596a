"""Per-principal and per-session caps on a real server: past one, 429 with ``Retry-After`` and a JSON-RPC error
naming the limit, before any stream is committed; another principal is never affected."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from mcp_lossless.core.errors import LIMIT_EXCEEDED
from mcp_lossless.core.limits import Limits
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.modern_http import ModernPeer, answer
from tests.support.uvicorn_server import lossless_server

CLIENTS = {"a": "secret-a", "b": "secret-b"}
LIMITS = Limits(sessions_per_principal=3, calls_per_principal=2, streams_per_session=2)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS, limits=LIMITS))

    with lossless_server(make) as base:
        yield base


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def _peer(http: httpx.AsyncClient, url: str, client: str) -> Peer:
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp", client=(client, CLIENTS[client])))
    await peer.initialize()
    return peer


def _limit_refusal(status: int, headers: httpx.Headers, body: bytes, limit: str, retry_after: int) -> None:
    assert status == 429
    assert headers["retry-after"] == str(retry_after)
    error = orjson.loads(body)["error"]
    assert error["code"] == LIMIT_EXCEEDED
    assert error["data"] == {"limit": limit, "maximum": getattr(LIMITS, limit), "retryAfter": retry_after}


async def _running_call(peer: Peer, request_id: int) -> None:
    """A call left running: its first progress event read, then the connection dropped (the call goes on)."""
    read = await peer.post(call(request_id, "search", "p", query="q", steps=50, delay_ms=1000), stop_after=2)
    assert read.status == 200 and len(read.ids) == 2


@pytest.mark.anyio
async def test_sessions_past_the_principal_cap_get_429_and_others_are_unaffected(
    url: str, http: httpx.AsyncClient
) -> None:
    held = [await _peer(http, url, "a") for _ in range(LIMITS.sessions_per_principal)]
    extra = Peer(http, url, held[0].token)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
    refused = await http.post(extra.url, content=orjson.dumps(init), headers=extra.headers())
    _limit_refusal(refused.status_code, refused.headers, refused.content, "sessions_per_principal", 60)
    assert "mcp-session-id" not in refused.headers

    other = await _peer(http, url, "b")  # another principal opens sessions and calls meanwhile
    answer = await other.post(call(1, "search", query="q", steps=1, delay_ms=0))
    assert answer.status == 200 and answer.messages[-1]["result"]["isError"] is False

    deleted = await http.delete(held[0].url, headers=held[0].headers())
    assert deleted.status_code == 204
    again = await _peer(http, url, "a")  # a slot freed by ending a session
    for peer in [*held[1:], again, other]:
        await http.delete(peer.url, headers=peer.headers())


@pytest.mark.anyio
async def test_calls_past_the_principal_cap_get_429_across_its_sessions(url: str, http: httpx.AsyncClient) -> None:
    first, second = await _peer(http, url, "a"), await _peer(http, url, "a")
    await _running_call(first, 1)
    await _running_call(second, 1)
    read = await first.post(call(2, "search", query="q", steps=1, delay_ms=0))
    _limit_refusal(read.status, read.headers, read.body, "calls_per_principal", 1)

    ping = await first.post({"jsonrpc": "2.0", "id": 3, "method": "ping"})  # no call: not counted
    assert ping.status == 200
    other = await _peer(http, url, "b")
    answer = await other.post(call(1, "search", query="q", steps=1, delay_ms=0))
    assert answer.status == 200 and answer.messages[-1]["result"]["isError"] is False

    assert (await http.delete(second.url, headers=second.headers())).status_code == 204  # cancels its call
    admitted = await first.post(call(4, "search", query="q", steps=1, delay_ms=0))
    assert admitted.status == 200 and admitted.messages[-1]["result"]["isError"] is False
    for peer in (first, other):
        await http.delete(peer.url, headers=peer.headers())


@pytest.mark.anyio
async def test_2026_calls_count_against_the_principal_cap_with_its_sessions_calls(
    url: str, http: httpx.AsyncClient
) -> None:
    """One cap per principal in both eras: a legacy call and a 2026-07-28 call at work fill a's cap of 2, so a's
    next call in either era gets 429 naming the limit; b is unaffected; a's call that ends frees its place."""
    legacy = await _peer(http, url, "a")
    modern = ModernPeer(http, url, await dev_token(http, url, f"{url}/mcp", client=("a", CLIENTS["a"])))
    await _running_call(legacy, 1)
    slow = modern.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 10, "delay_ms": 300}})
    slow["params"]["_meta"]["progressToken"] = "p"
    async with http.stream("POST", modern.url, content=orjson.dumps(slow), headers=modern.headers(slow)) as held:
        assert held.status_code == 200
        lines = held.aiter_lines()  # kept: a loop's break would close it, and a closed stream cancels the call
        while not (await anext(lines)).startswith("data:"):  # its first progress event: the call is at work
            pass
        refused = await modern.call("search", query="q", steps=1, delay_ms=0)
        _limit_refusal(refused.status, refused.headers, refused.body, "calls_per_principal", 1)
        read = await legacy.post(call(2, "search", query="q", steps=1, delay_ms=0))
        _limit_refusal(read.status, read.headers, read.body, "calls_per_principal", 1)
        other = ModernPeer(http, url, await dev_token(http, url, f"{url}/mcp", client=("b", CLIENTS["b"])))
        assert answer(await other.call("search", query="q", steps=1, delay_ms=0))["result"]["isError"] is False
        async for _ in lines:  # the held call ends: its place is free
            pass
    admitted = answer(await modern.call("search", query="q", steps=1, delay_ms=0))
    assert admitted["result"]["isError"] is False
    await http.delete(legacy.url, headers=legacy.headers())


@pytest.mark.anyio
async def test_streams_past_the_session_cap_get_429_and_the_principal_other_sessions_work(
    url: str, http: httpx.AsyncClient
) -> None:
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp", client=("b", CLIENTS["b"])))
    await peer.initialize()
    await _running_call(peer, 1)
    listening = http.stream("GET", peer.url, headers={**peer.headers(), "accept": "text/event-stream"})
    async with listening as stream:  # the standalone GET stream is the session's second stream
        assert stream.status_code == 200
        read = await peer.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        _limit_refusal(read.status, read.headers, read.body, "streams_per_session", 1)
    other_session = await _peer(http, url, "b")
    assert (await other_session.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status == 200
    for p in (peer, other_session):
        await http.delete(p.url, headers=p.headers())


def test_docs_state_each_limit_and_its_default() -> None:
    table = (Path(__file__).resolve().parents[2] / "docs" / "limits.md").read_text()
    for name in Limits.__dataclass_fields__:
        default = getattr(Limits(), name)
        shown = f"{default:g} s" if isinstance(default, float) else str(default)
        assert f"| `{name}` | {shown} |" in table, name
