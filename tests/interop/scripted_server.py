"""Our server (dev AS, memory store) for stock SDK clients, with tools whose stream close is scripted.

``search`` and ``fetch`` behave like the demo tools (progress per step, deterministic text) and can close
their SSE stream after a given step (SEP-1699), so a stock client must resume with GET + Last-Event-ID.
What happens next is ordered by events, never by sleeps: a recording ASGI wrapper sees every exchange,
and the tools wait on it (the POST stream really ended; the resume GET was answered 200), while resume
GETs can be held until the tool has stored every event, so the replay plan sees them all.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolContext, ToolError, ToolRegistry
from tests.support.uvicorn_server import lossless_server

RETRY_MS = 200
WAIT_SECONDS = 15.0


class AfterClose(enum.Enum):
    CONTINUE = "continue"
    """Go on once the POST stream has ended: the rest is replayed and then tailed live."""
    HOLD_RESUME = "hold_resume"
    """Hold resume GETs until every event is stored: a narrowed token is refused before commit (403)."""
    AWAIT_RESUME = "await_resume"
    """Go on only after a resume GET was answered 200: a narrowed token is refused in band, after commit."""


@dataclass
class Exchange:
    method: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    done: bool = False

    @property
    def resume(self) -> bool:
        return self.method == "GET" and "last-event-id" in self.headers


class Recorder:
    """ASGI wrapper noting each HTTP exchange; other threads wait on it with predicates."""

    def __init__(self) -> None:
        self.app: Any = None
        self.exchanges: list[Exchange] = []
        self.hold_resumes = False
        self.released = threading.Event()
        self._changed = threading.Condition()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(scope["method"], {k.decode().lower(): v.decode() for k, v in scope["headers"]})
        with self._changing():
            self.exchanges.append(exchange)
        if exchange.resume and self.hold_resumes:
            await anyio.to_thread.run_sync(self.released.wait, WAIT_SECONDS)

        async def receive_recorded() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body.extend(message.get("body", b""))
            return message

        async def send_recorded(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                with self._changing():
                    exchange.status = message["status"]
                    exchange.response_headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                with self._changing():
                    exchange.done = True

        await self.app(scope, receive_recorded, send_recorded)

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Change exchanges under the lock, then wake every waiter to re-check its predicate."""
        with self._changed:
            yield
            self._changed.notify_all()

    def wait_sync(self, predicate: Callable[[Exchange], bool]) -> Exchange:
        with self._changed:
            found: list[Exchange] = []

            def seen() -> bool:
                found.extend(e for e in self.exchanges if predicate(e))
                return bool(found)

            if not self._changed.wait_for(seen, WAIT_SECONDS):
                raise TimeoutError("the awaited HTTP exchange never happened")
            return found[0]

    async def wait(self, predicate: Callable[[Exchange], bool]) -> Exchange:
        return await anyio.to_thread.run_sync(functools.partial(self.wait_sync, predicate))

    def resumes(self) -> list[Exchange]:
        with self._changed:
            return [e for e in self.exchanges if e.resume]


def scripted_tools(recorder: Recorder, after_close: AfterClose) -> ToolRegistry:
    registry = ToolRegistry()

    async def run(ctx: ToolContext, what: str, marker: str, steps: int, close_at: int) -> None:
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"{what} step {step}/{steps}")
            if step != close_at:
                continue
            ctx.close_stream()
            try:
                await recorder.wait(lambda e: e.method == "POST" and marker.encode() in e.body and e.done)
                if after_close is AfterClose.AWAIT_RESUME:
                    await recorder.wait(lambda e: e.resume and e.status == 200)
            except TimeoutError as exc:
                raise ToolError(f"{what}: {exc}") from None
        if after_close is AfterClose.HOLD_RESUME:
            recorder.released.set()

    @registry.tool(idempotent=True, read_only=True)
    async def search(ctx: ToolContext, query: str, steps: int = 3, close_at: int = 0) -> str:
        """Search for `query`; closes its stream after step `close_at` (0: never)."""
        await run(ctx, "search", query, steps, close_at)
        return f"search results for {query!r}: 3 documents"

    @registry.tool(idempotent=True, read_only=True)
    async def fetch(ctx: ToolContext, url: str, steps: int = 3, close_at: int = 0) -> str:
        """Fetch `url`; closes its stream after step `close_at` (0: never)."""
        await run(ctx, "fetch", url, steps, close_at)
        return f"contents of {url}: {len(url)} bytes"

    return registry


@dataclass
class ScriptedServer:
    base: str
    recorder: Recorder

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def tool_resource(self, name: str) -> str:
        return f"{self.url}/tools/{name}"


@contextmanager
def scripted_server(after_close: AfterClose = AfterClose.CONTINUE) -> Iterator[ScriptedServer]:
    recorder = Recorder()
    recorder.hold_resumes = after_close is AfterClose.HOLD_RESUME

    def make(port: int) -> Recorder:
        config = ServerConfig(port=port, store="memory", retry_ms=RETRY_MS)
        recorder.app = create_app(config, scripted_tools(recorder, after_close))
        return recorder

    with lossless_server(make) as base:
        yield ScriptedServer(base, recorder)
