"""The memory store's bound: it counts the bytes it really holds, and one principal cannot evict another's events."""

from __future__ import annotations

import gc
import tracemalloc

import orjson
import pytest

from mcp_lossless.core.events import StoredEvent
from mcp_lossless.stores import EventsEvicted
from mcp_lossless.stores.memory import MemoryStore
from tests.integration.test_store_contract import ALICE, BOB, TOOL_A, event, session, stream

pytestmark = pytest.mark.anyio


def progress(key: str, seq: int, session_id: str = "s1") -> StoredEvent:
    """An event whose payload comes from ``orjson.dumps``, as the server's do (orjson over-allocates it)."""
    data = orjson.dumps(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": seq}}
    )
    return StoredEvent(session_id, key, seq, f"{key}.{seq:x}.mac-of-the-stream", data, 7, "a", TOOL_A)


async def two_principals(store: MemoryStore) -> None:
    await store.put_session(session("alice-session", ALICE))
    await store.put_session(session("bob-session", BOB))
    await store.open_stream(stream("alice-stream", "alice-session"))
    await store.open_stream(stream("bob-stream", "bob-session"))


async def test_memory_store_evicts_by_bytes_it_really_holds() -> None:
    """Replaces a test that counted payload bytes only: now the bound covers each event as held, and is tight."""
    store = MemoryStore(max_bytes=2_000)
    await store.open_stream(stream("k1"))
    events = [event("k1", seq)._replace(data=b"x" * 100) for seq in range(40)]
    for item in events:
        await store.append(item)

    evicted = 0
    while True:
        try:
            held = await store.read_after("k1", evicted - 1)
            break
        except EventsEvicted:
            evicted += 1
    kept = len(held)
    assert 0 < kept < 40
    assert held == events[evicted:], "the newest events are the retained ones, all of them"
    assert store.bytes_held <= 2_000
    assert store.bytes_held + store.bytes_held // kept > 2_000, "one more would not fit: nothing was dropped early"


async def test_memory_store_accounts_for_what_it_allocates() -> None:
    """The counted bytes match what tracemalloc sees the store keep alive (events made, appended and dropped by
    their producer, as the server's are), and an event costs its size, not ~4 KiB."""
    store = MemoryStore()
    await store.open_stream(stream("k1"))
    count = 5_000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(count):
            await store.append(progress("k1", seq))
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()

    events = [progress("k1", seq) for seq in range(count)]
    assert 0.9 * retained <= store.bytes_held <= 1.1 * retained
    assert retained / count < 2 * len(events[0].data) + 200, "each event is held in a compact copy"
    assert await store.read_after("k1", -1) == events


async def test_a_flood_by_one_principal_evicts_only_its_own_events() -> None:
    store = MemoryStore(max_bytes=200_000)
    await two_principals(store)
    bob = [progress("bob-stream", seq, "bob-session") for seq in range(20)]
    for item in bob:
        await store.append(item)

    for seq in range(20_000):
        await store.append(progress("alice-stream", seq, "alice-session"))

    assert store.bytes_held <= 200_000
    assert await store.read_after("bob-stream", -1) == bob
    with pytest.raises(EventsEvicted):
        await store.read_after("alice-stream", -1)
    assert [e.seq for e in await store.read_after("alice-stream", 19_990)] == list(range(19_991, 20_000))


async def test_a_principal_within_its_share_evicts_the_one_holding_the_most() -> None:
    """The store is full of Alice's events when Bob appends: Bob's events stay, Alice's oldest make room."""
    store = MemoryStore(max_events=1_000)
    await two_principals(store)
    for seq in range(1_000):
        await store.append(progress("alice-stream", seq, "alice-session"))
    assert [e.seq for e in await store.read_after("alice-stream", -1)][:1] == [0]

    bob = [progress("bob-stream", seq, "bob-session") for seq in range(50)]
    for item in bob:
        await store.append(item)

    assert await store.read_after("bob-stream", -1) == bob
    with pytest.raises(EventsEvicted):
        await store.read_after("alice-stream", -1)
    assert len(await store.read_after("alice-stream", 49)) == 950


async def test_a_principal_over_its_own_cap_loses_its_oldest_events_first() -> None:
    store = MemoryStore(max_events_per_principal=100)
    await two_principals(store)
    for seq in range(150):
        await store.append(progress("alice-stream", seq, "alice-session"))
        await store.append(progress("bob-stream", seq, "bob-session"))

    for key in ("alice-stream", "bob-stream"):
        assert [e.seq for e in await store.read_after(key, 49)] == list(range(50, 150))
        with pytest.raises(EventsEvicted):
            await store.read_after(key, 48)


async def test_deleting_a_session_releases_its_bytes() -> None:
    store = MemoryStore()
    await two_principals(store)
    for seq in range(100):
        await store.append(progress("alice-stream", seq, "alice-session"))
    await store.append(progress("bob-stream", 0, "bob-session"))
    await store.delete_session("alice-session")
    await store.delete_session("bob-session")
    assert store.bytes_held == 0
