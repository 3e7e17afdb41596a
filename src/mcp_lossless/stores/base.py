"""The event-store interface every backend implements.

A store holds sessions (with their principal binding), streams (with the requests they carry) and the
append-only events of each stream with their authorization tags. Reads are all-or-error: a cursor that
predates the retained window raises :class:`EventsEvicted`, never a partial replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core.events import Loss, StoredEvent, StreamRecord
from ..core.idempotency import KeyRecord
from ..core.principal import Principal


class EventsEvicted(Exception):
    """Events after the cursor are no longer retained; replaying the rest would lose them silently."""


class StoreUnavailable(Exception):
    """The backend cannot be reached; the server answers 503 and acknowledges nothing."""


class StoreFull(StoreUnavailable):
    """The store holds its configured maximum (a SQLite file at ``max_bytes``): nothing more can be written until
    retention or a deletion frees room. An outage as far as callers go (nothing of the write was stored, retrying
    later may succeed), named as what it is."""


class StreamTakenOver(StoreUnavailable):
    """Another instance took this stream over (its owner's lease lapsed): retrying cannot help."""


class EventsLost(StoreUnavailable):
    """The store no longer holds events of the stream it acknowledged (a failover to a replica that had not
    received them): an append finds a gap after the store's last position, or no stream at all. Retrying cannot
    help; the producer ends the stream as lost (:meth:`EventStore.mark_lost`)."""

    def __init__(self, message: str, held: int | None) -> None:
        super().__init__(message)
        self.held = held
        """The last position of the stream the store holds (``None``: not even the stream)."""


class KeyTaken(Exception):
    """Another process recorded one of the idempotency keys first (concurrent first uses on a shared store): the
    stream was not opened and none of its keys is held; the caller decides those calls again, as duplicates."""


@dataclass(slots=True)
class SessionRecord:
    session_id: str
    principal: Principal
    protocol_version: str
    created_at: float
    last_seen: float


class EventStore(Protocol):
    """Sessions, streams and events, durable as far as the backend's durability goes (docs/stores.md).

    The server keeps nothing it could not find here again: an event is sent only after it is stored, and a
    resume, a restarted process or another replica reads the stream from the store. So the server depends on
    this contract alone, and the contract tests hold every backend to it.

    Errors every backend raises the same way:

    - :class:`StoreUnavailable`: the backend cannot serve now (unreachable, locked, disk full); nothing of the
      failed write was stored, and retrying later may succeed.
    - :class:`StreamTakenOver` (a :class:`StoreUnavailable`): another instance owns the stream now; retrying
      cannot help.
    - ``KeyError`` from :meth:`append`: the stream was never opened, or is gone (its session was deleted).
    - ``ValueError`` from :meth:`append`: the position would leave a gap after the stream's last one, or (in a
      single-process store) rewrite a stored event; Redis answers the latter with :class:`StreamTakenOver`, and
      the former (or an unknown stream) with :class:`EventsLost`, as only a store that lost writes can show them
      to the stream's own producer.
      Appending again exactly the event stored at a position succeeds and changes nothing, so a retry of an
      append whose outcome was lost (a dropped reply, a cancelled wait) is always safe.
    - :class:`EventsEvicted` from reads: events after the cursor are no longer retained.
    """

    shared: bool
    """Whether other server processes use this store too: then the store, not process memory, is the truth
    about sessions (one replica's DELETE must hold on every replica)."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    async def secret(self) -> bytes:
        """The event-id MAC secret, created on first use and kept as durable as the events."""
        ...

    async def put_session(self, record: SessionRecord) -> None: ...
    async def get_session(self, session_id: str) -> SessionRecord | None: ...
    async def touch_session(self, session_id: str, now: float) -> None: ...
    async def delete_session(self, session_id: str) -> None:
        """Forget the session with all its streams and events."""
        ...

    async def expire_sessions(self, idle_before: float) -> list[str]:
        """Delete sessions idle since before ``idle_before``; return their ids."""
        ...

    idempotency_keys: bool
    """Whether :meth:`enqueue_open` records idempotency keys (SEP-3182, ADR 0029): the server declares
    ``tools.idempotency`` only then."""

    keys_durable_when_queued: bool
    """Whether a keyed :meth:`enqueue_open` has recorded its keys and stream record, as durably as the store keeps
    anything, when it returns (memory; SQLite: its key journal): a keyed call then starts at once instead of
    awaiting the record's write, and its record is committed with its answer, as an unkeyed call's is (ADR 0029).
    A shared store's write decides between processes (:class:`KeyTaken`): it is awaited."""

    async def open_stream(self, record: StreamRecord) -> None: ...
    def enqueue_open(
        self, record: StreamRecord, keys: Sequence[KeyRecord] = (), session: SessionRecord | None = None
    ) -> asyncio.Future[None]:
        """:meth:`open_stream` queued as :meth:`enqueue` queues an append: returns at once, and the future resolves
        once the record is stored (or fails as :meth:`open_stream` would), before any future of an event of the
        stream enqueued after it. So a call's stream record and its first events share one write. The record is
        stored as it is at this call (the caller's stream goes on changing it).

        The record makes the stream's event ids resumable: none may reach a client before this future resolved.
        If it fails, the stream's events are refused (``KeyError``: unknown stream) or fail with it.

        ``keys`` (only where :attr:`idempotency_keys`): the idempotency keys whose first use this stream runs, stored
        in the same write as the record, so a key is never held without the stream that holds its outcome (nor a
        keyed stream without its key). A key of the same principal and string replaces an expired one. A shared
        store records each key only if no other process holds it (one concurrent first use wins); when one is held,
        the future fails with :class:`KeyTaken` and nothing of the stream or its keys is kept. A keyed stream is
        kept, once completed, as long as its key.

        ``session``: the stream's session, stored (as :meth:`put_session` stores it) in the same write, before the
        stream: a stream that is a session of its own (a task's, ADR 0040) costs one write, not two.
        """
        ...

    async def get_key(self, principal: Principal, key: str, now: float) -> KeyRecord | None:
        """The principal's record of ``key``, or ``None`` (never one, expired at ``now``, or another principal's)."""
        ...

    def lacks_key(self, principal: Principal, key: str, now: float) -> bool:
        """``True`` when the store knows in process, without I/O, that :meth:`get_key` would find no record (one
        process owns the store: memory, SQLite): a first use, the common case, is decided at once. ``False``
        when it holds one or cannot tell (a shared store: Redis): ask :meth:`get_key`."""
        ...

    def keys_held(self, principal: Principal, now: float) -> int:
        """The principal's idempotency keys live at ``now`` (what ``idempotency_keys_per_principal`` bounds), read
        from process memory, without a round trip, as :meth:`stored_bytes`; a shared store counts those this process
        recorded."""
        ...

    async def get_stream(self, stream: str) -> StreamRecord | None: ...
    def enqueue(self, event: StoredEvent, completes: bool = False) -> asyncio.Future[None]:
        """Queue ``event`` behind every write already queued and return at once; the future resolves once the
        event is stored as durably as the backend stores anything, or fails as :meth:`append` would.

        What lets a producer go on without waiting for each write (the backend batches what queues up
        meanwhile into one transaction or round trip), while nothing is sent before it is stored: an event
        may be published only after its future resolved. Futures of one stream resolve in position order, and a
        store never holds a position of a stream without every position before it: after an append that
        failed, the next one of its stream is refused as a gap until the failed one is stored again. Progress
        events of one stream queued together may share one future, which then fails if any of them failed.

        ``completes``: the event answers the stream's last request, and the stream is marked complete in the
        same write, so no crash can leave a stream answered but still open.
        """
        ...

    async def append(self, event: StoredEvent, completes: bool = False) -> None:
        """``await enqueue(event, completes)``: store ``event`` durably before it is sent."""
        ...

    async def complete_stream(self, stream: str) -> None: ...
    async def read_after(self, stream: str, seq: int) -> Sequence[StoredEvent]:
        """Every retained event of ``stream`` with a position above ``seq``, in order: a list, or the store's own rows
        as :class:`~..core.events.EventRows` (the memory store's, ADR 0020); callers only index, slice and iterate."""
        ...

    async def owner_alive(self, owner: str) -> bool:
        """Whether the server instance ``owner`` still runs (single-process stores: never another)."""
        ...

    async def register_instance(self, instance: str) -> None:
        """This process serves as ``instance`` until :meth:`close` (shared stores keep a lease alive)."""
        ...

    async def mark_lost(self, stream: str, owner: str, loss: Loss) -> StreamRecord | None:
        """End ``stream`` without its producer, atomically and only if ``owner`` still produces it: record ``loss``
        (its unanswered requests' outcome) and complete it, writing no event (ADR 0025). Returns the record after,
        whoever ended it (a stream already ended is returned as it is); ``None`` for an unknown stream. A later
        append by the old owner is refused (:class:`StreamTakenOver`)."""
        ...

    def stored_bytes(self, principal: Principal) -> int:
        """What ``principal``'s sessions make this store hold, in bytes (events and streams, as
        :mod:`~mcp_lossless.stores.held` counts them, the memory store its own measure; and its live idempotency
        keys): read from process memory,
        without a round trip, as the server asks it on every POST and progress event. A shared store counts what
        this process wrote (docs/decisions/0026)."""
        ...

    async def wait_events(self, stream: str, seq: int, block_seconds: float) -> Sequence[StoredEvent]:
        """Like :meth:`read_after`, but block up to ``block_seconds`` for events another process appends.

        Single-process stores have no other writer to wait for and answer at once.
        """
        ...
