"""Server-initiated close (SEP-1699), tokens expiring mid-stream, and the auth-off conformance mode."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from mcp_lossless.core.errors import DELIVERY_REFUSED
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio


class Gates(dict[str, asyncio.Event]):
    """One release gate per test, created in the server's loop when a tool first waits on it."""

    def release(self, name: str) -> None:
        event = self[name]
        event._loop.call_soon_threadsafe(event.set)  # type: ignore[attr-defined]


def polling_tools():  # type: ignore[no-untyped-def]
    registry = demo_tools()
    release = Gates()

    @registry.tool()
    async def poll(ctx: ToolContext, gate: str, steps: int = 3) -> str:
        """Closes its SSE connection after the first step; finishes once its gate is released."""
        event = release.setdefault(gate, asyncio.Event())
        await ctx.report_progress(1, steps)
        ctx.close_stream()
        await event.wait()
        for step in range(2, steps + 1):
            await ctx.report_progress(step, steps)
        return "polled"

    @registry.tool()
    async def yield_once() -> str:
        """Answers after one trip through the event loop: while the writer may be busy sending."""
        await asyncio.sleep(0)
        return "b"

    return registry, release


@pytest.fixture(scope="module")
def short_lived() -> Iterator[tuple[str, Gates]]:
    registry, release = polling_tools()

    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", token_ttl=2, leeway_seconds=0, retry_ms=50)
        return create_app(config, registry)

    with lossless_server(make) as url:
        yield url, release


async def test_tool_closes_its_stream_and_the_client_resumes(short_lived, http: httpx.AsyncClient) -> None:
    url, release = short_lived
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp"))
    await peer.initialize()
    closed = await peer.post(call(1, "poll", progress="p", gate="first"))
    assert closed.status == 200
    assert [m.get("method") for m in closed.messages] == ["notifications/progress"], "closed before any result"
    assert closed.events[0].retry == 50, "the priming event told the client when to come back"
    release.release("first")
    resumed = await peer.resume(closed.ids[-1])
    assert [m["params"]["progress"] for m in resumed.messages if "method" in m] == [2, 3]
    assert resumed.messages[-1]["result"]["content"][0]["text"] == "polled"


async def test_token_expiring_mid_stream_is_an_in_band_resumable_error(short_lived, http: httpx.AsyncClient) -> None:
    url, _ = short_lived
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp"))
    await peer.initialize()
    read = await peer.post(call(2, "fetch", progress="f", url="x", steps=4, delay_ms=800))
    refusal = next(m for m in read.messages if m.get("id") == 2)["error"]
    assert refusal["code"] == DELIVERY_REFUSED and refusal["data"]["reason"] == "token_expired"
    assert refusal["data"]["lastEventId"] == read.ids[-1], "cursor = last delivered event"
    # Each fresh token lives 1-2 s too (whole-second iat/exp): resume from the cursor each refusal names
    # until the result arrives.
    delivered, progress, data = list(read.ids), [], refusal["data"]
    for _ in range(8):
        rest = await peer.resume(data["lastEventId"], token=await dev_token(http, url, f"{url}/mcp"))
        assert rest.ids[0] == data["eventId"], "the refused event is the first one delivered next time"
        delivered += rest.ids
        progress += [m["params"]["progress"] for m in rest.messages if m.get("method") == "notifications/progress"]
        final = rest.messages[-1]
        if "result" in final:
            break
        assert "error" in final, [(e.id, e.data[:90]) for e in rest.events]
        data = final["error"]["data"]
    assert final["id"] == 2 and final["result"]["isError"] is False
    assert len(delivered) == len(set(delivered)), "no event twice across the refusals"
    first = [m["params"]["progress"] for m in read.messages if m.get("method") == "notifications/progress"]
    assert first + progress == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def no_auth() -> Iterator[str]:
    with lossless_server(lambda port: create_app(ServerConfig(port=port, store="memory", issuer=None))) as url:
        yield url


async def test_auth_off_serves_without_tokens(no_auth: str, http: httpx.AsyncClient) -> None:
    peer = Peer(http, no_auth)
    await peer.initialize()
    read = await peer.post(call(1, "fetch", url="y", steps=0, delay_ms=0))
    assert read.messages[-1]["result"]["isError"] is False


async def test_close_before_any_event_id_waits_for_one(short_lived, http: httpx.AsyncClient) -> None:
    """Below 2025-11-25 there is no priming event: a close must not leave the client without a cursor."""
    url, release = short_lived
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp"), version="2025-03-26")
    await peer.initialize()
    closed = await peer.post(call(1, "poll", progress="p", gate="no-priming"))
    assert closed.ids, "the stream closed only after an event the client can resume from"
    assert closed.messages[0]["params"]["progress"] == 1
    release.release("no-priming")
    resumed = await peer.resume(closed.ids[-1])
    assert resumed.messages[-1]["result"]["content"][0]["text"] == "polled"


async def test_answer_published_while_the_writer_sends_is_not_lost(short_lived, http: httpx.AsyncClient) -> None:
    url, _ = short_lived
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp"))
    await peer.initialize()
    for request_id in range(20):
        read = await peer.post(call(request_id, "yield_once"))
        assert read.messages[-1]["result"]["content"][0]["text"] == "b"


async def test_priming_id_precedes_an_answer_given_at_once(short_lived, http: httpx.AsyncClient) -> None:
    """A client cut right after the priming event resumes from it and still gets the answer."""
    url, _ = short_lived
    peer = Peer(http, url, await dev_token(http, url, f"{url}/mcp"))
    await peer.initialize()
    primed = await peer.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, stop_after=1)
    assert primed.messages == [] and len(primed.ids) == 1
    rest = await peer.resume(primed.ids[0])
    assert rest.messages[-1]["id"] == 1 and "tools" in rest.messages[-1]["result"]
