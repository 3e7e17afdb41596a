"""Idempotency keys' retention in every store (ADR 0029), with an injected clock where the store takes one: a live key
counts in its principal's stored bytes and stops counting once expired; expired keys are purged, with the streams
only they kept (a 2026-07-28 keyed call's own stream, which no session holds); a legacy session's deletion leaves
the streams its live keys name, so a later duplicate is replayed (or, for a call the deletion cut, answered as
lost), never "outcome gone"."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from mcp_lossless.core.events import Loss, PendingRequest, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.idempotency import KeyRecord, StreamTarget
from mcp_lossless.core.principal import Principal
from mcp_lossless.stores.base import EventStore, SessionRecord, StoreUnavailable
from mcp_lossless.stores.held import KEY_BYTES, STREAM_BYTES
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

ALICE = Principal("https://issuer.example", "alice", "client-1")
TAGS = frozenset({"https://mcp.example/tools/charge"})
CALL = PendingRequest(1, "tools/call", "charge", TAGS)
START = time.time()


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> AsyncIterator[EventStore]:
    opened: EventStore
    if request.param == "memory":
        opened = MemoryStore(clock=clock)
    else:
        opened = SqliteStore(str(tmp_path / "keys.db"), clock=clock, retention_seconds=10)
    await opened.open()
    yield opened
    await opened.close()


def key(name: str, stream: str, expires: float) -> KeyRecord:
    return KeyRecord(ALICE, name, "charge", "hash", StreamTarget(stream, 1), START, expires)


def record(stream: str, session_id: str = "s1") -> StreamRecord:
    return StreamRecord(session_id, stream, StreamKind.POST, "me", (CALL,), 0)


def answer(stream: str, session_id: str = "s1") -> StoredEvent:
    return StoredEvent(session_id, stream, 1, f"{stream}.1", b'{"result":{}}', 1, "charge", TAGS, True)


async def sweep(store: EventStore, clock: Callable[[], float]) -> None:
    """What the server's periodic sweep and the store's own retention do at the clock's time."""
    await store.expire_sessions(0.0)
    if isinstance(store, SqliteStore):
        await store.sweep(clock())


async def test_expired_keys_are_purged_with_their_bytes_and_the_streams_only_they_kept(
    store: EventStore, clock: Clock
) -> None:
    await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", START, START))
    await store.enqueue_open(record("plain"))
    await store.append(answer("plain"), completes=True)
    before = store.stored_bytes(ALICE)
    await store.enqueue_open(record("legacy"), [key("k-legacy", "legacy", START + 60)])
    await store.append(answer("legacy"), completes=True)
    own = f"own-{uuid.uuid4().hex}"  # a 2026-07-28 keyed call's stream: its own session id, no session record
    legacy = store.stored_bytes(ALICE)
    await store.enqueue_open(record(own, own), [key("k-own", own, START + 60)])
    await store.append(answer(own, own), completes=True)
    assert store.stored_bytes(ALICE) - legacy > KEY_BYTES + len(answer(own, own).data), "its stream counts too"
    assert store.stored_bytes(ALICE) - before >= 2 * KEY_BYTES, "a live key counts in its principal's bytes"
    keyed = store.stored_bytes(ALICE)

    clock.now = START + 61
    assert store.stored_bytes(ALICE) <= keyed - 2 * KEY_BYTES, "an expired key counts no more"
    await sweep(store, clock)
    assert store.keys_held(ALICE, clock.now) == 0
    assert await store.get_key(ALICE, "k-own", START) is None, "purged, not only expired"
    assert await store.get_stream(own) is None, "the stream only its key kept went with it"
    assert store.stored_bytes(ALICE) < legacy, "what it held is released"
    if isinstance(store, MemoryStore):
        assert own not in store._by_session and own not in store._streams, "nothing of it is left in memory"
    if isinstance(store, SqliteStore):
        assert own not in store._counts._sessions, "nor of its count"


async def three_streams(store: EventStore, expires: float) -> None:
    """Session ``s1`` with a stream of no key (answered), one whose key expires at ``expires`` (answered), and one
    under another such key still running."""
    await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", START, START))
    await store.enqueue_open(record("plain"))
    await store.append(answer("plain"), completes=True)
    await store.enqueue_open(record("answered"), [key("k-answered", "answered", expires)])
    await store.append(answer("answered"), completes=True)
    await store.enqueue_open(record("running"), [key("k-running", "running", expires)])


async def delete_session_keeping_keyed(store: EventStore) -> None:
    """Delete :func:`three_streams`' session: the unkeyed stream goes, the answered keyed one stays with its
    outcome, the running one stays cut (lost with its owner)."""
    await store.delete_session("s1")
    assert await store.get_stream("plain") is None
    kept = await store.get_stream("answered")
    assert kept is not None and kept.answered == frozenset({1})
    assert [e.data for e in await store.read_after("answered", 0)] == [answer("answered").data], "its outcome"
    cut = await store.get_stream("running")
    assert cut is not None and (cut.completed, cut.lost) == (True, Loss.OWNER), "cut with its session: lost"


async def test_a_keyed_stream_outlives_its_sessions_deletion_until_its_key_expires(
    store: EventStore, clock: Clock
) -> None:
    await three_streams(store, START + 60)
    held = store.stored_bytes(ALICE)

    await delete_session_keeping_keyed(store)
    assert 0 < store.stored_bytes(ALICE) < held, "what stays is still counted; what went is not"

    clock.now = START + 61
    await sweep(store, clock)
    if isinstance(store, SqliteStore):  # completed streams go after their retention (10 s here)
        clock.now = START + 100
        await sweep(store, clock)
    assert [await store.get_stream(name) for name in ("answered", "running")] == [None, None]
    assert store.stored_bytes(ALICE) == 0


async def test_redis_counts_a_live_key_in_its_principals_bytes(redis_url: str) -> None:
    """Redis expires keys by its own clock: the count is this process's, released when the key's time passed."""
    store = RedisStore(redis_url, prefix=f"keys-{uuid.uuid4().hex}")
    await store.open()
    try:
        await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", START, START))
        await store.enqueue_open(record("plain"))
        before = store.stored_bytes(ALICE)
        now = time.time()
        await store.enqueue_open(record("keyed"), [key("k", "keyed", now + 3600)])
        assert store.stored_bytes(ALICE) - before >= KEY_BYTES
        assert store.keys_held(ALICE, now + 3601) == 0
        own = f"own-{uuid.uuid4().hex}"  # a 2026-07-28 keyed call's stream: counted for its key's principal too
        before = store.stored_bytes(ALICE)
        await store.enqueue_open(record(own, own), [key("k-own", own, now + 3600)])
        assert store.stored_bytes(ALICE) - before >= KEY_BYTES + STREAM_BYTES
    finally:
        await store.close()


async def test_redis_cluster_writes_a_keys_stream_record_before_the_key(redis_cluster_nodes: Any) -> None:
    """On a cluster a key's slot is not its session's: the nodes' pipelines run concurrently, so the record goes
    first and the key only once it is written (whoever finds the key finds its stream, on any replica)."""
    store = RedisStore(redis_cluster_nodes.spec, prefix=f"keys-{uuid.uuid4().hex}")
    await store.open()
    sent: list[list[str]] = []
    made = store.writes

    async def watched() -> Any:
        writes = await made()
        on, execute = writes.on, writes.execute
        queued: list[str] = []

        def on_key(key: str) -> Any:
            queued.append(key)
            return on(key)

        async def executed(**kwargs: Any) -> list[Any]:
            sent.append(list(queued))
            return await execute(**kwargs)

        writes.on = on_key  # type: ignore[method-assign]
        writes.execute = executed  # type: ignore[method-assign]
        return writes

    try:
        await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", START, START))
        store.writes = watched  # type: ignore[method-assign]
        await store.enqueue_open(record("keyed"), [key("k", "keyed", time.time() + 3600)])
        with_key = [n for n, names in enumerate(sent) if any(":key:" in name for name in names)]
        assert with_key == [len(sent) - 1] and sent[-1] == [name for name in sent[-1] if ":key:" in name], sent
        assert any(":s:keyed" in name for name in sent[-2]), "the record, in the write before"
        found = await store.get_key(ALICE, "k", time.time())
        assert found is not None and await store.get_stream("keyed") is not None
    finally:
        store.writes = made  # type: ignore[method-assign]
        await store.close()


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
async def test_redis_a_keyed_stream_outlives_its_sessions_deletion_until_its_key_expires(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """Redis expires by its own clock: the kept stream's record and events expire when its key does."""
    url = request.getfixturevalue("redis_cluster_nodes").spec if kind == "redis-cluster" else None
    store = RedisStore(url or request.getfixturevalue("redis_url"), prefix=f"keys-{uuid.uuid4().hex}")
    await store.open()
    try:
        await three_streams(store, time.time() + 3600)

        await delete_session_keeping_keyed(store)
        ttl = await store.client.pttl(f"{store.prefix}:{{s1}}:s:running")
        assert 3_500_000 < ttl <= 3_600_000, "kept as long as its key, no longer"
        assert await store.get_session("s1") is None
    finally:
        await store.close()


async def test_redis_a_keyed_record_not_acknowledged_leaves_no_key_behind(redis_url: str) -> None:
    """``wait_replicas=1`` on a server without replicas: every write's WAIT falls short, so the keyed call is refused
    (503) before it runs. Its key, set on the primary all the same, must not answer its retry "in progress" for the
    key's 24 h (docs/reliability.md, failover finding 8): it is compare-and-deleted with the stream record."""
    prefix = f"keys-{uuid.uuid4().hex}"
    acknowledging = RedisStore(redis_url, prefix=prefix, wait_replicas=1, wait_timeout_ms=10)
    plain = RedisStore(redis_url, prefix=prefix)
    await acknowledging.open()
    await plain.open()
    try:
        with pytest.raises(StoreUnavailable):
            await acknowledging.enqueue_open(record("keyed"), [key("k", "keyed", time.time() + 3600)])
        assert await plain.get_key(ALICE, "k", time.time()) is None, "the retry runs it: nothing ran"
        assert await plain.get_stream("keyed") is None
    finally:
        await acknowledging.close()
        await plain.close()
