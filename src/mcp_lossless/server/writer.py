"""Writing SSE responses: events from a source, each checked against the stream's token before it is sent.

A source gives batches of stored events: :class:`LiveSource` for a stream this process produces,
:class:`StoredSource` for a replay, followed by the tail of a stream another replica still produces. The
writer stops at the first event the token may not receive and says so in band, without an ``id:``, so the
cursor stays put.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from ..asgi import Receive, Send
from ..core import frames
from ..core.events import PendingRequest, RequestId, StoredEvent, StreamRecord
from ..core.replay import DeliveryGate, Refusal
from ..stores.base import EventStore, StoreUnavailable
from .observability import fingerprint, log_decision, now
from .state import ServerState
from .streams import LiveStream

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
TAIL_WAIT_SECONDS = 2.0
"""How long one blocking read of another replica's stream waits before its owner's lease is checked."""


class EventSource(Protocol):
    """Where a writer's events come from. ``ready`` never blocks: events now, ``[]`` for none yet, ``None`` at end."""

    def ready(self) -> list[StoredEvent] | None: ...
    async def wait(self) -> None: ...
    def close(self) -> None: ...


class LiveSource:
    """Events of a stream this process produces, as they are published, until it ends or this writer must stop."""

    __slots__ = ("generation", "has_cursor", "live", "sent_seq")

    def __init__(self, live: LiveStream, sent_seq: int, *, has_cursor: bool) -> None:
        self.live = live
        self.sent_seq = sent_seq
        self.has_cursor = has_cursor
        """Whether the client holds an event id of this stream (priming, a resume cursor, or a sent event)."""
        self.generation = live.attach()
        live.writer = self.generation

    def ready(self) -> list[StoredEvent] | None:
        live = self.live
        if live.broken:
            raise StoreUnavailable("an answer on this stream could not be stored")
        events = live.after(self.sent_seq)
        if events:
            self.sent_seq = events[-1].seq
            self.has_cursor = True
            return events
        if (live.done and self.sent_seq >= live.record.last_seq) or live.generation != self.generation:
            return None
        if live.close_generation == self.generation and self.has_cursor:
            # Close only once the client holds an event id of this stream to resume from (SEP-1699): a close
            # before any id (no priming below 2025-11-25) waits for the next event.
            live.close_generation = -1
            return None
        return []

    async def wait(self) -> None:
        """Until ``ready`` may have something new. Events published while the writer was sending (it was
        not waiting then) are noticed here, not lost with the wake-up that announced them."""
        live = self.live
        if (
            live.broken
            or live.done
            or live.after(self.sent_seq)
            or live.generation != self.generation
            or live.close_generation == self.generation
        ):
            return
        await live.waiter()

    def close(self) -> None:
        if self.live.writer == self.generation:
            self.live.writer = None


class StoredSource:
    """Replayed events, then, for a stream another replica still produces, its tail read through the store."""

    def __init__(
        self,
        events: list[StoredEvent],
        sent_seq: int,
        tail: tuple[EventStore, str, Callable[[str], Awaitable[bool]], Callable[[StreamRecord], Awaitable[object]]]
        | None = None,
    ) -> None:
        self.buffer = events
        self.sent_seq = events[-1].seq if events else sent_seq
        self.tail = tail
        self.finished = tail is None

    def ready(self) -> list[StoredEvent] | None:
        if self.buffer:
            events, self.buffer = self.buffer, []
            return events
        return None if self.finished else []

    async def wait(self) -> None:
        """One blocking read of the tail; between reads, notice the end of the stream or its owner's death."""
        assert self.tail is not None
        store, stream, owner_alive, end_orphan = self.tail
        events = await store.wait_events(stream, self.sent_seq, TAIL_WAIT_SECONDS)
        if events:
            self.buffer = events
            self.sent_seq = events[-1].seq
            return
        record = await store.get_stream(stream)
        if record is None or (record.completed and self.sent_seq >= record.last_seq):
            self.finished = True
        elif not record.completed and not await owner_alive(record.owner):
            await end_orphan(record)

    def close(self) -> None:
        return None


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class SseWriter:
    """One SSE response: a head, then batches from a source until it ends, the client leaves, or a refusal."""

    __slots__ = ("gate", "requests", "s", "session_id", "settled", "stream")

    def __init__(
        self,
        state: ServerState,
        session_id: str,
        stream: str,
        gate: DeliveryGate,
        requests: tuple[PendingRequest, ...],
        settled: Iterable[RequestId] = (),
    ) -> None:
        self.s = state
        self.session_id = session_id
        self.stream = stream
        self.gate = gate
        self.requests = requests
        self.settled = set(settled)
        """Requests whose answer the client already has: a refusal does not name them."""

    async def run(self, receive: Receive, send: Send, source: EventSource, head: bytes) -> None:
        """Send events as the source has them; coalesce what is ready into one write; end with the stream.

        Before blocking, the writer yields once so a call that answers at once lands in the same write, and
        only then starts watching for the client's disconnect.
        """
        pending = [head] if head else []
        started = False
        yielded = False
        disconnect: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    events = source.ready()
                except StoreUnavailable:
                    pending.append(self._store_failure())
                    return
                if events is None:
                    return
                if events:
                    yielded = False
                    if self._frames(events, pending):
                        return
                    continue
                if not yielded:
                    yielded = True
                    await asyncio.sleep(0)
                    continue
                if pending or not started:
                    if not started:
                        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                        started = True
                    await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                    pending = []
                if disconnect is None:
                    disconnect = asyncio.create_task(_wait_disconnect(receive))
                step = asyncio.ensure_future(source.wait())
                await asyncio.wait((step, disconnect), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    return
                try:
                    step.result()
                except StoreUnavailable:
                    pending.append(self._store_failure())
                    return
                yielded = True
        finally:
            if disconnect is not None:
                disconnect.cancel()
            source.close()
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})

    def _frames(self, events: list[StoredEvent], out: list[bytes]) -> bool:
        """Append the frames of ``events`` the token may receive; ``True`` when a refusal ended the stream."""
        admitted, refusal = self.gate.admit(events, now())
        retry = self.s.config.retry_ms
        sse = frames.sse
        settled = self.settled
        for event in events[:admitted] if refusal is not None else events:
            out.append(sse(event.event_id, event.data, None if event.data else retry))
            if event.terminal and event.request_id is not None:
                settled.add(event.request_id)
        if refusal is not None:
            out.append(self._refusal(refusal))
            return True
        return False

    def _unsettled(self) -> list[RequestId]:
        return [r.request_id for r in self.requests if r.request_id not in self.settled]

    def _refusal(self, refusal: Refusal) -> bytes:
        unsettled = self._unsettled()
        self.s.metrics.refusals.labels(refusal.reason.value, "live").inc()
        log_decision(
            "delivery_refused",
            session=fingerprint(self.session_id),
            stream=self.stream,
            reason=refusal.reason.value,
            event_id=refusal.event_id,
            missing=list(refusal.missing),
            cursor=refusal.cursor,
            requests=unsettled,
        )
        return frames.refusal_frames(refusal, unsettled)

    def _store_failure(self) -> bytes:
        unsettled = self._unsettled()
        self.s.metrics.refusals.labels("store_unavailable", "live").inc()
        log_decision("store_unavailable", session=fingerprint(self.session_id), stream=self.stream, requests=unsettled)
        return frames.store_unavailable_frames(self.gate.last_delivered, unsettled)
