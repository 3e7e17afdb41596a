"""A bounded in-memory store: fast, lost on restart, evicts oldest events explicitly when full.

The bound is honest: each event is held as a plain tuple of what is its own (:data:`_Held`: its id, its
payload copied to its exact size, request id, tool, the index of its tag set in its stream's table,
terminal flag), and what counts against ``max_bytes`` is what that allocates (:func:`_held_size`). A
payload straight from ``orjson.dumps`` would keep the ~4 KiB buffer orjson allocated for it; the copy
keeps only its length. The copy is ``b"".join((data, b""))``: a join of two parts always allocates its
exact size, at half the cost of ``memoryview(data).tobytes()``, which first makes two objects the garbage
collector tracks (~900 instructions an event under callgrind). A plain tuple of strings, bytes and numbers
is one the garbage collector stops tracking, so a million held events add nothing to a full collection
(held as event tuples, which carry their tag set, each one was walked: pauses of 0.4 s); and a replay gets
the held rows as they are (:class:`~..core.events.EventRows`, ADR 0020), it neither decodes nor rebuilds an
event per row (an encoded ``bytes`` per event was ~2x smaller and made replay ~4x slower; a rebuilt event per
row was half the replay's instructions).

The bound is partitioned by principal (the session's issuer, subject and client): each principal's
events are evicted only to bring it under ``max_bytes_per_principal`` / ``max_events_per_principal``, or,
when the whole store is full, if it holds at least its fair share (the total over the principals holding
events; the append's own principal first, else the one holding the most). A principal holding less than
its share never loses events to another's appends, and an evicted principal's resume gets
:class:`EventsEvicted` (410), never a shortened replay.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice

from ..core.events import EventRows, Loss, Row, StoredEvent, StreamRecord
from ..core.idempotency import KeyRecord
from ..core.principal import Principal
from .base import EventsEvicted, SessionRecord, StreamTakenOver
from .held import HeldKeys

_SLOT_BYTES = 16
"""Two deque slots per held event (its stream's and its principal's eviction order), on top of its bytes."""


_Held = Row
"""An event as held (:data:`~..core.events.Row`): id, payload, request id, tool, tag-set index, terminal (its
position is its place); a replay gets these rows as they are (:class:`~..core.events.EventRows`)."""


_HELD_BYTES = sys.getsizeof((None,) * 6) + sys.getsizeof("") + sys.getsizeof(b"") + _SLOT_BYTES
"""What an event held with an empty id and payload allocates; an ASCII id and the payload add their lengths."""


def _held_size(held: _Held) -> int:
    """What holding an event allocates (``sys.getsizeof`` of its tuple, id and payload, computed without three
    calls per event: an ASCII string's and a bytes' size is their empty one's plus their length); the tool name
    and tag set it shares with its stream are not its own."""
    event_id = held[0]
    if event_id.isascii():
        return _HELD_BYTES + len(event_id) + len(held[1])
    return _HELD_BYTES - sys.getsizeof("") + sys.getsizeof(event_id) + len(held[1])


class _Partition:
    """The events of one principal, and the order they were appended in (what eviction takes from)."""

    __slots__ = ("bytes", "count", "order")

    def __init__(self) -> None:
        self.order: deque[_Stream] = deque()
        """One entry per appended event, naming its stream; entries of deleted streams linger until popped."""
        self.count = 0
        self.bytes = 0


class _Stream:
    __slots__ = ("answered", "events", "first_seq", "gone", "partition", "record", "tag_index", "tags")

    def __init__(self, record: StreamRecord, partition: _Partition) -> None:
        self.record = record
        self.answered = set(record.answered)
        """The record's answers, kept here: a frozenset rebuilt per answer made a batch quadratic."""
        self.partition = partition
        self.events: deque[_Held] = deque()
        """The retained events, positions ``record.last_seq - len(events) + 1`` to ``record.last_seq``."""
        self.first_seq = 0
        """Lowest position still retained; anything below it was evicted."""
        self.tags: list[frozenset[str]] = []
        """The distinct tag sets of this stream's events (its requests'), which held events name by index."""
        self.tag_index: dict[frozenset[str], int] = {}
        """Each tag set's index in ``tags``: one lookup per append (a frozenset keeps its hash)."""
        self.gone = False


class MemoryStore:
    shared = False

    def __init__(
        self,
        max_events: int = 1_000_000,
        max_bytes: int = 256 * 1024 * 1024,
        *,
        max_events_per_principal: int | None = None,
        max_bytes_per_principal: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Per-principal bounds default to the global ones: the fair-share rule alone keeps principals apart.
        ``clock``: the wall clock idempotency keys expire by (the server dates them by it; a test's is injected)."""
        self._clock = clock
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_events_per_principal = max_events if max_events_per_principal is None else max_events_per_principal
        self.max_bytes_per_principal = max_bytes if max_bytes_per_principal is None else max_bytes_per_principal
        self._secret = os.urandom(32)
        self._sessions: dict[str, SessionRecord] = {}
        self._streams: dict[str, _Stream] = {}
        self._keys: dict[tuple[Principal, str], KeyRecord] = {}
        """Idempotency keys (ADR 0029); an expired one is dropped when looked up or replaced, or by the sweep
        (:meth:`expire_sessions`)."""
        self._held_keys = HeldKeys()
        self._kept: dict[str, float] = {}
        """Keyed streams, until when their keys keep them: past their session's deletion, and (a 2026-07-28 keyed
        call's, which no session holds) until then only (ADR 0029)."""
        self._kept_order: list[tuple[float, str]] = []
        """The same as a heap by time: what the sweep releases next."""
        self._by_session: dict[str, set[str]] = {}
        self._partitions: dict[Principal | None, _Partition] = {}
        """By principal; ``None`` holds streams of sessions the store was never told about."""
        self._count = 0
        self._bytes = 0
        self._stored: asyncio.Future[None] | None = None
        """The resolved future :meth:`enqueue` answers a stored event with (on the loop it was made on)."""

    @property
    def bytes_held(self) -> int:
        """What ``max_bytes`` bounds: the retained events' encoded size, as allocated."""
        return self._bytes

    def stored_bytes(self, principal: Principal) -> int:
        """The principal's partition: its events as allocated (what ``max_bytes_per_principal`` bounds too), and
        its live idempotency keys (:data:`.held.KEY_BYTES` each)."""
        partition = self._partitions.get(principal)
        held = 0 if partition is None else partition.bytes
        keys = self._held_keys
        return held if principal not in keys.expiries else held + keys.bytes(principal, self._clock)  # a call less

    async def open(self) -> None:
        """Forgets :meth:`enqueue`'s resolved future, made again on the loop that opened the store."""
        self._stored = None

    async def close(self) -> None:
        return None

    async def secret(self) -> bytes:
        return self._secret

    async def put_session(self, record: SessionRecord) -> None:
        self._put_session(record)

    def _put_session(self, record: SessionRecord) -> None:
        self._sessions[record.session_id] = record
        self._by_session.setdefault(record.session_id, set())

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    async def touch_session(self, session_id: str, now: float) -> None:
        record = self._sessions.get(session_id)
        if record is not None:
            record.last_seen = now

    async def delete_session(self, session_id: str) -> None:
        """A stream a live idempotency key names outlives its session (its outcome is the key's): a running one
        ends as lost (the session's calls end with it), and the sweep drops it when its keys expire."""
        self._sessions.pop(session_id, None)
        at = self._clock()
        for key in self._by_session.pop(session_id, ()):
            if self._kept.get(key, 0.0) > at:
                record = self._streams[key].record
                if not record.completed:
                    record.lost, record.completed = Loss.OWNER, True
                continue
            stream = self._streams.pop(key, None)
            if stream is not None:
                self._drop(stream)

    def _release_kept(self, at: float) -> None:
        """Drop the keyed streams whose keys expired and whose session is gone (or never was: a 2026-07-28 call's
        own): their outcome is no one's any more."""
        order = self._kept_order
        while order and order[0][0] <= at:
            until, key = heapq.heappop(order)
            if self._kept.get(key) != until:
                continue  # kept longer by a later key, or dropped
            del self._kept[key]
            stream = self._streams.get(key)
            if stream is None or stream.record.session_id in self._sessions:
                continue  # its session's own retention decides now
            del self._streams[key]
            self._drop(stream)
            held = self._by_session.get(stream.record.session_id)
            if held is not None:
                held.discard(key)
                if not held:
                    del self._by_session[stream.record.session_id]

    def _drop(self, stream: _Stream) -> None:
        stream.gone = True
        partition = stream.partition
        held = sum(map(_held_size, stream.events))
        partition.bytes -= held
        partition.count -= len(stream.events)
        self._bytes -= held
        self._count -= len(stream.events)
        stream.events.clear()
        if len(partition.order) > 2 * partition.count + 1024:
            partition.order = deque(entry for entry in partition.order if not entry.gone)

    def lacks_key(self, principal: Principal, key: str, now: float) -> bool:
        found = self._keys.get((principal, key))
        return found is None or found.expires <= now

    def keys_held(self, principal: Principal, now: float) -> int:
        return self._held_keys.held(principal, now)

    async def expire_sessions(self, idle_before: float) -> list[str]:
        """Also purges expired idempotency keys: the server's periodic sweep calls this."""
        at = self._clock()  # keys expire by the wall clock, as the server dates them
        self._keys = {name: key for name, key in self._keys.items() if key.expires > at}
        self._held_keys.purge(at)
        self._release_kept(at)
        gone = [sid for sid, rec in self._sessions.items() if rec.last_seen < idle_before]
        for sid in gone:
            await self.delete_session(sid)
        return gone

    async def open_stream(self, record: StreamRecord) -> None:
        self._open(record)

    idempotency_keys = True
    keys_durable_when_queued = True

    def enqueue_open(
        self, record: StreamRecord, keys: Sequence[KeyRecord] = (), session: SessionRecord | None = None
    ) -> asyncio.Future[None]:
        """Opens at once, with its keys (and its session first): the future is the shared resolved one
        :meth:`enqueue` returns. A keyed stream no session holds (a 2026-07-28 call's own) is its key's principal's."""
        if session is not None:
            self._put_session(session)
        self._open(record, keys[0].principal if keys else None)
        for key in keys:
            self._keys[key.principal, key.key] = key
            self._held_keys.add(key.principal, key.key, key.expires)
        if keys:
            until = max(self._kept.get(record.stream, 0.0), *(key.expires for key in keys))
            self._kept[record.stream] = until
            heapq.heappush(self._kept_order, (until, record.stream))
        stored = self._stored
        return self._resolved() if stored is None else stored

    def _open(self, record: StreamRecord, principal: Principal | None = None) -> None:
        session = self._sessions.get(record.session_id)
        owner = principal if session is None else session.principal
        partition = self._partitions.get(owner)
        if partition is None:
            partition = self._partitions[owner] = _Partition()
        previous = self._streams.get(record.stream)
        if previous is not None:
            self._drop(previous)
        self._streams[record.stream] = _Stream(record.copy(), partition)
        streams = self._by_session.get(record.session_id)
        if streams is None:
            streams = self._by_session[record.session_id] = set()
        streams.add(record.stream)

    async def get_key(self, principal: Principal, key: str, now: float) -> KeyRecord | None:
        found = self._keys.get((principal, key))
        if found is not None and found.expires <= now:
            del self._keys[principal, key]
            return None
        return found

    async def get_stream(self, stream: str) -> StreamRecord | None:
        found = self._streams.get(stream)
        if found is None:
            return None
        record = found.record.copy()
        record.answered = frozenset(found.answered)
        return record

    def enqueue(self, event: StoredEvent, completes: bool = False) -> asyncio.Future[None]:
        """Appends at once (memory has nothing to wait for): the future is already resolved. A stored event's is one
        resolved future shared by all (a resolved future never changes; making one per event cost more than the
        append itself)."""
        try:
            self._append(event, completes)
        except (KeyError, ValueError, StreamTakenOver) as exc:
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        stored = self._stored
        if stored is None:  # once per open, not per event: asking asyncio for its loop costs a getpid system call
            stored = self._stored = asyncio.get_running_loop().create_future()
            stored.set_result(None)
        return stored

    def _resolved(self) -> asyncio.Future[None]:
        """The shared resolved future (:meth:`enqueue`'s, written out there: a call per event costs more)."""
        stored = self._stored
        if stored is None:  # once per open, not per event: asking asyncio for its loop costs a getpid system call
            stored = self._stored = asyncio.get_running_loop().create_future()
            stored.set_result(None)
        return stored

    async def append(self, event: StoredEvent, completes: bool = False) -> None:
        self._append(event, completes)

    def _append(self, event: StoredEvent, completes: bool) -> None:
        _session, key, seq, event_id, data, request_id, tool, resources, terminal = event  # one unpack, not 9 lookups
        stream = self._streams.get(key)
        if stream is None:
            raise KeyError(f"append to unknown stream {key}")
        record = stream.record
        if record.lost is not None:
            raise StreamTakenOver(f"stream {key} was ended as lost ({record.lost.value}): no event is appended to it")
        if seq != record.last_seq + 1:
            if seq <= record.last_seq and self._holds(stream, event):
                return  # a retry of a stored append (its outcome was lost to a cancel): already done
            raise ValueError(f"append of position {seq} to stream {key} after {record.last_seq}")
        tag_index = stream.tag_index.get(resources)
        if tag_index is None:
            tag_index = stream.tag_index[resources] = len(stream.tags)
            stream.tags.append(resources)
        data = b"".join((data, b""))  # an exact-size copy (module docstring)
        held = (event_id, data, request_id, tool, tag_index, terminal)
        stream.events.append(held)
        record.last_seq = seq
        if terminal and request_id is not None:
            stream.answered.add(request_id)
        if completes:
            record.completed = True
        # _held_size inline for an ASCII id (every id this server makes): a call per event costs more than the sum
        size = _HELD_BYTES + len(event_id) + len(data) if event_id.isascii() else _held_size(held)
        partition = stream.partition
        partition.order.append(stream)
        partition.count += 1
        partition.bytes += size
        self._count += 1
        self._bytes += size
        if (
            partition.bytes > self.max_bytes_per_principal
            or partition.count > self.max_events_per_principal
            or self._bytes > self.max_bytes
            or self._count > self.max_events
        ):
            self._evict(partition)

    def _holds(self, stream: _Stream, event: StoredEvent) -> bool:
        first = stream.record.last_seq - len(stream.events) + 1
        if event.seq < first:
            return False
        event_id, data, request_id, tool, tag_index, terminal = stream.events[event.seq - first]
        return (event_id, data, request_id, tool, stream.tags[tag_index], terminal) == (
            event.event_id,
            event.data,
            event.request_id,
            event.tool,
            event.resources,
            event.terminal,
        )

    def _evict(self, own: _Partition) -> None:
        while own.count and (own.bytes > self.max_bytes_per_principal or own.count > self.max_events_per_principal):
            self._evict_oldest(own)
        while self._count and (self._bytes > self.max_bytes or self._count > self.max_events):
            holding = sum(1 for p in self._partitions.values() if p.count)
            victim = own
            if own.count == 0 or own.bytes * holding < self._bytes:
                victim = max(self._partitions.values(), key=lambda p: p.bytes)
            self._evict_oldest(victim)

    def _evict_oldest(self, partition: _Partition) -> None:
        while True:
            stream = partition.order.popleft()
            if not stream.gone and stream.events:
                break
        size = _held_size(stream.events.popleft())
        stream.first_seq = stream.record.last_seq - len(stream.events) + 1
        partition.count -= 1
        partition.bytes -= size
        self._count -= 1
        self._bytes -= size

    async def complete_stream(self, stream: str) -> None:
        found = self._streams.get(stream)
        if found is not None:
            found.record.completed = True

    async def read_after(self, stream: str, seq: int) -> Sequence[StoredEvent]:
        """The held rows themselves, with the stream's tag table (:class:`EventRows`): a replay frames and checks
        them without an event built per row (ADR 0020)."""
        found = self._streams.get(stream)
        if found is None:
            return []
        if seq + 1 < found.first_seq:
            raise EventsEvicted(f"events {seq + 1}..{found.first_seq - 1} of stream {stream} were evicted")
        events, record = found.events, found.record
        if not events or record.last_seq <= seq:
            return []
        first = record.last_seq - len(events) + 1
        start = max(0, seq + 1 - first)
        return EventRows(record.session_id, stream, first + start, list(islice(events, start, None)), tuple(found.tags))

    async def owner_alive(self, owner: str) -> bool:
        return False

    async def register_instance(self, instance: str) -> None:
        return None

    async def mark_lost(self, stream: str, owner: str, loss: Loss) -> StreamRecord | None:
        found = self._streams.get(stream)
        if found is None:
            return None
        record = found.record
        if not record.completed:
            if record.owner != owner:
                raise StreamTakenOver(f"stream {stream} is produced by {record.owner}, not {owner}")
            record.lost = loss
            record.completed = True
        return await self.get_stream(stream)

    async def wait_events(self, stream: str, seq: int, block_seconds: float) -> Sequence[StoredEvent]:
        return await self.read_after(stream, seq)
