"""Tasks in the SQLite file of the event store (table ``tasks``, its own connection): they survive SIGKILL.

Same durability as :mod:`mcp_lossless.stores.sqlite`: every write commits (WAL, ``synchronous=NORMAL``)
before it returns, so a task acknowledged with ``CreateTaskResult`` is on disk as far as a process crash
goes. A task whose process died stays ``working`` in the file; the server settles it as lost the first
time it is polled (the event store's ``owner_alive`` knows no other live process for a SQLite file).

Threading: the event store writes the same file from a thread of its own, so a task write may wait for its
lock; each operation therefore runs on a worker thread (one at a time), never blocking the event loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import anyio

from ..core.tasks import TaskRecord, decode_task, encode_task
from .base import StoreUnavailable

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    terminal INTEGER NOT NULL,
    record BLOB NOT NULL,
    seen_at REAL NOT NULL,
    ttl REAL,
    expires_at REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at);
"""
"""``seen_at``, ``ttl`` and ``expires_at`` live beside the record so a poll and the purge need not decode it."""


class SqliteTaskStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._one = anyio.CapacityLimiter(1)

    async def open(self) -> None:
        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=5000")
                conn.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            self._conn = await anyio.to_thread.run_sync(connect, limiter=self._one)
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open sqlite task store {self.path!r}: {exc}") from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await anyio.to_thread.run_sync(conn.close, limiter=self._one)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise RuntimeError("SqliteTaskStore used before open()")
        try:
            return await anyio.to_thread.run_sync(work, conn, limiter=self._one)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite task store {self.path!r} unavailable: {exc}") from exc

    @staticmethod
    def _row(record: TaskRecord) -> tuple[str, int, bytes, float, float | None, float | None]:
        terminal = int(record.status.terminal)
        return (record.task_id, terminal, encode_task(record), record.seen_at, record.ttl, record.expires_at)

    async def create(self, record: TaskRecord) -> None:
        row = self._row(record)
        await self._run(lambda db: db.execute("INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?)", row))

    async def get(self, task_id: str) -> TaskRecord | None:
        def read(db: sqlite3.Connection) -> tuple[bytes, float] | None:
            found: tuple[bytes, float] | None = db.execute(
                "SELECT record, seen_at FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
            return found

        row = await self._run(read)
        if row is None:
            return None
        record = decode_task(row[0])
        return replace(record, seen_at=max(record.seen_at, row[1]))

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT terminal, seen_at FROM tasks WHERE task_id = ?", (record.task_id,)).fetchone()
                if row is not None and not row[0]:
                    fresh = replace(record, seen_at=max(record.seen_at, row[1]))
                    db.execute(
                        "UPDATE tasks SET terminal = ?, record = ?, seen_at = ?, ttl = ?, expires_at = ? "
                        "WHERE task_id = ?",
                        (*self._row(fresh)[1:], record.task_id),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._run(write)
        return await self.get(record.task_id)

    async def touch(self, task_id: str, now: float) -> None:
        # The TTL counts from the later of the last change and the last poll: expiry moves to now + ttl at least.
        await self._run(
            lambda db: db.execute(
                "UPDATE tasks SET seen_at = max(seen_at, ?), "
                "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE max(expires_at, ? + ttl) END WHERE task_id = ?",
                (now, now, task_id),
            )
        )

    async def purge_expired(self, now: float) -> int:
        return await self._run(
            lambda db: db.execute("DELETE FROM tasks WHERE expires_at IS NOT NULL AND expires_at < ?", (now,)).rowcount
        )
