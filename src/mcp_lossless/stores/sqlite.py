"""A durable single-file store on the stdlib ``sqlite3``: the default store of ``mcp-lossless serve``.

Durability: WAL journal with ``synchronous=NORMAL``. A write's future resolves only after its transaction
committed, so a crash of the server *process* (even SIGKILL) keeps every event, session, stream record and
the event-id secret whose write returned: a commit is in the WAL file, i.e. in the OS page cache, by then.
An *OS* crash or power loss may roll back the last transactions, because WAL frames are fsynced only at
checkpoints; that is the price of appends that never wait for the disk (docs/stores.md).

Threading and group commit: one thread owns the connection and does every read and write, so nothing
blocks the event loop. Work is queued in order; the thread takes everything queued while it was busy and
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
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from mcp_lossless.core.events import RequestId, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.principal import Principal

from ._codec import Interner, decode_requests, encode_requests, encode_tags
from .base import EventsEvicted, SessionRecord, StoreUnavailable

T = TypeVar("T")

_SCHEMA_VERSION = 1
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
    stream TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    owner TEXT NOT NULL,
    requests TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    completed INTEGER NOT NULL,
    answered TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS streams_by_session ON streams (session_id);
CREATE TABLE IF NOT EXISTS events (
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    request_id TEXT,
    tool TEXT,
    resources TEXT NOT NULL,
    data BLOB NOT NULL,
    terminal INTEGER NOT NULL,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
"""
_CHECKPOINT_EVERY = 100
"""Transactions between background checkpoints (a batch of appends is one transaction)."""
_BATCH_LIMIT = 4096
"""Queued operations one transaction takes at most: bounds the latency one batch adds to the next."""


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


class _Append:
    """A queued append. Appends of one batch are applied together: one row read and one update per stream."""

    __slots__ = ("completes", "event", "future")

    def __init__(self, event: StoredEvent, completes: bool, future: asyncio.Future[None]) -> None:
        self.event = event
        self.completes = completes
        self.future = future


class _Call:
    """A queued write (``write=True``: inside the batch's transaction) or read (after its commit)."""

    __slots__ = ("fn", "future", "write")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], write: bool, future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.write = write
        self.future = future


_Op = _Append | _Call
_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


class _StreamState:
    """A stream's row as a batch of appends changes it; written back once per batch."""

    __slots__ = ("answered", "completes", "first_seq", "last_seq", "trimmed")

    def __init__(self, first_seq: int, last_seq: int, answered: str) -> None:
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.answered = answered
        self.completes = False
        self.trimmed = False


class _Batch:
    """The appends of one transaction, gathered per stream, then written with one ``executemany``."""

    def __init__(self, db: sqlite3.Connection, limit: int | None) -> None:
        self.db = db
        self.limit = limit
        self.rows: list[tuple[Any, ...]] = []
        self.states: dict[str, _StreamState | None] = {}

    def add(self, op: _Append) -> BaseException | None:
        """Record ``op``'s writes, or return why it is refused (nothing of it is written then)."""
        event = op.event
        states = self.states
        key = event.stream
        if key in states:
            state = states[key]
        else:
            found = self.db.execute(
                "SELECT first_seq, last_seq, answered FROM streams WHERE stream = ?", (key,)
            ).fetchone()
            state = states[key] = None if found is None else _StreamState(*found)
        if state is None:
            return KeyError(f"append to unknown stream {key}")
        if event.seq != state.last_seq + 1:
            if event.seq <= state.last_seq and self._holds(event):
                return None  # a retry of a stored append (its outcome was lost to a cancel): already done
            return ValueError(f"append of position {event.seq} to stream {key} after {state.last_seq}")
        request_id = event.request_id
        self.rows.append(
            (
                key,
                event.seq,
                event.event_id,
                None if request_id is None else _text(request_id),
                event.tool,
                encode_tags(event.resources).decode(),
                event.data,
                int(event.terminal),
            )
        )
        state.last_seq = event.seq
        if event.terminal and request_id is not None:
            ids = orjson.loads(state.answered)
            if request_id not in ids:
                state.answered = _text([*ids, request_id])
        if op.completes:
            state.completes = True
        limit = self.limit
        if limit is not None and event.seq - limit + 1 > state.first_seq:
            state.first_seq = event.seq - limit + 1
            state.trimmed = True
        return None

    def _holds(self, event: StoredEvent) -> bool:
        self.flush()  # rows gathered so far may hold it
        found = self.db.execute(
            "SELECT event_id, data FROM events WHERE stream = ? AND seq = ?", (event.stream, event.seq)
        ).fetchone()
        return found is not None and tuple(found) == (event.event_id, event.data)

    def flush(self) -> None:
        """Write what was gathered; the cache is dropped, since other writes may change streams next."""
        db = self.db
        if self.rows:
            db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self.rows)
            self.rows = []
        for key, state in self.states.items():
            if state is None:
                continue
            if state.trimmed:
                db.execute("DELETE FROM events WHERE stream = ? AND seq < ?", (key, state.first_seq))
            db.execute(
                "UPDATE streams SET last_seq = ?, first_seq = ?, answered = ?, completed = completed OR ?"
                " WHERE stream = ?",
                (state.last_seq, state.first_seq, state.answered, state.completes, key),
            )
        self.states = {}


class SqliteStore:
    """The :class:`~mcp_lossless.stores.base.EventStore` on one SQLite file, owned by one server process."""

    shared = False

    def __init__(self, path: str, *, max_events_per_stream: int | None = None) -> None:
        if max_events_per_stream is not None and max_events_per_stream < 1:
            raise ValueError("max_events_per_stream must be at least 1")
        self.path = path
        self.max_events_per_stream = max_events_per_stream
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_Op | None] = deque()
        """Work for the writer thread, in order; ``None`` asks it to finish."""
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._secret: bytes | None = None
        self._interner = Interner()
        """Used on the writer thread only."""

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

    async def close(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._queue.append(None)
        self._wake.set()
        await asyncio.to_thread(thread.join)
        self._loop = self._thread = None

    def _run(self, opened: asyncio.Future[bytes]) -> None:
        """The writer thread: open the file, then serve batches until asked to finish."""
        loop = opened.get_loop()
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
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
        queue, wake = self._queue, self._wake
        try:
            while True:
                wake.wait()
                wake.clear()
                while queue:
                    batch: list[_Op] = []
                    while queue and len(batch) < _BATCH_LIMIT:
                        op = queue.popleft()
                        if op is None:
                            self._serve(db, batch, loop)
                            return
                        batch.append(op)
                    if self._serve(db, batch, loop):
                        commits += 1
                        if commits % _CHECKPOINT_EVERY == 0:
                            checkpointer.wake()
        finally:
            checkpointer.stop()
            db.close()

    def _initialize(self, db: sqlite3.Connection) -> bytes:
        if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
            raise sqlite3.DatabaseError("the file system does not support a WAL journal")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=2000")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {version}, expected {_SCHEMA_VERSION}")
        db.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA user_version={_SCHEMA_VERSION};COMMIT;")
        db.execute("INSERT OR IGNORE INTO meta VALUES ('secret', ?)", (os.urandom(32),))
        secret: bytes = db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()[0]
        return secret

    # -- the writer thread's batches -------------------------------------------------------------------

    def _serve(self, db: sqlite3.Connection, batch: list[_Op], loop: asyncio.AbstractEventLoop) -> bool:
        """Run one batch: its writes in one transaction, then its reads; hand the outcomes to the loop.

        Returns whether a transaction committed. If the transaction fails, each write is retried alone, so a
        write that cannot be done (a bug) fails by itself and does not take the others down; when the file
        cannot be written at all (disk full, I/O error) each fails with :class:`StoreUnavailable`.
        """
        writes = [op for op in batch if isinstance(op, _Append) or op.write]
        outcomes: list[_Outcome] = []
        committed = False
        if writes:
            try:
                outcomes = self._transaction(db, writes)
                committed = True
            except Exception as exc:
                if len(writes) == 1:
                    outcomes = [(writes[0].future, None, self._failure(exc))]
                else:
                    outcomes = []
                    for op in writes:
                        try:
                            outcomes += self._transaction(db, [op])
                            committed = True
                        except Exception as alone:
                            outcomes.append((op.future, None, self._failure(alone)))
        for op in batch:
            if isinstance(op, _Call) and not op.write:
                try:
                    outcomes.append((op.future, op.fn(db), None))
                except Exception as exc:  # EventsEvicted, sqlite3 errors, bugs: the awaiting task raises them
                    outcomes.append((op.future, None, self._failure(exc)))
        loop.call_soon_threadsafe(_settle, outcomes)
        return committed

    def _transaction(self, db: sqlite3.Connection, writes: list[_Op]) -> list[_Outcome]:
        outcomes: list[_Outcome] = []
        batch = _Batch(db, self.max_events_per_stream)
        db.execute("BEGIN IMMEDIATE")
        try:
            for op in writes:
                if isinstance(op, _Append):
                    outcomes.append((op.future, None, batch.add(op)))
                    continue
                batch.flush()
                outcomes.append((op.future, op.fn(db), None))
            batch.flush()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return outcomes

    def _failure(self, exc: Exception) -> Exception:
        """Locked, I/O error, disk full: the store cannot serve now. Anything else stays itself (a bug, or
        :class:`EventsEvicted` from a read)."""
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailable(f"sqlite store {self.path!r}: {exc}")
        return exc

    # -- queueing from the loop ------------------------------------------------------------------------

    def _submit(self, op: _Op) -> None:
        self._queue.append(op)
        self._wake.set()

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

    # -- the interface -------------------------------------------------------------------------------

    async def secret(self) -> bytes:
        if self._secret is None:
            raise RuntimeError("SqliteStore used before open()")
        return self._secret

    async def put_session(self, record: SessionRecord) -> None:
        p = record.principal
        row = (
            record.session_id,
            p.issuer,
            p.subject,
            p.client_id,
            record.protocol_version,
            record.created_at,
            record.last_seen,
        )
        await self._write(lambda db: db.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)", row))

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
        await self._write(lambda db: _delete_session(db, session_id))

    async def expire_sessions(self, idle_before: float) -> list[str]:
        def expire(db: sqlite3.Connection) -> list[str]:
            gone = [row[0] for row in db.execute("SELECT session_id FROM sessions WHERE last_seen < ?", (idle_before,))]
            for session_id in gone:
                _delete_session(db, session_id)
            return gone

        return await self._write(expire)

    async def open_stream(self, record: StreamRecord) -> None:
        """Create ``record``'s stream; opening an existing key starts it afresh, as the memory store does."""
        row = (
            record.stream,
            record.session_id,
            record.kind.value,
            record.owner,
            encode_requests(record.requests).decode(),
            record.last_seq,
            int(record.completed),
            _text(list(record.answered)),
        )

        def open_stream(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM events WHERE stream = ?", (record.stream,))
            db.execute("INSERT OR REPLACE INTO streams VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)", row)

        await self._write(open_stream)

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
        )

    def enqueue(self, event: StoredEvent, completes: bool = False) -> asyncio.Future[None]:
        """Queue ``event`` for the next transaction; the future resolves once that transaction committed."""
        future = self._future()
        self._submit(_Append(event, completes, future))
        return future

    async def append(self, event: StoredEvent, completes: bool = False) -> None:
        await self.enqueue(event, completes)

    async def complete_stream(self, stream: str) -> None:
        await self._write(lambda db: db.execute("UPDATE streams SET completed = 1 WHERE stream = ?", (stream,)))

    async def read_after(self, stream: str, seq: int) -> list[StoredEvent]:
        return await self._read(lambda db: self._read_after(db, stream, seq))

    def _read_after(self, db: sqlite3.Connection, stream: str, seq: int) -> list[StoredEvent]:
        found = db.execute("SELECT session_id, first_seq FROM streams WHERE stream = ?", (stream,)).fetchone()
        if found is None:
            return []
        session_id, first_seq = found
        if seq + 1 < first_seq:
            raise EventsEvicted(f"events {seq + 1}..{first_seq - 1} of stream {stream} were evicted")
        rows = db.execute(
            "SELECT seq, event_id, request_id, tool, resources, data, terminal"
            " FROM events WHERE stream = ? AND seq > ? ORDER BY seq",
            (stream, seq),
        ).fetchall()
        value, tags = self._interner.value, self._interner.tags
        events = []
        for position, event_id, raw_rid, tool, raw_tags, data, terminal in rows:
            rid: RequestId | None = None if raw_rid is None else value(raw_rid)
            events.append(
                StoredEvent(session_id, stream, position, event_id, data, rid, tool, tags(raw_tags), bool(terminal))
            )
        return events

    async def owner_alive(self, owner: str) -> bool:
        """Always ``False``: one process owns the file, so any other owner ended with its process."""
        return False

    async def register_instance(self, instance: str) -> None:
        return None

    async def claim_stream(self, stream: str, expected_owner: str, new_owner: str) -> bool:
        def claim(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE streams SET owner = ? WHERE stream = ? AND owner = ?", (new_owner, stream, expected_owner)
            )
            return cursor.rowcount == 1

        return await self._write(claim)

    async def wait_events(self, stream: str, seq: int, block_seconds: float) -> list[StoredEvent]:
        return await self.read_after(stream, seq)


def _delete_session(db: sqlite3.Connection, session_id: str) -> None:
    db.execute(
        "DELETE FROM events WHERE stream IN (SELECT stream FROM streams WHERE session_id = ?)",
        (session_id,),
    )
    db.execute("DELETE FROM streams WHERE session_id = ?", (session_id,))
    db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))


def _settle(outcomes: list[_Outcome]) -> None:
    """On the loop: resolve a batch's futures in queue order (so events publish in position order)."""
    for future, value, error in outcomes:
        if future.done():  # its awaiting task was cancelled; the write itself happened or failed regardless
            continue
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
