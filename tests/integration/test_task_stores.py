"""The TaskStore contract against every backend (Redis: a real redis-server), each a facet of its event store
(ADR 0028); SQLite across a restart and from the files of schema 5."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import anyio.lowlevel
import pytest
from redis.asyncio import Redis

from mcp_lossless.core.principal import Principal
from mcp_lossless.core.tasks import (
    POLL_NOTED_WITHIN,
    Requirement,
    TaskRecord,
    TaskStatus,
    advance,
    encode_task,
    lost,
    new_task,
)
from mcp_lossless.stores.base import EventStore, StoreUnavailable
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.open import task_store_beside
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore
from mcp_lossless.stores.tasks import TaskLimitReached, TaskStore
from mcp_lossless.stores.tasks_memory import MemoryTaskStore
from mcp_lossless.stores.tasks_redis import RedisTaskStore
from mcp_lossless.stores.tasks_sqlite import SqliteTaskStore

pytestmark = pytest.mark.anyio

ALICE = Principal("https://issuer.example", "alice", "client-1")
FETCH = Requirement(frozenset({"https://mcp.example/mcp/tools/fetch"}), frozenset({"read"}))
MALLORY = Principal("https://issuer.example", "mallory", "client-2")
T0 = 1_800_000_000.0


def task(task_id: str = "t-1", ttl: float | None = 30.0) -> TaskRecord:
    return new_task(task_id, ALICE, "fetch", FETCH, "instance-a", T0, ttl)


OpenTasks = Callable[[int | None], Awaitable[TaskStore]]
"""Opens a task store on a fresh event store (opened first, as the server does); the argument is ``max_tasks``."""


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def open_tasks(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenTasks]:
    opened: list[tuple[EventStore, TaskStore]] = []

    async def factory(max_tasks: int | None = None) -> TaskStore:
        events: EventStore
        if request.param == "memory":
            events = MemoryStore()
        elif request.param == "sqlite":
            events = SqliteStore(str(tmp_path / f"tasks{len(opened)}.db"))
        else:
            events = RedisStore(request.getfixturevalue("redis_url"), prefix=f"tasks-{uuid.uuid4().hex}")
        await events.open()
        tasks = task_store_beside(events)
        if max_tasks is not None:
            tasks = _bounded(events, max_tasks)
        await tasks.open()
        opened.append((events, tasks))
        return tasks

    yield factory
    for events, tasks in opened:
        await tasks.close()
        await events.close()


def _bounded(events: EventStore, max_tasks: int) -> TaskStore:
    """The facet ``task_store_beside`` makes for ``events``, holding at most ``max_tasks``."""
    if isinstance(events, SqliteStore):
        return SqliteTaskStore(events, max_tasks)
    if isinstance(events, RedisStore):
        return RedisTaskStore(events, max_tasks)
    return MemoryTaskStore(max_tasks)


@pytest.fixture
async def store(open_tasks: OpenTasks) -> TaskStore:
    return await open_tasks(None)


async def test_a_created_task_is_found_whole(store: TaskStore) -> None:
    record = task()
    await store.create(record)
    assert await store.get("t-1") == record
    assert await store.get("t-2") is None


async def test_the_first_terminal_outcome_wins(store: TaskStore) -> None:
    record = task()
    await store.create(record)
    working = advance(record, TaskStatus.INPUT_REQUIRED, T0 + 1)
    assert await store.update(working) == working
    done = advance(working, TaskStatus.COMPLETED, T0 + 2, result={"content": [{"type": "text", "text": "42"}]})
    assert await store.update(done) == done
    late = lost(working, T0 + 3)  # a replica settling the task as lost, or a cancel, after it completed
    assert await store.update(late) == done, "a result is never overwritten"
    assert await store.update(task("t-404")) is None, "an update does not create"


async def test_a_poll_only_moves_seen_forward_and_restarts_the_ttl(store: TaskStore) -> None:
    record = task(ttl=30)
    await store.create(record)
    await store.poll("t-1", ALICE, T0 + 20)
    await store.poll("t-1", ALICE, T0 + 5)
    found = await store.get("t-1")
    assert found is not None and found.seen_at == T0 + 20 and found.expires_at == T0 + 50
    stale = advance(record, TaskStatus.COMPLETED, T0 + 10, result={"content": []})  # built from an older read
    stored = await store.update(stale)
    assert stored is not None and stored.seen_at == T0 + 20, "an update built from an older read keeps the poll"
    await store.poll("t-404", ALICE, T0)  # a poll of a purged task is no error


async def test_a_poll_is_noted_only_for_its_owners_live_task(store: TaskStore) -> None:
    record = task(ttl=30)
    await store.create(record)
    assert await store.poll("t-1", MALLORY, T0 + 20) == record, "another principal's poll reads, and notes nothing"
    assert await store.poll("t-1", ALICE, T0 + 31) == record, "a poll after the TTL ran out restarts nothing"
    assert await store.get("t-1") == record
    polled = await store.poll("t-1", ALICE, T0 + 20)
    assert polled == replace(record, seen_at=T0 + 20) == await store.get("t-1"), "returned as stored: seen_at moved"
    assert await store.poll("t-404", ALICE, T0) is None


async def test_a_poll_that_would_move_the_expiry_by_less_than_the_grain_is_not_written(store: TaskStore) -> None:
    """ADR 0039: a poll within ``min(POLL_NOTED_WITHIN, ttl / 100)`` of the task's last change or noted poll writes
    nothing (its TTL restarts up to that much early); later ones are written; an unlimited task's never are."""
    short, long, unlimited = task("short", ttl=30), task("long", ttl=3600), task("unlimited", ttl=None)
    for record in (short, long, unlimited):
        await store.create(record)
    assert await store.poll("short", ALICE, T0 + 0.2) == short == await store.get("short"), "0.2 s < 30 s / 100"
    polled = await store.poll("short", ALICE, T0 + 0.4)
    assert polled == replace(short, seen_at=T0 + 0.4) == await store.get("short")
    assert await store.poll("short", ALICE, T0 + 0.6) == polled == await store.get("short"), "0.2 s after a poll"
    settled = await store.update(advance(short, TaskStatus.COMPLETED, T0 + 5, result={"content": []}))
    assert settled is not None and await store.poll("short", ALICE, T0 + 5.1) == settled, "0.1 s after its change"
    assert await store.poll("long", ALICE, T0 + POLL_NOTED_WITHIN * 0.9) == long, "the grain is at most a second"
    assert await store.poll("long", ALICE, T0 + POLL_NOTED_WITHIN * 1.1) == replace(
        long, seen_at=T0 + POLL_NOTED_WITHIN * 1.1
    )
    assert await store.poll("unlimited", ALICE, T0 + 100) == unlimited == await store.get("unlimited")


async def test_expired_tasks_are_purged_alike_in_every_store(store: TaskStore, request: pytest.FixtureRequest) -> None:
    await store.create(task("short", ttl=10))
    await store.create(task("polled", ttl=10))
    await store.create(task("forever", ttl=None))
    await store.poll("polled", ALICE, T0 + 8)  # its TTL restarts: it expires at T0 + 18
    assert await store.purge_expired(T0 + 5) == 0
    assert await store.purge_expired(T0 + 11) == 1
    assert await store.get("short") is None and await store.get("polled") is not None
    assert await store.purge_expired(T0 + 11) == 0, "purged once"
    assert await store.purge_expired(T0 + 19) == 1
    assert await store.get("polled") is None and await store.get("forever") is not None
    if request.node.callspec.params["open_tasks"] == "redis":  # and Redis drops what nobody purges by itself
        await store.create(task("abandoned", ttl=10))
        redis = Redis.from_url(request.getfixturevalue("redis_url"))
        try:
            prefix = store.prefix  # type: ignore[attr-defined]
            assert await redis.pttl(f"{prefix}:task:forever") == -1, "an unlimited task never expires"
            expiry = await redis.pexpiretime(f"{prefix}:task:abandoned")
            assert abs(expiry - (T0 + 10 + 60) * 1000) < 2, "Redis drops the task a grace period after its TTL"
        finally:
            await redis.aclose()


async def test_every_store_is_bounded_and_makes_room_from_what_expired(open_tasks: OpenTasks) -> None:
    store = await open_tasks(2)
    await store.create(task("a", ttl=10))
    await store.create(task("b", ttl=None))
    with pytest.raises(TaskLimitReached, match="holds 2 tasks, its limit"):
        await store.create(replace(task("c"), created_at=T0 + 1))
    assert await store.get("c") is None, "nothing is created past the limit"
    await store.create(replace(task("c"), created_at=T0 + 11))  # "a" expired by then and made room
    assert await store.get("a") is None and await store.get("c") is not None
    with pytest.raises(TaskLimitReached):
        await store.create(replace(task("d"), created_at=T0 + 12))
    assert await store.purge_expired(T0 + 50) == 1  # "c": the count goes down with a purge too
    await store.create(replace(task("d"), created_at=T0 + 50))


async def test_sqlite_tasks_share_the_event_store_file_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    events = SqliteStore(str(path))
    await events.open()
    first = task_store_beside(events)
    await first.open()
    await first.create(task())
    await first.poll("t-1", ALICE, T0 + 7)
    await first.close()
    await events.close()
    events = SqliteStore(str(path))
    await events.open()
    again = task_store_beside(events)
    try:
        found = await again.get("t-1")
        assert found is not None and found.status is TaskStatus.WORKING and found.seen_at == T0 + 7
    finally:
        await events.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7


SCHEMA_5_TASKS = """
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
"""The table the task store of schema 5 created in the event store's file, with its own connection."""


@pytest.mark.parametrize("had_tasks", [True, False])
async def test_a_schema_5_file_opens_and_keeps_its_tasks(tmp_path: Path, had_tasks: bool) -> None:
    path = tmp_path / "events.db"
    events = SqliteStore(str(path))
    await events.open()
    await events.close()
    kept = advance(task("kept"), TaskStatus.COMPLETED, T0 + 1, result={"content": [{"type": "text", "text": "42"}]})
    with sqlite3.connect(path) as db:  # back to a schema 5 file: the event tables, the tasks table or none
        db.executescript("DROP TABLE tasks; PRAGMA user_version=5;")
        if had_tasks:
            db.executescript(SCHEMA_5_TASKS)
            db.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?)",
                ("kept", 1, encode_task(kept), kept.seen_at, kept.ttl, kept.expires_at),
            )
    events = SqliteStore(str(path))
    await events.open()
    tasks = task_store_beside(events)
    try:
        assert await tasks.get("kept") == (kept if had_tasks else None)
        await tasks.create(task("new"))
        assert await tasks.get("new") == task("new")
    finally:
        await events.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7


def test_a_sqlite_server_does_not_load_the_redis_client_for_its_tasks(tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path / 'x.db'}"
    script = (
        "import sys\n"
        "from mcp_lossless.stores.open import open_store, task_store_beside\n"
        f"tasks = task_store_beside(open_store({spec!r}))\n"
        "print(type(tasks).__name__, 'redis' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["SqliteTaskStore", "False"]


async def test_sqlite_reads_the_files_record_when_it_differs_from_what_this_process_wrote(tmp_path: Path) -> None:
    """The SQLite store keeps the records it wrote to spare a poll the decoding; the file's bytes decide whether a
    kept one stands for the row: a row rewritten by another path (here an update that never went through the store) or
    a write rolled back is decoded from the file."""
    events = SqliteStore(str(tmp_path / "decoded.db"))
    await events.open()
    tasks = SqliteTaskStore(events)
    try:
        record = task()
        await tasks.create(record)
        elsewhere = advance(record, TaskStatus.CANCELLED, T0 + 1, message="cancelled by another path")
        blob = encode_task(elsewhere)
        await events.run_write(lambda db: db.execute("UPDATE tasks SET record = ?, terminal = 1", (blob,)))
        assert await tasks.get(record.task_id) == elsewhere
        polled = await tasks.poll(record.task_id, ALICE, T0 + 2)
        assert polled == replace(elsewhere, seen_at=T0 + 2)

        theirs = replace(task("t-3"), principal=MALLORY)  # the row another principal's now, the kept record alice's
        await tasks.create(task("t-3"))
        taken = encode_task(theirs)
        await events.run_write(lambda db: db.execute("UPDATE tasks SET record = ? WHERE task_id = 't-3'", (taken,)))
        assert await tasks.poll("t-3", ALICE, T0 + 2) == theirs, "not alice's task in the file: nothing noted"
        assert await tasks.get("t-3") == theirs

        def rolled_back(db: sqlite3.Connection) -> None:
            db.execute("SELECT * FROM no_such_table")  # fails: its transaction, the update's write included, rolls back

        working = task("t-2")
        await tasks.create(working)
        updating = asyncio.create_task(tasks.update(advance(working, TaskStatus.COMPLETED, T0 + 3, result={})))
        await anyio.lowlevel.checkpoint()  # the update queued; the failing write joins its batch, after it
        with pytest.raises(StoreUnavailable):
            await events.run_write(rolled_back)
        with pytest.raises(StoreUnavailable):
            await updating
        assert await tasks.get(working.task_id) == working
    finally:
        await events.close()


async def test_sqlite_updates_by_the_rows_seen_at_not_by_what_this_process_believes(tmp_path: Path) -> None:
    """ADR 0041: an update is one plain ``UPDATE`` that holds only while the row's ``seen_at`` is the one this process
    last wrote there; a row whose ``seen_at`` moved behind its back (another path, a poll rolled back) is updated as
    before, its ``seen_at`` kept forward and the expiry counted from it."""
    events = SqliteStore(str(tmp_path / "seen.db"))
    await events.open()
    tasks = SqliteTaskStore(events)

    def row(task_id: str) -> Callable[[sqlite3.Connection], tuple[float, float]]:
        return lambda db: tuple(
            db.execute("SELECT seen_at, expires_at FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        )

    try:
        moved = task("moved")
        await tasks.create(moved)
        await events.run_write(lambda db: db.execute("UPDATE tasks SET seen_at = ? WHERE task_id = 'moved'", (T0 + 7,)))
        done = advance(moved, TaskStatus.COMPLETED, T0 + 5, result={"content": []})
        assert await tasks.update(done) == replace(done, seen_at=T0 + 7) == await tasks.get("moved")
        assert await events.run_read(row("moved")) == (T0 + 7, T0 + 37)

        kept = task("kept")
        await tasks.create(kept)
        assert await tasks.poll("kept", ALICE, T0 + 3) == replace(kept, seen_at=T0 + 3)
        done = advance(kept, TaskStatus.COMPLETED, T0 + 4, result={"content": []})
        assert await tasks.update(done) == replace(done, seen_at=T0 + 3) == await tasks.get("kept")
        assert await events.run_read(row("kept")) == (T0 + 3, T0 + 34)
        assert await tasks.update(advance(kept, TaskStatus.CANCELLED, T0 + 6, message="late")) == replace(
            done, seen_at=T0 + 3
        )
    finally:
        await events.close()
