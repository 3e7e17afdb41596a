"""Writing SSE responses: events from a source, each checked against the stream's token before it is sent.

A source gives batches of stored events: :class:`LiveSource` for a stream this process produces,
:class:`StoredSource` for a replay, followed by the tail of a stream another replica still produces. The
writer stops at the first event the token may not receive and says so in band, without an ``id:``, so the
cursor stays put.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ..asgi import Receive, Send, disconnected
from ..core import frames
from ..core.events import Loss, PendingRequest, RequestId, StoredEvent, answered_in
from ..core.replay import DeliveryGate, Refusal
from ..stores.base import EventStore, StoreUnavailable
from .observability import Metrics, fingerprint, log_decision, now
from .streams import LiveStream, Producers

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
TAIL_WAIT_SECONDS = 2.0
"""How long one blocking read of another replica's stream waits before its owner's lease is checked."""
FLUSH_BYTES = 64 * 1024
"""Frames a writer gathers before it sends them, even while more events are ready: a tool that never stops
reporting still sees its events go out (and its backlog shrink), and no one write holds the loop for long."""


class StreamLost(Exception):
    """A source's stream ended without its producer (ADR 0025): the writer sends each unanswered request's outcome
    (``loss``) without an id. ``held``: the id of the last event the store holds of the stream."""

    def __init__(self, loss: Loss, held: str | None) -> None:
        super().__init__(f"{loss.value}; the store holds the stream up to {held}")
        self.loss = loss
        self.held = held


class EventSource(Protocol):
    """Where a writer's events come from. ``ready`` never blocks: events now, ``[]`` for none yet, ``None`` at end.
    ``sent`` tells the source that everything ``ready`` gave so far is with the connection."""

    def ready(self) -> Sequence[StoredEvent] | None: ...
    async def wait(self) -> None: ...
    def sent(self) -> None: ...
    def close(self) -> None: ...


class LiveSource:
    """Events of a stream this process produces, as they are published, until it ends or this writer must stop.

    Events that memory no longer holds (a resume from before what an earlier connection was sent) come from the
    store first: ``replay`` as the resume read them, then :meth:`.streams.LiveStream.catch_up` for any sent
    meanwhile.
    """

    __slots__ = ("buffer", "generation", "has_cursor", "live", "sent_seq")

    def __init__(
        self, live: LiveStream, sent_seq: int, has_cursor: bool, replay: Sequence[StoredEvent] | None = None
    ) -> None:
        self.live = live
        self.sent_seq = sent_seq
        """The last position :meth:`ready` gave the writer."""
        self.buffer = replay or []
        """Events read from the store, to be given before those memory holds."""
        self.has_cursor = has_cursor
        """Whether the client holds an event id of this stream (priming, a resume cursor, or a sent event)."""
        self.generation = live.attach_writer()

    def _has_news(self) -> bool:
        """Whether :meth:`ready` has anything to act on: events, the stream's end or failure, a newer writer, or
        a close request this writer may honour (only once the client holds an id to resume from, SEP-1699: a
        close before any id, as below 2025-11-25 where there is no priming, waits for the next event)."""
        live = self.live
        events = live.events
        return (
            live.broken
            or live.done
            or bool(self.buffer)
            or self.sent_seq < live.delivered
            or (bool(events) and events[-1].seq > self.sent_seq)
            or live.generation != self.generation
            or (self.has_cursor and live.close_requested(self.generation))
        )

    def ready(self) -> Sequence[StoredEvent] | None:
        live = self.live
        if live.broken:
            lost = live.loss
            if lost is not None:
                raise StreamLost(Loss.STORE, None if lost.held is None else live.event_id(lost.held))
            raise StoreUnavailable("an answer on this stream could not be stored")
        events: Sequence[StoredEvent] | None
        if self.buffer:
            events, self.buffer = self.buffer, []
        else:
            events = live.after(self.sent_seq)
            if events is None:  # sent to an earlier connection, no longer in memory: :meth:`wait` reads the store
                return None if live.generation != self.generation else []
        if events:
            self.sent_seq = events[-1].seq
            self.has_cursor = True
            return events
        if (live.done and self.sent_seq >= live.record.last_seq) or live.generation != self.generation:
            return None
        if self._has_news():  # what news is left is a close this writer may honour
            live.take_close_request(self.generation)
            return None
        return []

    async def wait(self) -> None:
        """Until ``ready`` may have something new. Events published while the writer was sending (it was
        not waiting then) are noticed here, not lost with the wake-up that announced them."""
        live = self.live
        if self.sent_seq < live.delivered and not self.buffer:
            self.buffer = await live.catch_up(self.sent_seq)
        elif not self._has_news():
            await live.waiter()

    def sent(self) -> None:
        self.live.deliver(self.sent_seq)

    def close(self) -> None:
        self.live.detach_writer(self.generation)


class RemoteTail:
    """How a replay follows a stream that another live process produces: through the store, minding its owner.

    Between blocking reads it notices the stream's end, its owner's death (the stream is settled here,
    :meth:`.streams.Producers.settle`), or the store's loss of what this reader was sent, so that the reader gets
    an explicit end instead of waiting for ever.
    """

    __slots__ = ("event_id", "producers", "store", "stream")

    def __init__(self, store: EventStore, stream: str, producers: Producers, event_id: Callable[[int], str]) -> None:
        self.store = store
        self.stream = stream
        self.producers = producers
        self.event_id = event_id
        """The id of a position of the stream (to name the last event the store holds)."""

    async def read_after(self, seq: int) -> Sequence[StoredEvent] | None:
        """Events after ``seq`` (``[]``: none yet, ask again), or ``None`` once the stream has ended; raises
        :class:`StreamLost` once it ended without its producer, or the store no longer holds position ``seq``."""
        events = await self.store.wait_events(self.stream, seq, TAIL_WAIT_SECONDS)
        if events:
            return events
        record = await self.store.get_stream(self.stream)
        if record is None:  # gone while followed: deleted with its session, or lost with the store's tail
            raise StreamLost(Loss.STORE, None)
        held = self.event_id(record.last_seq) if record.last_seq >= 0 else None
        if seq > record.last_seq:  # this reader was sent events the store no longer has: it lost them
            raise StreamLost(Loss.STORE, held)
        if record.completed and seq >= record.last_seq:
            if record.lost is not None:
                raise StreamLost(record.lost, held)
            return None
        if not record.completed and not await self.producers.owner_alive(record.owner):
            await self.producers.settle(record)
        return []


class StoredSource:
    """Replayed events, then, for a stream another replica still produces, its tail (:class:`RemoteTail`); for a
    stream that ended without its producer, the explicit end (``lost``)."""

    __slots__ = ("buffer", "lost", "sent_seq", "tail")

    def __init__(
        self,
        events: Sequence[StoredEvent],
        sent_seq: int,
        tail: RemoteTail | None = None,
        lost: StreamLost | None = None,
    ) -> None:
        self.buffer = events
        self.sent_seq = events[-1].seq if events else sent_seq
        self.tail = tail
        self.lost = lost

    def ready(self) -> Sequence[StoredEvent] | None:
        if self.buffer:
            events, self.buffer = self.buffer, []
            return events
        if self.tail is not None:
            return []
        if self.lost is not None:
            raise self.lost
        return None

    async def wait(self) -> None:
        """One blocking read of the tail."""
        assert self.tail is not None
        events = await self.tail.read_after(self.sent_seq)
        if events is None:
            self.tail = None
        elif events:
            self.buffer = events
            self.sent_seq = events[-1].seq

    def sent(self) -> None:
        return None

    def close(self) -> None:
        return None


class SseWriter:
    """One SSE response: a head, then batches from a source until it ends, the client leaves, or a refusal."""

    __slots__ = ("gate", "metrics", "requests", "retry_ms", "session_id", "settled", "stream")

    def __init__(
        self,
        retry_ms: int,
        metrics: Metrics,
        session_id: str,
        stream: str,
        gate: DeliveryGate,
        requests: tuple[PendingRequest, ...],
        settled: Iterable[RequestId] = (),
    ) -> None:
        self.retry_ms = retry_ms
        """The SSE ``retry`` sent with events that have no data (priming)."""
        self.metrics = metrics
        self.session_id = session_id
        self.stream = stream
        self.gate = gate
        self.requests = requests
        self.settled = set(settled)
        """Requests whose answer the client already has: a refusal does not name them."""

    async def run(self, receive: Receive, send: Send, source: EventSource, head: bytes) -> None:
        """Send events as the source has them; coalesce what is ready into one write (up to
        :data:`FLUSH_BYTES`); end with the stream.

        Before blocking, the writer yields once so a call that answers at once lands in the same write, and
        only then starts watching for the client's disconnect. A send waits while the connection's buffer is
        full (the ASGI server's flow control): what a client does not read stays in the store, not here.
        """
        pending = [head] if head else []
        size = 0
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
                except StreamLost as lost:
                    pending.append(self._lost(lost))
                    return
                if events is None:
                    return
                if events:
                    yielded = False
                    size = self._frames(events, pending, size)
                    if size < 0:
                        return
                    if size < FLUSH_BYTES:
                        continue
                elif not yielded:
                    yielded = True
                    await asyncio.sleep(0)
                    continue
                if pending or not started:
                    if not started:
                        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                        started = True
                    await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                    source.sent()
                    pending = []
                    size = 0
                if disconnect is None:
                    disconnect = asyncio.create_task(disconnected(receive))
                elif disconnect.done():
                    return  # gone while events kept coming: they stay in the store for its resume
                if events:
                    continue  # flushed a full write: more may be ready
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
                except StreamLost as lost:
                    pending.append(self._lost(lost))
                    return
                yielded = True
        finally:
            if disconnect is not None:
                disconnect.cancel()
            source.close()
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})

    def _frames(self, events: Sequence[StoredEvent], out: list[bytes], size: int) -> int:
        """Append the frames of ``events`` the token may receive; the bytes in ``out`` after them (``size``
        before), or -1 when a refusal ended the stream."""
        admitted, refusal = self.gate.admit(events, now())
        sent = events[:admitted] if refusal is not None else events
        if sent:
            frame = frames.sse_events(sent, self.retry_ms)
            out.append(frame)
            size += len(frame)
            self.settled.update(answered_in(sent))  # a replay's rows are read as they are, no event built per row
        if refusal is not None:
            out.append(self._refusal(refusal))
            return -1
        return size

    def _unsettled(self) -> list[RequestId]:
        return [r.request_id for r in self.requests if r.request_id not in self.settled]

    def _refusal(self, refusal: Refusal) -> bytes:
        unsettled = self._unsettled()
        self.metrics.refusals.labels(refusal.reason.value, "live").inc()
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
        self.metrics.refusals.labels("store_unavailable", "live").inc()
        log_decision("store_unavailable", session=fingerprint(self.session_id), stream=self.stream, requests=unsettled)
        return frames.store_unavailable_frames(self.gate.last_delivered, unsettled)

    def _lost(self, lost: StreamLost) -> bytes:
        unsettled = self._unsettled()
        self.metrics.refusals.labels(lost.loss.value, "live").inc()
        log_decision(
            "stream_lost",
            session=fingerprint(self.session_id),
            stream=self.stream,
            reason=lost.loss.value,
            held=lost.held,
            requests=unsettled,
        )
        return frames.lost_frames(lost.loss, lost.held, unsettled)
