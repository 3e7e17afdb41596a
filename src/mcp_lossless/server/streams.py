"""Streams this process is producing, and the append path that keeps store-before-send order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter

from ..core.eventids import EventIdCodec
from ..core.events import PendingRequest, StoredEvent, StreamRecord
from ..stores.base import EventStore, StoreUnavailable, StreamTakenOver

STORE_RETRY_SECONDS = 30.0
"""How long an append waits out a store outage before the event's request is declared lost."""


async def _append_with_retry(store: EventStore, event: StoredEvent, completes: bool) -> None:
    """Store ``event``, riding out a short outage: an event is never sent before it is stored."""
    delay = 0.05
    waited = 0.0
    while True:
        try:
            await store.append(event, completes)
            return
        except StreamTakenOver:
            raise
        except StoreUnavailable:
            if waited >= STORE_RETRY_SECONDS:
                raise
            await asyncio.sleep(delay)  # backoff while the store is away; nothing to await instead
            waited += delay
            delay = min(delay * 2, 1.0)


class LiveStream:
    """A stream with events still to come from this process.

    Events are stored before they are published here, and published in position order, so any writer
    that sends what it finds here never sends an event a resume could not find again.
    """

    __slots__ = (
        "_lock",
        "_mac",
        "_observe",
        "_store",
        "_waiters",
        "broken",
        "close_generation",
        "done",
        "events",
        "generation",
        "record",
        "writer",
    )

    def __init__(
        self, record: StreamRecord, store: EventStore, codec: EventIdCodec, observe: Callable[[float], None]
    ) -> None:
        self.record = record
        self._store = store
        self._mac = codec.stream_mac(record.session_id, record.stream)
        self._observe = observe
        """Records the store latency of each answer's append (a metrics histogram)."""
        self.events: list[StoredEvent] = []
        self.done = False
        self.broken = False
        """An answer could not be stored: the stream cannot end normally and must say so."""
        self.generation = 0
        """Bumped when a writer attaches; an older writer sees it and steps aside."""
        self.writer: int | None = None
        """Generation of the writer currently sending this stream, if any."""
        self.close_generation = -1
        """A tool asked to close the connection of this writer generation (SEP-1699)."""
        self._lock = asyncio.Lock()
        self._waiters: list[asyncio.Future[None]] = []

    def event_id(self, seq: int) -> str:
        """The id of position ``seq`` of this stream (the priming event names position 0 this way)."""
        return EventIdCodec.encode(self.record.stream, seq, self._mac)

    def after(self, seq: int) -> list[StoredEvent]:
        events = self.events
        if not events:
            return []
        start = max(0, seq + 1 - events[0].seq)
        return events[start:] if start < len(events) else []

    def notify(self) -> None:
        waiters = self._waiters
        if not waiters:
            return
        self._waiters = []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def waiter(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return future

    def attach(self) -> int:
        self.generation += 1
        self.notify()
        return self.generation

    def fail(self) -> None:
        self.broken = True
        self.notify()

    def request_close(self) -> None:
        self.close_generation = self.generation
        self.notify()

    async def append(self, data: bytes, request: PendingRequest, terminal: bool = False) -> StoredEvent:
        """Store one event of ``request``, then publish it. The answer to the last request completes the stream
        in the same store write.

        An event carries its request's tags and nothing else, so a stream's possible tag sets are its requests'
        (what lets replay checks skip per-event work when a token covers them all).
        """
        record = self.record
        store = self._store
        request_id = request.request_id
        lock = self._lock
        await lock.acquire()  # one coroutine; ``async with`` costs three on this per-event path
        try:
            seq = record.last_seq + 1
            event = StoredEvent(
                record.session_id,
                record.stream,
                seq,
                EventIdCodec.encode(record.stream, seq, self._mac),
                data,
                request_id,
                request.tool,
                request.resources,
                terminal,
            )
            answered = record.answered
            completes = False
            if terminal and request_id is not None:
                answered = answered | {request_id}
                requests = record.requests  # a batch may repeat an id: then the counts differ
                completes = bool(requests) and (
                    len(answered) == len(requests) or all(r.request_id in answered for r in requests)
                )
            started = perf_counter()
            try:
                await store.append(event, completes)
            except StoreUnavailable:
                await _append_with_retry(store, event, completes)
            if terminal:  # one latency sample per answer: an observation per progress event costs more than it tells
                self._observe(perf_counter() - started)
            record.last_seq = seq
            self.events.append(event)
            record.answered = answered
            if completes:
                record.completed = self.done = True
        finally:
            lock.release()
        self.notify()
        return event
