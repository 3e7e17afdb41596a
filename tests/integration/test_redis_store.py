"""What the Redis store adds to the contract: sharing between replicas, leases, blocking reads, outages.

Every test runs against a real redis-server (tests/support/redis_server.py); the outage test starts its
own so stopping it disturbs nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from mcp_lossless.core.events import Loss, PendingRequest, StoredEvent
from mcp_lossless.stores import EventsEvicted, EventsLost, StoreUnavailable, open_store
from mcp_lossless.stores.redis import _PIPELINE_LIMIT, RedisStore, StreamTakenOver
from tests.integration.test_store_contract import ALICE, TOOL_A, TOOL_BC, event, fill, session, stream
from tests.support.redis_server import RedisServer, redis_server_binary

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
OpenReplica = Callable[..., Awaitable[RedisStore]]


@pytest.fixture
async def replica(redis_url: str) -> AsyncIterator[OpenReplica]:
    """Opens stores on one fresh prefix: each is what one server replica would hold."""
    prefix = f"t-{uuid.uuid4().hex}"
    opened: list[RedisStore] = []

    async def factory(**settings: Any) -> RedisStore:
        store = RedisStore(redis_url, prefix=prefix, **settings)
        await store.open()
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_replicas_share_secret_sessions_streams_and_events(replica: OpenReplica) -> None:
    a, b = await replica(), await replica()
    assert await a.secret() == await b.secret()

    await a.put_session(session("s1"))
    requests = (PendingRequest(7, "tools/call", "a", TOOL_A),)
    await a.open_stream(stream("k1", requests=requests))
    written = await fill(a, "k1", 3)
    await a.append(event("k1", 3, request_id=7, terminal=True))

    assert await b.get_session("s1") == session("s1")
    record = await b.get_stream("k1")
    assert record is not None
    assert (record.session_id, record.last_seq, record.unanswered()) == ("s1", 3, ())
    assert (await b.read_after("k1", -1))[:3] == written

    await b.delete_session("s1")
    assert await a.get_session("s1") is None
    assert await a.get_stream("k1") is None
    assert await a.read_after("k1", -1) == []


async def test_read_interns_equal_tag_sets(replica: OpenReplica) -> None:
    store = await replica()
    await store.open_stream(stream("k1"))
    for seq in range(4):
        tags = frozenset(TOOL_BC) if seq % 2 else frozenset(set(TOOL_A))
        await store.append(event("k1", seq, tags=tags))

    read = await (await replica()).read_after("k1", -1)

    assert read[0].resources is read[2].resources
    assert read[1].resources is read[3].resources
    assert (read[0].resources, read[1].resources) == (TOOL_A, TOOL_BC)


async def test_keys_live_under_the_prefix_with_one_hash_tag_per_session(replica: OpenReplica, raw: Redis) -> None:
    store = await replica()
    await store.secret()
    await store.put_session(session("sid-1"))
    await store.open_stream(stream("key-1", "sid-1"))
    await fill(store, "key-1", 2, session_id="sid-1")
    await store.register_instance("inst-1")

    keys = sorted(k.decode() for k in await raw.keys(f"{store.prefix}:*"))

    p = store.prefix
    assert keys == [
        f"{p}:instance:inst-1",
        f"{p}:secret",
        f"{p}:sessions",
        f"{p}:streamidx:key-1",
        f"{p}:{{sid-1}}:e:key-1",
        f"{p}:{{sid-1}}:s:key-1",
        f"{p}:{{sid-1}}:session",
        f"{p}:{{sid-1}}:streams",
    ]
    entries = await raw.xrange(f"{p}:{{sid-1}}:e:key-1")
    assert [entry_id for entry_id, _ in entries] == [b"0-1", b"1-1"]
    assert list(entries[1][1]) == [b"i", b"r", b"t", b"g", b"x", b"d"]
    assert entries[1][1][b"i"] == b".mac", "the id's stream and position are not stored twice"


async def test_completed_streams_and_sessions_expire_open_streams_do_not(replica: OpenReplica, raw: Redis) -> None:
    store = await replica(retention_seconds=120)
    p = store.prefix
    await store.put_session(session("s1"))
    await store.open_stream(stream("open"))
    await store.open_stream(stream("done"))
    await store.open_stream(stream("answered", requests=(PendingRequest(7, "tools/call", "a", TOOL_A),)))
    await fill(store, "open", 2)
    await fill(store, "done", 2)
    await store.complete_stream("done")
    await fill(store, "answered", 1)
    await store.append(event("answered", 1, request_id=7, terminal=True), completes=True)

    assert await raw.ttl(f"{p}:{{s1}}:s:open") == -1
    assert await raw.ttl(f"{p}:{{s1}}:e:open") == -1
    assert await raw.zscore(f"{p}:{{s1}}:streams", "open") == float("inf")
    for name in ("done", "answered"):
        for key in (f"{p}:{{s1}}:s:{name}", f"{p}:{{s1}}:e:{name}", f"{p}:streamidx:{name}"):
            assert 100 < await raw.ttl(key) <= 120, key
        assert await raw.zscore(f"{p}:{{s1}}:streams", name) < time.time() + 121
        record = await store.get_stream(name)
        assert record is not None
        assert record.completed
    assert 100 < await raw.ttl(f"{p}:{{s1}}:session") <= 120


async def test_sessions_whose_hash_expired_are_still_swept_with_their_streams(replica: OpenReplica, raw: Redis) -> None:
    store = await replica()
    p = store.prefix
    await store.put_session(session("gone", last_seen=10.0))
    await store.open_stream(stream("orphaned", "gone"))
    await fill(store, "orphaned", 2, session_id="gone")
    await raw.delete(f"{p}:{{gone}}:session")  # as its TTL would

    assert await store.expire_sessions(20.0) == ["gone"]
    assert await raw.keys(f"{p}:*gone*") == []
    assert await raw.keys(f"{p}:streamidx:*") == []


async def test_concurrent_sweeps_report_each_session_once(replica: OpenReplica) -> None:
    a, b = await replica(), await replica()
    for n in range(20):
        await a.put_session(session(f"idle-{n}", last_seen=float(n)))

    first, second = await asyncio.gather(a.expire_sessions(100.0), b.expire_sessions(100.0))

    assert sorted(first + second) == sorted(f"idle-{n}" for n in range(20))
    assert not set(first) & set(second)


async def test_replicas_ending_a_stream_as_lost_at_once_agree_and_its_owner_appends_no_more(
    replica: OpenReplica,
) -> None:
    stores = [await replica() for _ in range(4)]
    await stores[0].open_stream(stream("k1", requests=(PendingRequest(1, "tools/call", "a", TOOL_A),)))
    await fill(stores[0], "k1", 2)

    ended = await asyncio.gather(*(s.mark_lost("k1", "instance-1", Loss.OWNER) for s in stores))

    assert all(record == ended[0] for record in ended)
    assert ended[0] is not None and (ended[0].lost, ended[0].completed, ended[0].last_seq) == (Loss.OWNER, True, 1)
    with pytest.raises(StreamTakenOver):  # the owner was thought dead: its late event is refused, never stored
        await stores[0].append(event("k1", 2, request_id=1, terminal=True))
    assert len(await stores[1].read_after("k1", -1)) == 2


async def test_an_append_past_what_the_store_holds_is_events_lost_naming_what_it_holds(
    replica: OpenReplica, raw: Redis
) -> None:
    store = await replica()
    await store.open_stream(stream("k1"))
    await fill(store, "k1", 5)
    await raw.hset(f"{store.prefix}:{{s1}}:s:k1", "last", 3)  # what a failover to a lagging replica leaves

    with pytest.raises(EventsLost) as lost:
        await store.append(event("k1", 5))
    assert lost.value.held == 3
    await raw.delete(f"{store.prefix}:{{s1}}:s:k1")
    with pytest.raises(EventsLost) as gone:
        await store.append(event("k1", 7))
    assert gone.value.held is None


async def test_append_is_idempotent_and_never_overwrites_another_instance(replica: OpenReplica) -> None:
    a, b = await replica(), await replica()
    await a.open_stream(stream("k1", requests=(PendingRequest(1, "tools/call", "a", TOOL_A),)))
    await fill(a, "k1", 2)
    lost = event("k1", 2, request_id=1, terminal=True)._replace(data=b'{"error":"execution lost"}')
    await b.append(lost)

    await b.append(lost)  # a retry after a lost reply: already stored, fine
    with pytest.raises(StreamTakenOver):
        await a.append(lost._replace(data=b'{"result":"late"}'))
    with pytest.raises(EventsLost, match="it lost events"):
        await a.append(event("k1", 9))

    assert (await b.read_after("k1", 1)) == [lost]


async def test_a_cursor_before_the_length_trim_is_evicted(replica: OpenReplica, raw: Redis) -> None:
    store = await replica(max_events_per_stream=3)
    await store.open_stream(stream("k1"))
    events = await fill(store, "k1", 10)

    assert await raw.xlen(f"{store.prefix}:{{s1}}:e:k1") == 3
    assert await store.read_after("k1", 6) == events[7:]
    with pytest.raises(EventsEvicted):
        await store.read_after("k1", 5)
    with pytest.raises(EventsEvicted):
        await store.wait_events("k1", 5, block_seconds=1)


async def test_events_lost_behind_the_stores_back_are_an_error_not_a_short_replay(
    replica: OpenReplica, raw: Redis
) -> None:
    store = await replica()
    await store.open_stream(stream("k1"))
    await fill(store, "k1", 4)
    await raw.delete(f"{store.prefix}:{{s1}}:e:k1")  # what an allkeys-* maxmemory policy could do

    with pytest.raises(EventsEvicted, match="noeviction"):
        await store.read_after("k1", 0)


async def test_wait_events_blocks_until_another_replica_appends(replica: OpenReplica) -> None:
    producer, tailer = await replica(), await replica()
    await producer.open_stream(stream("k1"))
    first = await fill(producer, "k1", 2)
    assert await tailer.wait_events("k1", -1, block_seconds=5) == first

    later = [event("k1", 2), event("k1", 3)]
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        waited: list[StoredEvent] = []

        async def wait() -> None:
            waited.extend(await tailer.wait_events("k1", 1, block_seconds=10))

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        for item in later:
            await producer.append(item)
    assert waited[0] == later[0]
    assert time.monotonic() - started < 5, "woken by the append, not by the timeout"
    assert await tailer.wait_events("k1", 3, block_seconds=0.2) == []


async def test_a_lease_lives_with_its_heartbeat_and_dies_with_the_process(replica: OpenReplica) -> None:
    store, other = await replica(lease_seconds=0.3), await replica()
    await store.register_instance("alive")
    assert await other.owner_alive("alive") is True
    await anyio.sleep(1.0)  # more than three lease periods: only the heartbeat keeps it
    assert await other.owner_alive("alive") is True
    await store.close()
    assert await other.owner_alive("alive") is False
    assert await other.owner_alive("never-registered") is False


@contextlib.asynccontextmanager
async def key_events(url: str, event: str) -> AsyncIterator[Callable[[str], Awaitable[None]]]:
    """Redis keyspace notifications: await the moment Redis sets or expires a key, instead of polling."""
    client = Redis.from_url(url)
    await client.config_set("notify-keyspace-events", "E$x")
    pubsub = client.pubsub()
    await pubsub.subscribe(f"__keyevent@0__:{event}")

    async def until(key: str) -> None:
        async for message in pubsub.listen():
            if message["type"] == "message" and message["data"] == key.encode():
                return

    try:
        yield until
    finally:
        await pubsub.aclose()
        await client.aclose()


async def test_a_killed_instance_lease_expires(redis_url: str, replica: OpenReplica) -> None:
    watcher = await replica()
    child = [sys.executable, "-m", "tests.integration.test_redis_store", redis_url, watcher.prefix]
    async with key_events(redis_url, "expired") as expired:
        async with await anyio.open_process(child, cwd=REPO_ROOT) as process:
            assert process.stdout is not None
            assert (await process.stdout.receive()).strip() == b"registered"
            assert await watcher.owner_alive("doomed") is True
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL
            killed = time.monotonic()
        with anyio.fail_after(5):
            await expired(f"{watcher.prefix}:instance:doomed")
    assert await watcher.owner_alive("doomed") is False
    assert time.monotonic() - killed < 2.0, "the lease of a dead instance runs out after lease_seconds"


async def child_registers_then_waits(url: str, prefix: str) -> None:
    store = RedisStore(url, prefix=prefix, lease_seconds=0.5)
    await store.open()
    await store.register_instance("doomed")
    print("registered", flush=True)
    await anyio.sleep(60)


def test_open_store_reads_store_settings_from_the_url() -> None:
    store = open_store("redis://127.0.0.1:7/3?prefix=tenant-a&retention_seconds=60&lease_seconds=2.5&db=3")
    assert isinstance(store, RedisStore)
    assert (store.prefix, store.retention_seconds, store.lease_seconds) == ("tenant-a", 60.0, 2.5)
    assert store.max_events_per_stream == 10_000
    assert store.url == "redis://127.0.0.1:7/3?db=3"
    unbounded = open_store("rediss://user:pw@cache.internal:6380?max_events_per_stream=none")
    assert isinstance(unbounded, RedisStore)
    assert unbounded.max_events_per_stream is None
    with pytest.raises(ValueError, match="retention_seconds='soon'"):
        open_store("redis://127.0.0.1:7?retention_seconds=soon")
    with pytest.raises(ValueError, match="hash tags"):
        open_store("redis://127.0.0.1:7?prefix=a{b}")


async def test_outage_raises_store_unavailable_then_recovers_by_itself(tmp_path: Path) -> None:
    server = RedisServer(redis_server_binary(), tmp_path)
    server.start()
    store = RedisStore(server.url, prefix="outage", lease_seconds=1.0)
    try:
        await store.open()
        secret = await store.secret()
        await store.register_instance("me")
        await store.put_session(session("s1"))
        await store.open_stream(stream("k1"))
        stored = await fill(store, "k1", 3)

        async with anyio.create_task_group() as tg:
            blocked: list[BaseException] = []

            async def tail() -> None:
                try:
                    await store.wait_events("k1", 2, block_seconds=30)
                except StoreUnavailable as exc:
                    blocked.append(exc)

            tg.start_soon(tail)
            await anyio.wait_all_tasks_blocked()
            stopped = time.monotonic()
            server.stop()
        assert blocked, "a blocked read ends with StoreUnavailable when Redis goes"
        assert time.monotonic() - stopped < 5

        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.put_session(session("s2")),
            lambda: store.get_session("s1"),
            lambda: store.touch_session("s1", 200.0),
            lambda: store.delete_session("s1"),
            lambda: store.expire_sessions(0.0),
            lambda: store.open_stream(stream("k2")),
            lambda: store.get_stream("k1"),
            lambda: store.append(event("k1", 3)),
            lambda: store.complete_stream("k1"),
            lambda: store.read_after("k1", -1),
            lambda: store.wait_events("k1", 2, 1.0),
            lambda: store.owner_alive("me"),
            lambda: store.mark_lost("k1", "instance-1", Loss.OWNER),
            lambda: store.register_instance("me"),
            lambda: first_secret(server.url),
        ]
        for call in calls:
            with anyio.fail_after(10), pytest.raises(StoreUnavailable, match="unavailable"):
                await call()

        server.start()  # same port, same append-only file: every acknowledged write is back
        assert await store.secret() == secret
        assert await store.read_after("k1", -1) == stored
        assert await store.get_session("s1") == session("s1")
        await store.append(event("k1", 3))
        async with key_events(server.url, "set") as renewed:
            with anyio.fail_after(3):
                await renewed("outage:instance:me")  # the heartbeat outlived the outage
        assert await store.owner_alive("me") is True
    finally:
        await store.close()
        server.stop()


async def first_secret(url: str) -> bytes:
    """What a replica starting now does first."""
    store = RedisStore(url, prefix="outage")
    await store.open()
    try:
        return await store.secret()
    finally:
        await store.close()


async def test_touch_never_creates_a_partial_session(replica: OpenReplica) -> None:
    store = await replica()
    await store.touch_session("nobody", 5.0)
    assert await store.get_session("nobody") is None
    await store.put_session(session("s1"))
    await store.touch_session("s1", 300.0)
    touched = await store.get_session("s1")
    assert touched is not None
    assert (touched.principal, touched.last_seen) == (ALICE, 300.0)
    assert await store.expire_sessions(250.0) == []


if __name__ == "__main__":
    anyio.run(child_registers_then_waits, sys.argv[1], sys.argv[2])


async def test_a_stream_with_many_appends_queued_delays_another_streams_by_one_pipeline(replica: OpenReplica) -> None:
    """Pipelines take the streams in turn: a flooding stream's queue does not stand in front of another stream's
    append (issue 11, H1: another client's answer waited for all of it), and each stream stays in order."""
    store = await replica()
    await store.put_session(session("s1"))
    await store.open_stream(stream("flood"))
    await store.open_stream(stream("other"))
    flood = [store.enqueue(event("flood", seq)) for seq in range(20 * _PIPELINE_LIMIT)]
    await store.enqueue(event("other", 0))
    assert sum(future.done() for future in flood) <= 2 * _PIPELINE_LIMIT
    await asyncio.gather(*flood)
    assert [e.seq for e in await store.read_after("flood", -1)] == list(range(20 * _PIPELINE_LIMIT))
