"""Our client against the official ``mcp`` 2.3 Python SDK server, over real HTTP on loopback.

The SDK server runs under uvicorn with an event store written here (the SDK ships none), a retry
interval, and tools that report progress and close their SSE stream mid-call (SEP-1699 polling).
A recording wrapper notes every HTTP request the server receives, so the tests can check what went
over the wire (GET + Last-Event-ID resumes, cancellation, DELETE).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as ServerToolError
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCMessage, ToolAnnotations

from mcp_lossless.client import Client, DeadlineExceeded, ProgressUpdate, SessionLost, ToolFailed
from mcp_lossless.client.sync import SyncClient
from mcp_lossless.client.transport import Backoff
from tests.support.uvicorn_server import serve_app

RETRY_MS = 100


class MemoryEventStore(EventStore):
    """The semantics of the SDK's example stores: global ids, replay of the same stream after an id."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._events: list[tuple[str, str, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(next(self._ids))
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        position = next((i for i, (eid, _, _) in enumerate(self._events) if eid == last_event_id), None)
        if position is None:
            return None
        stream_id = self._events[position][1]
        for event_id, stream, message in self._events[position + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


@dataclass
class Seen:
    method: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


class Recorder:
    """ASGI wrapper that records each HTTP request (method, headers, body) the server receives."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[Seen] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = Seen(scope["method"], {k.decode().lower(): v.decode() for k, v in scope["headers"]})
        with self._lock:
            self.seen.append(record)

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                record.body += message.get("body", b"")
            return message

        await self.app(scope, recording_receive, send)

    def requests(self, method: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.method == method]

    def posted(self, rpc_method: str) -> list[dict[str, Any]]:
        bodies = [s.json() for s in self.requests("POST")]
        return [b for b in bodies if isinstance(b, dict) and b.get("method") == rpc_method]


class CancelLog:
    """Markers of tool runs the server cancelled, awaitable from the test's event loop."""

    def __init__(self) -> None:
        self._events: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def _event(self, marker: int) -> threading.Event:
        with self._lock:
            return self._events.setdefault(marker, threading.Event())

    def record(self, marker: int) -> None:
        self._event(marker).set()

    async def wait_for(self, marker: int) -> bool:
        """Whether the server cancelled the run marked ``marker`` within five seconds."""
        return await anyio.to_thread.run_sync(self._event(marker).wait, 5.0)


@dataclass
class SdkServer:
    url: str
    recorder: Recorder
    cancelled: CancelLog
    release: threading.Event
    """Lets ``transfer`` finish."""


def build_app(cancelled: CancelLog, release: threading.Event) -> Any:
    server = MCPServer("sdk-peer")

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def count(n: int, ctx: Context, close_after: int = 0) -> str:
        """Count to n, reporting each step; optionally close the SSE stream after a step."""
        for step in range(1, n + 1):
            await ctx.report_progress(step, n, f"step {step}")
            if step == close_after:
                await ctx.close_sse_stream()
            await anyio.sleep(0.02)
        return f"counted to {n}"

    @server.tool()
    async def transfer(amount: int, ctx: Context) -> str:
        """Not idempotent: running it twice would move the money twice. Finishes when the test says so."""
        await ctx.report_progress(1, 2)
        await ctx.close_sse_stream()
        await anyio.to_thread.run_sync(release.wait, 10)
        return f"moved {amount}"

    @server.tool()
    async def sleepy(marker: int) -> str:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.record(marker)
            raise
        return "woke up"

    @server.tool()
    async def pings(ctx: Context) -> str:
        """Pings the client on its session's standalone GET stream (a request of no call's), within 10 s."""
        with anyio.fail_after(10):
            await ctx.session.send_ping()
        return "answered"

    @server.tool()
    async def broken() -> str:
        raise ServerToolError("the tool failed on purpose")

    return server.streamable_http_app(event_store=MemoryEventStore(), retry_interval=RETRY_MS)


@pytest.fixture(scope="module")
def sdk_server() -> Iterator[SdkServer]:
    cancelled = CancelLog()
    release = threading.Event()
    recorder = Recorder(build_app(cancelled, release))
    with serve_app(recorder) as base:
        yield SdkServer(f"{base}/mcp", recorder, cancelled, release)
    release.set()


def fast_client(url: str, **kwargs: Any) -> Client:
    return Client(url, backoff=Backoff(initial=0.05, maximum=0.5), **kwargs)


@pytest.mark.anyio
async def test_initialize_negotiates_latest_and_carries_headers(sdk_server: SdkServer) -> None:
    async with fast_client(sdk_server.url) as client:
        assert client.server.protocol_version == "2025-11-25"
        assert client.server.session_id
        assert client.server.info.get("name") == "sdk-peer"
        session_id = client.server.session_id
        tools = {t.name: t for t in await client.list_tools()}
    assert set(tools) >= {"count", "transfer", "sleepy", "broken"}
    assert tools["count"].idempotent and not tools["transfer"].idempotent
    (listing,) = [s for s in sdk_server.recorder.requests("POST") if (s.json() or {}).get("method") == "tools/list"]
    assert listing.headers["mcp-session-id"] == session_id
    assert listing.headers["mcp-protocol-version"] == "2025-11-25"
    assert "application/json" in listing.headers["accept"] and "text/event-stream" in listing.headers["accept"]
    deletes = [s for s in sdk_server.recorder.requests("DELETE") if s.headers.get("mcp-session-id") == session_id]
    assert len(deletes) == 1


@pytest.mark.anyio
async def test_a_request_on_the_standalone_stream_is_answered(sdk_server: SdkServer) -> None:
    """The SDK's ``send_ping()`` names no request, so it goes out on the GET stream: ``listen`` answers it (the
    tool fails with a timeout if nothing does), and hands ``on_message`` only notifications."""
    seen: list[Any] = []
    async with fast_client(sdk_server.url) as client:
        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.listen, seen.append, opened.set)
            with anyio.fail_after(10):
                await opened.wait()
            result = await client.call_tool("pings")
            tg.cancel_scope.cancel()
    assert result.text == "answered"
    assert all("id" not in message for message in seen)


@pytest.mark.anyio
async def test_tools_call_with_progress(sdk_server: SdkServer) -> None:
    updates: list[ProgressUpdate] = []
    async with fast_client(sdk_server.url) as client:
        result = await client.call_tool("count", {"n": 4}, on_progress=updates.append)
    assert result.text == "counted to 4"
    assert [(u.progress, u.total, u.message) for u in updates] == [(i, 4.0, f"step {i}") for i in range(1, 5)]


@pytest.mark.anyio
async def test_resume_after_server_initiated_close(sdk_server: SdkServer) -> None:
    updates: list[float] = []
    async with fast_client(sdk_server.url) as client:
        session_id = client.server.session_id
        result = await client.call_tool(
            "count", {"n": 5, "close_after": 2}, on_progress=lambda u: updates.append(u.progress)
        )
    assert result.text == "counted to 5"
    assert updates == [1, 2, 3, 4, 5]  # each exactly once, across the close and the replay
    resumes = [s for s in sdk_server.recorder.requests("GET") if s.headers.get("mcp-session-id") == session_id]
    assert resumes, "the client must resume with GET"
    assert all(r.headers.get("last-event-id") for r in resumes)
    assert resumes[0].headers["accept"] == "text/event-stream"


@pytest.mark.anyio
async def test_concurrent_calls_each_get_their_own_result(sdk_server: SdkServer) -> None:
    results: dict[int, str] = {}
    async with fast_client(sdk_server.url) as client:

        async def one(n: int) -> None:
            results[n] = (await client.call_tool("count", {"n": n, "close_after": 1})).text

        async with anyio.create_task_group() as tg:
            for n in range(2, 7):
                tg.start_soon(one, n)
    assert results == {n: f"counted to {n}" for n in range(2, 7)}


@pytest.mark.anyio
async def test_tool_error_is_typed(sdk_server: SdkServer) -> None:
    async with fast_client(sdk_server.url) as client:
        with pytest.raises(ToolFailed) as caught:
            await client.call_tool("broken")
    assert "failed on purpose" in caught.value.reason


@pytest.mark.anyio
async def test_deadline_cancels_the_call_on_the_server(sdk_server: SdkServer) -> None:
    marker = 4242
    async with fast_client(sdk_server.url) as client:
        with anyio.fail_after(5), pytest.raises(DeadlineExceeded):
            await client.call_tool("sleepy", {"marker": marker}, timeout=0.5)
        assert await sdk_server.cancelled.wait_for(marker), "the server never cancelled the tool"
    notices = sdk_server.recorder.posted("notifications/cancelled")
    assert any(n["params"]["requestId"] for n in notices)


@pytest.mark.anyio
async def test_caller_cancellation_is_forwarded(sdk_server: SdkServer) -> None:
    marker = 777
    async with fast_client(sdk_server.url) as client:
        with anyio.move_on_after(0.5):
            await client.call_tool("sleepy", {"marker": marker}, timeout=10)
        assert await sdk_server.cancelled.wait_for(marker), "the server never cancelled the tool"


@pytest.mark.anyio
async def test_session_lost_mid_call_of_non_idempotent_tool_is_may_have_run(sdk_server: SdkServer) -> None:
    """The session disappears while ``transfer`` runs; the client's resume then gets 404.

    The client starts a new session, but it does not run ``transfer`` again: it may have run already.
    (Whether the resume lands before or after the DELETE, the next resume finds no session.)
    """
    started = anyio.Event()
    async with fast_client(sdk_server.url) as client, httpx.AsyncClient() as raw:
        old_session = client.server.session_id or ""

        async def kill_session() -> None:
            await started.wait()
            response = await raw.delete(sdk_server.url, headers={"mcp-session-id": old_session})
            assert response.status_code == 200
            sdk_server.release.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_session)
            with pytest.raises(SessionLost) as caught:
                await client.call_tool("transfer", {"amount": 10}, on_progress=lambda _: started.set())
        assert (await client.call_tool("count", {"n": 1})).text == "counted to 1"  # on a new session
        assert client.server.session_id not in (None, old_session)
    assert "may have run" in caught.value.reason
    transfers = [t for t in sdk_server.recorder.posted("tools/call") if t["params"]["name"] == "transfer"]
    assert len(transfers) == 1


def test_sync_wrapper_for_scripts(sdk_server: SdkServer) -> None:
    updates: list[float] = []
    with SyncClient(sdk_server.url, backoff=Backoff(initial=0.05, maximum=0.5)) as client:
        assert client.server.protocol_version == "2025-11-25"
        assert "count" in {t.name for t in client.list_tools()}
        result = client.call_tool("count", {"n": 3, "close_after": 1}, on_progress=lambda u: updates.append(u.progress))
        with pytest.raises(ToolFailed):
            client.call_tool("broken")
    assert result.text == "counted to 3"
    assert updates == [1, 2, 3]
