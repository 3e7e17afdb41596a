"""The EventStore contract against every backend (Redis: a real redis-server), plus SQLite durability after SIGKILL."""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from mcp_lossless.core.events import Loss, PendingRequest, RequestId, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.idempotency import KeyRecord, StreamTarget
from mcp_lossless.core.principal import Principal
from mcp_lossless.stores.base import (
    EventsEvicted,
    EventsLost,
    EventStore,
    KeyTaken,
    SessionRecord,
    StoreUnavailable,
    StreamTakenOver,
)
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

TOOL_A = frozenset({"https://mcp.example/tools/a"})
TOOL_BC = frozenset({"https://mcp.example/tools/b", "https://mcp.example/tools/c"})
ALICE = Principal("https://issuer.example", "alice", "client-1")
BOB = Principal("https://issuer.example", "bob", "client-2")
REPO_ROOT = Path(__file__).resolve().parents[2]

OpenStore = Callable[[int | None], Awaitable[EventStore]]
"""Opens a fresh store; the argument is its eviction limit (memory: total events, sqlite and redis: per stream)."""


@pytest.fixture(params=["memory", "sqlite", "redis", "redis-cluster"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    opened: list[EventStore] = []

    async def factory(limit: int | None = None) -> EventStore:
        store: EventStore
        if request.param == "memory":
            store = MemoryStore() if limit is None else MemoryStore(max_events=limit)
        elif request.param == "sqlite":
            store = SqliteStore(str(tmp_path / f"store{len(opened)}.db"), max_events_per_stream=limit)
        else:  # a cluster spreads the sessions of one test over its three primaries: no command may span slots
            cluster = request.param == "redis-cluster"
            url = (
                request.getfixturevalue("redis_cluster_nodes").spec if cluster else request.getfixturevalue("redis_url")
            )
            store = RedisStore(url, prefix=f"contract-{uuid.uuid4().hex}", max_events_per_stream=limit)
        await store.open()
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_store: OpenStore) -> EventStore:
    return await open_store(None)


def session(session_id: str, principal: Principal = ALICE, last_seen: float = 100.0) -> SessionRecord:
    return SessionRecord(session_id, principal, "2025-11-25", created_at=50.0, last_seen=last_seen)


def stream(key: str, session_id: str = "s1", requests: tuple[PendingRequest, ...] = ()) -> StreamRecord:
    return StreamRecord(session_id, key, StreamKind.POST, owner="instance-1", requests=requests)


def event(
    key: str,
    seq: int,
    *,
    session_id: str = "s1",
    request_id: RequestId | None = None,
    tags: frozenset[str] = TOOL_A,
    terminal: bool = False,
) -> StoredEvent:
    data = b"" if seq == 0 else b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"n":%d}}' % seq
    tool = "a" if tags else None
    return StoredEvent(session_id, key, seq, f"{key}.{seq:x}.mac", data, request_id, tool, tags, terminal)


async def fill(store: EventStore, key: str, count: int, session_id: str = "s1") -> list[StoredEvent]:
    events = [event(key, seq, session_id=session_id) for seq in range(count)]
    for item in events:
        await store.append(item)
    return events


async def test_secret_is_stable_and_strong_enough_for_event_ids(store: EventStore) -> None:
    first = await store.secret()
    assert len(first) >= 16
    assert await store.secret() == first


async def test_session_round_trip_touch_and_replace(store: EventStore) -> None:
    assert await store.get_session("s1") is None
    await store.put_session(session("s1"))
    await store.put_session(session("s2", BOB))
    assert await store.get_session("s1") == session("s1")
    assert await store.get_session("s2") == session("s2", BOB)

    await store.touch_session("s1", 175.5)
    touched = await store.get_session("s1")
    assert touched is not None
    assert touched.last_seen == 175.5
    assert touched.created_at == 50.0
    await store.touch_session("nobody", 175.5)
    assert await store.get_session("nobody") is None

    await store.put_session(replace(session("s1"), protocol_version="2025-06-18"))
    replaced = await store.get_session("s1")
    assert replaced is not None
    assert replaced.protocol_version == "2025-06-18"


async def test_an_enqueued_open_is_stored_before_the_events_enqueued_after_it(store: EventStore) -> None:
    """``enqueue_open`` returns at once; the record's future resolves before those of the events queued after it
    (no wait between them: the store may write them together), and the stream reads back whole."""
    request = PendingRequest(1, "tools/call", "a", TOOL_A)
    await store.put_session(session("s1"))
    resolved: list[str] = []
    opened = store.enqueue_open(stream("k1", requests=(request,)))
    opened.add_done_callback(lambda _future: resolved.append("record"))
    events = [event("k1", 0, request_id=1), event("k1", 1, request_id=1), event("k1", 2, request_id=1, terminal=True)]
    futures = [store.enqueue(item, completes=item.terminal) for item in events]
    for item, future in zip(events, futures, strict=True):
        future.add_done_callback(lambda _future, seq=item.seq: resolved.append(f"event {seq}"))
    with anyio.fail_after(10):
        await asyncio.gather(opened, *futures)
        await asyncio.sleep(0)  # one turn: the last done-callbacks run
    assert resolved == ["record", "event 0", "event 1", "event 2"]
    record = await store.get_stream("k1")
    assert record is not None and (record.completed, record.last_seq, record.answered) == (True, 2, frozenset({1}))
    assert await store.read_after("k1", -1) == events


async def test_an_enqueued_open_stores_its_session_in_the_same_write(store: EventStore) -> None:
    """``enqueue_open(..., session=...)`` (a task's stream, a session of its own: ADR 0040): the session is stored
    with the stream, its events count for the session's principal, and the stream goes with the session."""
    own = session("own", BOB)
    opened = store.enqueue_open(stream("own", "own"), session=own)
    appended = store.enqueue(event("own", 0, session_id="own"), completes=False)
    with anyio.fail_after(10):
        await asyncio.gather(opened, appended)
    assert await store.get_session("own") == own
    assert await store.get_stream("own") is not None and store.stored_bytes(BOB) > 0
    await store.delete_session("own")
    assert await store.get_stream("own") is None and store.stored_bytes(BOB) == 0


async def test_delete_session_removes_its_streams_and_events_only(store: EventStore) -> None:
    await store.put_session(session("s1"))
    await store.put_session(session("s2", BOB))
    await store.open_stream(stream("stream-of-s1"))
    await store.open_stream(stream("stream-of-s2", "s2"))
    await fill(store, "stream-of-s1", 3)
    kept = await fill(store, "stream-of-s2", 2, session_id="s2")

    await store.delete_session("s1")

    assert await store.get_session("s1") is None
    assert await store.get_stream("stream-of-s1") is None
    assert await store.read_after("stream-of-s1", -1) == []
    assert await store.get_session("s2") is not None
    assert await store.read_after("stream-of-s2", -1) == kept


async def test_expire_sessions_deletes_only_idle_ones_with_their_events(store: EventStore) -> None:
    await store.put_session(session("idle", last_seen=10.0))
    await store.put_session(session("exactly-at-limit", last_seen=20.0))
    await store.put_session(session("active", last_seen=30.0))
    await store.open_stream(stream("idle-stream", "idle"))
    await fill(store, "idle-stream", 2, session_id="idle")

    assert await store.expire_sessions(20.0) == ["idle"]

    assert await store.get_session("idle") is None
    assert await store.get_stream("idle-stream") is None
    assert await store.read_after("idle-stream", -1) == []
    assert await store.get_session("exactly-at-limit") is not None
    assert await store.get_session("active") is not None
    assert await store.expire_sessions(20.0) == []


async def test_stream_round_trip_keeps_requests_and_id_types(store: EventStore) -> None:
    requests = (
        PendingRequest(1, "tools/call", "a", TOOL_A),
        PendingRequest("1", "tools/call", "bc", TOOL_BC),
        PendingRequest("ping-é", "ping"),
    )
    record = stream("k1", requests=requests)
    await store.open_stream(record)

    got = await store.get_stream("k1")
    assert got == record
    assert got is not None
    assert [type(r.request_id) for r in got.requests] == [int, str, str]
    assert got.unanswered() == requests
    assert await store.get_stream("missing") is None


async def test_opening_an_existing_key_starts_it_afresh_beside_new_streams(store: EventStore) -> None:
    """A key opened again is a new stream: its old events and answers go. Opened together with new streams (one
    batch of a group-committing store), each new one is created and the old one replaced, nothing mixed up."""
    call = PendingRequest(1, "tools/call", "a", TOOL_A)
    await store.open_stream(stream("k1", requests=(call,)))
    await fill(store, "k1", 2)
    await store.append(event("k1", 2, request_id=1, terminal=True), completes=True)
    other = await fill_stream(store, "k0")

    again = PendingRequest("again", "tools/call", "bc", TOOL_BC)
    await asyncio.gather(
        store.open_stream(stream("k2")),
        store.open_stream(stream("k1", requests=(again,))),
        store.open_stream(stream("k3")),
    )

    assert await store.get_stream("k1") == stream("k1", requests=(again,))
    assert await store.read_after("k1", -1) == []
    for key in ("k2", "k3"):
        assert await store.get_stream(key) == stream(key)
    assert await store.read_after("k0", -1) == other
    restarted = event("k1", 0, request_id="again")
    await store.append(restarted)
    assert await store.read_after("k1", -1) == [restarted]


async def fill_stream(store: EventStore, key: str) -> list[StoredEvent]:
    await store.open_stream(stream(key))
    return await fill(store, key, 3)


async def test_returned_stream_record_is_a_copy(store: EventStore) -> None:
    await store.open_stream(stream("k1"))
    got = await store.get_stream("k1")
    assert got is not None
    got.completed = True
    got.last_seq = 99
    assert await store.get_stream("k1") == stream("k1")


async def test_complete_stream_marks_it_completed(store: EventStore) -> None:
    await store.open_stream(stream("k1"))
    await store.complete_stream("k1")
    got = await store.get_stream("k1")
    assert got is not None
    assert got.completed


async def test_the_last_answer_completes_its_stream_in_the_same_append(store: EventStore) -> None:
    requests = (PendingRequest(1, "tools/call", "a", TOOL_A), PendingRequest("two", "tools/call", "a", TOOL_A))
    await store.open_stream(stream("k1", requests=requests))
    await store.append(event("k1", 0))
    await store.append(event("k1", 1, request_id=1, terminal=True))
    first = await store.get_stream("k1")
    assert first is not None
    assert (first.answered, first.completed) == ({1}, False)
    await store.append(event("k1", 2, request_id="two", terminal=True), completes=True)
    done = await store.get_stream("k1")
    assert done is not None
    assert (done.answered, done.completed, done.last_seq) == ({1, "two"}, True, 2)
    assert [e.seq for e in await store.read_after("k1", 0)] == [1, 2]


async def test_append_then_read_after_follows_cursor_semantics(store: EventStore) -> None:
    await store.open_stream(stream("k1"))
    await store.open_stream(stream("k2"))
    events = await fill(store, "k1", 6)
    await fill(store, "k2", 2)

    assert await store.read_after("k1", -1) == events
    assert await store.read_after("k1", 0) == events[1:]
    assert await store.read_after("k1", 3) == events[4:]
    assert await store.read_after("k1", 5) == []
    assert await store.read_after("k1", 40) == []
    assert await store.read_after("unknown", -1) == []
    got = await store.get_stream("k1")
    assert got is not None
    assert got.last_seq == 5


async def test_read_events_round_trip_every_field(store: EventStore) -> None:
    await store.open_stream(stream("k1"))
    ids: list[RequestId | None] = [None, 7, "7", 2**64 - 1, -(2**63), "naïve ☃"]
    written = [
        StoredEvent("s1", "k1", seq, f"id-{seq}", bytes([seq, 0, 255]), rid, "bc", TOOL_BC, seq % 2 == 1)
        for seq, rid in enumerate(ids)
    ]
    for item in written:
        await store.append(item)

    read = await store.read_after("k1", -1)

    assert read == written
    assert [type(e.request_id) for e in read] == [type(rid) for rid in ids]


async def test_a_batch_streams_interleaved_requests_read_back_from_every_cursor(store: EventStore) -> None:
    """Progress and answers of two requests with different tools interleave, a repeated id's second answer and an
    event of no request among them: whatever the cursor (so whichever request the first event read has), every
    event after it reads back whole and in order."""
    await store.open_stream(stream("k1"))
    shapes: list[tuple[RequestId | None, str | None, frozenset[str], bool]] = [
        (1, "a", TOOL_A, False),
        ("b", "bc", TOOL_BC, False),
        (1, "a", TOOL_A, False),
        ("b", "bc", TOOL_BC, True),
        (None, None, frozenset(), False),
        (1, "a", TOOL_A, False),
        (1, "a", TOOL_A, True),
        (1, "bc", TOOL_BC, True),
        ("b", "bc", TOOL_BC, False),
    ]
    written = [
        StoredEvent("s1", "k1", seq, f"k1.{seq:x}.mac", b"[%d]" % seq, rid, tool, tags, terminal)
        for seq, (rid, tool, tags, terminal) in enumerate(shapes)
    ]
    for item in written:
        await store.append(item)

    for cursor in range(-1, len(written)):
        read = await store.read_after("k1", cursor)
        assert read == written[cursor + 1 :]
        assert [type(e.request_id) for e in read] == [type(e.request_id) for e in written[cursor + 1 :]]


async def test_terminal_events_mark_only_their_request_answered(store: EventStore) -> None:
    int_call = PendingRequest(1, "tools/call", "a", TOOL_A)
    str_call = PendingRequest("1", "tools/call", "a", TOOL_A)
    await store.open_stream(stream("k1", requests=(int_call, str_call)))

    await store.append(event("k1", 0))
    await store.append(event("k1", 1, request_id="1"))
    record = await store.get_stream("k1")
    assert record is not None
    assert record.unanswered() == (int_call, str_call)

    await store.append(event("k1", 2, request_id="1", terminal=True))
    record = await store.get_stream("k1")
    assert record is not None
    assert record.answered == frozenset({"1"})
    assert record.unanswered() == (int_call,)

    await store.append(event("k1", 3, request_id=1, terminal=True))
    record = await store.get_stream("k1")
    assert record is not None
    assert record.unanswered() == ()


async def test_append_to_unknown_stream_is_refused(store: EventStore) -> None:
    """A shared store can lose a stream its producer opened (a failover): it says so; a single-process one cannot."""
    if store.shared:
        with pytest.raises(EventsLost) as lost:
            await store.append(event("never-opened", 0))
        assert lost.value.held is None
    else:
        with pytest.raises(KeyError):
            await store.append(event("never-opened", 0))


async def test_append_that_would_leave_a_gap_is_refused(store: EventStore) -> None:
    await store.open_stream(stream("k1"))
    events = await fill(store, "k1", 2)
    if store.shared:  # the stream's producer is ahead of the store: it lost events (a failover)
        with pytest.raises(EventsLost, match="up to 1, not 2") as lost:
            await store.append(event("k1", 3))
        assert lost.value.held == 1
    else:
        with pytest.raises(ValueError, match="position 3"):
            await store.append(event("k1", 3))
    assert await store.read_after("k1", -1) == events
    record = await store.get_stream("k1")
    assert record is not None
    assert record.last_seq == 1


async def test_queued_appends_of_many_streams_are_stored_in_order_and_a_refused_one_fails_alone(
    store: EventStore,
) -> None:
    """What group commit must keep: appends queued without waiting, from several streams, land in position order;
    a refused append (a gap) fails alone, and the stream's next position is still the one after its last stored."""
    keys = [f"many-{n}" for n in range(4)]
    for key in keys:
        await store.open_stream(stream(key))
    written = {key: [event(key, seq) for seq in range(150)] for key in keys}
    queued = [store.enqueue(written[key][seq]) for seq in range(150) for key in keys]
    refused = store.enqueue(event("many-0", 200))
    after = store.enqueue(event("many-1", 150))
    await asyncio.gather(*queued, after)
    refusal = (EventsLost, "149, not 199") if store.shared else (ValueError, "position 200")
    with pytest.raises(refusal[0], match=refusal[1]):
        await refused
    for key in keys:
        assert await store.read_after(key, -1) == written[key] + ([event(key, 150)] if key == "many-1" else [])
    record = await store.get_stream("many-0")
    assert record is not None
    assert record.last_seq == 149


async def test_appending_exactly_the_stored_event_again_changes_nothing(store: EventStore) -> None:
    """A retry whose first attempt's outcome was lost is safe; different content at a stored position is not."""
    await store.open_stream(stream("k1"))
    events = await fill(store, "k1", 3)
    await store.append(events[1])
    with pytest.raises((ValueError, StoreUnavailable)):
        await store.append(events[1]._replace(data=b"something else"))
    assert await store.read_after("k1", -1) == events


async def test_eviction_is_all_or_error_never_a_partial_list(open_store: OpenStore) -> None:
    store = await open_store(5)
    await store.open_stream(stream("k1"))
    events = await fill(store, "k1", 8)

    assert await store.read_after("k1", 2) == events[3:]
    assert await store.read_after("k1", 6) == events[7:]
    for cursor in (-1, 0, 1):
        with pytest.raises(EventsEvicted):
            await store.read_after("k1", cursor)


async def test_deleted_sessions_do_not_count_towards_the_eviction_limit(open_store: OpenStore) -> None:
    store = await open_store(5)
    await store.open_stream(stream("kept"))
    await store.open_stream(stream("dropped", "s2"))
    kept = [event("kept", seq) for seq in range(5)]
    for item in kept[:2]:
        await store.append(item)
    await fill(store, "dropped", 3, session_id="s2")
    await store.delete_session("s2")
    for item in kept[2:]:
        await store.append(item)

    assert await store.read_after("kept", -1) == kept


async def test_owner_alive_is_false_for_single_process_stores(store: EventStore) -> None:
    assert await store.owner_alive("instance-1") is False


async def test_mark_lost_ends_an_open_stream_of_its_owner_once_writing_no_event(store: EventStore) -> None:
    requests = (PendingRequest(1, "tools/call", "a", TOOL_A), PendingRequest(2, "tools/call", "a", TOOL_A))
    await store.open_stream(stream("k1", requests=requests))
    answer = event("k1", 2, request_id=1, terminal=True)
    events = [*await fill(store, "k1", 2), answer]
    await store.append(answer)

    with pytest.raises(StreamTakenOver):
        await store.mark_lost("k1", "someone-else", Loss.OWNER)
    got = await store.mark_lost("k1", "instance-1", Loss.OWNER)
    assert got is not None
    assert (got.completed, got.lost, got.last_seq, got.answered) == (True, Loss.OWNER, 2, frozenset({1}))
    assert [r.request_id for r in got.unanswered()] == [2]
    assert await store.get_stream("k1") == got
    assert await store.read_after("k1", -1) == events

    again = await store.mark_lost("k1", "instance-1", Loss.STORE)
    assert again == got, "an ended stream is left as it is: a retry, or a second replica, changes nothing"
    assert await store.mark_lost("never-opened", "instance-1", Loss.OWNER) is None


def key_record(key: str, stream_key: str, principal: Principal = ALICE, expires: float | None = None) -> KeyRecord:
    """Times are the wall clock's: a shared store expires keys by its own clock."""
    created = time.time()
    when = created + 3600 if expires is None else expires
    return KeyRecord(principal, key, "a", "hash-of-arguments", StreamTarget(stream_key, 1), created, when)


async def test_keys_are_stored_with_their_stream_and_found_only_by_their_principal_until_they_expire(
    store: EventStore,
) -> None:
    call = PendingRequest(1, "tools/call", "a", TOOL_A)
    await store.put_session(session("s1"))
    assert store.idempotency_keys
    now = time.time()
    kept, brief = key_record("k-1", "keyed"), key_record("k-2", "keyed", expires=now + 60)
    await store.enqueue_open(stream("keyed", requests=(call,)), [kept, brief])
    assert await store.get_stream("keyed") is not None, "the key's stream is stored with it"
    assert await store.get_key(ALICE, "k-1", now) == kept
    assert await store.get_key(BOB, "k-1", now) is None, "another principal's same string is another key"
    assert await store.get_key(ALICE, "k-3", now) is None
    assert await store.get_key(ALICE, "k-2", now) == brief
    assert await store.get_key(ALICE, "k-2", now + 60) is None, "expired"
    assert (store.keys_held(ALICE, now), store.keys_held(ALICE, now + 60), store.keys_held(BOB, now)) == (2, 1, 0)
    answer = event("keyed", 0, request_id=1, terminal=True)
    await store.append(answer, completes=True)
    assert await store.read_after("keyed", -1) == [answer], "the key's outcome is its stream's answer"


async def test_sqlite_keeps_a_keyed_stream_past_its_sessions_count_of_completed_streams(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "keys.db"), max_completed_streams_per_session=1)
    await store.open()
    try:
        call = PendingRequest(1, "tools/call", "a", TOOL_A)
        await store.put_session(session("s1"))
        for name in ("keyed", "old", "new"):
            keys = [key_record("k", name)] if name == "keyed" else []
            await store.enqueue_open(stream(name, requests=(call,)), keys)
            await store.append(event(name, 0, request_id=1, terminal=True), completes=True)
        await store.sweep()
        assert [name for name in ("keyed", "old", "new") if await store.get_stream(name)] == ["keyed", "new"]
    finally:
        await store.close()


async def test_sqlite_numbers_the_keys_of_a_file_keyed_by_principal_and_key_when_it_opens(tmp_path: Path) -> None:
    """The first layout of the key table (a primary key of principal and key) is copied into the numbered one."""
    path = tmp_path / "first-layout.db"
    kept = key_record("k", "keyed")
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE idempotency_keys (issuer TEXT NOT NULL, subject TEXT NOT NULL, client_id TEXT NOT NULL,"
            " key TEXT NOT NULL, tool TEXT NOT NULL, arguments_hash TEXT NOT NULL, stream TEXT NOT NULL,"
            " request_id TEXT NOT NULL, created REAL NOT NULL, expires REAL NOT NULL,"
            " PRIMARY KEY (issuer, subject, client_id, key)) WITHOUT ROWID"
        )
        db.execute("CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires)")
        p = kept.principal
        db.execute(
            "INSERT INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (p.issuer, p.subject, p.client_id, "k", "a", "hash-of-arguments", "keyed", "1", kept.created, kept.expires),
        )
    db.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        assert await store.get_key(ALICE, "k", time.time()) == kept
        await store.put_session(session("s1"))
        call = PendingRequest(1, "tools/call", "a", TOOL_A)
        await store.enqueue_open(stream("next", requests=(call,)), [key_record("k2", "next")])
        assert (await store.get_key(ALICE, "k2", time.time())) is not None
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, key FROM idempotency_keys ORDER BY id").fetchall()
    db.close()
    assert rows == [(1, "k"), (2, "k2")], "numbered in recording order, the next one after them"


async def test_memory_store_purges_expired_keys_in_its_sweep() -> None:
    store = MemoryStore()
    await store.open()
    call = PendingRequest(1, "tools/call", "a", TOOL_A)
    await store.put_session(session("s1"))
    store.enqueue_open(stream("keyed", requests=(call,)), [key_record("gone", "keyed", expires=time.time() - 1)])
    store.enqueue_open(stream("kept", requests=(call,)), [key_record("kept", "kept")])
    await store.expire_sessions(0.0)
    assert [name for _principal, name in store._keys] == ["kept"]


async def test_redis_one_of_concurrent_first_uses_of_a_key_wins_on_every_replica(redis_url: str) -> None:
    """Two replicas (two stores on one prefix) record the same key at once: exactly one holds it; the other's open
    fails with KeyTaken and leaves nothing of its stream behind. (In a single-process store the server's in-process
    claim decides: tests/integration/test_idempotency_keys.py.)"""
    prefix = f"contract-{uuid.uuid4().hex}"
    first, second = RedisStore(redis_url, prefix=prefix), RedisStore(redis_url, prefix=prefix)
    await first.open()
    await second.open()
    try:
        for store in (first, second):
            await store.put_session(session("s1"))
        call = PendingRequest(1, "tools/call", "a", TOOL_A)
        opens = [
            store.enqueue_open(
                stream(f"on-{n}", requests=(call,)), [key_record("k", f"on-{n}"), key_record(f"mine-{n}", f"on-{n}")]
            )
            for n, store in enumerate((first, second))
        ]
        outcomes = await asyncio.gather(*opens, return_exceptions=True)
        taken = [n for n, outcome in enumerate(outcomes) if isinstance(outcome, KeyTaken)]
        assert len(taken) == 1 and outcomes.count(None) == 1, outcomes
        [loser] = taken
        winner = 1 - loser
        for store in (first, second):
            held = await store.get_key(ALICE, "k", time.time())
            assert held is not None and held.target == StreamTarget(f"on-{winner}", 1)
            assert await store.get_stream(f"on-{loser}") is None, "the loser's stream record was deleted"
            assert await store.get_key(ALICE, f"mine-{loser}", time.time()) is None, "and the keys it did set"
            assert await store.get_key(ALICE, f"mine-{winner}", time.time()) is not None
    finally:
        await first.close()
        await second.close()


async def test_redis_a_completed_keyed_stream_is_kept_as_long_as_its_key(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix=f"contract-{uuid.uuid4().hex}", retention_seconds=60)
    await store.open()
    try:
        await store.put_session(session("s1"))
        call = PendingRequest(1, "tools/call", "a", TOOL_A)
        expires = time.time() + 3600
        await store.enqueue_open(stream("keyed", requests=(call,)), [key_record("k", "keyed", expires=expires)])
        await store.open_stream(stream("plain", requests=(call,)))
        for key in ("keyed", "plain"):
            await store.append(event(key, 0, request_id=1, terminal=True), completes=True)
        client = store.client
        ttl = {key: await client.pttl(f"{store.prefix}:{{s1}}:s:{key}") for key in ("keyed", "plain")}
        events_ttl = await client.pttl(f"{store.prefix}:{{s1}}:e:keyed")
        assert 3_500_000 < ttl["keyed"] <= 3_600_000 and 3_500_000 < events_ttl <= 3_600_000
        assert 0 < ttl["plain"] <= 60_000, "an unkeyed stream keeps the retention"
        key_ttl = await client.pttl(next(iter(await client.keys(f"{store.prefix}:key:*"))))
        assert 3_500_000 < key_ttl <= 3_600_000
    finally:
        await store.close()


async def test_wait_events_answers_at_once_when_events_are_there(store: EventStore) -> None:
    await store.open_stream(stream("k1"))
    events = await fill(store, "k1", 4)

    with anyio.fail_after(2):
        assert await store.wait_events("k1", 1, block_seconds=30) == events[2:]


async def test_sqlite_interns_equal_tag_sets(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "tags.db"))
    await store.open()
    await store.open_stream(stream("k1"))
    for seq in range(4):
        tags = frozenset(TOOL_BC) if seq % 2 else frozenset(set(TOOL_A))
        await store.append(event("k1", seq, tags=tags))
    read = await store.read_after("k1", -1)
    await store.close()

    assert read[0].resources is read[2].resources
    assert read[1].resources is read[3].resources
    assert read[0].resources == TOOL_A
    assert read[1].resources == TOOL_BC


async def test_sqlite_keeps_everything_across_close_and_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "reopen.db")
    first = SqliteStore(path, max_events_per_stream=3)
    await first.open()
    secret = await first.secret()
    await first.put_session(session("s1"))
    await first.open_stream(stream("k1", requests=(PendingRequest(4, "tools/call", "a", TOOL_A),)))
    events = await fill(first, "k1", 5)
    await first.append(event("k1", 5, request_id=4, terminal=True))
    await first.complete_stream("k1")
    await first.close()

    second = SqliteStore(path, max_events_per_stream=3)
    await second.open()
    try:
        assert await second.secret() == secret
        assert await second.get_session("s1") == session("s1")
        record = await second.get_stream("k1")
        assert record is not None
        assert (record.last_seq, record.completed, record.unanswered()) == (5, True, ())
        assert (await second.read_after("k1", 2))[:2] == events[3:]
        with pytest.raises(EventsEvicted):
            await second.read_after("k1", 1)
    finally:
        await second.close()


async def test_sqlite_refuses_to_replay_a_stream_with_a_position_missing(tmp_path: Path) -> None:
    """A replay counts positions rather than reading them, so a row deleted under the store (by hand, or by another
    program) is an explicit failure naming the stream, never a replay with later events at the wrong positions."""
    path = tmp_path / "gap.db"
    store = SqliteStore(str(path))
    await store.open()
    try:
        await store.open_stream(stream("k1"))
        events = await fill(store, "k1", 5)
        with sqlite3.connect(path) as other:
            other.execute("DELETE FROM events WHERE seq = 3")
        assert await store.read_after("k1", 3) == events[4:]
        with pytest.raises(StoreUnavailable, match=re.escape("stream k1 holds 3 events at positions 1..4, not 4")):
            await store.read_after("k1", 0)
        with sqlite3.connect(path) as other:
            other.execute("DELETE FROM events WHERE seq = 1")
        with pytest.raises(StoreUnavailable, match="stream k1"):  # the first position after the cursor is gone
            await store.read_after("k1", 0)
    finally:
        await store.close()


async def test_sqlite_rejects_use_before_open(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "unopened.db"))
    with pytest.raises(RuntimeError, match="before open"):
        await store.secret()
    with pytest.raises(RuntimeError, match="before open"):
        await store.read_after("k1", -1)


async def test_sqlite_reports_an_unusable_file_clearly(tmp_path: Path) -> None:
    garbage = tmp_path / "not-a-database.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    for path in (garbage, tmp_path / "no-such-dir" / "x.db"):
        store = SqliteStore(str(path))
        with pytest.raises(StoreUnavailable, match="cannot open sqlite store"):
            await store.open()


# --- durability across a real process kill -------------------------------------------------------

KILL_EVENTS = 240
KILL_REQUESTS = (
    PendingRequest(1, "tools/call", "a", TOOL_A),
    PendingRequest("call-2", "tools/call", "bc", TOOL_BC),
    PendingRequest(3, "tools/call", "a", TOOL_A),
)


def kill_test_event(seq: int) -> StoredEvent:
    """The events the child writes; the parent recomputes them to compare after the kill."""
    request = KILL_REQUESTS[seq % 3]
    terminal = seq in (KILL_EVENTS - 2, KILL_EVENTS - 1)
    return event("killed-stream", seq, request_id=request.request_id, tags=request.resources, terminal=terminal)


async def child_writes_then_waits(path: str) -> None:
    store = SqliteStore(path)
    await store.open()
    await store.put_session(session("s1"))
    await store.open_stream(stream("killed-stream", requests=KILL_REQUESTS))
    for seq in range(KILL_EVENTS):
        await store.append(kill_test_event(seq))
    print("ready", (await store.secret()).hex(), flush=True)
    sys.stdin.read()


async def test_sqlite_keeps_every_event_after_sigkill(tmp_path: Path) -> None:
    path = str(tmp_path / "killed.db")
    child = [sys.executable, "-m", "tests.integration.test_store_contract", path]
    async with await anyio.open_process(child, cwd=REPO_ROOT) as process:
        assert process.stdout is not None
        output = b""
        while b"\n" not in output:
            output += await process.stdout.receive()
        word, secret_hex = output.decode().split()
        assert word == "ready"
        wal = await anyio.Path(path + "-wal").stat()
        assert wal.st_size > 0, "a live WAL shows the store was not closed cleanly"
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL

    store = SqliteStore(path)
    await store.open()
    try:
        assert (await store.secret()).hex() == secret_hex
        assert await store.get_session("s1") == session("s1")
        read = await store.read_after("killed-stream", -1)
        assert read == [kill_test_event(seq) for seq in range(KILL_EVENTS)]
        assert {e.resources for e in read} == {TOOL_A, TOOL_BC}
        record = await store.get_stream("killed-stream")
        assert record is not None
        assert record.requests == KILL_REQUESTS
        assert record.last_seq == KILL_EVENTS - 1
        assert record.unanswered() == (KILL_REQUESTS[0],)
    finally:
        await store.close()


if __name__ == "__main__":
    anyio.run(child_writes_then_waits, sys.argv[1])
