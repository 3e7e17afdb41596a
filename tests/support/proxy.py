"""A loopback TCP proxy that cuts or delays connections at chosen SSE event boundaries, for fault injection.

Two ways to choose where. ``plan(index)`` is asked once per accepted connection: ``None`` forwards
everything; ``n`` forwards the server's bytes up to and including the ``n``-th event on that connection
and then drops both sides, as a network failure would. ``hook(number)`` is asked for every event that
passes, numbered across all connections since the last :meth:`CuttingProxy.reset` (so a schedule can
say "drop after the 7th event, whichever connection carries it"), and may delay the event or cut after
it. :meth:`CuttingProxy.cut_all` drops every open connection at once. Requests flow unchanged.

HTTP heads end in CRLF CRLF and JSON bodies never hold a raw blank line, so every LF LF on a connection
ends an SSE event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

BOUNDARY = b"\n\n"


@dataclass(frozen=True, slots=True)
class Fault:
    """What to do with one event: wait ``delay`` seconds before forwarding it, then maybe ``cut``."""

    delay: float = 0.0
    cut: bool = False


@dataclass
class ProxyStats:
    connections: int = 0
    events: int = 0
    cuts: int = 0
    cut_at: list[int] = field(default_factory=list)


class CuttingProxy:
    def __init__(
        self,
        upstream_port: int,
        plan: Callable[[int], int | None] | None = None,
        *,
        hook: Callable[[int], Fault | None] | None = None,
        upstream_grace: float = 0.0,
    ) -> None:
        self.upstream_port = upstream_port
        self.upstream_grace = upstream_grace
        """Seconds to keep trying an upstream that refuses connections (a restart), as a load balancer would."""
        self.plan = plan
        self.hook = hook
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def reset(self, hook: Callable[[int], Fault | None] | None = None) -> None:
        """Number events from 1 again and use ``hook`` from now on (connections already open included)."""
        self.hook = hook
        self.stats = ProxyStats()

    def cut_all(self) -> int:
        """Drop every open connection now (RST); returns how many."""
        dropped = list(self._open)
        for writer in dropped:
            writer.transport.abort()
        self.stats.cuts += len(dropped)
        return len(dropped)

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut_all()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        index = self.stats.connections
        self.stats.connections += 1
        cut_after = self.plan(index) if self.plan is not None else None
        try:
            server_r, server_w = await self._connect_upstream()
        except OSError:
            client_w.transport.abort()  # the upstream stayed down: the client sees its connection reset
            return
        self._open.add(client_w)
        upstream = asyncio.ensure_future(self._pipe(client_r, server_w))
        self._tasks.add(upstream)
        upstream.add_done_callback(self._tasks.discard)
        try:
            await self._downstream(server_r, client_w, cut_after)
        finally:
            self._open.discard(client_w)
            upstream.cancel()
            for writer in (client_w, server_w):
                writer.close()

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.upstream_grace
        while True:
            try:
                return await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                if loop.time() >= give_up:
                    raise
            await asyncio.sleep(0.02)  # polling a port that is coming back: there is no event to await

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
        """Forward the server's bytes event by event, applying the connection's plan and the event hook."""
        events = 0
        last = b""
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                scan = last + data
                start = len(last)
                sent = 0
                at = scan.find(BOUNDARY)
                while at >= 0:
                    end = at + 2 - start  # the end of this event within ``data``
                    events += 1
                    self.stats.events += 1
                    fault = self.hook(self.stats.events) if self.hook is not None else None
                    if fault is not None and fault.delay > 0:
                        await asyncio.sleep(fault.delay)
                    writer.write(data[sent:end])
                    sent = end
                    if (fault is not None and fault.cut) or (cut_after is not None and events >= cut_after):
                        await writer.drain()
                        self.stats.cuts += 1
                        self.stats.cut_at.append(events)
                        writer.transport.abort()  # RST: a broken connection, not a clean end
                        return
                    at = scan.find(BOUNDARY, at + 2)
                writer.write(data[sent:])
                await writer.drain()
                last = data[-1:]
