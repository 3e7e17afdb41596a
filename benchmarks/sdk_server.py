"""The official `mcp` SDK server the benchmark compares against.

Same two tools as mcp-lossless (`search`, `fetch`), stateful Streamable HTTP on uvicorn, one process,
auth off. The SDK ships an `EventStore` interface but no implementation, so `MemoryEventStore` below
supplies a fair one: O(1) append, a global index by event id, O(k) replay. A naive store (linear scan)
would make the SDK look slower than it is on replay.

    python benchmarks/sdk_server.py --port 8000 [--json-response]
"""

from __future__ import annotations

import argparse
import itertools

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage


class MemoryEventStore(EventStore):
    """Events per stream in append order, plus `event id -> (stream, position)` for O(1) lookup."""

    def __init__(self) -> None:
        self._streams: dict[StreamId, list[tuple[EventId, JSONRPCMessage | None]]] = {}
        self._index: dict[EventId, tuple[StreamId, int]] = {}
        self._counter = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(next(self._counter))
        events = self._streams.setdefault(stream_id, [])
        self._index[event_id] = (stream_id, len(events))
        events.append((event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        location = self._index.get(last_event_id)
        if location is None:
            return None
        stream_id, position = location
        events = self._streams[stream_id]
        for index in range(position + 1, len(events)):
            event_id, message = events[index]
            if message is not None:  # priming events carry no message
                await send_callback(EventMessage(message, event_id))
        return stream_id


server = MCPServer("sdk-bench", log_level="WARNING")


async def _report_steps(ctx: Context, steps: int, delay_ms: int, what: str) -> None:
    """`steps` progress notifications, `delay_ms` apart; the SDK drops them without a progress token.

    Same message text as mcp-lossless's demo tools, so both servers put the same bytes on the wire.
    """
    for step in range(1, steps + 1):
        if delay_ms > 0:
            await anyio.sleep(delay_ms / 1000)
        await ctx.report_progress(step, steps, f"{what} step {step}/{steps}")


@server.tool()
async def search(query: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
    """Pretend search: progress steps, then a deterministic text result."""
    await _report_steps(ctx, steps, delay_ms, "search")
    return f"search results for {query!r}: 3 documents"


@server.tool()
async def fetch(url: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
    """Pretend fetch: progress steps, then a deterministic text result."""
    await _report_steps(ctx, steps, delay_ms, "fetch")
    return f"contents of {url}: {len(url)} bytes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--json-response", action="store_true", help="JSON replies, no SSE, no event store")
    parser.add_argument("--loop", default="auto", help="uvicorn event loop (auto picks uvloop if installed)")
    parser.add_argument("--http", default="auto", help="uvicorn HTTP parser (auto picks httptools if installed)")
    args = parser.parse_args()
    app = server.streamable_http_app(
        json_response=args.json_response,
        event_store=None if args.json_response else MemoryEventStore(),
        retry_interval=None if args.json_response else 1000,
        host=args.host,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        workers=1,
        loop=args.loop,
        http=args.http,
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
