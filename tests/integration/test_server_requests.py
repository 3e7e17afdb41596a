"""Requests the server sends the client (sampling, elicitation), extra method handlers, and cancellation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.core.errors import EXECUTION_LOST, REQUEST_CANCELLED
from mcp_lossless.core.events import PendingRequest, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.server import MethodError, ServerConfig, ToolContext, ToolRegistry, create_app
from mcp_lossless.stores.memory import MemoryStore
from tests.support.mcp_http import Peer, call, parse_sse
from tests.support.uvicorn_server import lossless_server, serve_app

pytestmark = pytest.mark.anyio


def registry() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool()
    async def ask(ctx: ToolContext, prompt: str) -> str:
        """Asks the client's model through sampling/createMessage."""
        answer = await ctx.request("sampling/createMessage", {"messages": [{"role": "user", "content": prompt}]})
        await ctx.log("info", {"sampled": True})
        return f"model said: {answer['content']['text']}"

    @tools.tool()
    async def wait_forever(ctx: ToolContext) -> str:
        """Never finishes unless cancelled."""
        await asyncio.Event().wait()
        return "unreachable"

    return tools


async def read_resource(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("uri") != "test://hello":
        raise MethodError(-32002, "resource not found", {"uri": params.get("uri")})
    return {"contents": [{"uri": "test://hello", "text": "hello"}]}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", issuer=None)
        return create_app(config, registry(), methods={"resources/read": read_resource}, capabilities={"resources": {}})

    with lossless_server(make) as base:
        yield base


async def test_sampling_request_round_trip(url: str, http: httpx.AsyncClient) -> None:
    peer = Peer(http, url)
    init = await peer.initialize()
    assert "resources" in init["capabilities"]
    messages = []
    async with http.stream(
        "POST", peer.url, headers=peer.headers(), content=orjson.dumps(call(1, "ask", prompt="hi"))
    ) as r:
        buffer = ""
        async for text in r.aiter_text():
            buffer += text
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                for event in parse_sse(block + "\n\n"):
                    message = event.message
                    if message is None:
                        continue
                    messages.append(message)
                    if message.get("method") == "sampling/createMessage":
                        reply = {
                            "jsonrpc": "2.0",
                            "id": message["id"],
                            "result": {"role": "assistant", "content": {"type": "text", "text": "42"}},
                        }
                        ack = await http.post(peer.url, headers=peer.headers(), content=orjson.dumps(reply))
                        assert ack.status_code == 202
    assert [m.get("method") for m in messages] == ["sampling/createMessage", "notifications/message", None]
    assert messages[-1]["result"]["content"][0]["text"] == "model said: 42"


async def test_extra_method_handler_and_its_errors(url: str, http: httpx.AsyncClient) -> None:
    peer = Peer(http, url)
    await peer.initialize()
    ok = await peer.post({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "test://hello"}})
    assert ok.messages[-1]["result"]["contents"][0]["text"] == "hello"
    missing = await peer.post({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "x"}})
    assert missing.messages[-1]["error"] == {"code": -32002, "message": "resource not found", "data": {"uri": "x"}}


async def test_cancelled_request_still_gets_exactly_one_answer(url: str, http: httpx.AsyncClient) -> None:
    peer = Peer(http, url)
    await peer.initialize()
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "w"}}
    events = []
    body = orjson.dumps(call("w", "wait_forever"))
    async with http.stream("POST", peer.url, headers=peer.headers(), content=body) as response:
        text = ""
        async for chunk in response.aiter_text():
            text += chunk
            if not events and "\n\n" in text:  # the priming event: the call is registered and running
                events.append("primed")
                ack = await http.post(peer.url, headers=peer.headers(), content=orjson.dumps(cancel))
                assert ack.status_code == 202
    answers = [e.message for e in parse_sse(text) if e.message and e.message.get("id") == "w"]
    assert len(answers) == 1 and answers[0]["error"]["code"] == REQUEST_CANCELLED


async def test_shutdown_under_a_running_call_records_execution_lost(http: httpx.AsyncClient) -> None:
    """The ASGI server ending a request mid-call is not a client's cancel: the stored answer says EXECUTION_LOST."""
    store = MemoryStore()
    app = create_app(ServerConfig(store="memory", issuer=None), registry(), store=store)
    with serve_app(app, lifespan="on", graceful_shutdown=1) as base:
        peer = Peer(http, base)
        await peer.initialize()
        request = http.build_request(
            "POST", peer.url, headers=peer.headers(), content=orjson.dumps(call("w", "wait_forever"))
        )
        response = await http.send(request, stream=True)
        text = ""
        async for chunk in response.aiter_text():
            text += chunk
            if "\n\n" in text:  # the priming event: the call runs
                break
        stream = parse_sse(text)[0].id.split(".")[0]
    await response.aclose()
    answers = [e for e in await store.read_after(stream, 0) if e.terminal]
    assert [orjson.loads(e.data)["error"]["code"] for e in answers] == [EXECUTION_LOST]


async def test_a_stream_answered_but_never_marked_complete_ends_on_resume(http: httpx.AsyncClient) -> None:
    """Its process died between storing the last answer and marking the stream complete: a resume replays the
    answer and ends the stream, with no EXECUTION_LOST (the request was answered)."""
    store = MemoryStore()
    app = create_app(ServerConfig(store="memory", issuer=None), registry(), store=store)
    with serve_app(app, lifespan="on") as base:
        peer = Peer(http, base)
        await peer.initialize()
        assert peer.session_id is not None
        stream, codec = "a-stream-of-a-dead-process", app.state.codec
        mac = codec.stream_mac(peer.session_id, stream)
        request = PendingRequest("w", "tools/call", "wait_forever", app.state.tool_tags["wait_forever"])
        await store.open_stream(StreamRecord(peer.session_id, stream, StreamKind.POST, "dead", (request,), 0))
        answer = orjson.dumps({"jsonrpc": "2.0", "id": "w", "result": {"content": [], "isError": False}})
        tags = request.resources
        await store.append(
            StoredEvent(peer.session_id, stream, 1, codec.encode(stream, 1, mac), answer, "w", None, tags, True)
        )
        with anyio.fail_after(10):
            response = await http.get(
                peer.url, headers={**peer.headers(), "last-event-id": codec.encode(stream, 0, mac)}
            )
    messages = [e.message for e in parse_sse(response.text) if e.message]
    assert [m.get("id") for m in messages] == ["w"] and "result" in messages[0]
    record = await store.get_stream(stream)
    assert record is not None and record.completed


class HeldAnswers(MemoryStore):
    """Holds the answer of request ``held`` in the store until released (as a durable store's commit does):
    the window a cancel used to land in."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self._release: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def enqueue(self, event: StoredEvent, completes: bool = False) -> asyncio.Future[None]:
        if not (event.terminal and event.request_id == "held"):
            return super().enqueue(event, completes)
        self._loop, self._release = asyncio.get_running_loop(), asyncio.Event()
        self.entered.set()
        return asyncio.ensure_future(self._held(self._release, event, completes))

    async def _held(self, release: asyncio.Event, event: StoredEvent, completes: bool) -> None:
        await release.wait()
        await self.append(event, completes)

    def release(self) -> None:
        assert self._loop is not None and self._release is not None
        self._loop.call_soon_threadsafe(self._release.set)


async def test_a_cancel_while_the_answer_is_recorded_does_not_cut_it_short(http: httpx.AsyncClient) -> None:
    """The answer exists once the work returns: a cancel then is too late, and the answer arrives whole."""
    tools = ToolRegistry()

    @tools.tool()
    async def answer_now() -> str:
        return "done"

    store = HeldAnswers()
    app = create_app(ServerConfig(store="memory", issuer=None), tools, store=store)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "held"}}
    with serve_app(app, lifespan="on") as base:
        peer = Peer(http, base)
        await peer.initialize()
        body = orjson.dumps(call("held", "answer_now"))
        async with http.stream("POST", peer.url, headers=peer.headers(), content=body) as response:
            with anyio.fail_after(10):
                assert await anyio.to_thread.run_sync(store.entered.wait, 10), "the answer never reached the store"
                ack = await http.post(peer.url, headers=peer.headers(), content=orjson.dumps(cancel))
                assert ack.status_code == 202
                store.release()
                text = (await response.aread()).decode()
    answers = [e.message for e in parse_sse(text) if e.message and e.message.get("id") == "held"]
    assert len(answers) == 1 and answers[0]["result"]["content"][0]["text"] == "done"
