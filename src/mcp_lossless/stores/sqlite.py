"""A durable single-file store on the stdlib ``sqlite3``: the default store of ``mcp-lossless serve``.

Durability: WAL journal with ``synchronous=NORMAL``. A write's future resolves only after its transaction
committed, so a crash of the server *process* (even SIGKILL) keeps every event, session, stream record and
the event-id secret whose write returned: a commit is in the WAL file, i.e. in the OS page cache, by then.
An *OS* crash or power loss may roll back the last transactions, because WAL frames are fsynced only at
checkpoints; that is the price of appends that never wait for the disk (docs/stores.md).

Threading and group commit: one thread owns the connection and does every read and write, so nothing
blocks the event loop. Work is queued in order and handed to the thread once a turn of the loop queued no
more (:meth:`SqliteStore._gather`); the thread takes everything handed to it while it was busy and
runs the writes of that batch -- appends of every stream, sessions, stream records -- as **one**
transaction, then the reads, then hands every outcome back to the loop in one call. Many appends thus
share one commit (one WAL write) and one thread hop. :meth:`SqliteStore.enqueue` returns as soon as the
event is queued; its future resolves after the commit, and the server publishes the event only then.
A read queued after a write sees it; a read never sees a write that has not committed.

Reads are all-or-error: each stream keeps ``first_seq``, the lowest position still retained; a cursor
below it raises :class:`EventsEvicted`. With ``max_events_per_stream`` set, an append trims the oldest
positions of its stream beyond the limit and advances ``first_seq`` in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl

import orjson

from ..core.events import EventRows, Loss, RequestId, StoredEvent, StreamKind, StreamRecord
from ..core.idempotency import KeyRecord, StreamTarget
from ..core.principal import Principal
from ._codec import CACHE_LIMIT, Interner, decode_requests, encode_requests, encode_tags
from .base import EventsEvicted, SessionRecord, StoreFull, StoreUnavailable, StreamTakenOver
from .held import ROW_BYTES, STREAM_BYTES, HeldBytes, HeldKeys, QueuedBytes
from .key_journal import KeyJournal, Segment

T = TypeVar("T")

_SCHEMA_VERSION = 7
_LOSSES = {2: Loss.OWNER, 3: Loss.STORE}
"""``streams.completed`` beyond 1: the stream ended as lost, and why (ADR 0025). Any non-zero value is completed, so
files stay readable by the versions before (which see such a stream as completed with its requests unanswered)."""
_LOST_OWNER = 2
"""A running keyed stream whose session is deleted: ended as lost (its calls end with the session)."""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    client_id TEXT NOT NULL,
    protocol_version TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_seen REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_last_seen ON sessions (last_seen);
CREATE TABLE IF NOT EXISTS streams (
    id INTEGER PRIMARY KEY,
    stream TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    owner TEXT NOT NULL,
    requests TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    completed INTEGER NOT NULL,
    answered TEXT NOT NULL,
    completed_at REAL,
    kept_until REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS completed_streams ON streams (completed_at, session_id) WHERE completed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    stream_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    request_id TEXT,
    tool TEXT,
    resources TEXT NOT NULL,
    data BLOB NOT NULL,
    terminal INTEGER NOT NULL,
    PRIMARY KEY (stream_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_streams (
    session_id TEXT NOT NULL,
    stream_id INTEGER NOT NULL,
    PRIMARY KEY (session_id, stream_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    terminal INTEGER NOT NULL,
    record BLOB NOT NULL,
    seen_at REAL NOT NULL,
    ttl REAL,
    expires_at REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    id INTEGER PRIMARY KEY,
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    client_id TEXT NOT NULL,
    key TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments_hash TEXT NOT NULL,
    stream TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_by_expiry ON idempotency_keys (expires);
"""
"""Schema 4 (ADR 0017): a stream's events are keyed by its row's integer id, which grows with each stream opened,
so the events of the streams in work sit together at the end of their B-tree and a commit writes a few pages,
not one page per stream (the random 144-bit stream key placed each stream's events, and its row, on a page
of their own: a group commit of 16 calls rewrote ~50 pages). The key is looked up once, by the ``UNIQUE``
index (keys begin with their time, so new ones go at its end too). A stream's entry in its session's index is
written once, when it opens; completed streams are indexed by completion time, in which order they complete,
so a completion adds at the end of that index, and retention by age reads it from the oldest. The count of a
session's completed streams scans it whole (it covers the query). Version 3 indexed (session, completion
time): a completion moved the stream's entry on its session's page, one more page per call and commit.

Schema 5 (ADR 0022): a session's streams are found through ``session_streams``, which the writer fills in bulk
(:data:`_INDEX_EVERY` streams at a time, and at each sweep), not in each commit: version 4's index by session put
each new stream's entry on its session's page, one page per session a commit touched (measured: 43 WAL writes a
commit of 8 calls from 16 sessions, 20 without it). The streams not indexed yet are those above
``indexed_through`` (in ``meta``), found by their id range; a session's deletion takes both.

Schema 6 (ADR 0028): the tasks of the 2026-07-28 leg (:mod:`.tasks_sqlite`) are part of the schema, written by
the writer thread like everything else. Version 5 files may hold the same ``tasks`` table already (the task store
created it, outside the versioned schema, with a connection of its own): its definition is this one, so the
migration keeps it and its rows as they are, and creates it where it is missing.

``idempotency_keys`` (ADR 0029) is in version 6 too, created where it is missing (every open runs the schema):
a table added, nothing changed, so files of the versions before it read as before. A key row is written in the
transaction of its stream's row (:class:`_Open`); its request id is stored as JSON (a string or an integer). Rows
are numbered by the store in the order keys are recorded, and no index is on the key itself: a random key would put
each new row (or index entry) on a random page, so that a commit of 16 keys wrote ~16 scattered pages (ADR 0017's
lesson for streams). A key is found through the store's in-memory index of live keys (:class:`.held.HeldKeys`,
read from the table at open), which names its row. A file whose table is keyed by (principal, key), as it was
first, has its rows copied into the numbered table when it is opened (:data:`_NUMBER_KEYS`).

Schema 7: a keyed stream's row says until when its keys keep it (``kept_until``: the latest expiry of its keys,
0 for none), which retention reads, and the key table has no index by stream. Version 6 found a stream's live keys
through an index on the key rows' stream: a random stream key put each new entry on a random page, so a commit of
16 keyed calls wrote ~16 scattered pages again (measured: a keyed call 10-30 us more of the writer's CPU, growing
with the table). Version 6 files gain the column, set from their keys, when opened (:data:`_MIGRATE_FROM_6`)."""
_MIGRATE_FROM_6 = """
ALTER TABLE streams ADD COLUMN kept_until REAL NOT NULL DEFAULT 0;
UPDATE streams SET kept_until = (SELECT max(k.expires) FROM idempotency_keys AS k WHERE k.stream = streams.stream)
    WHERE stream IN (SELECT stream FROM idempotency_keys);
DROP INDEX IF EXISTS idempotency_keys_by_stream;
"""
"""A file of a version before 7 whose ``streams`` lacks ``kept_until`` (3 to 6; 1 and 2 are rebuilt whole)."""
_NUMBER_KEYS = """
DROP INDEX IF EXISTS idempotency_keys_by_expiry;
DROP INDEX IF EXISTS idempotency_keys_by_stream;
ALTER TABLE idempotency_keys RENAME TO idempotency_keys_unnumbered;
{schema}
INSERT INTO idempotency_keys (issuer, subject, client_id, key, tool, arguments_hash, stream, request_id, created,
    expires) SELECT * FROM idempotency_keys_unnumbered ORDER BY created;
DROP TABLE idempotency_keys_unnumbered;
"""
"""The first layout of ``idempotency_keys`` (keyed by principal and key) made numbered (see :data:`_SCHEMA`)."""
_MIGRATE_FROM_1 = (
    "ALTER TABLE streams ADD COLUMN completed_at REAL; UPDATE streams SET completed_at = {now} WHERE completed;"
)
"""Version 1 had no completion times: its completed streams count as completed when the file is opened."""
_MIGRATE_FROM_2 = """
DROP INDEX IF EXISTS streams_by_session;
DROP INDEX IF EXISTS completed_streams_by_session;
ALTER TABLE streams RENAME TO streams_v2;
ALTER TABLE events RENAME TO events_v2;
{schema}
INSERT INTO streams (stream, session_id, kind, owner, requests, last_seq, first_seq, completed, answered, completed_at)
    SELECT stream, session_id, kind, owner, requests, last_seq, first_seq, completed, answered, completed_at
    FROM streams_v2;
INSERT INTO events SELECT s.id, e.seq, e.event_id, e.request_id, e.tool, e.resources, e.data, e.terminal
    FROM events_v2 AS e JOIN streams AS s ON s.stream = e.stream;
DROP TABLE events_v2;
DROP TABLE streams_v2;
"""
"""Versions 1 and 2 keyed streams and events by the stream key: rebuilt in schema 4's tables, in one transaction
(events of no stream, which a version-2 store never left, are dropped)."""
_MIGRATE_FROM_3 = "DROP INDEX IF EXISTS streams_by_session;"
"""Version 3 had schema 4's tables with one index by (session, completion time); version 4 one by session: both
replaced by ``session_streams``, which the first indexing fills with every stream."""
_NOT_KEPT = "kept_until <= ?5"
"""No live idempotency key names the stream (?5: now): else it is kept past its session's count as past its age
(ADR 0029)."""
_SESSION_STREAMS = (
    "SELECT stream_id FROM session_streams WHERE session_id = ?1"
    " UNION ALL SELECT id FROM streams WHERE id > ?2 AND session_id = ?1"
)
"""The ids of a session's streams (?1), indexed or above ``indexed_through`` (?2); stale entries name no stream."""
_INDEX_EVERY = 2000
"""Streams opened after which the writer indexes them by session: bounds the range a session's deletion scans."""
_INSERT_STREAM = (
    "INSERT {conflict} INTO streams VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, CASE WHEN ?9 THEN ?11 END, ?12)"
)
"""A stream's row as it opens: ``OR IGNORE`` first, since a new key (nearly always: keys are random) needs no
deletion of an old stream's events; ``OR REPLACE`` after those are deleted when a key existed. The completion
time is given always and kept only for a completed stream: a ``None`` parameter costs an adapter lookup."""
_SAME_REQUEST = "request_id IS ?1 AND tool IS ?2 AND resources = ?3"
_READ_EVENTS = (
    f"SELECT CASE WHEN {_SAME_REQUEST} AND NOT terminal THEN event_id END, data"
    " FROM events WHERE stream_id = ?4 AND seq > ?5 ORDER BY seq"
)
"""A replay's rows: id and payload of each progress event of the first event's request (its id, tool and tags given
as ?1-?3); no id for any other event, whose columns :data:`_READ_AT` reads (an answer; another request's)."""
_READ_AT = (
    "SELECT seq, event_id, request_id, tool, resources, terminal FROM events"
    " WHERE stream_id = ? AND seq IN (SELECT value FROM json_each(?))"
)
"""The other rows of a replay, by position (a JSON list): each a lookup in the primary key, not another scan."""
DEFAULT_MAX_BYTES = 4 * 1024**3
"""The file's default bound (4 GiB): 64 principals at their ``stored_bytes_per_principal`` default."""
_MIN_MAX_BYTES = 1024 * 1024
"""A smaller bound leaves no room for the schema and a session's first writes."""
_ALL = 2**62
"""A position above every stream's (``_HELD_BELOW`` with it counts a stream's every event)."""
_HELD_BELOW = (
    f"SELECT coalesce(sum(length(data)), 0) + count(*) * {ROW_BYTES} FROM events WHERE stream_id = ? AND seq < ?"
)
"""What a stream's events below a position count in the store's counts (what a trim or retention releases)."""
_JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
"""Bytes the WAL file is truncated to after a checkpoint resets it (else it keeps its high-water size)."""
_SWEEP_CHUNK = 500
"""Streams one retention transaction deletes at most: a sweep never holds queued appends up for long."""
_VACUUM_PAGES = 2048
"""Free pages one incremental vacuum returns to the file system at most (8 MiB with 4 KiB pages)."""
_CHECKPOINT_EVERY = 100
"""Transactions between background checkpoints (a batch of appends is one transaction)."""
_BATCH_LIMIT = 4096
"""Queued operations after which a transaction takes no more loop turns' work: bounds the latency one batch adds
to the next."""
_HAND_OVER_AT = 64
"""Queued operations (each event of a :class:`_Run` one) handed to the thread at once, whether or not more keep
coming: a tool reporting progress in a tight loop queues 16 a turn, and its events are committed while it goes on,
not all once it must wait for them."""
_BUSY_TIMEOUT_MS = 2000
"""How long a write waits for another process's lock on the file before the store reports itself unavailable."""


class _Checkpointer:
    """Copies the WAL into the database file on its own thread, so the writer rarely waits for the fsyncs.

    A PASSIVE checkpoint takes no writer lock and sqlite3 releases the GIL while it runs. It cannot
    restart the WAL under a steady stream of appends (measured: 200 MB after 20,000 appends), so the
    writer keeps SQLite's own auto-checkpoint as the backstop that does; by then this thread has copied
    and synced most frames. A failed attempt only leaves more for the next one; the WAL is replayed on
    open either way.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None)
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    continue
        finally:
            conn.close()


def _text(value: Any) -> str:
    """JSON as TEXT, so the database stays readable with the ``sqlite3`` shell."""
    return orjson.dumps(value).decode()


_Append = tuple[StoredEvent, bool, "asyncio.Future[None]"]
"""A queued append: the event, whether it completes its stream, its future. A plain tuple: an object per event
(its ``__init__`` a Python frame) cost more than the batch's own work for it."""


class _Run:
    """Progress events of one stream queued one after another (:meth:`SqliteStore.enqueue`: a tool reporting in a
    loop), sharing one future: the writer takes them as one operation (:meth:`_Batch.add_run`), and the loop adds
    each to the run and to its session's queued count (``queued``, :meth:`HeldBytes.queue`) without a lookup. Made
    from the queued append of the first when the second comes."""

    __slots__ = ("events", "future", "queued", "session", "size", "stream")

    def __init__(self, first: _Append, size: int, queued: QueuedBytes | None) -> None:
        event, _completes, future = first
        self.events = [event]
        self.future = future
        self.stream = event.stream
        self.session = event.session_id
        self.size = size
        """What the events count (payload and :data:`ROW_BYTES` each): what lands when the writer is done with them."""
        self.queued = queued
        """The session's queued count (``None``: a session the counts were never told of)."""


_UNREAD: Any = object()
"""A stream a batch has not read its row of yet (``None``: read, and there is none)."""


class _Open:
    """A queued :meth:`SqliteStore.open_stream`: part of the batch's appends, so a call's stream record and its
    answer arriving in one batch cost one row write and no read."""

    __slots__ = ("future", "keys", "record", "requests", "session")

    def __init__(
        self,
        record: StreamRecord,
        future: asyncio.Future[None],
        keys: Sequence[tuple[Any, ...]] = (),
        requests: str | None = None,
        session: SessionRecord | None = None,
    ) -> None:
        self.record = record
        self.future = future
        self.keys = keys
        """The rows of its idempotency keys (made by :meth:`SqliteStore.enqueue_open`)."""
        self.requests = requests
        """The record's requests encoded (:func:`encode_requests`) when the loop did so already, for the key
        journal: not encoded twice."""
        self.session = session
        """The stream's session, stored in the same transaction (a task's stream, its own session)."""


class _Call:
    """A queued write (``write=True``: inside the batch's transaction) or read (after its commit)."""

    __slots__ = ("fn", "future", "write")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], write: bool, future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.write = write
        self.future = future


class _Settle(_Call):
    """A queued write whose event is appended in the same transaction when the write says so (the second value of
    what it returns): a task's outcome and its outcome event in one commit, the event only if the outcome was the
    one stored (:meth:`SqliteStore.run_write_appending`)."""

    __slots__ = ("completes", "event")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], tuple[Any, bool]],
        future: asyncio.Future[Any],
        event: StoredEvent,
        completes: bool,
    ) -> None:
        super().__init__(fn, True, future)
        self.event = event
        self.completes = completes


_Op = _Append | _Run | _Open | _Call
_RECOVER_KEY = "INSERT OR IGNORE INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
"""A journaled key's row (made by :meth:`SqliteStore.enqueue_open`), unless its transaction committed it after
all. (A key is otherwise inserted plainly: the decision to run it was taken on finding none live,
:mod:`..core.idempotency`; a row left of the same key is expired, and the sweep deletes it.)"""


_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


def _future_of(op: _Op) -> asyncio.Future[Any]:
    return op[2] if isinstance(op, tuple) else op.future


class _StreamState:
    """A stream's row as a batch of appends changes it; written back once per batch.

    ``opened``: the stream's record as a queued :meth:`SqliteStore.open_stream` gave it (the row is written whole
    then, and the stream's old events, if the key existed, deleted first). The answered ids are decoded on the
    first answer of the batch and encoded once when written: per answer, a batch of many would be quadratic.
    """

    __slots__ = (
        "answered",
        "answered_text",
        "completes",
        "first_seq",
        "held",
        "kept_until",
        "last_seq",
        "opened",
        "requests",
        "session",
        "stream_id",
        "trimmed",
    )

    def __init__(
        self,
        stream_id: int,
        first_seq: int,
        last_seq: int,
        answered_text: str,
        opened: StreamRecord | None = None,
        requests: str | None = None,
    ) -> None:
        self.stream_id = stream_id
        """The row's integer id, which keys its events (schema 3)."""
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.answered_text = answered_text
        self.answered: dict[RequestId, None] | None = None
        """The ids once one is added: insertion-ordered, and a membership test costs no scan."""
        self.opened = opened
        self.requests = requests
        """``opened``'s requests encoded, when its :class:`_Open` came with them."""
        self.kept_until = 0.0
        """Opened with idempotency keys: the latest of their expiries (written with the row)."""
        self.completes = False
        self.trimmed = False
        self.session = ""
        """The stream's session: what its appended and trimmed events count for (set with the first append)."""
        self.held = 0
        """Bytes the batch's appends to the stream add to its session's count: summed per stream, applied to the
        batch's ``held`` once per flush, not per event."""

    def answer(self, request_id: RequestId) -> None:
        answered = self.answered
        if answered is None:
            answered = self.answered = dict.fromkeys(orjson.loads(self.answered_text))
        answered[request_id] = None

    def answered_json(self) -> str:
        return self.answered_text if self.answered is None else _text(list(self.answered))


class _Batch:
    """The appends of one transaction, gathered per stream, then written with a few statements (one per kind of
    write, the events in rows of :data:`_ROWS_PER_INSERT`)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        limit: int | None,
        now: float,
        tag_texts: dict[frozenset[str], str],
        next_id: int,
    ) -> None:
        self.db = db
        self.limit = limit
        self.now = now
        self.tag_texts = tag_texts
        self.rows: list[tuple[Any, ...]] = []
        self.states: dict[str, _StreamState | None] = {}
        self.next_id = next_id
        """The id the next stream opened in this transaction gets; ids only grow, so a new stream's row and events
        go at the end of their tables. The store carries it from one transaction to the next (it owns the file),
        so the largest id is read once, when the file is opened."""
        self.request_id: RequestId | None = None
        self.request_id_text: str | None = None
        """The last request id encoded: a request's events carry the same id object, encoded once."""
        self.keys: list[tuple[Any, ...]] = []
        """The idempotency keys' rows of the streams opened (made by :meth:`SqliteStore.enqueue_open`), written with
        one statement."""
        self.held: dict[str, int] = {}
        """Bytes this transaction adds to (or, trimming, takes from) each session's count in the store's
        :class:`~.held.HeldBytes`: applied once it committed, so a rolled-back batch counts nothing."""

    def add(self, event: StoredEvent, completes: bool) -> BaseException | None:
        """Record the append's writes, or return why it is refused (nothing of it is written then)."""
        _session, key, seq, event_id, data, request_id, tool, resources, terminal = event  # one unpack, not 9 lookups
        states = self.states
        state = states.get(key, _UNREAD)
        if state is _UNREAD:
            found = self.db.execute(
                "SELECT id, first_seq, last_seq, answered FROM streams WHERE stream = ?", (key,)
            ).fetchone()
            state = states[key] = None if found is None else _StreamState(*found)
            if state is not None:
                state.session = _session
        if state is None:
            return KeyError(f"append to unknown stream {key}")
        if seq != state.last_seq + 1:
            if seq <= state.last_seq and self._holds(state, event):
                return None  # a retry of a stored append (its outcome was lost to a cancel): already done
            return ValueError(f"append of position {seq} to stream {key} after {state.last_seq}")
        tag_texts = self.tag_texts
        tags = tag_texts.get(resources)
        if tags is None:
            if len(tag_texts) >= CACHE_LIMIT:
                tag_texts.clear()
            tags = tag_texts[resources] = encode_tags(resources).decode()
        if request_id is not self.request_id:  # a request's events carry the same id object: encoded once
            self.request_id = request_id
            self.request_id_text = None if request_id is None else _text(request_id)
        # The payload goes as a bytearray: sqlite3 binds int, float, str and bytearray as they are but looks for an
        # adapter for anything else, bytes included (some 3,000 instructions per event); copying a payload costs
        # less, and registering an adapter for bytes would change every sqlite3 user in the process.
        blob = bytearray(data)
        self.rows.append((state.stream_id, seq, event_id, self.request_id_text, tool, tags, blob, 1 if terminal else 0))
        state.held += len(data) + ROW_BYTES
        state.last_seq = seq
        if terminal and request_id is not None:
            state.answer(request_id)
        if completes:
            state.completes = True
        limit = self.limit
        if limit is not None and seq - limit + 1 > state.first_seq:
            state.first_seq = seq - limit + 1
            state.trimmed = True
        return None

    def add_run(self, events: list[StoredEvent]) -> BaseException | None:
        """:meth:`add` of each of ``events`` (a :class:`_Run`: progress of one stream, none terminal), and why the last
        refused one was refused. After the first, each event that follows its request's previous one at the next
        position is written with what that one looked up (the stream's row, the tags, the request id's text) in a
        loop of its own: a Python call and half a dozen lookups per event fewer. Any other goes through :meth:`add`."""
        error = self.add(events[0], False)
        state = self.states.get(events[0].stream)
        if error is not None or state is None:  # refused, or written through a flush: each on its own
            index = 1
        else:
            rows = self.rows
            stream_id = state.stream_id
            resources_0 = events[0].resources
            tags = self.tag_texts[resources_0]
            request_id = self.request_id
            request_text = self.request_id_text
            last_seq = state.last_seq
            held = 0
            index = len(events)
            for position in range(1, index):
                _session, _key, seq, event_id, data, event_request, tool, resources, terminal = events[position]
                if terminal or seq != last_seq + 1 or event_request is not request_id or resources is not resources_0:
                    index = position
                    break
                # A bytearray, as in :meth:`add` (sqlite3 binds one without an adapter lookup).
                rows.append((stream_id, seq, event_id, request_text, tool, tags, bytearray(data), 0))
                held += len(data) + ROW_BYTES
                last_seq = seq
            state.last_seq = last_seq
            state.held += held
            limit = self.limit
            if limit is not None and last_seq - limit + 1 > state.first_seq:
                state.first_seq = last_seq - limit + 1
                state.trimmed = True
        for event in events[index:]:
            refused = self.add(event, False)
            if refused is not None:
                error = refused
        return error

    def open(self, op: _Open) -> None:
        """Start ``op``'s stream afresh: its row is written with this batch's appends to it."""
        record = op.record
        if record.stream in self.states:  # appends to the old stream in this batch: write them before it restarts
            self.flush()
        stream_id = self.next_id
        self.next_id = stream_id + 1
        state = self.states[record.stream] = _StreamState(stream_id, 0, record.last_seq, "", record, op.requests)
        state.session = record.session_id
        state.answered = dict.fromkeys(record.answered)  # encoded once, when the row is written
        state.completes = record.completed
        if op.keys:
            self.keys += op.keys
            state.kept_until = op.keys[0][-1] if len(op.keys) == 1 else max(row[-1] for row in op.keys)
        self.held[record.session_id] = self.held.get(record.session_id, 0) + STREAM_BYTES

    def _holds(self, state: _StreamState, event: StoredEvent) -> bool:
        self.flush()  # rows gathered so far may hold it
        found = self.db.execute(
            "SELECT event_id, data FROM events WHERE stream_id = ? AND seq = ?", (state.stream_id, event.seq)
        ).fetchone()
        return found is not None and tuple(found) == (event.event_id, event.data)

    def flush(self) -> None:
        """Write what was gathered; the cache is dropped, since other writes may change streams next."""
        db = self.db
        now = self.now
        opened: list[tuple[Any, ...]] = []
        updated: list[tuple[Any, ...]] = []
        trimmed: list[tuple[int, int]] = []
        held = self.held
        for key, state in self.states.items():
            if state is None:
                continue
            if state.held:
                held[state.session] = held.get(state.session, 0) + state.held
            if state.trimmed:
                trimmed.append((state.stream_id, state.first_seq))
            record = state.opened
            completes = int(state.completes)  # an int: sqlite3 binds a bool (or None) through its adapter lookup
            if record is not None:
                opened.append(
                    (
                        state.stream_id,
                        key,
                        record.session_id,
                        "post" if record.kind is StreamKind.POST else record.kind.value,  # no enum property call
                        record.owner,
                        state.requests or encode_requests(record.requests).decode(),
                        state.last_seq,
                        state.first_seq,
                        completes,
                        state.answered_json(),
                        now,
                        state.kept_until,
                    )
                )
                continue
            updated.append((state.last_seq, state.first_seq, state.answered_json(), completes, now, state.stream_id))
        if opened:
            changes = db.total_changes
            db.executemany(_INSERT_STREAM.format(conflict="OR IGNORE"), opened)
            if db.total_changes - changes != len(opened):  # a key that exists starts afresh: its old events go
                db.executemany(
                    "DELETE FROM events WHERE stream_id = (SELECT id FROM streams WHERE stream = ?)",
                    [(row[1],) for row in opened],
                )
                db.executemany(_INSERT_STREAM.format(conflict="OR REPLACE"), opened)
        if self.rows:
            _insert_rows(db, "events", self.rows)
            self.rows = []
        if self.keys:
            _insert_rows(db, "idempotency_keys", self.keys)
            self.keys = []
        if trimmed:
            for state in self.states.values():
                if state is not None and state.trimmed:
                    held[state.session] = (
                        held.get(state.session, 0)
                        - db.execute(_HELD_BELOW, (state.stream_id, state.first_seq)).fetchone()[0]
                    )
            db.executemany("DELETE FROM events WHERE stream_id = ? AND seq < ?", trimmed)
        if updated:
            db.executemany(
                "UPDATE streams SET last_seq = ?1, first_seq = ?2, answered = ?3, completed = completed OR ?4,"
                " completed_at = CASE WHEN ?4 AND completed_at IS NULL THEN ?5 ELSE completed_at END WHERE id = ?6",
                updated,
            )
        self.states = {}


class SqliteStore:
    """The :class:`~mcp_lossless.stores.base.EventStore` on one SQLite file, owned by one server process."""

    shared = False

    PARAMETERS: ClassVar[dict[str, type]] = {
        "retention_seconds": float,
        "max_completed_streams_per_session": int,
        "max_events_per_stream": int,
        "sweep_seconds": float,
        "max_bytes": int,
    }
    """Settings a ``sqlite:PATH?name=value&...`` spec may carry."""

    def __init__(
        self,
        path: str,
        *,
        retention_seconds: float = 3600,
        max_completed_streams_per_session: int = 1000,
        max_events_per_stream: int | None = None,
        sweep_seconds: float = 30,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``retention_seconds``: how long a completed stream is kept; ``max_completed_streams_per_session``: how
        many completed streams each session keeps at most (the newest); both are enforced by a sweep every
        ``sweep_seconds``, which also returns free pages to the file system. ``max_events_per_stream``: a
        length cap applied on append (``None``: none). ``max_bytes``: the most the database file may grow to
        (SQLite's ``max_page_count``; ``None``: no bound): a write past it fails with :class:`StoreFull` until
        retention or a deletion frees pages. ``clock``: wall-clock seconds (a test's is injected)."""
        if max_events_per_stream is not None and max_events_per_stream < 1:
            raise ValueError("max_events_per_stream must be at least 1")
        if max_bytes is not None and max_bytes < _MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {_MIN_MAX_BYTES}")
        if retention_seconds <= 0 or sweep_seconds <= 0 or max_completed_streams_per_session < 1:
            raise ValueError("retention_seconds, sweep_seconds and max_completed_streams_per_session must be positive")
        self.path = path
        self.retention_seconds = retention_seconds
        self.max_completed_streams_per_session = max_completed_streams_per_session
        self.max_events_per_stream = max_events_per_stream
        self.sweep_seconds = sweep_seconds
        self.max_bytes = max_bytes
        self._clock = clock
        self._counts = HeldBytes()
        self._held_keys = HeldKeys()
        self.stored_bytes: Callable[[Principal], int] = self._counts.reader(self._held_keys, clock)
        """:meth:`~.base.EventStore.stored_bytes`: the events, streams and live keys counted in process memory, as one
        function (asked on every POST, answer and progress event)."""
        self._next_key_row = 1
        """The number the next idempotency key's row gets (read from the file at open): rows in recording order."""
        self.keys_durable_when_queued = path != ":memory:"
        self._journal: KeyJournal | None = None
        """Where a keyed stream's record is made durable before its call starts (:mod:`.key_journal`)."""
        self._unstored: dict[tuple[Principal, str], KeyRecord] = {}
        self._journaling: deque[tuple[asyncio.Future[None], Segment, Sequence[KeyRecord]]] = deque()
        """Journaled records in queue order, each with its segment and keys, until its write settled: settled by
        :meth:`_journaled` after each batch's outcomes, on the loop (no done callback per call: its partial, its
        scheduling and its frame were ~5,000 instructions a keyed call)."""
        """Keys journaled whose transaction failed: still known (their stream is not: "outcome gone") until the next
        open inserts them from the journal."""
        """What each principal's sessions hold in the file (writer thread only, but for :meth:`stored_bytes`)."""
        self._forgotten: list[str] = []
        """Sessions the writer's transaction deletes: their counts go from its counts once it committed."""
        self._released: list[tuple[str, int]] = []
        """Sessions the writer's transaction deletes whose keyed streams stay: what goes, once it committed."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[list[_Op] | None] = queue.SimpleQueue()
        """Work for the writer thread, in order, a loop turn's worth at a time; ``None`` asks it to finish. A C queue:
        putting wakes a waiting thread for a fraction of what a ``threading.Event`` costs (~13 us CPU per round trip,
        loop to thread and back, measured, against ~25)."""
        self._pending: list[_Op] = []
        """Work queued since the last hand-over, given to the thread as one item (:meth:`_gather`): a tool reporting
        progress in a loop, or many calls answered over a few turns, wake the thread once, not once each."""
        self._last_queued: QueuedBytes | None = None
        """The count (:meth:`HeldBytes.queue`) the last :meth:`enqueue` added to: the session of ``_pending``'s last
        append when it is one (only :meth:`enqueue` queues them), which a :class:`_Run` made of it takes on."""
        self._queued_ops = 0
        """What ``_pending`` holds, each event of a run counted (what :meth:`_gather` weighs)."""
        self._gathered = 0
        """How many of ``_queued_ops`` the last look of :meth:`_gather` found."""
        self._thread: threading.Thread | None = None
        self._next_sweep = 0.0
        """When the writer thread sweeps next (``time.monotonic``); a deleted session's pages bring it forward."""
        self._secret: bytes | None = None
        self._interner = Interner()
        self._tag_texts: dict[frozenset[str], str] = {}
        """Encoded tag sets by set: events of one tool share one. Both used on the writer thread only."""
        self._next_stream_id = 0
        """The id the next stream opened gets (read when the file is opened; writer thread only)."""
        self._indexed_through = 0
        """The largest stream id ``session_streams`` holds every stream up to (writer thread only)."""

    @classmethod
    def from_spec(cls, spec: str) -> SqliteStore:
        """``PATH[?retention_seconds=S&max_completed_streams_per_session=N&max_events_per_stream=N&sweep_seconds=S
        &max_bytes=N]`` (``max_bytes`` and ``max_events_per_stream`` take ``none``)."""
        path, _, query = spec.partition("?")
        if not path:
            raise ValueError("sqlite store: the spec names no file (sqlite:PATH)")
        settings: dict[str, Any] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            kind = cls.PARAMETERS.get(name)
            if kind is None:
                raise ValueError(f"sqlite store: unknown setting {name!r} (known: {', '.join(cls.PARAMETERS)})")
            if name in ("max_events_per_stream", "max_bytes") and value.lower() in ("", "none", "0"):
                settings[name] = None
                continue
            try:
                settings[name] = kind(value)
            except ValueError:
                raise ValueError(f"sqlite store: {name}={value!r} is not a valid {kind.__name__}") from None
        return cls(path, **settings)

    # -- lifecycle -----------------------------------------------------------------------------------

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[bytes] = loop.create_future()
        self._loop = loop
        self._thread = threading.Thread(target=self._run, args=(opened,), name="sqlite-store", daemon=True)
        self._thread.start()
        try:
            self._secret = await opened
        except BaseException:
            self._loop = self._thread = None
            raise
        if self.keys_durable_when_queued:
            self._journal = KeyJournal(self.path, 0)  # the thread read and removed the segments left before

    async def close(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._hand_over()
        self._queue.put(None)
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0)  # the last batch's outcomes, handed to the loop, settle (and settle their journal)
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self._loop = self._thread = None

    def _run(self, opened: asyncio.Future[bytes]) -> None:
        """The writer thread: open the file, then serve batches until asked to finish."""
        loop = opened.get_loop()
        try:
            db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=True, cached_statements=_CACHED_STATEMENTS
            )
            try:
                secret = self._initialize(db)
            except BaseException:
                db.close()
                raise
        except Exception as exc:
            failure: Exception = exc
            if isinstance(exc, sqlite3.DatabaseError):
                failure = StoreUnavailable(f"cannot open sqlite store {self.path!r}: {exc}")
            failed: list[_Outcome] = [(opened, None, failure)]
            loop.call_soon_threadsafe(_settle, failed)
            return
        ready: list[_Outcome] = [(opened, secret, None)]
        loop.call_soon_threadsafe(_settle, ready)
        checkpointer = _Checkpointer(self.path)
        commits = 0
        work = self._queue
        self._next_sweep = time.monotonic() + self.sweep_seconds
        try:
            while True:
                try:
                    first = work.get(timeout=max(0.0, self._next_sweep - time.monotonic()))
                except queue.Empty:
                    self._sweep_quietly(db)
                    continue
                batch: list[_Op] = []
                turn: list[_Op] | None = first
                while turn is not None:
                    batch += turn
                    if len(batch) >= _BATCH_LIMIT:
                        break
                    try:
                        turn = work.get_nowait()
                    except queue.Empty:
                        break
                if batch and self._serve(db, batch, loop):
                    commits += 1
                    if commits % _CHECKPOINT_EVERY == 0:
                        checkpointer.wake()
                    if self._next_stream_id - self._indexed_through > _INDEX_EVERY:
                        self._index_quietly(db)
                if turn is None:  # close(): everything queued before it was served just now
                    return
                if time.monotonic() >= self._next_sweep:  # a busy store sweeps between batches
                    self._sweep_quietly(db)
        finally:
            checkpointer.stop()
            db.close()

    def _initialize(self, db: sqlite3.Connection) -> bytes:
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file; an old one is vacuumed below
        if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
            raise sqlite3.DatabaseError("the file system does not support a WAL journal")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        db.execute(f"PRAGMA journal_size_limit={_JOURNAL_SIZE_LIMIT}")
        if self.max_bytes is not None:  # a file larger already keeps its size: SQLite never sets it below that
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            db.execute(f"PRAGMA max_page_count={self.max_bytes // page_size}")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, 2, 3, 4, 5, 6, _SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {version}, expected {_SCHEMA_VERSION}")
        script = _SCHEMA
        columns = [row[1] for row in db.execute("PRAGMA table_info(idempotency_keys)")]
        if columns and "id" not in columns:
            script = _NUMBER_KEYS.format(schema=_SCHEMA)
        if version in (3, 4):
            script = _MIGRATE_FROM_3 + script
        if version in (1, 2):
            script = _MIGRATE_FROM_2.format(schema=_SCHEMA)
        if version == 1:
            script = _MIGRATE_FROM_1.format(now=repr(self._clock())) + script
        stream_columns = [row[1] for row in db.execute("PRAGMA table_info(streams)")]
        if version not in (1, 2) and stream_columns and "kept_until" not in stream_columns:
            script += _MIGRATE_FROM_6
        db.executescript(f"BEGIN IMMEDIATE;{script}PRAGMA user_version={_SCHEMA_VERSION};COMMIT;")
        if db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # a file made before page reuse was configured
            db.execute("VACUUM")
        db.execute("INSERT OR IGNORE INTO meta VALUES ('secret', ?)", (os.urandom(32),))
        secret: bytes = db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()[0]
        found = db.execute("SELECT value FROM meta WHERE key = 'indexed_through'").fetchone()
        self._indexed_through = 0 if found is None else int(found[0])
        if self.keys_durable_when_queued:
            self._recover_journal(db)
        # Ids never go back, not even across restarts after the streams with the largest ones were deleted: an id
        # at or below indexed_through would never be indexed.
        self._next_stream_id = (
            max(db.execute("SELECT coalesce(max(id), 0) FROM streams").fetchone()[0], self._indexed_through) + 1
        )
        self._index_sessions(db)
        self._count_held(db)
        return secret

    def _recover_journal(self, db: sqlite3.Connection) -> None:
        """Insert the keys and stream records a previous process journaled and did not commit (a crash, a failed
        transaction), in one transaction, then delete its segments. A stream inserted so has no answer: its key is
        answered as execution lost (its owner is gone), as a run killed after its commit is."""
        leftovers = KeyJournal.leftovers(self.path)
        if not leftovers:
            return
        now = self._clock()
        first = max(db.execute("SELECT coalesce(max(id), 0) FROM streams").fetchone()[0], self._indexed_through) + 1
        db.execute("BEGIN IMMEDIATE")
        try:
            next_id = first
            for segment in leftovers:
                for stream, session_id, kind, owner, requests, keys in KeyJournal.read(segment):
                    if all(row[-1] <= now for row in keys):
                        continue  # every key of it expired: nothing to answer for
                    kept = max(row[-1] for row in keys)
                    row = (next_id, stream, session_id, kind, owner, requests, 0, 0, 0, "[]", now, kept)
                    if db.execute(_INSERT_STREAM.format(conflict="OR IGNORE"), row).rowcount:
                        next_id += 1
                    db.executemany(_RECOVER_KEY, keys)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        for segment in leftovers:
            segment.unlink()

    def _count_held(self, db: sqlite3.Connection) -> None:
        """Count from the file: every session's principal, streams and events (one scan, at open)."""
        counts = self._counts
        for session_id, issuer, subject, client_id in db.execute(
            "SELECT session_id, issuer, subject, client_id FROM sessions"
        ):
            counts.bind(session_id, Principal(issuer, subject, client_id))
        for session_id, issuer, subject, client_id in db.execute(  # keyed streams no session holds (2026-07-28)
            "SELECT s.session_id, k.issuer, k.subject, k.client_id FROM idempotency_keys AS k"
            " JOIN streams AS s ON s.stream = k.stream WHERE s.session_id = s.stream"
        ):
            counts.bind(session_id, Principal(issuer, subject, client_id))
        for session_id, held in db.execute(
            f"SELECT session_id, count(*) * {STREAM_BYTES} FROM streams GROUP BY session_id"
        ):
            counts.add(session_id, held)
        for session_id, held in db.execute(
            f"SELECT s.session_id, sum(length(e.data)) + count(*) * {ROW_BYTES}"
            " FROM events AS e JOIN streams AS s ON s.id = e.stream_id GROUP BY s.session_id"
        ):
            counts.add(session_id, held)
        keys = self._held_keys
        for row, issuer, subject, client_id, key, expires in db.execute(
            "SELECT id, issuer, subject, client_id, key, expires FROM idempotency_keys WHERE expires > ? ORDER BY id",
            (self._clock(),),
        ):
            keys.add(Principal(issuer, subject, client_id), key, expires, row)
        self._next_key_row = db.execute("SELECT coalesce(max(id), 0) FROM idempotency_keys").fetchone()[0] + 1

    def _index_sessions(self, db: sqlite3.Connection) -> None:
        """Enter the streams opened since the last indexing in ``session_streams``, in one transaction."""
        top = db.execute("SELECT coalesce(max(id), 0) FROM streams").fetchone()[0]
        if top <= self._indexed_through:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT OR IGNORE INTO session_streams SELECT session_id, id FROM streams WHERE id > ? AND id <= ?",
                (self._indexed_through, top),
            )
            db.execute("INSERT OR REPLACE INTO meta VALUES ('indexed_through', ?)", (top,))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._indexed_through = top

    # -- the writer thread's batches -------------------------------------------------------------------

    def _serve(self, db: sqlite3.Connection, batch: list[_Op], loop: asyncio.AbstractEventLoop) -> bool:
        """Run one batch: its writes in one transaction, then its reads; hand the outcomes to the loop.

        Returns whether a transaction committed. When the file cannot be written now (locked by another
        process, disk full, I/O error) every write of the batch fails with :class:`StoreUnavailable`; any other
        failure (a bug) has each write retried alone, so the one that cannot be done does not take the others
        down.
        """
        writes = [op for op in batch if not isinstance(op, _Call) or op.write]
        outcomes: list[_Outcome] = []
        committed = False
        if writes:
            try:
                outcomes = self._transaction(db, writes)
                committed = True
            except Exception as exc:
                if len(writes) == 1 or isinstance(exc, sqlite3.OperationalError):  # the file cannot be written now
                    failure = self._failure(exc)
                    outcomes = [(_future_of(op), None, failure) for op in writes]
                else:
                    outcomes = []
                    for op in writes:
                        try:
                            outcomes += self._transaction(db, [op])
                            committed = True
                        except Exception as alone:
                            outcomes.append((_future_of(op), None, self._failure(alone)))
        landed: dict[str, int] = {}
        for op in batch:  # one pass: the reads, and what the appends queued (written or failed, it has landed)
            if type(op) is _Run:
                landed[op.session] = landed.get(op.session, 0) + op.size
            elif type(op) is tuple:
                event = op[0]
                landed[event.session_id] = landed.get(event.session_id, 0) + len(event.data) + ROW_BYTES
            elif isinstance(op, _Call) and not op.write:
                try:
                    outcomes.append((op.future, op.fn(db), None))
                except Exception as exc:  # EventsEvicted, sqlite3 errors, bugs: the awaiting task raises them
                    outcomes.append((op.future, None, self._failure(exc)))
            elif type(op) is _Settle:
                event = op.event
                landed[event.session_id] = landed.get(event.session_id, 0) + len(event.data) + ROW_BYTES
        loop.call_soon_threadsafe(self._land, outcomes, landed)
        return committed

    def _land(self, outcomes: list[_Outcome], landed: dict[str, int]) -> None:
        """On the loop: a batch's appends are written (counted by the writer then) or failed; settle them, then
        the journaled records they settled."""
        if landed:
            self._counts.landed(landed)
        _settle(outcomes)
        if self._journaling:
            self._journaled()

    def _transaction(self, db: sqlite3.Connection, writes: list[_Op]) -> list[_Outcome]:
        outcomes: list[_Outcome] = []
        batch = _Batch(db, self.max_events_per_stream, self._clock(), self._tag_texts, self._next_stream_id)
        db.execute("BEGIN IMMEDIATE")
        try:
            add = batch.add
            outcome = outcomes.append
            for op in writes:
                if isinstance(op, tuple):
                    event, completes, future = op
                    outcome((future, None, add(event, completes)))
                elif isinstance(op, _Run):
                    outcome((op.future, None, batch.add_run(op.events)))
                elif isinstance(op, _Open):
                    if op.session is not None:
                        self._put_session(db, op.session)
                    batch.open(op)
                    record = op.record
                    # A 2026-07-28 keyed call's own stream (its own session id) counts for its key's principal; a
                    # legacy POST's session is bound already (not a principal made for every keyed call).
                    if op.keys and record.session_id == record.stream:
                        _row, issuer, subject, client_id, *_rest = op.keys[0]
                        self._counts.bind(record.session_id, Principal(issuer, subject, client_id))
                    outcome((op.future, None, None))
                else:
                    batch.flush()
                    result = op.fn(db)
                    if type(op) is _Settle:  # its event only if the write says so; a refusal is its own outcome
                        value, appending = result
                        result = (value, appending, add(op.event, op.completes) if appending else None)
                    outcome((op.future, result, None))
            batch.flush()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:  # ids a rolled-back transaction gave out are not given again: a gap, never a reuse
            self._next_stream_id = batch.next_id
            forgotten, self._forgotten = self._forgotten, []
            released, self._released = self._released, []
        counts = self._counts
        for session_id, held in batch.held.items():
            counts.add(session_id, held)
        for session_id in forgotten:
            counts.forget(session_id)
        for session_id, held in released:
            counts.add(session_id, -held)
        return outcomes

    def _failure(self, exc: Exception) -> Exception:
        """Locked, I/O error, disk full: the store cannot serve now. Anything else stays itself (a bug, or
        :class:`EventsEvicted` from a read)."""
        if isinstance(exc, sqlite3.OperationalError):
            if exc.sqlite_errorcode == sqlite3.SQLITE_FULL and self.max_bytes is not None:
                return StoreFull(f"sqlite store {self.path!r} is full: it holds its max_bytes={self.max_bytes} ({exc})")
            return StoreUnavailable(f"sqlite store {self.path!r}: {exc}")
        return exc

    def _index_quietly(self, db: sqlite3.Connection) -> None:
        """Index new streams by session; a failure (the file locked, say) leaves them for the next attempt, and a
        session's deletion finds them by their id range meanwhile."""
        with contextlib.suppress(sqlite3.Error):
            self._index_sessions(db)

    def _sweep_quietly(self, db: sqlite3.Connection) -> None:
        """The periodic sweep, and when it is due next; its failure (the file locked, say) only leaves the work
        for the next one."""
        self._index_quietly(db)
        try:
            more = self._sweep(db, self._clock())
        except sqlite3.Error:
            more = False
        self._next_sweep = time.monotonic() + (0 if more else self.sweep_seconds)

    def _sweep(self, db: sqlite3.Connection, now: float) -> bool:
        """One step of retention: delete up to a chunk of completed streams past their age or beyond their
        session's count, with their events, then return free pages. Returns whether more is due at once."""
        aged = db.execute(
            "SELECT session_id, id, session_id = stream FROM streams WHERE completed_at IS NOT NULL"
            " AND completed_at < ?1 AND kept_until <= ?3 LIMIT ?2",
            (now - self.retention_seconds, _SWEEP_CHUNK, now),
        ).fetchall()
        doomed: list[tuple[str, int]] = [(session_id, key) for session_id, key, _alone in aged]
        # 2026-07-28 keyed calls' own session ids (their stream's key): counted only while their stream was kept.
        alone = [session_id for session_id, _key, own in aged if own]
        db.execute("DELETE FROM idempotency_keys WHERE expires <= ?", (now,))  # autocommit: a key kept no longer
        if len(doomed) < _SWEEP_CHUNK:
            keep = self.max_completed_streams_per_session
            crowded = db.execute(
                "SELECT session_id FROM streams INDEXED BY completed_streams WHERE completed_at IS NOT NULL"
                " GROUP BY session_id HAVING count(*) > ?",
                (keep,),
            ).fetchall()
            for (session_id,) in crowded:
                doomed += db.execute(
                    f"SELECT session_id, id FROM streams WHERE id IN ({_SESSION_STREAMS}) AND completed_at IS NOT NULL"
                    f" AND {_NOT_KEPT} ORDER BY completed_at DESC LIMIT ?3 OFFSET ?4",
                    (session_id, self._indexed_through, _SWEEP_CHUNK - len(doomed), keep, now),
                ).fetchall()
                if len(doomed) >= _SWEEP_CHUNK:
                    break
        if doomed:
            released: list[tuple[str, int]] = []
            db.execute("BEGIN IMMEDIATE")
            try:
                for session_id, key in doomed:
                    released.append((session_id, STREAM_BYTES + db.execute(_HELD_BELOW, (key, _ALL)).fetchone()[0]))
                db.executemany("DELETE FROM events WHERE stream_id = ?", [(key,) for _, key in doomed])
                db.executemany("DELETE FROM streams WHERE id = ?", [(key,) for _, key in doomed])
                db.executemany("DELETE FROM session_streams WHERE session_id = ? AND stream_id = ?", doomed)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            for session_id, held in released:
                self._counts.add(session_id, -held)
            for session_id in alone:
                self._counts.forget(session_id)
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        if free:
            db.executescript(f"PRAGMA incremental_vacuum({_VACUUM_PAGES});")  # execute() would free one page
            if free <= _VACUUM_PAGES:  # the last free pages went: the WAL, which holds the moves, can go too
                _truncate_wal(db)
        return len(doomed) >= _SWEEP_CHUNK or free > _VACUUM_PAGES

    async def sweep(self, now: float | None = None) -> None:
        """Index new streams by session and run retention now, to the end (what the writer thread does step by step
        every ``sweep_seconds``)."""

        def sweep(db: sqlite3.Connection) -> None:
            self._index_sessions(db)
            while self._sweep(db, self._clock() if now is None else now):
                pass

        await self._read(sweep)  # a "read": it runs after the batch's commit, in transactions of its own

    # -- queueing from the loop ------------------------------------------------------------------------

    def _submit(self, op: _Op) -> None:
        pending = self._pending
        pending.append(op)
        self._queued_ops += 1
        if len(pending) == 1:
            assert self._loop is not None
            self._gathered = 1
            self._loop.call_soon(self._gather)

    def _gather(self) -> None:
        """Hand the queued work to the thread once a turn of the loop added none to it, or :data:`_HAND_OVER_AT`
        operations are queued: calls from many clients, which arrive a few per turn, then share one transaction
        instead of each waking the thread for a commit of its own (ADR 0023). Work queued alone waits one turn."""
        count = self._queued_ops
        if self._gathered < count < _HAND_OVER_AT:
            self._gathered = count
            assert self._loop is not None
            self._loop.call_soon(self._gather)
            return
        self._hand_over()

    def _hand_over(self) -> None:
        pending = self._pending
        if pending:
            self._pending = []
            self._queued_ops = 0
            self._queue.put(pending)

    def _future(self) -> asyncio.Future[Any]:
        if self._loop is None:
            raise RuntimeError("SqliteStore used before open()")
        return self._loop.create_future()

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        future = self._future()
        self._submit(_Call(fn, True, future))
        return future

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        future = self._future()
        self._submit(_Call(fn, False, future))
        return future

    def run_write(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn`` on the writer thread inside its next transaction; resolves after the commit. For the facets
        that keep their rows in this file (:mod:`.tasks_sqlite`): one connection, one writer, one schema."""
        return self._write(fn)

    def run_write_appending(
        self, fn: Callable[[sqlite3.Connection], tuple[T, bool]], event: StoredEvent, completes: bool
    ) -> asyncio.Future[tuple[T, bool, BaseException | None]]:
        """:meth:`run_write`, and ``event`` appended in the same transaction if ``fn`` says so (its second value): a
        task's outcome and its outcome event in one trip to the writer and one commit, the event only if the outcome
        was stored. Resolves to ``fn``'s value, whether the event was to be appended, and why the store refused it
        (``None``: appended, or not asked)."""
        self._counts.queue(event.session_id, len(event.data) + ROW_BYTES)
        future: asyncio.Future[tuple[T, bool, BaseException | None]] = self._future()
        self._submit(_Settle(fn, future, event, completes))
        return future

    def run_read(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn`` on the writer thread after the batch queued before it committed (it sees those writes)."""
        return self._read(fn)

    # -- the interface -------------------------------------------------------------------------------

    async def secret(self) -> bytes:
        if self._secret is None:
            raise RuntimeError("SqliteStore used before open()")
        return self._secret

    async def put_session(self, record: SessionRecord) -> None:
        await self._write(lambda db: self._put_session(db, record))

    def _put_session(self, db: sqlite3.Connection, record: SessionRecord) -> None:
        """The session's row, and its principal's count (writer thread, inside the caller's transaction)."""
        p = record.principal
        row = (record.session_id, p.issuer, p.subject, p.client_id, record.protocol_version, record.created_at,
               record.last_seen)  # fmt: skip
        db.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        self._counts.bind(record.session_id, p)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        rows = await self._read(
            lambda db: db.execute(
                "SELECT issuer, subject, client_id, protocol_version, created_at, last_seen"
                " FROM sessions WHERE session_id = ?",
                (session_id,),
            ).fetchall()
        )
        if not rows:
            return None
        issuer, subject, client_id, version, created_at, last_seen = rows[0]
        return SessionRecord(session_id, Principal(issuer, subject, client_id), version, created_at, last_seen)

    async def touch_session(self, session_id: str, now: float) -> None:
        await self._write(
            lambda db: db.execute("UPDATE sessions SET last_seen = ? WHERE session_id = ?", (now, session_id))
        )

    async def delete_session(self, session_id: str) -> None:
        def delete(db: sqlite3.Connection) -> None:
            self._delete_session(db, session_id)
            self._next_sweep = 0.0  # return what the session held to the file system now, not at the next sweep

        await self._write(delete)

    def _delete_session(self, db: sqlite3.Connection, session_id: str) -> None:
        """The session, its streams and their events (inside the caller's transaction, whose commit releases what
        the store counted for it), but for the streams a live idempotency key names: those outlive the session
        (their outcome is the key's; a running one ends as lost, as the session's calls end with it) and stay
        counted for its principal until retention deletes them (ADR 0029)."""
        now = self._clock()
        ids = (session_id, self._indexed_through, now)
        doomed = f"SELECT id FROM streams WHERE id IN ({_SESSION_STREAMS}) AND kept_until <= ?3"
        kept = db.execute(
            f"UPDATE streams SET completed = CASE WHEN completed THEN completed ELSE {_LOST_OWNER} END,"
            f" completed_at = coalesce(completed_at, ?3) WHERE id IN ({_SESSION_STREAMS}) AND kept_until > ?3",
            ids,
        ).rowcount
        if kept:  # the session's count goes down by what goes, not to nothing
            released = sum(
                STREAM_BYTES + db.execute(_HELD_BELOW, (stream_id, _ALL)).fetchone()[0]
                for (stream_id,) in db.execute(doomed, ids).fetchall()
            )
            self._released.append((session_id, released))
        else:
            self._forgotten.append(session_id)
        db.execute(f"DELETE FROM events WHERE stream_id IN ({doomed})", ids)
        db.execute(f"DELETE FROM streams WHERE id IN ({_SESSION_STREAMS}) AND kept_until <= ?3", ids)
        db.execute("DELETE FROM session_streams WHERE session_id = ?", (session_id,))
        db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))

    async def expire_sessions(self, idle_before: float) -> list[str]:
        """Also forgets the expired keys held in memory (the sweep deletes their rows)."""
        self._held_keys.purge(self._clock())

        def expire(db: sqlite3.Connection) -> list[str]:
            gone = [row[0] for row in db.execute("SELECT session_id FROM sessions WHERE last_seen < ?", (idle_before,))]
            for session_id in gone:
                self._delete_session(db, session_id)
            if gone:
                self._next_sweep = 0.0
            return gone

        return await self._write(expire)

    async def open_stream(self, record: StreamRecord) -> None:
        """Create ``record``'s stream; opening an existing key starts it afresh, as the memory store does."""
        await self.enqueue_open(record)

    idempotency_keys = True

    def enqueue_open(
        self, record: StreamRecord, keys: Sequence[KeyRecord] = (), session: SessionRecord | None = None
    ) -> asyncio.Future[None]:
        """Queue the stream's row for the next transaction: with the events enqueued after it in the same loop turn
        (a call that answers at once), one transaction writes it and them, the row whole with its last position;
        its idempotency keys' rows, and its session's, go in the same transaction."""
        future = self._future()
        if not keys:
            self._submit(_Open(record.copy(), future, session=session))
            return future
        rows = []  # each key's row in the table (:data:`_SCHEMA`), made here, with one unpack of its record
        for principal, name, tool, arguments_hash, target, created, expires in keys:
            assert type(target) is StreamTarget, "a key recorded with a stream names that stream"
            stream, request_id = target
            row = self._next_key_row
            self._next_key_row = row + 1  # a rolled-back transaction leaves a gap, never a reuse
            rows.append((row, *principal, name, tool, arguments_hash, stream, orjson.dumps(request_id).decode(),
                         created, expires))  # fmt: skip
        journal = self._journal
        requests = None
        if journal is not None:
            kind = "post" if record.kind is StreamKind.POST else record.kind.value
            requests = encode_requests(record.requests).decode()  # once: the writer's row takes it too
            try:
                segment = journal.write((record.stream, record.session_id, kind, record.owner, requests, rows))
            except OSError as exc:
                raise StoreUnavailable(f"sqlite store {self.path!r}: cannot journal an idempotency key: {exc}") from exc
            self._journaling.append((future, segment, keys))
        held = self._held_keys
        for key, row_of in zip(keys, rows, strict=True):
            held.add(key.principal, key.key, key.expires, row_of[0])
        self._submit(_Open(record.copy(), future, rows, requests, session))
        return future

    def _journaled(self) -> None:
        """After a batch's futures settled (on the loop, before any task awaiting them resumes, so before a read
        of a key returns): each journaled record whose transaction settled lets its segment go; if it failed, its
        keys stay known. In queue order: one still queued holds those behind it (their segments go a batch later).
        A cancelled future is settled as not committed: its segment stays for the next open."""
        journaling, journal = self._journaling, self._journal
        while journaling and journaling[0][0].done():
            future, segment, keys = journaling.popleft()
            stored = not future.cancelled()
            if stored and future.exception() is not None:
                stored = False
                for key in keys:
                    self._unstored[key.principal, key.key] = key
            if journal is not None:  # else closed first: the segment was kept, and the next open reads it
                journal.settled(segment, stored)

    def lacks_key(self, principal: Principal, key: str, now: float) -> bool:
        return self._held_keys.known(principal, key, now) is None  # one process owns the file: it knows every key

    def keys_held(self, principal: Principal, now: float) -> int:
        return self._held_keys.held(principal, now)

    async def get_key(self, principal: Principal, key: str, now: float) -> KeyRecord | None:
        """A key this process never recorded (nor found at open) is none: only a duplicate reads the file. A key
        journaled whose transaction is still queued is read once it settled: a read runs after the commit of the
        batch it joins, behind every write queued before it (and :meth:`_journaled`, which keeps a failed one's
        key in :attr:`_unstored`, runs before the read's result is delivered)."""
        number = self._held_keys.known(principal, key, now)
        if number is None:
            return None
        row = await self._read(
            lambda db: db.execute(
                "SELECT tool, arguments_hash, stream, request_id, created, expires FROM idempotency_keys WHERE id = ?",
                (number,),
            ).fetchone()
        )
        if row is None:
            return self._unstored.get((principal, key))
        tool, arguments_hash, stream, request_id, created, expires = row
        target = StreamTarget(stream, orjson.loads(request_id))
        return KeyRecord(principal, key, tool, arguments_hash, target, created, expires)

    async def get_stream(self, stream: str) -> StreamRecord | None:
        rows = await self._read(
            lambda db: db.execute(
                "SELECT session_id, kind, owner, requests, last_seq, completed, answered FROM streams WHERE stream = ?",
                (stream,),
            ).fetchall()
        )
        if not rows:
            return None
        session_id, kind, owner, requests, last_seq, completed, answered = rows[0]
        return StreamRecord(
            session_id,
            stream,
            StreamKind(kind),
            owner,
            decode_requests(requests),
            last_seq,
            bool(completed),
            frozenset(orjson.loads(answered)),
            _LOSSES.get(completed),
        )

    def enqueue(self, event: StoredEvent, completes: bool = False) -> asyncio.Future[None]:
        """Queue ``event`` for the next transaction; the future resolves once that transaction committed.

        Progress events of one stream queued one after another share the first one's future (a tool reporting in a
        loop: one future, one outcome and one wake-up of the stream per hand-over, not per event). It fails if any
        of them could not be stored; storing them again is safe, as an identical append of a stored position
        succeeds."""
        size = len(event.data) + ROW_BYTES
        pending = self._pending
        if pending and not completes and not event.terminal:
            last = pending[-1]
            if type(last) is tuple and not last[1] and not last[0].terminal and last[0].stream == event.stream:
                last = pending[-1] = _Run(last, len(last[0].data) + ROW_BYTES, self._last_queued)
            if type(last) is _Run and last.stream == event.stream:
                last.events.append(event)
                last.size += size
                self._queued_ops += 1
                # The session's entry took the run's bytes so far, which have not landed (it is still pending), so
                # it stands and takes this one's without a lookup; unless bytes queued before the session was bound
                # (never counted) landed meanwhile and emptied it (HeldBytes.queue): then it is looked up again.
                queued = last.queued
                if queued is not None and queued.size > 0:
                    queued.size += size
                    queued.total.size += size
                else:
                    last.queued = self._counts.queue(event.session_id, size)
                return last.future
        self._last_queued = self._counts.queue(event.session_id, size)
        future = self._future()
        self._submit((event, completes, future))
        return future

    async def append(self, event: StoredEvent, completes: bool = False) -> None:
        await self.enqueue(event, completes)

    async def complete_stream(self, stream: str) -> None:
        await self._write(
            lambda db: db.execute(
                "UPDATE streams SET completed = 1, completed_at = coalesce(completed_at, ?) WHERE stream = ?",
                (self._clock(), stream),
            )
        )

    async def read_after(self, stream: str, seq: int) -> Sequence[StoredEvent]:
        return await self._read(lambda db: self._read_after(db, stream, seq))

    def _read_after(self, db: sqlite3.Connection, stream: str, seq: int) -> Sequence[StoredEvent]:
        """The events after ``seq`` as rows (:class:`EventRows`: a replay frames and checks them with no event built
        per row, ADR 0020), reading per row only what differs from the first event's request.

        What a row costs is mostly its columns: ``sqlite3`` releases and takes back the GIL around each column
        it fetches, then builds an object for it (some 1,100 instructions per column and row, measured). So
        each row's position is counted from the first one's, not read (a stream holds every position from its
        first to ``last_seq``: appends leave no gap and trimming takes the oldest), and its request's id, tool and tags,
        which consecutive events mostly share, are compared in SQL with the first event's: a progress event of
        that request gives only its id and payload; any other (its answer, another request's events) gives its
        payload, and a second query reads the rest of those rows.
        """
        found = db.execute(
            "SELECT id, session_id, first_seq, last_seq FROM streams WHERE stream = ?", (stream,)
        ).fetchone()
        if found is None:
            return []
        stream_id, session_id, first_seq, last_seq = found
        if seq + 1 < first_seq:
            raise EventsEvicted(f"events {seq + 1}..{first_seq - 1} of stream {stream} were evicted")
        if seq >= last_seq:
            return []
        probe = db.execute(
            "SELECT seq, request_id, tool, resources FROM events WHERE stream_id = ? AND seq > ? ORDER BY seq LIMIT 1",
            (stream_id, seq),
        ).fetchone()
        if probe is None:
            return []
        start, raw_rid, tool, raw_tags = probe
        same = (raw_rid, tool, raw_tags)
        rows = db.execute(_READ_EVENTS, (*same, stream_id, seq)).fetchall()
        if start > max(seq + 1, first_seq, 1) or len(rows) != last_seq - start + 1:  # position 0 may not be stored
            # Not something this store writes (a gap, or positions past ``last_seq``): the file was changed under it.
            raise StoreUnavailable(
                f"sqlite store {self.path!r}: stream {stream} holds {len(rows)} events at positions"
                f" {start}..{last_seq}, not {last_seq - start + 1}"
            )
        value, tags = self._interner.value, self._interner.tags
        rid: RequestId | None = None if raw_rid is None else value(raw_rid)
        table: list[frozenset[str]] = [tags(raw_tags)]
        """The tag sets the rows name by index: the first event's request's first."""
        out: list[Any] = []
        """The rows in order; another request's event, or an answer, first as its payload, replaced below."""
        append = out.append
        others: list[int] = []
        position = start - 1
        for event_id, data in rows:
            position += 1
            if event_id is not None:
                append((event_id, data, rid, tool, 0, False))
            else:
                others.append(position)
                append(data)
        if others:
            found = db.execute(_READ_AT, (stream_id, orjson.dumps(others).decode())).fetchall()
            if len(found) != len(others):  # the rows read a moment ago: gone only if the file changed under it
                raise StoreUnavailable(f"sqlite store {self.path!r}: events of stream {stream} changed while read")
            indices = {raw_tags: 0}
            for position, event_id, raw, other_tool, other_tags, terminal in found:
                index = indices.get(other_tags)
                if index is None:
                    index = indices[other_tags] = len(table)
                    table.append(tags(other_tags))
                request_id = None if raw is None else value(raw)
                out[position - start] = (event_id, out[position - start], request_id, other_tool, index, terminal == 1)
        return EventRows(session_id, stream, start, out, table)

    async def owner_alive(self, owner: str) -> bool:
        """Always ``False``: one process owns the file, so any other owner ended with its process."""
        return False

    async def register_instance(self, instance: str) -> None:
        return None

    async def mark_lost(self, stream: str, owner: str, loss: Loss) -> StreamRecord | None:
        """One process owns the file, so no producer is left to append to the stream after this."""
        code = next(code for code, known in _LOSSES.items() if known is loss)
        await self._write(
            lambda db: db.execute(
                "UPDATE streams SET completed = ?, completed_at = coalesce(completed_at, ?)"
                " WHERE stream = ? AND owner = ? AND NOT completed",
                (code, self._clock(), stream, owner),
            )
        )
        record = await self.get_stream(stream)
        if record is not None and not record.completed:
            raise StreamTakenOver(f"stream {stream} is produced by {record.owner}, not {owner}")
        return record

    async def wait_events(self, stream: str, seq: int, block_seconds: float) -> Sequence[StoredEvent]:
        return await self.read_after(stream, seq)


def _truncate_wal(db: sqlite3.Connection) -> None:
    """Copy the WAL into the file and empty it, unless a reader holds it now (no waiting: appends queue behind)."""
    db.execute("PRAGMA busy_timeout=0")
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")


_ROWS_PER_INSERT = 64
"""Events one ``INSERT`` statement writes at most: one statement per count up to it, each prepared once (the
connection caches :data:`_CACHED_STATEMENTS`)."""
_CACHED_STATEMENTS = 256
_INSERTS: dict[tuple[str, int, int], str] = {}
"""The ``INSERT`` of so many rows of so many columns into a table."""


def _insert_rows(db: sqlite3.Connection, table: str, rows: list[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (events, idempotency keys) with one statement per :data:`_ROWS_PER_INSERT`, not one step
    each (``executemany``): a step binds its row's parameters, resets the statement and hands the GIL back and
    forth once more (stream workload: 58.7k -> 55.7k instructions per event)."""
    width = len(rows[0])
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        shape = (table, width, len(chunk))
        sql = _INSERTS.get(shape)
        if sql is None:
            row = "(" + ", ".join(["?"] * width) + ")"
            sql = _INSERTS[shape] = f"INSERT INTO {table} VALUES " + ", ".join([row] * len(chunk))
        db.execute(sql, list(chain.from_iterable(chunk)))  # in C: a comprehension ran ~2 opcodes a value


def _settle(outcomes: list[_Outcome]) -> None:
    """On the loop: resolve a batch's futures in queue order (so events publish in position order)."""
    for future, value, error in outcomes:
        if future.done():  # its awaiting task was cancelled; the write itself happened or failed regardless
            continue
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
