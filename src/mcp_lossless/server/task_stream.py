"""Task event streams on the 2026-07-28 leg (SEP-2694; docs/decisions/0031): the producer that keeps a running
task's events in the event store, and ``tasks/stream``, which replays and follows them under the request's token.

A task's events are a stream of the event store (:func:`~mcp_lossless.core.task_stream.stream_of`) under a session
of its own, bound to the task's principal: the store's bounds (``max_events_per_stream``, retention, the
per-principal limits) and its gap-freedom are the task stream's. Only the process running the task appends (the
producer, as for a POST's stream: ADR 0025); a process that finds the task lost ends the stream with
``mark_lost``, writing no event, and every ``tasks/stream`` reaching that end gets the explicit outcome.

What to send is decided by :func:`~mcp_lossless.core.task_stream.decide_task_stream` (and live events by its
:func:`~mcp_lossless.core.task_stream.gate`); this module only answers its questions and carries its outcomes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, assert_never

from ..asgi import Receive, Send, disconnected, respond
from ..core import errors, frames, protocol
from ..core.events import Loss, PendingRequest, StoredEvent, StreamKind, StreamRecord
from ..core.principal import Grant, Principal
from ..core.resources import requirement
from ..core.task_stream import (
    EventsGone,
    EventType,
    NeedEarliest,
    NeedTaskEvents,
    StreamDenied,
    StreamFacts,
    TaskReplay,
    Then,
    decide_task_stream,
    event_message,
    events_gone_error,
    gate,
    lost_error,
    stream_denial_error,
    stream_of,
)
from ..core.tasks import UNKNOWN_MESSAGE, Deliver, Denied, TaskRecord, TaskStatus, Unknown
from ..stores.base import EventsEvicted, EventsLost, EventStore, SessionRecord, StoreUnavailable, StreamTakenOver
from ..stores.tasks import AppendingTaskStore
from .observability import log_decision, now
from .writer import SSE_HEADERS

log = logging.getLogger("mcp_lossless.task_stream")

FOLLOW_POLL_SECONDS = 1.0
"""A follower re-reads the store this often besides being woken: another replica's appends reach it so."""


class _Produced:
    """A running task's stream as its producer holds it: the next seq, what is not stored yet, its lock, and what
    every event of it carries (its stream, its tool's tags), worked out once."""

    __slots__ = ("broken", "last_status", "lock", "next_seq", "pending", "record", "stream", "tags")

    def __init__(self, record: TaskRecord, next_seq: int, stream: str, tags: frozenset[str]) -> None:
        self.record = record
        self.next_seq = next_seq
        self.stream = stream
        self.tags = tags
        self.pending: list[tuple[StoredEvent, bool]] = []
        """Events given a seq but not stored yet (the store was down): stored first, in order, at the next emit."""
        self.lock = asyncio.Lock()
        self.last_status = record.status
        self.broken = False
        """The store lost the stream or another instance ended it: this producer writes nothing more."""


def _event(produced: _Produced, seq: int, kind: EventType, payload: dict[str, Any], terminal: bool) -> StoredEvent:
    """Event ``seq`` of ``produced``'s stream, as stored."""
    task_id, sid = produced.record.task_id, produced.stream
    data = event_message(task_id, seq, kind, payload)
    return StoredEvent(sid, sid, seq, f"{sid}.{seq:x}.t", data, task_id, produced.record.tool, produced.tags, terminal)


def _outcome(stored: TaskRecord) -> dict[str, Any]:
    """The payload of a terminal task's outcome event."""
    outcome: dict[str, Any] = {"status": stored.status.value}
    if stored.result is not None:
        outcome["result"] = stored.result
    if stored.error is not None:
        outcome["error"] = stored.error
    return outcome


class TaskEvents:
    """The producer side: each running task's events appended in seq order, store before wake-up."""

    def __init__(self, store: EventStore, instance: str) -> None:
        self.store = store
        self.instance = instance
        self._produced: dict[str, _Produced] = {}
        self._wakers: dict[str, set[asyncio.Event]] = {}

    async def open(self, record: TaskRecord) -> None:
        """The task's stream, its session and its first event (``working``, seq 0), stored before the client
        hears of the task: a task id never names a task without its stream."""
        sid = stream_of(record.task_id)
        at = now()
        # The session is never touched (no request is made on it): dated at the task's expiry, the idle sweep
        # leaves its stream for as long as the task's TTL, not ``session_idle_seconds`` from its creation
        # (30 minutes, when a task lives an hour), after which the sweep treats it as any session
        session = SessionRecord(sid, record.principal, protocol.STATELESS, at, at + (record.ttl or 0.0))
        resources = frozenset(requirement(record.requirement.resources, record.requirement.scopes))
        pending = PendingRequest(record.task_id, "tools/call", record.tool, resources)
        # The session and the record queued, not awaited, before the first event: one write stores the three
        # (enqueue_open; on SQLite with the task's own record, queued before: ADR 0040), and the event's future
        # resolves only after the record's.
        stream = StreamRecord(sid, sid, StreamKind.POST, self.instance, (pending,))
        opened = self.store.enqueue_open(stream, session=session)
        self._produced[record.task_id] = _Produced(record, 0, sid, resources)
        try:
            await self.emit(record.task_id, EventType.STATUS, {"status": record.status.value})
        finally:
            await opened  # the record's own failure is the one to report (its event failed with it)

    async def discard(self, record: TaskRecord) -> None:
        """A task that was not created after all (its store refused it): its stream goes with its session."""
        self._produced.pop(record.task_id, None)
        try:
            await self.store.delete_session(stream_of(record.task_id))
        except StoreUnavailable:
            log.warning("task %s: the stream of a task not created is left to retention", record.task_id[:8])

    async def emit(self, task_id: str, kind: EventType, payload: dict[str, Any], terminal: bool = False) -> None:
        """Append one event of a task this process runs; advisory progress is kept for the next try when the
        store is down (never skipped: a seq once given is stored before any later one)."""
        produced = self._produced.get(task_id)
        if produced is None or produced.broken:
            return
        async with produced.lock:
            seq = produced.next_seq
            produced.next_seq += 1
            produced.pending.append((_event(produced, seq, kind, payload, terminal), terminal))
            await self._flush(produced)

    async def settle(self, settled: TaskRecord, store: AppendingTaskStore) -> TaskRecord | None:
        """Store the outcome of a task this process runs with its outcome event in one write of ``store``
        (SQLite: one transaction, one trip to its writer), the event appended only if ``settled`` is what got
        stored. A task found terminal keeps its first outcome and gets that one's event (:meth:`observe`), as does
        a stream with events still pending or broken (the outcome alone, then its event as before)."""
        produced = self._produced.get(settled.task_id)
        if produced is None or produced.broken or produced.pending or produced.last_status.terminal:
            stored = await store.update(settled)
            if stored is not None:
                await self.observe(stored)
            return stored
        async with produced.lock:
            seq = produced.next_seq
            event = _event(produced, seq, EventType.OUTCOME, _outcome(settled), True)
            stored, appending, refused = await store.update_appending(settled, event)
            if appending:  # the outcome stored: its seq is given, and the stream ends with it
                produced.next_seq = seq + 1
                produced.last_status = settled.status
                if refused is not None:  # handled as any refused append is (stored again: EventsLost, a bug)
                    produced.pending.append((event, True))
                    await self._flush(produced)
                else:
                    self.wake(settled.task_id)
        if not appending:
            if stored is not None:
                await self.observe(stored)
            return stored
        self._produced.pop(settled.task_id, None)
        return stored

    async def _flush(self, produced: _Produced) -> None:
        task_id = produced.record.task_id
        while produced.pending:
            event, terminal = produced.pending[0]
            try:
                await self.store.append(event, completes=terminal)
            except EventsLost:
                produced.broken = True
                with contextlib.suppress(StoreUnavailable):
                    await self.store.mark_lost(stream_of(task_id), self.instance, Loss.STORE)
                break
            except StreamTakenOver:
                produced.broken = True
                break
            except KeyError:  # the stream is gone (its session idled out, or was deleted): the tool goes on
                produced.broken = True  # and its outcome is the task's; a tasks/stream hears events_gone
                produced.pending.clear()
                log.warning("task %s: its event stream is gone; event %d and later not kept", task_id[:8], event.seq)
                break
            except StoreUnavailable:
                if not terminal:
                    log.warning("task %s: event %d not stored yet (store unavailable)", task_id[:8], event.seq)
                    return
                raise
            produced.pending.pop(0)
        self.wake(task_id)

    async def observe(self, stored: TaskRecord) -> None:
        """A task this process runs was stored in a new state: its status change (and requests for input, and
        the terminal outcome, which ends the stream) become events."""
        produced = self._produced.get(stored.task_id)
        if produced is None:
            return
        if produced.pending:  # an outcome the store refused last time: stored before anything else
            async with produced.lock:
                await self._flush(produced)
            if not produced.pending and produced.last_status.terminal:
                self._produced.pop(stored.task_id, None)
        if stored.status is produced.last_status:
            return
        produced.last_status = stored.status
        status: dict[str, Any] = {"status": stored.status.value}
        if stored.message is not None:
            status["statusMessage"] = stored.message
        if stored.status is TaskStatus.INPUT_REQUIRED:
            await self.emit(stored.task_id, EventType.INPUT_REQUIRED, {"inputRequests": dict(stored.input_requests)})
            return
        if not stored.status.terminal:
            await self.emit(stored.task_id, EventType.STATUS, status)
            return
        await self.emit(stored.task_id, EventType.OUTCOME, _outcome(stored), terminal=True)
        self._produced.pop(stored.task_id, None)

    async def lost(self, task_id: str, owner: str) -> None:
        """A task whose process is gone was settled as lost: its stream ends without an event (ADR 0025)."""
        with contextlib.suppress(StreamTakenOver):
            await self.store.mark_lost(stream_of(task_id), owner, Loss.OWNER)
        self.wake(task_id)

    def wake(self, task_id: str) -> None:
        for waker in self._wakers.get(task_id, ()):
            waker.set()

    @contextlib.contextmanager
    def following(self, task_id: str) -> Any:
        waker = asyncio.Event()
        self._wakers.setdefault(task_id, set()).add(waker)
        try:
            yield waker
        finally:
            wakers = self._wakers.get(task_id)
            if wakers is not None:
                wakers.discard(waker)
                if not wakers:
                    del self._wakers[task_id]


Look = Callable[[], Awaitable[Unknown | Denied | Deliver]]
RefuseStream = Callable[[StreamDenied], BaseException]


class TaskStreams:
    """``tasks/stream``: at most one active per task per connection, replay then follow, each seq once."""

    def __init__(self, events: TaskEvents, policy: Any) -> None:
        self.events = events
        self.policy = policy
        self.active: set[tuple[Principal, object, str]] = set()

    async def serve(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: Any,
        params: dict[str, Any],
        connection: object,
        look: Look,
        refuse: RefuseStream,
    ) -> None:
        task_id = params.get("taskId")
        assert isinstance(task_id, str)  # checked against Mcp-Name by the leg
        key = (grant.principal, connection, task_id)
        if key in self.active:
            error = frames.error(rid, errors.INVALID_PARAMS, f"a tasks/stream of task {task_id} is already active")
            await respond(send, 200, error, b"application/json")
            return
        self.active.add(key)
        try:
            await self._serve(receive, send, grant, rid, task_id, params.get("after"), look, refuse)
        finally:
            self.active.discard(key)

    async def _decide(self, facts: StreamFacts, grant: Grant) -> Unknown | StreamDenied | EventsGone | TaskReplay:
        store = self.events.store
        while True:
            match decide_task_stream(facts, grant, self.policy, now()):
                case NeedTaskEvents(stream=stream, after=after):
                    facts.record = await store.get_stream(stream)
                    facts.read = True
                    try:
                        facts.events = await store.read_after(stream, after)
                    except EventsEvicted:
                        facts.events = None
                case NeedEarliest(stream=stream):
                    facts.earliest = await self._earliest(stream, facts.record)
                case (Unknown() | StreamDenied() | EventsGone() | TaskReplay()) as outcome:
                    return outcome
                case unreachable:
                    assert_never(unreachable)

    async def _earliest(self, stream: str, record: StreamRecord | None) -> int:
        """The first seq the store still holds: the least cursor it replays from, found by bisection (an error
        path only, so a few reads are fine)."""
        low, high = -1, -1 if record is None else record.last_seq
        while low < high:  # invariant: reading after ``high`` succeeds; after ``low - 1`` it may not
            middle = (low + high) // 2
            try:
                await self.events.store.read_after(stream, middle)
            except EventsEvicted:
                low = middle + 1
            else:
                high = middle
        return high + 1

    async def _serve(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: Any,
        task_id: str,
        after: object,
        look: Look,
        refuse: RefuseStream,
    ) -> None:
        facts = StreamFacts(task_id, after, await look())
        outcome = await self._decide(facts, grant)
        match outcome:
            case Unknown():
                await respond(send, 200, frames.error(rid, errors.INVALID_PARAMS, UNKNOWN_MESSAGE), b"application/json")
                return
            case StreamDenied() as denied:
                raise refuse(denied)
            case EventsGone() as gone:
                error = events_gone_error(gone)
                body = frames.error(rid, error["code"], error["message"], error["data"])
                await respond(send, 200, body, b"application/json")
                return
            case TaskReplay():
                pass
            case unreachable:
                assert_never(unreachable)
        log_decision("task_stream", task=task_id[:8], after=str(after), replayed=len(outcome.events))
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        cursor: int | None = None if after is None else int(after)  # type: ignore[call-overload]
        if outcome.events:
            await self._body(send, b"".join(frames.sse(None, event.data) for event in outcome.events))
            cursor = outcome.events[-1].seq
        if outcome.then is Then.END:
            await self._end(send, frames.result(rid, {"resultType": "complete"}))
        elif outcome.then is Then.LOST:
            assert outcome.loss is not None
            await self._end(send, self._error(rid, lost_error(task_id, outcome.loss, cursor)))
        else:
            await self._follow(receive, send, grant, rid, task_id, cursor)

    async def _follow(
        self, receive: Receive, send: Send, grant: Grant, rid: Any, task_id: str, cursor: int | None
    ) -> None:
        """Live events as they are stored, each through the gate; the end is the terminal event, a lost stream's
        explicit outcome, an in-band denial, or the client leaving (which stops the stream, not the task)."""
        store, stream = self.events.store, stream_of(task_id)
        gone = asyncio.get_running_loop().create_task(disconnected(receive))
        try:
            with self.events.following(task_id) as waker:
                while True:
                    waker.clear()
                    at = -1 if cursor is None else cursor
                    reading = asyncio.ensure_future(store.wait_events(stream, at, FOLLOW_POLL_SECONDS))
                    await asyncio.wait({gone, reading}, return_when="FIRST_COMPLETED")
                    if gone.done():  # the client left: the stream stops, the task goes on
                        reading.cancel()
                        return
                    try:
                        fresh = reading.result()
                    except EventsEvicted:
                        earliest = await self._earliest(stream, await store.get_stream(stream))
                        gone_error = events_gone_error(EventsGone(task_id, earliest))
                        await self._end(send, self._error(rid, gone_error))
                        return
                    for event in fresh:
                        refused = gate(event, grant, self.policy, now(), cursor)
                        if refused is not None:
                            log_decision("task_stream_denied", task=task_id[:8], cursor=str(cursor))
                            await self._end(send, self._error(rid, stream_denial_error(refused)))
                            return
                        await self._body(send, frames.sse(None, event.data))
                        cursor = event.seq
                        if event.terminal:
                            await self._end(send, frames.result(rid, {"resultType": "complete"}))
                            return
                    if fresh:
                        continue
                    record = await store.get_stream(stream)
                    if record is None:
                        await self._end(send, self._error(rid, events_gone_error(EventsGone(task_id, None))))
                        return
                    if record.lost is not None and (cursor if cursor is not None else -1) >= record.last_seq:
                        await self._end(send, self._error(rid, lost_error(task_id, record.lost, cursor)))
                        return
                    if gone.done():
                        return
                    wakers = {asyncio.ensure_future(waker.wait())}
                    try:
                        await asyncio.wait({gone, *wakers}, timeout=FOLLOW_POLL_SECONDS, return_when="FIRST_COMPLETED")
                    finally:
                        for pending in wakers:
                            pending.cancel()
                    if gone.done():
                        return
        finally:
            gone.cancel()

    @staticmethod
    def _error(rid: Any, error: dict[str, Any]) -> bytes:
        return frames.error(rid, error["code"], error["message"], error["data"])

    @staticmethod
    async def _body(send: Send, body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})

    @staticmethod
    async def _end(send: Send, message: bytes) -> None:
        await send({"type": "http.response.body", "body": frames.sse(None, message)})
