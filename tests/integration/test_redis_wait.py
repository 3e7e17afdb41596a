"""Replica-acknowledged appends (``wait_replicas``): a write counts as stored only once a replica holds it.

A real primary and a real replica on loopback; the replica is stopped (SIGSTOP) to stand for one that lags, so
the primary's ``WAIT`` times out exactly as it would behind a slow or cut replication link.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from redis.asyncio import Redis

from mcp_lossless.core.tasks import TaskStatus, advance
from mcp_lossless.stores import StoreUnavailable
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.tasks_redis import RedisTaskStore
from tests.integration.test_store_contract import event, session, stream
from tests.integration.test_task_stores import T0, task
from tests.support.redis_server import RedisServer, redis_server_binary

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """The process frozen (SIGSTOP) until the block ends: it holds its socket but acknowledges nothing."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    binary = redis_server_binary()
    with tempfile.TemporaryDirectory(prefix="mcpl-wait-") as directory:
        primary = RedisServer(binary, Path(directory) / "p")
        replica = RedisServer(binary, Path(directory) / "r")
        for server in (primary, replica):
            server.directory.mkdir()
            server.start()
        try:
            yield primary, replica
        finally:
            replica.stop()
            primary.stop()


@pytest.fixture
async def linked(pair: tuple[RedisServer, RedisServer]) -> AsyncIterator[tuple[RedisServer, Redis, Redis]]:
    """The replica following the primary, with a raw client to each."""
    primary, replica = pair
    to_primary, to_replica = Redis.from_url(primary.url), Redis.from_url(replica.url)
    await to_replica.execute_command("REPLICAOF", "127.0.0.1", primary.port)
    deadline = time.monotonic() + 20
    while (await to_replica.info("replication"))["master_link_status"] != "up":  # another process's readiness
        assert time.monotonic() < deadline, "the replica never caught up with the primary"
        await anyio.sleep(0.05)
    try:
        yield replica, to_primary, to_replica
    finally:
        await to_primary.aclose()
        await to_replica.aclose()


@pytest.fixture
async def acknowledged(pair: tuple[RedisServer, RedisServer]) -> AsyncIterator[RedisStore]:
    """A store on the primary whose writes count once one replica holds them (300 ms for it to say so)."""
    store = RedisStore(pair[0].url, wait_replicas=1, wait_timeout_ms=300)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_an_append_counts_only_once_a_replica_holds_it(
    acknowledged: RedisStore, linked: tuple[RedisServer, Redis, Redis]
) -> None:
    store = acknowledged
    replica, _, to_replica = linked
    await store.put_session(session("s1"))
    await store.open_stream(stream("k1"))
    await store.append(event("k1", 0))
    assert await to_replica.xlen("mcpl:{s1}:e:k1") == 1, "acknowledged: the replica holds it already"

    with stopped(replica):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas acknowledged"):
            await store.append(event("k1", 1))
        assert time.monotonic() - started < 3, "a WAIT times out as configured, it does not hang"
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas"):
            await store.open_stream(stream("k2"))

    await store.append(event("k1", 1))  # the same append again (the server's retry): stored once, now held
    assert await to_replica.xlen("mcpl:{s1}:e:k1") == 2
    assert [e.seq for e in await store.read_after("k1", -1)] == [0, 1]


async def test_a_task_record_counts_only_once_a_replica_holds_it(
    acknowledged: RedisStore, linked: tuple[RedisServer, Redis, Redis]
) -> None:
    replica, _, to_replica = linked
    tasks = RedisTaskStore(acknowledged)
    await tasks.create(task("t-1"))
    assert await to_replica.exists("mcpl:task:t-1") == 1, "acknowledged: the replica holds the task already"
    with stopped(replica):
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas"):
            await tasks.create(task("t-2"))
        done = advance(task("t-1"), TaskStatus.COMPLETED, T0 + 1, result={"content": []})
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas"):  # an outcome not held is not stored
            await tasks.update(done)
    assert (await tasks.update(done)) is not None  # the same write again, now held
    got = await tasks.get("t-1")
    assert got is not None and got.status is TaskStatus.COMPLETED


async def test_without_wait_replicas_the_primary_alone_acknowledges(
    pair: tuple[RedisServer, RedisServer], linked: tuple[RedisServer, Redis, Redis]
) -> None:
    primary, _ = pair
    replica, _, _ = linked
    store = RedisStore(primary.url)
    await store.open()
    try:
        await store.open_stream(stream("k1"))
        with stopped(replica):
            await store.append(event("k1", 0))  # what a failover can then lose: docs/redis.md
        assert [e.seq for e in await store.read_after("k1", -1)] == [0]
    finally:
        await store.close()


async def test_wait_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="WAIT 0 blocks"):
        RedisStore("redis://127.0.0.1:1", wait_timeout_ms=0)
    store = RedisStore.from_spec("redis://127.0.0.1:1?wait_replicas=2&wait_timeout_ms=50")
    assert (store.wait_replicas, store.wait_timeout_ms) == (2, 50)
