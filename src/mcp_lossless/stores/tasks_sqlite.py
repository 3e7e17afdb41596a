"""Tasks in the SQLite file of the event store: a facet of :class:`~.sqlite.SqliteStore`, not a store beside it.

The ``tasks`` table is part of the event store's versioned schema (6, ADR 0028), and every task read and write
runs on the event store's writer thread and connection, queued with its appends: a task write joins their group
commit, no second connection waits for the file's lock, and no worker thread is needed. Durability is the event
store's: a task acknowledged with ``CreateTaskResult`` has committed (WAL, ``synchronous=NORMAL``) and survives a
crash of the process. A task whose process died stays ``working`` in the file; the server settles it as lost the
first time it is polled (the event store's ``owner_alive`` knows no other live process for a SQLite file).

The facet opens and closes nothing: the event store's owner does (the server opens it before the task layer and
closes it after).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable

from ..core.events import StoredEvent
from ..core.principal import Principal
from ..core.tasks import TaskRecord, decode_task, encode_task, noted, owned, seen
from .sqlite import SqliteStore
from .tasks import DEFAULT_MAX_TASKS, Settled, TaskLimitReached, limit_message

_COUNT = "SELECT count(*) FROM tasks"
_PURGE = "DELETE FROM tasks WHERE expires_at IS NOT NULL AND expires_at < ?"
_RECORD = "SELECT record, seen_at FROM tasks WHERE task_id = ?"
_UPDATE = (
    "UPDATE tasks SET terminal = ?1, record = ?2, seen_at = max(seen_at, ?3), ttl = ?4,"
    " expires_at = CASE WHEN ?4 IS NULL THEN NULL ELSE max(?5, seen_at, ?3) + ?4 END"
    " WHERE task_id = ?6 AND NOT terminal RETURNING seen_at"
)
"""A task's new state, unless the stored one is terminal; ``seen_at`` (the column, which :meth:`_Decoded.stored` merges
into the record) never moves back, and the expiry counts from the later of the change and the last poll."""
_UPDATE_SEEN = (
    "UPDATE tasks SET terminal = ?1, record = ?2, seen_at = ?3, ttl = ?4,"
    " expires_at = CASE WHEN ?4 IS NULL THEN NULL ELSE max(?5, ?3) + ?4 END"
    " WHERE task_id = ?6 AND NOT terminal AND seen_at = ?7"
)
""":data:`_UPDATE` when this process knows the row's ``seen_at`` (?7, :meth:`_Decoded.seen_at`): ``seen_at`` becomes
the later of it and the record's (?3, worked out before), and the row says by its ``seen_at`` whether the belief holds
(else nothing changes, and :data:`_UPDATE` runs). No ``RETURNING``: its result table cost some 28k instructions an
update (ADR 0041)."""
_TOUCH = (
    "UPDATE tasks SET seen_at = max(seen_at, ?1), "
    "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE max(expires_at, ?2 + ttl) END WHERE task_id = ?3"
)
"""An owner's poll: the TTL counts from the later of the last change and the last poll, so expiry moves to
``now + ttl`` at least."""


_DECODED_LIMIT = 4096
"""Records :class:`_Decoded` keeps before it starts afresh (a bound, not a tuning knob)."""
_DECODED_BYTES = 16 * 1024
"""The largest encoded record it keeps: a bound on its memory (a large result is decoded each time)."""


class _Decoded:
    """The records this process wrote last, by task id, each with the bytes it was stored as and the ``seen_at`` its
    row was last given (writer thread only).

    A poll reads the row and, when its bytes are the ones written here, takes the record written instead of
    decoding it again (some 10 µs a poll). An update asks the row to hold the ``seen_at`` believed
    (:data:`_UPDATE_SEEN`). The file decides, not what the cache believes: a write rolled back, a task purged or
    rewritten by another path leaves bytes or a ``seen_at`` that differ (or no row), and those are read as before."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: dict[str, tuple[bytearray, TaskRecord, float]] = {}

    def wrote(self, record: TaskRecord, blob: bytearray, seen_at: float) -> None:
        """``record`` stored as ``blob``, its row's ``seen_at`` now ``seen_at``."""
        if len(blob) > _DECODED_BYTES:
            return
        records = self._records
        if len(records) >= _DECODED_LIMIT:
            records.clear()
        records[record.task_id] = (blob, record, seen_at)

    def touched(self, task_id: str, seen_at: float) -> None:
        """An owner's poll moved the row's ``seen_at`` to ``seen_at`` (:data:`_TOUCH`: never back)."""
        known = self._records.get(task_id)
        if known is not None and seen_at > known[2]:
            self._records[task_id] = (known[0], known[1], seen_at)

    def seen_at(self, task_id: str) -> float | None:
        """The row's ``seen_at`` as this process last wrote it (``None``: not known)."""
        known = self._records.get(task_id)
        return None if known is None else known[2]

    def stored(self, task_id: str, row: tuple[bytes, float] | None) -> TaskRecord | None:
        """A task as its row holds it: the record, with ``seen_at`` from its column (a poll moves only that)."""
        if row is None:
            return None
        blob, seen_at = row
        known = self._records.get(task_id)
        record = known[1] if known is not None and known[0] == blob else decode_task(blob)
        return seen(record, seen_at)


def _row(record: TaskRecord) -> tuple[str, int, bytearray, float, float | None, float | None]:
    """``seen_at``, ``ttl`` and ``expires_at`` live beside the record so a poll and the purge need not decode it. The
    record goes as a bytearray: ``sqlite3`` binds one as it is, but looks for an adapter for ``bytes`` (some 3,000
    instructions a statement; copying the record costs less), as the event store's payloads do."""
    terminal = int(record.status.terminal)
    return (record.task_id, terminal, bytearray(encode_task(record)), record.seen_at, record.ttl, record.expires_at)


def _updating(record: TaskRecord, decoded: _Decoded) -> Callable[[sqlite3.Connection], tuple[TaskRecord | None, bool]]:
    """The writer's job for :meth:`SqliteTaskStore.update`: what is stored now, and whether it is ``record``."""
    task_id, terminal, blob, seen_at, ttl, _expires = _row(record)
    values = (terminal, blob, seen_at, ttl, record.updated_at, task_id)

    def write(db: sqlite3.Connection) -> tuple[TaskRecord | None, bool]:
        believed = decoded.seen_at(task_id)
        if believed is not None:  # the row's seen_at as written here: one plain UPDATE if the row still holds it
            later = believed if believed > seen_at else seen_at
            if db.execute(_UPDATE_SEEN, (terminal, blob, later, ttl, record.updated_at, task_id, believed)).rowcount:
                decoded.wrote(record, blob, later)
                return seen(record, later), True
        changed = db.execute(_UPDATE, values).fetchall()
        if changed:
            decoded.wrote(record, blob, changed[0][0])
            return seen(record, changed[0][0]), True
        return decoded.stored(task_id, db.execute(_RECORD, (task_id,)).fetchone()), False  # terminal, or gone

    return write


class SqliteTaskStore:
    """The tasks of ``events``' file, at most ``max_tasks`` of them (expired ones are purged first when full)."""

    def __init__(self, events: SqliteStore, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        if max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self.events = events
        self.max_tasks = max_tasks
        self._decoded = _Decoded()
        self._count: int | None = None
        """How many tasks the file holds, at most (writer thread only; ``None``: count again). One process owns the
        file, so the count need not be read per task created: a create adds one (a rolled-back one leaves it one
        too high, which the recount at the limit corrects) and a purge has it counted again."""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def create(self, record: TaskRecord) -> Awaitable[None]:
        """Queued for the writer's next transaction at this call (not at the first await): what the caller queues
        before it awaits, such as the task's event stream, joins the same commit."""
        row = _row(record)

        def create(db: sqlite3.Connection) -> bool:
            count = self._count
            if count is None:
                count = db.execute(_COUNT).fetchone()[0]
            if count >= self.max_tasks:  # full as far as known: what expired makes room, then count exactly
                db.execute(_PURGE, (record.created_at,))
                count = self._count = db.execute(_COUNT).fetchone()[0]
                if count >= self.max_tasks:
                    return False
            db.execute("INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?)", row)
            self._decoded.wrote(record, row[2], record.seen_at)
            self._count = count + 1
            return True

        return self._created(self.events.run_write(create))

    async def _created(self, stored: Awaitable[bool]) -> None:
        if not await stored:
            raise TaskLimitReached(limit_message(self.max_tasks))

    async def get(self, task_id: str) -> TaskRecord | None:
        return await self.events.run_read(
            lambda db: self._decoded.stored(task_id, db.execute(_RECORD, (task_id,)).fetchone())
        )

    async def poll(self, task_id: str, principal: Principal, now: float) -> TaskRecord | None:
        def read_and_touch(db: sqlite3.Connection) -> TaskRecord | None:
            record = self._decoded.stored(task_id, db.execute(_RECORD, (task_id,)).fetchone())
            if record is None or not owned(record, task_id, principal, now) or not noted(record, now):
                return record
            db.execute(_TOUCH, (now, now, task_id))
            self._decoded.touched(task_id, now)
            return seen(record, now)

        # One trip to the writer and one transaction for the read and the poll's touch (durable before the answer).
        return await self.events.run_write(read_and_touch)

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        # One statement in the writer's transaction: the terminal check, the write and seen_at kept forward are one;
        # what it stored is what it returns (no second trip to the writer thread to read it back).
        stored, _changed = await self.events.run_write(_updating(record, self._decoded))
        return stored

    def update_appending(self, record: TaskRecord, event: StoredEvent) -> Awaitable[Settled]:
        """:meth:`update`, and ``event`` (the outcome's, completing its stream) appended in the same transaction if
        the update stored ``record``: one trip to the writer and one commit for both, and a task found terminal
        (its first outcome stays) gets no event of ``record``'s."""
        return self.events.run_write_appending(_updating(record, self._decoded), event, True)

    async def purge_expired(self, now: float) -> int:
        def purge(db: sqlite3.Connection) -> int:
            self._count = None
            gone: int = db.execute(_PURGE, (now,)).rowcount
            return gone

        return await self.events.run_write(purge)
