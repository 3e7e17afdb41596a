"""A bounded in-memory store: fast, lost on restart, evicts oldest events explicitly when full."""

from __future__ import annotations

import os
from collections import deque
from itertools import islice

from ..core.events import StoredEvent, StreamRecord
from .base import EventsEvicted, SessionRecord


class _Stream:
    __slots__ = ("events", "first_seq", "record")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self.events: deque[StoredEvent] = deque()
        self.first_seq = 0
        """Lowest position still retained; anything below it was evicted."""


class MemoryStore:
    shared = False

    def __init__(self, max_events: int = 1_000_000, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._secret = os.urandom(32)
        self._sessions: dict[str, SessionRecord] = {}
        self._streams: dict[str, _Stream] = {}
        self._by_session: dict[str, set[str]] = {}
        self._order: deque[tuple[str, int]] = deque()
        """Append order for eviction; entries of deleted streams linger until evicted or compacted."""
        self._count = 0
        """Events retained in live streams: what ``max_events`` bounds (``_order`` also holds stale entries)."""
        self._bytes = 0
        self.evicted = 0

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def secret(self) -> bytes:
        return self._secret

    async def put_session(self, record: SessionRecord) -> None:
        self._sessions[record.session_id] = record
        self._by_session.setdefault(record.session_id, set())

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    async def touch_session(self, session_id: str, now: float) -> None:
        record = self._sessions.get(session_id)
        if record is not None:
            record.last_seen = now

    async def delete_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        for key in self._by_session.pop(session_id, ()):
            stream = self._streams.pop(key, None)
            if stream is not None:
                self._bytes -= sum(len(e.data) for e in stream.events)
                self._count -= len(stream.events)
        if len(self._order) > 2 * self._count + 1024:
            self._order = deque(entry for entry in self._order if entry[0] in self._streams)

    async def expire_sessions(self, idle_before: float) -> list[str]:
        gone = [sid for sid, rec in self._sessions.items() if rec.last_seen < idle_before]
        for sid in gone:
            await self.delete_session(sid)
        return gone

    async def open_stream(self, record: StreamRecord) -> None:
        self._streams[record.stream] = _Stream(record.copy())
        streams = self._by_session.get(record.session_id)
        if streams is None:
            streams = self._by_session[record.session_id] = set()
        streams.add(record.stream)

    async def get_stream(self, stream: str) -> StreamRecord | None:
        found = self._streams.get(stream)
        return None if found is None else found.record.copy()

    async def append(self, event: StoredEvent, completes: bool = False) -> None:
        stream = self._streams.get(event.stream)
        if stream is None:
            raise KeyError(f"append to unknown stream {event.stream}")
        record = stream.record
        if event.seq != record.last_seq + 1:
            raise ValueError(f"append of position {event.seq} to stream {event.stream} after {record.last_seq}")
        stream.events.append(event)
        record.last_seq = event.seq
        if event.terminal and event.request_id is not None:
            record.answered = record.answered | {event.request_id}
        if completes:
            record.completed = True
        self._order.append((event.stream, event.seq))
        self._count += 1
        self._bytes += len(event.data)
        if self._count > self.max_events or self._bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        while self._order and (self._count > self.max_events or self._bytes > self.max_bytes):
            key, _seq = self._order.popleft()
            stream = self._streams.get(key)
            if stream is None or not stream.events:
                continue
            oldest = stream.events.popleft()
            stream.first_seq = oldest.seq + 1
            self._count -= 1
            self._bytes -= len(oldest.data)
            self.evicted += 1

    async def complete_stream(self, stream: str) -> None:
        found = self._streams.get(stream)
        if found is not None:
            found.record.completed = True

    async def read_after(self, stream: str, seq: int) -> list[StoredEvent]:
        found = self._streams.get(stream)
        if found is None:
            return []
        if seq + 1 < found.first_seq:
            raise EventsEvicted(f"events {seq + 1}..{found.first_seq - 1} of stream {stream} were evicted")
        events = found.events
        if not events or events[-1].seq <= seq:
            return []
        start = max(0, seq + 1 - events[0].seq)
        return list(islice(events, start, None))

    async def owner_alive(self, owner: str) -> bool:
        return False

    async def register_instance(self, instance: str) -> None:
        return None

    async def claim_stream(self, stream: str, expected_owner: str, new_owner: str) -> bool:
        found = self._streams.get(stream)
        if found is None or found.record.owner != expected_owner:
            return False
        found.record.owner = new_owner
        return True

    async def wait_events(self, stream: str, seq: int, block_seconds: float) -> list[StoredEvent]:
        return await self.read_after(stream, seq)
