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
from dataclasses import replace

from ..core.tasks import TaskRecord, decode_task, encode_task
from .sqlite import SqliteStore
from .tasks import DEFAULT_MAX_TASKS, TaskLimitReached, limit_message

_COUNT = "SELECT count(*) FROM tasks"
_PURGE = "DELETE FROM tasks WHERE expires_at IS NOT NULL AND expires_at < ?"


def _row(record: TaskRecord) -> tuple[str, int, bytes, float, float | None, float | None]:
    """``seen_at``, ``ttl`` and ``expires_at`` live beside the record so a poll and the purge need not decode it."""
    terminal = int(record.status.terminal)
    return (record.task_id, terminal, encode_task(record), record.seen_at, record.ttl, record.expires_at)


class SqliteTaskStore:
    """The tasks of ``events``' file, at most ``max_tasks`` of them (expired ones are purged first when full)."""

    def __init__(self, events: SqliteStore, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        if max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self.events = events
        self.max_tasks = max_tasks
        self._count: int | None = None
        """How many tasks the file holds, at most (writer thread only; ``None``: count again). One process owns the
        file, so the count need not be read per task created: a create adds one (a rolled-back one leaves it one
        too high, which the recount at the limit corrects) and a purge has it counted again."""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def create(self, record: TaskRecord) -> None:
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
            self._count = count + 1
            return True

        if not await self.events.run_write(create):
            raise TaskLimitReached(limit_message(self.max_tasks))

    async def get(self, task_id: str) -> TaskRecord | None:
        def read(db: sqlite3.Connection) -> tuple[bytes, float] | None:
            found: tuple[bytes, float] | None = db.execute(
                "SELECT record, seen_at FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
            return found

        row = await self.events.run_read(read)
        if row is None:
            return None
        record = decode_task(row[0])
        return replace(record, seen_at=max(record.seen_at, row[1]))

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        def write(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT terminal, seen_at FROM tasks WHERE task_id = ?", (record.task_id,)).fetchone()
            if row is not None and not row[0]:
                fresh = replace(record, seen_at=max(record.seen_at, row[1]))
                db.execute(
                    "UPDATE tasks SET terminal = ?, record = ?, seen_at = ?, ttl = ?, expires_at = ? WHERE task_id = ?",
                    (*_row(fresh)[1:], record.task_id),
                )

        await self.events.run_write(write)  # inside the writer's transaction: the read and the write are one
        return await self.get(record.task_id)

    async def touch(self, task_id: str, now: float) -> None:
        # The TTL counts from the later of the last change and the last poll: expiry moves to now + ttl at least.
        await self.events.run_write(
            lambda db: db.execute(
                "UPDATE tasks SET seen_at = max(seen_at, ?), "
                "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE max(expires_at, ? + ttl) END WHERE task_id = ?",
                (now, now, task_id),
            )
        )

    async def purge_expired(self, now: float) -> int:
        def purge(db: sqlite3.Connection) -> int:
            self._count = None
            gone: int = db.execute(_PURGE, (now,)).rowcount
            return gone

        return await self.events.run_write(purge)
