"""Streams this process is producing, and the append path that keeps store-before-send order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from operator import itemgetter
from time import perf_counter
from typing import Any

from .. import tracing
from ..core.eventids import EventIdCodec
from ..core.events import Loss, PendingRequest, StoredEvent, StreamRecord
from ..core.limits import Limits
from ..stores.base import EventsEvicted, EventsLost, EventStore, StoreUnavailable, StreamTakenOver
from .observability import log_decision

log = logging.getLogger("mcp_lossless.server.streams")

_request_id = itemgetter(0)
"""A :class:`~..core.events.PendingRequest`'s id, without a Python frame per request."""
_new_event = tuple.__new__
"""Builds a :class:`~..core.events.StoredEvent` from its fields without the named tuple's Python ``__new__``
(a frame per event)."""
STORE_RETRY_SECONDS = 30.0
"""How long an append waits out a store outage before the event's request is declared lost."""
UNCOMMITTED_LIMIT = 256
"""Events of one stream queued in the store and not yet stored: a progress append beyond it waits for the store."""
"""What an answer that answers nothing new (a batch's repeated id) runs under instead of a span (reusable: nothing to
allocate per event)."""
YIELD_EVERY = 16
"""Positions between two turns a progress append gives to other tasks: a tool reporting in a tight loop never holds
the loop (counted by position, which the stream keeps anyway, not by a counter of its own)."""


async def _append_with_retry(
    store: EventStore, event: StoredEvent, completes: bool, opening: asyncio.Future[None] | None = None
) -> None:
    """Store ``event``, riding out a short outage: an event is never sent before it is stored. ``opening``: the
    write of the stream's record, still pending when ``event`` was handed over; if it failed, so does this (the
    store would refuse the event as one of an unknown stream)."""
    if opening is not None:
        if not opening.done():
            await _done(opening)
        if opening.cancelled() or opening.exception() is not None:
            raise StoreUnavailable(f"the record of stream {event.stream} could not be stored")
    delay = 0.05
    waited = 0.0
    while True:
        try:
            await store.append(event, completes)
            return
        except (StreamTakenOver, EventsLost):  # no retry can help
            raise
        except StoreUnavailable:
            if waited >= STORE_RETRY_SECONDS:
                raise
            await asyncio.sleep(delay)  # backoff while the store is away; nothing to await instead
            waited += delay
            delay = min(delay * 2, 1.0)


async def _store_durably(
    store: EventStore,
    event: StoredEvent,
    completes: bool,
    first: asyncio.Future[None],
    opening: asyncio.Future[None] | None,
) -> None:
    """Wait for ``first`` (the event handed to the store), storing it again through a short outage."""
    try:
        await first
    except StoreUnavailable:
        await _append_with_retry(store, event, completes, opening)
    except KeyError:  # an unknown stream: its record's write, if still pending then, failed (or it is gone)
        if opening is None:
            raise
        await _append_with_retry(store, event, completes, opening)


def _done(write: asyncio.Future[None]) -> asyncio.Future[None]:
    """A future that resolves once ``write`` is done, and whose cancel leaves ``write`` alone: what
    ``asyncio.wait((write,))`` gives, without its set, its waiter and its callbacks' removal (a call's record and
    its answer are each waited for so)."""
    settled = write.get_loop().create_future()
    write.add_done_callback(partial(_wake, settled))
    return settled


def _wake(settled: asyncio.Future[None], _write: asyncio.Future[None]) -> None:
    """``write`` is done: wake the task waiting on ``settled``, unless a cancel woke it already."""
    if not settled.done():
        settled.set_result(None)


class AppendLock:
    """The order of a stream's appends: ``asyncio.Lock``'s first come, first served exclusion, taken without a
    coroutine when it is free (nearly every append; ``asyncio.Lock.acquire`` is a coroutine, some 5 % of a
    progress event). A release hands the lock straight to the first waiter still waiting.

    Taken with ``if not lock.take(): await lock.wait()``, always released in a ``finally``.
    """

    __slots__ = ("_held", "_waiters")

    def __init__(self) -> None:
        self._held = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        """Waiting in arrival order; there are waiters only while the lock is held."""

    def locked(self) -> bool:
        return self._held

    def take(self) -> bool:
        """Hold the lock now if it is free; ``False``: :meth:`wait` for it."""
        if self._held:
            return False
        self._held = True
        return True

    async def wait(self) -> None:
        """Wait in line; return holding the lock. Cancelled while waiting, the place in line is given up; cancelled
        once handed the lock, the lock goes on to the next."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if not waiter.cancel() and not waiter.cancelled():  # handed the lock already: on to the next
                self.release()
            raise  # else its place is a cancelled future, which a release skips

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # still held: now by that waiter
                return
        self._held = False


class LiveStream:
    """A stream with events still to come from this process.

    Events are stored before they are published here, and published in position order, so any writer
    that sends what it finds here never sends an event a resume could not find again.

    Memory holds only the backlog: events published and not yet sent by a writer (:meth:`deliver` drops the
    sent ones; a resume from an earlier cursor reads them from the store). A tool whose stream's backlog
    reaches ``limits.stream_backlog`` events or ``limits.stream_backlog_bytes`` waits at its next progress
    event until a writer has sent half of it: a client that does not read holds the tool, not the server's
    memory (docs/limits.md).
    """

    __slots__ = (
        "_backlog_bytes",
        "_drained",
        "_lock",
        "_lost",
        "_mac",
        "_marking",
        "_max_bytes",
        "_max_events",
        "_observe",
        "_queued",
        "_repair",
        "_store",
        "_stored",
        "_waiters",
        "_waiting",
        "answers_only",
        "broken",
        "close_generation",
        "delivered",
        "done",
        "events",
        "generation",
        "loss",
        "record",
        "recording",
        "writer",
    )

    def __init__(
        self,
        record: StreamRecord,
        store: EventStore,
        codec: EventIdCodec,
        observe: Callable[[float], None],
        limits: Limits | None = None,
        answers_only: bool = False,
        opening: asyncio.Future[None] | None = None,
    ) -> None:
        self.record = record
        self._store = store
        self._mac = codec.stream_mac(record.session_id, record.stream)
        self._observe = observe
        """Records the store latency of each answer's append (a metrics histogram)."""
        self.events: list[StoredEvent] = []
        """Published events no writer has sent yet (positions ``delivered + 1`` on), in order."""
        self.delivered = record.last_seq
        """The highest position a writer has handed to its connection: memory holds nothing up to it."""
        self.answers_only = answers_only
        """The response carries answers only (JSON response mode): no writer ever sends progress, so it is
        stored and not held, and the tool never waits for a reader."""
        limits = limits or Limits()
        self._max_events = limits.stream_backlog
        self._max_bytes = limits.stream_backlog_bytes
        self._backlog_bytes = 0
        """Payload bytes of the events appended after ``delivered`` (published or queued for the store)."""
        self._drained: asyncio.Future[None] | None = None
        """What a tool waiting on a full backlog awaits: resolved once a writer has sent half of it."""
        self.done = False
        self.broken = False
        """An answer could not be stored: the stream cannot end normally and must say so."""
        self.generation = 0
        """Bumped when a writer attaches; an older writer sees it and steps aside."""
        self.writer: int | None = None
        """Generation of the writer currently sending this stream, if any."""
        self.close_generation = -1
        """A tool asked to close the connection of this writer generation (SEP-1699)."""
        self._lock: AppendLock | None = None
        """Made when an append first has to hold it across a suspension (:meth:`_append_lock`): most streams'
        appends never suspend, so they never need one."""
        self._waiters: list[asyncio.Future[None]] = []
        self._queued: deque[tuple[StoredEvent, asyncio.Future[None]]] | None = None
        """Progress events handed to the store and not yet published, in position order, with their commits; made
        when the first one waits for its store (a memory store's never does)."""
        self._repair: asyncio.Future[None] | None = None
        self._stored: asyncio.Future[None] | None = None
        """The store's last write of a progress event found successful at once (:meth:`_stored_now`)."""
        self._lost: BaseException | None = None
        self.loss: EventsLost | None = None
        """Set once the store lost events of this stream it had acknowledged: the stream has ended as lost."""
        self._marking: asyncio.Future[None] | None = None
        """Ending the stream as lost in the store (:meth:`_lose`)."""
        """Why a queued event could not be stored even after retrying: every later append fails with it."""
        self.recording: asyncio.Future[None] | None = None
        """The store's write of this stream's record (:meth:`EventStore.enqueue_open`) until it is known stored
        (``None`` from then on): no id of the stream may reach a client before, since a resume from it could not
        find the stream (store-before-publish)."""
        if opening is not None and (not opening.done() or opening.cancelled() or opening.exception() is not None):
            self.recording = opening
            opening.add_done_callback(self._opened)
        requests = record.requests
        # a set display for the one request of nearly every stream: set(map(...)) costs twice as much
        waiting = {requests[0].request_id} if len(requests) == 1 else set(map(_request_id, requests))
        if record.answered:  # a stream taken over to settle it starts with answers
            waiting -= record.answered
        self._waiting = waiting
        """Requests of the stream not answered yet: the stream completes with the last of them. ``record.answered``
        is brought up to date then (see :meth:`snapshot`): a frozenset rebuilt per answer made batches quadratic."""

    async def wait_recorded(self) -> bool:
        """Wait until the store has written this stream's record; ``False`` if it could not (the stream is then
        failed: none of its events can be stored, and a writer ends it with an explicit error, no id)."""
        opening = self.recording
        if opening is not None:
            if not opening.done():
                await _done(opening)  # not ``await opening``: a cancel here must not cancel the write
            self._opened(opening)
        return self.recording is None

    def _opened(self, opening: asyncio.Future[None]) -> None:
        if self.recording is not opening:
            return
        if not opening.cancelled() and opening.exception() is None:
            self.recording = None
            return
        self._lost = StoreUnavailable(f"the record of stream {self.record.stream} could not be stored")
        self.fail()

    def snapshot(self) -> StreamRecord:
        """The record as of now, answers included (``record`` itself has them once the stream completes)."""
        record = self.record.copy()
        record.answered = record.answered.union(map(_request_id, record.requests)) - self._waiting
        return record

    def event_id(self, seq: int) -> str:
        """The id of position ``seq`` of this stream (the priming event names position 0 this way)."""
        return EventIdCodec.encode(self.record.stream, seq, self._mac)

    @property
    def backlog(self) -> int:
        """Events stored (or queued for the store) that no writer has sent yet."""
        return self.record.last_seq - self.delivered

    @property
    def backlog_bytes(self) -> int:
        """The payload bytes of :attr:`backlog` held here (what ``limits.stream_backlog_bytes`` bounds)."""
        return self._backlog_bytes

    def after(self, seq: int) -> list[StoredEvent] | None:
        """The published events after position ``seq``; ``None`` when memory no longer holds them all (a writer
        sent some already: the store has them, see :meth:`catch_up`)."""
        if seq < self.delivered or self.answers_only:
            return None
        events = self.events
        if not events:
            return []
        start = seq + 1 - events[0].seq
        return events[start:] if start < len(events) else []

    async def catch_up(self, seq: int) -> Sequence[StoredEvent]:
        """The events after ``seq`` that memory no longer holds, from the store (which holds whatever was
        published); a writer whose client resumed from an earlier position than was last sent reads them here."""
        try:
            events = await self._store.read_after(self.record.stream, seq)
        except EventsEvicted as exc:  # the store's own bound took them: explicit, as a resume's 410 is
            raise StoreUnavailable(str(exc)) from None
        if not events:
            raise StoreUnavailable(f"the store holds no event of stream {self.record.stream} after {seq}")
        return events

    def deliver(self, seq: int) -> None:
        """A writer handed every event up to ``seq`` to its connection: drop them from memory, and let a tool
        waiting on a full backlog go on once half of it is sent."""
        if seq <= self.delivered:
            return
        events = self.events
        sent = min(len(events), seq - events[0].seq + 1) if events else 0
        if sent:
            if sent == len(events) and not self._queued:
                self._backlog_bytes = 0  # all published is sent, nothing waits for the store: no sum to take
            else:
                sent_bytes = 0
                for event in events[:sent]:  # a plain loop: a generator, or map over attrgetter, measured slower
                    sent_bytes += len(event.data)
                self._backlog_bytes -= sent_bytes
            del events[:sent]
        self.delivered = seq
        if (
            self._drained is not None
            and self.backlog <= self._max_events // 2
            and self._backlog_bytes <= self._max_bytes // 2
        ):
            self._release()

    def _publish(self, event: StoredEvent) -> None:
        """Make a stored event visible to writers (or not at all: sent already from the store, or progress of
        an answers-only response)."""
        if event.seq <= self.delivered or (self.answers_only and not event.terminal):
            self._backlog_bytes -= len(event.data)
            return
        self.events.append(event)

    async def _wait_for_reader(self) -> None:
        """The backlog is full: wait until a writer sent half of it (a session closing cancels the wait)."""
        drained = self._drained
        if drained is None or drained.done():
            drained = self._drained = asyncio.get_running_loop().create_future()
        await _done(drained)  # not ``await drained``: one tool's cancel must not cancel it for another

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

    # -- lifecycle: who writes the stream, and when it ends. Only these change ``done``, ``writer``, the
    # generations and the close request; other modules call them rather than set fields.

    def attach_writer(self) -> int:
        """A writer takes the stream over (a resume replaces the connection): an older writer sees the new
        generation and steps aside. Returns the new writer's generation."""
        generation = self.generation = self.generation + 1
        self.writer = generation
        if self._waiters:  # an older writer waiting: it wakes to step aside
            self.notify()
        return generation

    def detach_writer(self, generation: int) -> None:
        """Writer ``generation`` has stopped; the stream has no writer unless a newer one took over."""
        if self.writer == generation:
            self.writer = None

    def request_close(self) -> None:
        """A tool asks to close the current connection (SEP-1699); the client resumes with ``Last-Event-ID``."""
        self.close_generation = self.generation
        self.notify()

    def close_requested(self, generation: int) -> bool:
        return self.close_generation == generation

    def take_close_request(self, generation: int) -> bool:
        """Whether writer ``generation`` is asked to close; the request is honoured once."""
        if self.close_generation != generation:
            return False
        self.close_generation = -1
        return True

    def end(self) -> None:
        """No more events will come from this process (its session is closing): writers finish what they have."""
        self.done = True
        self.notify()
        self._release()

    def fail(self) -> None:
        self.broken = True
        self.notify()
        self._release()

    def _release(self) -> None:
        """A tool waiting on a full backlog goes on: half of it was sent, or no writer will send it any more."""
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def append(self, data: bytes, request: PendingRequest, terminal: bool = False) -> Coroutine[Any, Any, StoredEvent]:
        """Store one event of ``request``, then publish it: an answer (``terminal``, :meth:`_answer`) or a progress
        event (:meth:`progress`). Both take the stream's next position in one shared step (:meth:`_next_event`).

        An event carries its request's tags and nothing else, so a stream's possible tag sets are its requests'
        (what lets replay checks skip per-event work when a token covers them all).

        Not a coroutine itself: it hands back the step's, so an event pays for one coroutine, not two.
        """
        return self.answer(data, request) if terminal else self.progress(data, request)

    async def progress(self, data: bytes, request: PendingRequest) -> StoredEvent:
        """A progress event: returns once the store has queued it; it is published when the store has it, in
        position order, so a client never holds the id of an event the store could lose. At most
        :data:`UNCOMMITTED_LIMIT` of them wait for the store at once: beyond, the next waits in line until half
        are published. Then the backlog's bound (:meth:`_wait_for_reader`) and the loop's turn. A request's channel
        calls it directly (its events are never answers): one call an event fewer than :meth:`append`."""
        if not self.answers_only:  # held until sent: an exact-size copy (``orjson.dumps`` keeps ~4 KiB per result),
            data = b"".join((data, b""))  # made as the memory store makes its own (stores/memory.py)
        queued = self._queued
        lock = self._lock
        # The fast path: the lock is free and the store's queue has room, so nothing suspends up to the store's
        # answer and nothing can come between: no lock is taken (two calls per event saved).
        fast = (queued is None or len(queued) < UNCOMMITTED_LIMIT) and (lock is None or not lock.locked())
        if not fast:
            lock = await self._wait_in_line(UNCOMMITTED_LIMIT, UNCOMMITTED_LIMIT // 2)
        try:
            event = self._next_event(data, request, False)
            committed = self._store.enqueue(event)
            self.record.last_seq = seq = event.seq
            queued = self._queued
            # A write still pending (SQLite's, until its transaction commits) is told by one method call, not two.
            if not queued and (committed is self._stored or (committed.done() and self._stored_now(committed))):
                # Stored at once (memory): published without a turn of the loop, as :meth:`_publish` would (no
                # writer can have sent a position stored just now; an answers-only response holds no progress).
                if not self.answers_only:
                    self._backlog_bytes += len(data)
                    self.events.append(event)
                if self._waiters:  # no call when no one waits (a writer busy sending, or none)
                    self.notify()
            else:  # published in order once stored (:meth:`_committed`)
                self._backlog_bytes += len(data)
                if queued is None:
                    queued = self._queued = deque()
                if not queued or queued[-1][1] is not committed:  # a future the store shares calls back once
                    committed.add_done_callback(self._committed)
                queued.append((event, committed))
        finally:
            if not fast:
                assert lock is not None
                lock.release()
        full = seq - self.delivered >= self._max_events or self._backlog_bytes >= self._max_bytes
        if full and not (self.answers_only or self.done or self.broken):  # wait for a reader to send half
            await self._wait_for_reader()
        elif seq % YIELD_EVERY == 0:
            await asyncio.sleep(0)  # give other tasks their turn: nothing else may suspend a tight loop
        return event

    def _stored_now(self, committed: asyncio.Future[None]) -> bool:
        """Whether ``committed``, done, is a successful write; if so it is remembered, as a store that stores at once
        hands out one such future for every event (a resolved future never changes): the next event's is known by
        identity, not by three calls."""
        if not committed.cancelled() and committed.exception() is None:
            self._stored = committed
            return True
        return False

    async def _wait_in_line(self, full: int, keep: int) -> AppendLock:
        """Take the append lock behind the appends holding or awaiting it; then, when ``full`` or more progress
        events wait for the store, publish them (waiting for their writes) until ``keep`` remain. Returns the lock,
        held. The queue is read once the lock is held: an append before this one may have made it. After an
        earlier failure nothing is stored again: :meth:`_next_event` raises it."""
        lock = self._append_lock()
        if not lock.take():
            await lock.wait()
        queued = self._queued
        if self._lost is None and queued is not None and len(queued) >= full:
            try:
                await self._publish_queued(keep)
            except BaseException:
                lock.release()
                raise
        return lock

    def _next_event(self, data: bytes, request: PendingRequest, terminal: bool) -> StoredEvent:
        """The event at the stream's next position, the step progress and answers share. The position is taken
        (``record.last_seq``) only once the store has the event: queued for progress, stored for an answer. Raises
        what made an earlier queued event unstorable: no later position may be stored after a lost one."""
        if self._lost is not None:
            raise self._lost
        record = self.record
        stream = record.stream
        seq = record.last_seq + 1
        request_id, _method, tool, resources = request  # one unpack, not three field lookups
        event_id = EventIdCodec.encode(stream, seq, self._mac)
        # all nine fields, in order
        return _new_event(
            StoredEvent, (record.session_id, stream, seq, event_id, data, request_id, tool, resources, terminal)
        )

    async def answer(self, data: bytes, request: PendingRequest, traced: bool = True) -> StoredEvent:
        """An answer: returns once it is stored and published, after every event before it. The answer to the last
        request completes the stream in the same store write. In line when an append holds or awaits the lock or
        progress waits for the store (all of it is published first); otherwise the fast path, which takes the lock
        only if the store does not hold the answer at once. ``traced=False``: the caller found its request untraced
        (:func:`.tracing.silent`), so its commit's span would be the empty one: not asked again."""
        if not self.answers_only:  # held until sent: an exact-size copy, as for progress
            data = b"".join((data, b""))
        lock = self._lock
        fast = not self._queued and (lock is None or not lock.locked())
        if not fast:
            lock = await self._wait_in_line(1, 0)
        try:
            event = self._next_event(data, request, True)
            waiting = self._waiting
            answers = event.request_id in waiting  # a batch may repeat an id: only its first answer counts
            completes = answers and len(waiting) == 1
            # The commit of an answer is a span of the call's trace (a progress event's is not: the hot path).
            if answers and traced:
                commit = tracing.span(
                    "store commit", {"mcp_lossless.stream": event.stream, "mcp_lossless.seq": event.seq}
                )
            else:
                commit = tracing.UNTRACED
            with commit:
                started = perf_counter()
                write = self._store.enqueue(event, completes)  # handed over: it happens whatever becomes of this task
                # Stored at once (memory): no task and no turn of the loop, so the writer's one yield finds the
                # answer and sends the whole response in one write.
                if not write.done() or write.cancelled() or write.exception() is not None:
                    if fast:  # free, as nothing suspended since it was found free: held while this waits
                        lock = self._append_lock()
                        lock.take()
                        fast = False
                    if not write.done():  # waited for here, not in a coroutine of its own (one frame a resume)
                        try:
                            await _done(write)  # not ``await write``: a cancel of this task would cancel the write
                        except asyncio.CancelledError:
                            await self._answer_cancelled(event, answers, completes, write)
                            raise
                    if write.cancelled() or write.exception() is not None:
                        await self._answer_rewritten(event, answers, completes, write)
                self._observe(perf_counter() - started)  # one sample per answer: per progress event costs more
                self._answer_stored(event, answers, completes)
        finally:
            if not fast:
                assert lock is not None
                lock.release()
        if self._waiters:
            self.notify()
        return event

    async def _answer_cancelled(
        self, event: StoredEvent, answers: bool, completes: bool, write: asyncio.Future[None]
    ) -> None:
        """Under the lock, cancelled while the store's ``write`` of an answer was pending: a write handed over happens
        whatever becomes of this task, so its outcome (stored again through an outage) is still learned before the
        lock goes (:meth:`_settle_cancelled`); the caller then raises the cancel on."""
        retry = asyncio.ensure_future(_store_durably(self._store, event, completes, write, self.recording))
        await self._settle_cancelled(event, answers, completes, retry)

    async def _answer_rewritten(
        self, event: StoredEvent, answers: bool, completes: bool, write: asyncio.Future[None]
    ) -> None:
        """Under the lock: the store's ``write`` of an answer failed; store it again through an outage, in a task
        shielded from a cancel of this one (whose outcome is still learned before the lock goes). Nearly every write
        succeeds the first time, so :meth:`answer` waits for it itself and comes here only on a failure."""
        retry = asyncio.ensure_future(_store_durably(self._store, event, completes, write, self.recording))
        try:
            await asyncio.shield(retry)
        except asyncio.CancelledError:
            await self._settle_cancelled(event, answers, completes, retry)
            raise
        except EventsLost as lost:
            self._lose(lost)
            raise

    async def _settle_cancelled(
        self, event: StoredEvent, answers: bool, completes: bool, durable: asyncio.Future[None]
    ) -> None:
        """The task storing an answer was cancelled: a write once handed to the store happens whatever becomes of
        this task, so learn the outcome of ``durable`` (a :func:`_store_durably` of it) before the lock goes, so a
        stored answer is published and the next append takes the next position (not this one again, which the
        store would refuse as a rewrite)."""
        while not durable.done():
            with contextlib.suppress(asyncio.CancelledError):
                await _done(durable)
        if not durable.cancelled() and durable.exception() is None:
            self._answer_stored(event, answers, completes)
            self.notify()

    def _append_lock(self) -> AppendLock:
        lock = self._lock
        if lock is None:
            lock = self._lock = AppendLock()
        return lock

    def _answer_stored(self, event: StoredEvent, answers: bool, completes: bool) -> None:
        record = self.record
        record.last_seq = event.seq
        self._backlog_bytes += len(event.data)
        self._publish(event)
        if answers:
            self._waiting.discard(event.request_id)
            if completes:  # every request answered: a stream of one has only this one
                requests = record.requests
                if len(requests) == 1:
                    record.answered = frozenset((requests[0].request_id,))
                else:
                    record.answered = record.answered.union(map(_request_id, requests))
                record.completed = self.done = True

    def _committed(self, _future: asyncio.Future[None]) -> None:
        """A queued event's write finished: publish every stored one at the head of the queue, in order."""
        queued = self._queued
        run: list[StoredEvent] = []
        # The last write found successful: the events after it that share it (a store hands one future to the
        # events of a hand-over) need no second look.
        stored = None
        while queued:
            event, committed = queued[0]
            if committed is not stored:
                if not committed.done():
                    break
                if committed.cancelled() or committed.exception() is not None:
                    if self._repair is None:  # no append may come soon to store it again: do it now
                        self._repair = asyncio.ensure_future(self._repair_queued())
                    break
                stored = committed
            queued.popleft()
            run.append(event)
        if run:
            self._publish_run(run)
            self.notify()

    def _publish_run(self, run: list[StoredEvent]) -> None:
        """:meth:`_publish` each of ``run``, stored events of consecutive positions, in order: in one step when every
        one of them is held (none sent already from the store, and no progress of an answers-only response), as
        nearly every run is; a store that commits in batches publishes hundreds at a time."""
        if run[0].seq > self.delivered and not self.answers_only:
            self.events += run
        else:
            for event in run:
                self._publish(event)

    async def _publish_queued(self, keep: int) -> None:
        """Under the lock: publish queued events until ``keep`` remain, storing again those whose write failed.

        A store leaves no position stored after one that failed, so from the first failure on, each queued
        event is stored again in order (riding out an outage as an answer does) before it is published.
        """
        queued = self._queued
        while queued is not None and len(queued) > keep:
            event, committed = queued[0]
            if not committed.done():
                await _done(committed)  # not ``await committed``: a cancel here must not cancel the write
                continue  # ``_committed`` ran first and published it, or left it for below
            if committed.cancelled() or committed.exception() is not None:
                try:  # an identical append of a stored position succeeds, so this is safe whatever happened
                    await _append_with_retry(self._store, event, False, self.recording)
                except Exception as exc:
                    self._lost = exc
                    if isinstance(exc, EventsLost):
                        self._lose(exc)
                    raise
            queued.popleft()
            self._publish(event)
            self.notify()

    async def _repair_queued(self) -> None:
        lock = self._append_lock()
        try:
            if not lock.take():
                await lock.wait()
            try:
                if self._lost is None:  # else an append already gave up on the store: it raises that
                    await self._publish_queued(0)
            finally:
                lock.release()
        except EventsLost as lost:
            self._lose(lost)
        except (StoreUnavailable, KeyError, ValueError):
            self.fail()  # the next append of the stream raises the failure too
        finally:
            self._repair = None

    def _lose(self, lost: EventsLost) -> None:
        """The store lost events of this stream that it had acknowledged: no append can succeed any more, and
        clients may hold ids of positions the store no longer has. The stream ends as lost, here (its writers send
        each unanswered request's explicit outcome, naming the last event the store holds) and in the store (a
        resume, or another replica following the stream, finds it ended so), with no event written: a position
        written now could name content other than what a client holds under its id (ADR 0025)."""
        if self.loss is None:
            self.loss = lost
            self._lost = lost
            self._marking = asyncio.ensure_future(self._mark_lost())
            log_decision("events_lost", stream=self.record.stream, held=lost.held, appended=self.record.last_seq)
        self.fail()

    async def _mark_lost(self) -> None:
        try:
            await self._store.mark_lost(self.record.stream, self.record.owner, Loss.STORE)
        except StoreUnavailable as exc:  # the store is away again: a resume finds its cursor beyond what it holds
            log.warning("stream %s could not be marked lost in the store: %s", self.record.stream, exc)


class Producers:
    """Which process produces a stream, and ending a stream whose producer died.

    A stream is produced by the process that opened it (its record's ``owner``) until that process dies; then
    any process that finds it (a resume, or a replica following it) ends it as lost (:data:`Loss.OWNER`): each
    unanswered request's outcome is execution lost, kept on the record and sent without an id (ADR 0025).
    """

    __slots__ = ("_instance", "_lost", "_store")

    def __init__(self, store: EventStore, instance: str, count_lost: Callable[[int], None]) -> None:
        self._store = store
        self._instance = instance
        self._lost = count_lost

    async def owner_alive(self, owner: str) -> bool:
        """Whether another live process produces the stream (this one would hold it among its live streams)."""
        return owner != self._instance and await self._store.owner_alive(owner)

    async def settle(self, record: StreamRecord) -> StreamRecord:
        """End ``record``'s stream as lost by its dead owner; the record after (another replica's ending, if it
        came first)."""
        try:
            settled = await self._store.mark_lost(record.stream, record.owner, Loss.OWNER)
        except StreamTakenOver:  # another process took it over meanwhile (a version that claimed streams)
            settled = await self._store.get_stream(record.stream)
        if settled is None:
            return record
        if settled.lost is Loss.OWNER:
            lost = [r.request_id for r in settled.unanswered()]
            if lost:
                self._lost(len(lost))
                log_decision("execution_lost", stream=record.stream, requests=lost)
        return settled
