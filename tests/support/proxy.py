"""A loopback TCP proxy that cuts connections at chosen SSE event boundaries, for fault injection.

Each accepted connection gets a plan from ``plan(index)``: ``None`` forwards everything; ``n`` forwards the
server's bytes up to and including the ``n``-th blank line after the response head (the end of the n-th SSE
event) and then drops both sides, as a network failure would. Requests flow unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

BOUNDARY = b"\n\n"


@dataclass
class ProxyStats:
    connections: int = 0
    cuts: int = 0
    cut_at: list[int] = field(default_factory=list)


class CuttingProxy:
    def __init__(self, upstream_port: int, plan: Callable[[int], int | None]) -> None:
        self.upstream_port = upstream_port
        self.plan = plan
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        index = self.stats.connections
        self.stats.connections += 1
        cut_after = self.plan(index)
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        upstream = asyncio.ensure_future(self._pipe(client_r, server_w))
        self._tasks.add(upstream)
        upstream.add_done_callback(self._tasks.discard)
        try:
            await self._downstream(server_r, client_w, cut_after)
        finally:
            upstream.cancel()
            for writer in (client_w, server_w):
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(ConnectionError, OSError):
            writer.write_eof()

    async def _downstream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut_after: int | None
    ) -> None:
        """Forward the server's bytes; with a plan, stop right after the chosen event and drop the connection.

        HTTP heads end in CRLF CRLF and JSON bodies never hold a raw blank line, so every LF LF on a
        connection ends an SSE event.
        """
        events = 0
        last = b""
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if cut_after is not None:
                    scan = last + data
                    start = len(last)
                    at = scan.find(BOUNDARY)
                    while at >= 0:
                        events += 1
                        if events >= cut_after:
                            writer.write(data[: at + 2 - start])
                            await writer.drain()
                            self.stats.cuts += 1
                            self.stats.cut_at.append(events)
                            writer.transport.abort()  # RST: a broken connection, not a clean end
                            return
                        at = scan.find(BOUNDARY, at + 2)
                    last = data[-1:]
                writer.write(data)
                await writer.drain()
