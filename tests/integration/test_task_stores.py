"""The TaskStore contract against every backend (Redis: a real redis-server), and SQLite across a restart."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis

from mcp_lossless.core.principal import Principal
from mcp_lossless.core.tasks import Requirement, TaskRecord, TaskStatus, advance, lost, new_task
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.open import task_store_beside
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore
from mcp_lossless.stores.tasks import TaskLimitReached, TaskStore
from mcp_lossless.stores.tasks_memory import MemoryTaskStore

pytestmark = pytest.mark.anyio

ALICE = Principal("https://issuer.example", "alice", "client-1")
FETCH = Requirement(frozenset({"https://mcp.example/mcp/tools/fetch"}), frozenset({"read"}))
T0 = 1_800_000_000.0


def task(task_id: str = "t-1", ttl: float | None = 30.0) -> TaskRecord:
    return new_task(task_id, ALICE, "fetch", FETCH, "instance-a", T0, ttl)


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TaskStore]:
    events: EventStore
    if request.param == "memory":
        events = MemoryStore()
    elif request.param == "sqlite":
        events = SqliteStore(str(tmp_path / "tasks.db"))
    else:
        events = RedisStore(request.getfixturevalue("redis_url"), prefix=f"tasks-{uuid.uuid4().hex}")
    opened = task_store_beside(events)
    await opened.open()
    yield opened
    await opened.close()


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
    await store.touch("t-1", T0 + 20)
    await store.touch("t-1", T0 + 5)
    found = await store.get("t-1")
    assert found is not None and found.seen_at == T0 + 20 and found.expires_at == T0 + 50
    stale = advance(record, TaskStatus.COMPLETED, T0 + 10, result={"content": []})  # built from an older read
    stored = await store.update(stale)
    assert stored is not None and stored.seen_at == T0 + 20, "an update built from an older read keeps the poll"
    await store.touch("t-404", T0)  # a poll of a purged task is no error


async def test_expired_tasks_are_purged_or_expire(store: TaskStore, request: pytest.FixtureRequest) -> None:
    await store.create(task("short", ttl=10))
    await store.create(task("forever", ttl=None))
    if request.node.callspec.params["store"] != "redis":
        assert await store.purge_expired(T0 + 5) == 0
        assert await store.purge_expired(T0 + 11) == 1
        assert await store.get("short") is None
    else:
        redis = Redis.from_url(request.getfixturevalue("redis_url"))
        try:
            prefix = store.prefix  # type: ignore[attr-defined]
            assert await redis.pttl(f"{prefix}:task:forever") == -1, "an unlimited task never expires"
            expiry = await redis.pexpiretime(f"{prefix}:task:short")
            assert abs(expiry - (T0 + 10 + 60) * 1000) < 2, "Redis drops the task a grace period after its TTL"
        finally:
            await redis.aclose()
    assert await store.get("forever") is not None


async def test_the_memory_store_is_bounded() -> None:
    store = MemoryTaskStore(max_tasks=2)
    await store.create(task("a", ttl=10))
    await store.create(task("b", ttl=None))
    with pytest.raises(TaskLimitReached):
        await store.create(replace(task("c"), created_at=T0 + 1))
    await store.create(replace(task("c"), created_at=T0 + 11))  # "a" expired by then and made room
    assert await store.get("a") is None and await store.get("c") is not None


async def test_sqlite_tasks_share_the_event_store_file_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    events = SqliteStore(str(path))
    await events.open()
    first = task_store_beside(events)
    await first.open()
    await first.create(task())
    await first.touch("t-1", T0 + 7)
    await first.close()
    await events.close()
    again = task_store_beside(SqliteStore(str(path)))
    await again.open()
    try:
        found = await again.get("t-1")
        assert found is not None and found.status is TaskStatus.WORKING and found.seen_at == T0 + 7
    finally:
        await again.close()
