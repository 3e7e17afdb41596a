"""Back-pressure (issue 11, acceptance 5): a client that does not read its stream holds the tool that writes it, not
the server's memory; reading later, or resuming from an earlier event, delivers every event exactly once, in order.

The server runs as ``serve`` runs it (the guarded uvicorn protocol, uvloop) on loopback, with small socket buffers
on both ends so that a few kilobytes fill the connection; the client reads real SSE bytes through httpx. The tool
of the test looks at its own stream's accounting before each progress call, and says (a threading event) when
the backlog is full, which is the moment its next call waits: the test awaits that, never a sleep.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from mcp_lossless.core.limits import Limits
from mcp_lossless.server.app import LosslessApp, create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.serving import lossless_server
from mcp_lossless.server.streams import LiveStream
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore
from tests.support.mcp_http import Peer, StreamRead, call, parse_sse
from tests.support.uvicorn_server import loopback_socket, run_server

pytestmark = pytest.mark.anyio

BACKLOG = 200
STEPS = 8_000
"""Far more than the backlog and the connection's buffers hold (a few hundred KiB here, some 2,000 events)."""
SMALL_BUFFER = 4096


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Probe:
    """What the flooding tool saw of its stream: the most events memory held, and when the backlog was full."""

    def __init__(self) -> None:
        self.app: LosslessApp | None = None
        self.most_held = 0
        self.most_bytes = 0
        self.full = threading.Event()
        self.full_at: int | None = None
        self.finished = threading.Event()

    def stream(self) -> LiveStream:
        assert self.app is not None
        (session,) = self.app.state.sessions.all()
        (live,) = session.live.values()
        return live

    def look(self, step: int) -> None:
        live = self.stream()
        self.most_held = max(self.most_held, len(live.events))
        self.most_bytes = max(self.most_bytes, sum(len(e.data) for e in live.events))
        if live.backlog + 1 >= BACKLOG and not self.full.is_set():  # this step's event fills it: its call waits
            self.full_at = step
            self.full.set()


def flood_tools(probe: Probe) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def flood(ctx: ToolContext, steps: int) -> str:
        """Progress ``steps`` times without a pause, looking at its stream before each."""
        for step in range(1, steps + 1):
            probe.look(step)
            await ctx.report_progress(step, steps)
        probe.finished.set()
        return f"{steps} steps"

    return registry


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> EventStore:
    if request.param == "memory":
        return MemoryStore()
    if request.param == "sqlite":
        return SqliteStore(str(tmp_path / "backpressure.db"))
    redis_url = request.getfixturevalue("redis_url")
    return RedisStore(redis_url, prefix=f"bp-{uuid.uuid4().hex}", max_events_per_stream=None)


@contextmanager
def served(store: EventStore, probe: Probe, **settings: Any) -> Iterator[str]:
    """``serve``'s server for the flood tool; accepted connections inherit the listener's small send buffer."""
    sock = loopback_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    limits = Limits(stream_backlog=BACKLOG)
    config = ServerConfig(port=sock.getsockname()[1], store="memory", issuer=None, limits=limits, **settings)
    app = create_app(config, flood_tools(probe), store=store)
    probe.app = app
    server = lossless_server(app)
    with run_server(server, server.listening, sock) as url:
        yield url


@asynccontextmanager
async def slow_client() -> AsyncIterator[httpx.AsyncClient]:
    """A client whose socket keeps its initial receive buffer while it does not read (the kernel grows it only
    as the application reads), so that a few hundred kilobytes make the server's writes wait."""
    async with httpx.AsyncClient(timeout=60) as http:
        yield http


async def held(probe: Probe) -> int:
    """Until the tool finds its backlog full (its next progress call waits for the reader); the step it was at."""
    assert await asyncio.to_thread(probe.full.wait, 60), "the tool never filled its backlog"
    assert probe.full_at is not None
    return probe.full_at


def assert_backlog_bounded(probe: Probe, at_step: int) -> None:
    assert at_step < STEPS // 2, f"the tool ran to step {at_step} of {STEPS} before its backlog was full"
    assert not probe.finished.is_set()
    assert probe.most_held <= BACKLOG, f"memory held {probe.most_held} events of the stream (bound {BACKLOG})"
    assert probe.most_bytes <= Limits().stream_backlog_bytes


def assert_every_step_once(events: list[Any], first: int = 1) -> None:
    """Progress ``first`` to STEPS, each once and in order, with increasing ids, then the tool's result."""
    messages = [orjson.loads(e.data) for e in events if e.data]
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == list(range(first, STEPS + 1))
    assert messages[-1].get("result", {}).get("content") == [{"type": "text", "text": f"{STEPS} steps"}]
    seqs = [int(e.id.split(".")[1], 16) for e in events if e.id and e.data]  # stream.seq(hex).mac
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def read_events(response: httpx.Response) -> list[Any]:
    text = ""
    async for chunk in response.aiter_text():
        text += chunk
    return parse_sse(text)


async def test_a_client_that_does_not_read_holds_its_tool_and_later_reads_every_event_once(store: EventStore) -> None:
    probe = Probe()
    with served(store, probe) as url:
        async with slow_client() as http:
            peer = Peer(http, url)
            await peer.initialize()
            body = orjson.dumps(call(1, "flood", "p", steps=STEPS))
            async with http.stream("POST", peer.url, headers=peer.headers(), content=body) as response:
                assert response.status_code == 200
                step = await held(probe)  # nothing read yet: the connection is full, the backlog too
                assert_backlog_bounded(probe, step)
                events = await read_events(response)
    assert_every_step_once(events)
    assert probe.most_held <= BACKLOG


async def test_a_resume_from_an_early_event_gets_every_later_one_once_from_store_and_memory(store: EventStore) -> None:
    """Events sent to the first connection (its buffers) are no longer in memory: the resume reads them from
    the store, then the backlog, then what the tool writes once it goes on."""
    probe = Probe()
    with served(store, probe) as url:
        async with slow_client() as http:
            peer = Peer(http, url)
            await peer.initialize()
            body = orjson.dumps(call(1, "flood", "p", steps=STEPS))
            cursor = None
            async with http.stream("POST", peer.url, headers=peer.headers(), content=body) as response:
                buffer = ""
                async for chunk in response.aiter_text():  # up to the tenth progress event, then no more reading
                    buffer += chunk
                    read = [e for e in parse_sse(buffer.rsplit("\n\n", 1)[0]) if e.id and e.data]
                    if len(read) >= 10:
                        cursor = read[9].id
                        break
                step = await held(probe)
                assert_backlog_bounded(probe, step)
            assert cursor is not None
            assert probe.stream().delivered > 10, "the first connection was sent more than it read"
        async with httpx.AsyncClient(timeout=60) as reader:
            peer.http = reader
            resumed: StreamRead = await peer.resume(cursor)
    assert resumed.status == 200
    assert_every_step_once(resumed.events, first=11)
    assert probe.most_held <= BACKLOG


async def test_an_answers_only_response_never_waits_for_a_reader() -> None:
    """JSON response mode sends only the answer: progress is stored and not held, and the tool runs through."""
    probe = Probe()
    with served(MemoryStore(), probe, json_response=True) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            peer = Peer(http, url)
            await peer.initialize()
            read = await peer.post(call(1, "flood", "p", steps=5 * BACKLOG))
    assert read.status == 200
    assert read.json()["result"]["content"] == [{"type": "text", "text": f"{5 * BACKLOG} steps"}]
    assert probe.most_held == 0
