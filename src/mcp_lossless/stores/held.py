"""What each principal makes a store hold, counted in process: the figure ``stored_bytes_per_principal`` bounds.

A store keeps one :class:`HeldBytes` and updates it where it writes and where it removes (an append, a stream opened,
a trim, retention, a session's deletion or expiry), so the server reads a principal's figure with a dictionary
lookup, never a round trip, on every POST and every progress event (docs/decisions/0026).

What is counted is what a client controls: each event's payload plus :data:`ROW_BYTES`, each stream
:data:`STREAM_BYTES`. The fixed costs stand for what a row holds besides its payload (its id, request id, tags,
keys, the B-tree's own overhead), so a flood of empty events or of POSTs is bounded too, not only big payloads.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..core.principal import Principal

ROW_BYTES = 128
"""What one stored event counts besides its payload: an event id (~40 bytes), request id, tags and the row's keys."""
STREAM_BYTES = 256
"""What one stream counts: its record (kind, owner, requests, positions) and its entries in the indexes."""
KEY_BYTES = 512
"""What one live idempotency key counts: its record (principal, a key string of up to 255 characters, tool, argument
hash, stream, request id, times) and its index entry, whichever store holds it (ADR 0029)."""


class QueuedBytes:
    """Bytes queued and not landed yet, of one session (``total``: its principal's entry) or of one principal.
    Mutable, so that a queued event adds to both without a new tuple or a lookup by principal."""

    __slots__ = ("principal", "size", "total")

    def __init__(self, principal: Principal, total: QueuedBytes | None = None) -> None:
        self.principal = principal
        self.size = 0
        self.total = self if total is None else total


class HeldBytes:
    """Bytes held per session and per principal.

    A session is bound to its principal when the store learns of it (created, loaded, found at open); what is
    added to a session it was never told of is not counted (a store holds no event of a session it has no
    record of: its appends are refused as of an unknown stream). The counts proper change on one thread (the
    SQLite store's writer, or the event loop). A store that commits on another thread counts what is queued
    for it on the loop as well (:meth:`queue`, :meth:`landed`): a tool's progress call returns once its event is
    queued, so a count taken only at commit would let a flood run ahead of it by what is in flight (measured:
    twice the bound). :meth:`held` reads both, dictionary lookups, from the loop.
    """

    __slots__ = ("_held", "_queued", "_queued_held", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[Principal, int]] = {}
        """Each session's principal and the bytes counted for it."""
        self._held: dict[Principal, int] = {}
        """Each principal's total over its sessions; a principal holding nothing has no entry."""
        self._queued: dict[str, QueuedBytes] = {}
        """Bytes queued for each session and not yet written or failed (loop thread only); an entry goes once its
        bytes have all landed."""
        self._queued_held: dict[Principal, QueuedBytes] = {}
        """The same per principal, each its sessions' ``total``; an entry goes once its bytes have all landed (then
        so have those of every session of the principal)."""

    def bind(self, session_id: str, principal: Principal) -> None:
        """``session_id`` belongs to ``principal`` (a session already bound keeps its count)."""
        if session_id not in self._sessions:
            self._sessions[session_id] = (principal, 0)

    def add(self, session_id: str, size: int) -> None:
        """``size`` bytes more (or fewer, when negative: a trim, retention) held for ``session_id``."""
        account = self._sessions.get(session_id)
        if account is None or not size:
            return
        principal, held = account
        total = held + size
        total = total if total > 0 else 0  # not ``max``: it parses keyword arguments (some 500 instructions)
        self._sessions[session_id] = (principal, total)
        # :meth:`_count` written out: this runs for every session a store transaction wrote to (a call's, each)
        by_principal = self._held
        total += by_principal.get(principal, 0) - held
        if total > 0:
            by_principal[principal] = total
        else:
            by_principal.pop(principal, None)

    def forget(self, session_id: str) -> None:
        """The session is gone with everything it held (deleted, expired)."""
        account = self._sessions.pop(session_id, None)
        if account is not None:
            self._count(account[0], -account[1])

    def queue(self, session_id: str, size: int) -> QueuedBytes | None:
        """On the loop: ``size`` bytes queued for ``session_id``, counted until :meth:`landed`. Called per event: the
        session's entry, once made, is one lookup and two additions. Returns the entry (``None``: a session never
        bound, not counted), which a store may add more of the session's bytes to directly (``size`` and
        ``total.size``) while its ``size`` is above 0: an entry goes (:meth:`landed`) only once its size is 0 (bytes
        that landed may include some queued before the session was bound, never counted), and nothing adds to it
        after."""
        queued = self._queued.get(session_id)
        if queued is None:
            account = self._sessions.get(session_id)
            if account is None:
                return None
            principal = account[0]
            total = self._queued_held.get(principal)
            if total is None:
                total = self._queued_held[principal] = QueuedBytes(principal)
            queued = self._queued[session_id] = QueuedBytes(principal, total)
        queued.size += size
        queued.total.size += size
        return queued

    def landed(self, sizes: dict[str, int]) -> None:
        """On the loop: what :meth:`queue` counted was written (and counted by then) or failed."""
        for session_id, size in sizes.items():
            queued = self._queued.get(session_id)
            if queued is None:
                continue
            written = size if size < queued.size else queued.size  # not ``min``: see :meth:`add`
            queued.size -= written
            if queued.size <= 0:
                del self._queued[session_id]
            total = queued.total
            total.size -= written
            if total.size <= 0:
                self._queued_held.pop(total.principal, None)

    def held(self, principal: Principal) -> int:
        queued = self._queued_held.get(principal)
        return self._held.get(principal, 0) + (0 if queued is None else queued.size)

    def reader(self, keys: HeldKeys, clock: Callable[[], float]) -> Callable[[Principal], int]:
        """:meth:`held` plus what the principal's live idempotency keys count (:meth:`HeldKeys.bytes`), as one
        function over the dictionaries themselves (never rebound): a store's ``stored_bytes``, asked on every POST,
        answer and progress event, in one Python call where :meth:`held` and :meth:`HeldKeys.bytes` took three."""
        held = self._held
        queued_held = self._queued_held
        keyed = keys.expiries

        def stored_bytes(principal: Principal) -> int:
            queued = queued_held.get(principal)
            total = held.get(principal, 0) if queued is None else held.get(principal, 0) + queued.size
            expiries = keyed.get(principal)
            if expiries is None:
                return total
            # :meth:`HeldKeys.bytes` inline while none expired (a principal's heap is never empty): asked on every
            # POST and answer of a principal that keys its calls, the call was ~1,500 instructions of each.
            return total + (KEY_BYTES * len(expiries) if expiries[0][0] > clock() else keys.bytes(principal, clock))

        return stored_bytes

    def _count(self, principal: Principal, size: int) -> None:
        total = self._held.get(principal, 0) + size
        if total > 0:
            self._held[principal] = total
        else:
            self._held.pop(principal, None)


class HeldKeys:
    """Each principal's live idempotency keys, in process memory: counted (what ``idempotency_keys_per_principal``
    bounds, asked on every keyed POST: no store round trip) and known by name. A key counts until it expires; a
    shared store counts the keys this process recorded, as it counts bytes (docs/decisions/0026). A store one process
    owns (SQLite) knows every key, so :meth:`known` tells a first use, the common case, without reading the file, and
    names a duplicate's row (``row``: the store's own number for it)."""

    __slots__ = ("_expiries", "_live", "expiries")

    def __init__(self) -> None:
        self._expiries: dict[Principal, list[tuple[float, str]]] = {}
        """Per principal, a heap of its keys' expiry times, with the key."""
        self.expiries: Mapping[Principal, Sequence[tuple[float, str]]] = self._expiries
        """Each principal's heap (read only: ``heap[0]`` is its earliest expiry): a store's ``stored_bytes`` counts
        a principal's keys from it while none expired, without the call to :meth:`bytes`, on every event."""
        self._live: dict[tuple[Principal, str], tuple[float, int]] = {}
        """Each key's expiry time and row (a key recorded again, once expired, has its new ones)."""

    def add(self, principal: Principal, key: str, expires: float, row: int = 0) -> None:
        heapq.heappush(self._expiries.setdefault(principal, []), (expires, key))
        self._live[principal, key] = (expires, row)

    def known(self, principal: Principal, key: str, now: float) -> int | None:
        """The live key's row, ``None`` when there is no live key."""
        found = self._live.get((principal, key))
        return found[1] if found is not None and found[0] > now else None

    def held(self, principal: Principal, now: float) -> int:
        expiries = self._expiries.get(principal)
        if expiries is None:
            return 0
        live = self._live
        while expiries and expiries[0][0] <= now:
            expires, key = heapq.heappop(expiries)
            found = live.get((principal, key))
            if found is not None and found[0] == expires:
                del live[principal, key]
        if not expiries:
            del self._expiries[principal]
        return len(expiries)

    def bytes(self, principal: Principal, clock: Callable[[], float]) -> int:
        """What the principal's live keys count in its stored bytes (``stored_bytes_per_principal``): an expired key
        is released when it is purged, as it is counted no more. The clock is read only for a principal holding
        keys: the stores ask this on every POST and answer, and nearly no principal keys its calls."""
        expiries = self._expiries.get(principal)
        if expiries is None:
            return 0
        now = clock()
        # None expired (the earliest is live: a principal's heap is never empty): counted as it is, no purge call.
        return KEY_BYTES * (len(expiries) if expiries[0][0] > now else self.held(principal, now))

    def purge(self, now: float) -> None:
        """Forget every expired key (the store's periodic sweep), not only those of principals that key again."""
        for principal in list(self._expiries):
            self.held(principal, now)


class ExpiringHeld:
    """The counts of a store whose completed streams expire by themselves (Redis: their keys' TTL), kept by the
    process that writes them.

    Each stream this process writes is counted while it runs; once complete, its count is released
    ``retention_seconds`` later, when the store drops its keys (the process models the TTL: no store round trip
    ever). A session deleted or expired releases everything at once. What the store trims from a stream longer
    than its ``max_events_per_stream`` stays counted until the stream expires: a conservative count, never one
    that grows without end.
    """

    __slots__ = ("_clock", "_expiring", "_retention", "_streams", "counts")

    def __init__(self, retention_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts = HeldBytes()
        self._retention = retention_seconds
        self._clock = clock
        self._streams: dict[str, tuple[str, int]] = {}
        """Each running stream this process wrote: its session and what it counts so far."""
        self._expiring: deque[tuple[float, str, int]] = deque()
        """Completed streams, in completion order: when the store drops them, their session, what they count."""

    def opened(self, session_id: str, stream: str) -> None:
        self._streams[stream] = (session_id, STREAM_BYTES)
        self.counts.add(session_id, STREAM_BYTES)

    def appended(self, session_id: str, stream: str, size: int, completes: bool) -> None:
        """An event of ``size`` payload bytes handed to the store (counted then: a retry through an outage counts
        twice, until the stream expires)."""
        size += ROW_BYTES
        self.counts.add(session_id, size)
        _session, held = self._streams.get(stream, (session_id, 0))
        self._streams[stream] = (session_id, held + size)
        if completes:
            self.completed(stream)

    def completed(self, stream: str) -> None:
        entry = self._streams.pop(stream, None)
        if entry is not None:
            self._expiring.append((self._clock() + self._retention, *entry))

    def forget(self, session_id: str, streams: Iterable[str] = ()) -> None:
        """The session is gone with its ``streams``."""
        for stream in streams:
            self._streams.pop(stream, None)
        self.counts.forget(session_id)

    def held(self, principal: Principal) -> int:
        expiring = self._expiring
        if expiring and expiring[0][0] <= self._clock():
            now = self._clock()
            while expiring and expiring[0][0] <= now:
                _deadline, session_id, size = expiring.popleft()
                self.counts.add(session_id, -size)
        return self.counts.held(principal)
