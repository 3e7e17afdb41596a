"""Writing SSE responses: events from a source, each checked against the stream's token before it is sent.

A source yields batches of stored events: :func:`live_batches` for a stream this process produces,
:func:`store_batches` for one another replica produces (tailed through the store). The writer stops at the
first event the token may not receive and says so in band, without an ``id:``, so the cursor stays put.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

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


async def live_batches(live: LiveStream, sent_seq: int, generation: int) -> AsyncIterator[list[StoredEvent]]:
    """Events of ``live`` after ``sent_seq`` as they are published, until it ends or this writer must stop."""
    live.writer = generation
    try:
        while True:
            if live.broken:
                raise StoreUnavailable("an answer on this stream could not be stored")
            events = live.after(sent_seq)
            if events:
                yield events
                sent_seq = events[-1].seq
                continue
            if (live.done and sent_seq >= live.record.last_seq) or live.generation != generation:
                return
            if live.close_generation == generation:
                live.close_generation = -1
                return
            await live.waiter()
    finally:
        if live.writer == generation:
            live.writer = None


async def replay_then(
    events: list[StoredEvent], tail: AsyncIterator[list[StoredEvent]] | None
) -> AsyncIterator[list[StoredEvent]]:
    """Replayed events as one batch, then (for a stream still running elsewhere) its tail."""
    if events:
        yield events
    if tail is not None:
        async for batch in tail:
            yield batch


async def store_batches(
    store: EventStore,
    stream: str,
    sent_seq: int,
    owner_alive: Callable[[str], Awaitable[bool]],
    end_orphan: Callable[[StreamRecord], Awaitable[object]],
) -> AsyncIterator[list[StoredEvent]]:
    """Tail a stream another replica produces: blocking reads, and an explicit end if that replica dies."""
    while True:
        events = await store.wait_events(stream, sent_seq, TAIL_WAIT_SECONDS)
        if events:
            yield events
            sent_seq = events[-1].seq
            continue
        record = await store.get_stream(stream)
        if record is None or (record.completed and sent_seq >= record.last_seq):
            return
        if not record.completed and not await owner_alive(record.owner):
            await end_orphan(record)


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class SseWriter:
    """One SSE response: a head, then batches from a source until it ends, the client leaves, or a refusal."""

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

    async def run(self, receive: Receive, send: Send, batches: AsyncIterator[list[StoredEvent]], head: bytes) -> None:
        retry = self.s.config.retry_ms
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        if head:
            await send({"type": "http.response.body", "body": head, "more_body": True})
        disconnect = asyncio.create_task(_wait_disconnect(receive))
        try:
            while True:
                step = asyncio.ensure_future(anext(batches))
                await asyncio.wait((step, disconnect), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    return
                try:
                    events = step.result()
                except StopAsyncIteration:
                    return
                except StoreUnavailable:
                    await self._send_end(send, self._store_failure())
                    return
                chunk = []
                for event in events:
                    refusal = self.gate.check(event, now())
                    if refusal is not None:
                        chunk.append(self._refusal(refusal))
                        await self._send_end(send, b"".join(chunk))
                        return
                    chunk.append(frames.sse(event.event_id, event.data, None if event.data else retry))
                    self.gate.delivered(event)
                    if event.terminal and event.request_id is not None:
                        self.settled.add(event.request_id)
                await send({"type": "http.response.body", "body": b"".join(chunk), "more_body": True})
        finally:
            disconnect.cancel()
            with contextlib.suppress(StopAsyncIteration, RuntimeError):
                await batches.aclose()  # type: ignore[attr-defined]
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_end(self, send: Send, body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})

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
