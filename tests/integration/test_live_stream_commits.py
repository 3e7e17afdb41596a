"""A live stream over a store that commits in batches: progress appends return once queued, events are published
only after their commit and in order, a failed commit is stored again before anything after it is published, and
a tool reporting progress in a tight loop never holds the event loop. Real stores (SQLite on a file, memory)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mcp_lossless.core.eventids import EventIdCodec
from mcp_lossless.core.events import PendingRequest, StreamKind, StreamRecord
from mcp_lossless.core.limits import Limits
from mcp_lossless.server.streams import UNCOMMITTED_LIMIT, LiveStream
from mcp_lossless.stores import EventStore, StoreUnavailable
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.sqlite import SqliteStore
from tests.integration.test_store_contract import TOOL_A

pytestmark = pytest.mark.anyio

REQUEST = PendingRequest(1, "tools/call", "a", TOOL_A)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventStore]:
    opened: EventStore = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "live.db"))
    await opened.open()
    yield opened
    await opened.close()


async def live_stream(store: EventStore, key: str = "live-1") -> LiveStream:
    record = StreamRecord("s1", key, StreamKind.POST, "instance-1", (REQUEST,), 0)
    await store.open_stream(record)
    return LiveStream(record.copy(), store, EventIdCodec(await store.secret()), lambda _seconds: None)


def progress(n: int) -> bytes:
    return b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":%d}}' % n


async def test_events_publish_in_order_and_the_answer_after_all_of_them(store: EventStore) -> None:
    live = await live_stream(store)
    for n in range(1, 1_001):
        await live.append(progress(n), REQUEST)
    await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)

    assert live.done
    assert [e.seq for e in live.events] == list(range(1, 1_002))
    stored = await store.read_after("live-1", 0)
    assert stored == live.events
    record = await store.get_stream("live-1")
    assert record is not None
    assert (record.completed, record.last_seq) == (True, 1_001)


async def test_an_event_is_published_only_once_the_file_holds_it(tmp_path: Path) -> None:
    """Every time the stream wakes its writers, a separate connection to the file already sees what it published."""
    path = tmp_path / "published.db"
    store = SqliteStore(str(path))
    await store.open()
    witness = sqlite3.connect(path)
    try:
        live = await live_stream(store)
        checked: list[int] = []

        async def watch() -> None:
            while not live.done:
                waiter = live.waiter()
                await waiter
                if live.events:
                    (stored,) = witness.execute(
                        "SELECT max(seq) FROM events JOIN streams ON events.stream_id = streams.id"
                        " WHERE streams.stream = 'live-1'"
                    ).fetchone()
                    assert stored is not None and stored >= live.events[-1].seq
                    checked.append(live.events[-1].seq)

        watcher = asyncio.create_task(watch())
        for n in range(1, 3 * UNCOMMITTED_LIMIT):
            await live.append(progress(n), REQUEST)
        await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)
        await watcher
        assert checked and checked[-1] == 3 * UNCOMMITTED_LIMIT
    finally:
        witness.close()
        await store.close()


async def test_progress_appends_return_before_their_commit(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "queued.db"))
    await store.open()
    try:
        live = await live_stream(store)
        for n in range(1, 11):
            await live.append(progress(n), REQUEST)
        assert len(live.events) < 10, "ten appends in a row did not each wait for a commit"
        await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)
        assert [e.seq for e in live.events] == list(range(1, 12))
    finally:
        await store.close()


async def test_the_backlog_bytes_are_the_payload_memory_holds_after_each_delivery(store: EventStore) -> None:
    """A delivery of everything published (the count is reset, not summed) and one of a part (summed) both leave
    the byte count the back-pressure bound reads equal to the payload still held."""
    live = await live_stream(store)
    for n in range(1, 51):
        await live.append(progress(n), REQUEST)
    if live.events:
        live.deliver(live.events[-1].seq)
    for n in range(51, 101):
        await live.append(progress(n), REQUEST)
    await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)  # after every event before it
    assert live.backlog_bytes == sum(len(e.data) for e in live.events) > 0
    live.deliver(live.events[9].seq)
    assert live.backlog_bytes == sum(len(e.data) for e in live.events) > 0
    live.deliver(live.events[-1].seq)
    assert (live.backlog_bytes, live.events, live.backlog) == (0, [], 0)


async def reader(live: LiveStream) -> None:
    """A writer's part for a client that reads: each published event is sent as soon as it is seen."""
    while not live.done:
        await live.waiter()
        if live.events:
            live.deliver(live.events[-1].seq)


async def test_a_tight_progress_loop_gives_other_tasks_their_turn(store: EventStore) -> None:
    live = await live_stream(store)
    turns = 0
    flooding = True

    async def other_client() -> None:
        nonlocal turns
        while flooding:
            await asyncio.sleep(0)  # what is measured: how often this task gets the loop
            turns += 1

    other = asyncio.create_task(other_client())
    reading = asyncio.create_task(reader(live))  # 5,000 is past the backlog bound: someone must read
    await asyncio.sleep(0)
    for n in range(1, 5_001):
        await live.append(progress(n), REQUEST)
    flooding = False
    await other
    assert turns >= 5_000 // 32, f"the other task ran {turns} times while 5,000 events were appended"
    await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)
    await reading
    assert [e.seq for e in await store.read_after("live-1", 0)] == list(range(1, 5_002))


async def test_a_full_backlog_holds_the_tool_until_half_of_it_is_sent(store: EventStore) -> None:
    """Past ``stream_backlog`` unsent events the next progress append waits; memory holds only the unsent
    events; sending half lets it go on; an earlier position is then read from the store, not from memory."""
    record = StreamRecord("s1", "live-1", StreamKind.POST, "instance-1", (REQUEST,), 0)
    await store.open_stream(record)
    codec = EventIdCodec(await store.secret())
    live = LiveStream(record.copy(), store, codec, lambda _seconds: None, Limits(stream_backlog=100))
    for n in range(1, 100):
        await live.append(progress(n), REQUEST)
    full = asyncio.create_task(live.append(progress(100), REQUEST))
    while len(live.events) < 100:  # published once stored: at once in memory, after its commit in SQLite
        await live.waiter()
    assert live.backlog == 100 and not full.done()  # the 100th was appended: its call waits for a reader
    assert [e.seq for e in live.events] == list(range(1, 101))
    live.deliver(40)  # not yet half
    await asyncio.sleep(0)
    assert not full.done() and [e.seq for e in live.events] == list(range(41, 101))
    live.deliver(50)
    await asyncio.wait_for(full, 5)
    assert live.after(30) is None and live.after(50) == live.events
    assert [e.seq for e in await live.catch_up(30)] == list(range(31, 101))


async def test_a_commit_that_fails_is_stored_again_before_anything_after_it(tmp_path: Path) -> None:
    """Another connection holds the write lock: the queued events' commits fail (database is locked) and are
    stored again, in order, once it lets go; nothing is published before it is stored, nothing twice."""
    path = tmp_path / "locked.db"
    store = SqliteStore(str(path))
    await store.open()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        live = await live_stream(store)
        blocker.execute("BEGIN IMMEDIATE")
        for n in range(1, 21):
            await live.append(progress(n), REQUEST)
        first = live._queued[0][1]  # the first event's commit: it fails once the busy timeout ran out
        await asyncio.wait([first])
        assert isinstance(first.exception(), StoreUnavailable)
        assert live.events == []
        blocker.execute("ROLLBACK")
        await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)

        assert [e.seq for e in live.events] == list(range(1, 22))
        assert await store.read_after("live-1", 0) == live.events
    finally:
        blocker.close()
        await store.close()


async def test_a_cancel_while_an_answer_is_stored_loses_neither_the_answer_nor_its_position(tmp_path: Path) -> None:
    """The write goes on once handed to the store: the cancelled task waits for it, publishes the answer, and the
    stream's next append takes the next position (without the wait it reused this one: refused as a rewrite)."""
    store = SqliteStore(str(tmp_path / "cancel.db"))
    await store.open()
    try:
        second = PendingRequest(2, "tools/call", "a", TOOL_A)
        record = StreamRecord("s1", "live-1", StreamKind.POST, "instance-1", (REQUEST, second), 0)
        await store.open_stream(record)
        live = LiveStream(record.copy(), store, EventIdCodec(await store.secret()), lambda _seconds: None)
        answering = asyncio.create_task(live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True))
        await asyncio.sleep(0)  # one step: the task runs up to its wait for the store (the write is queued)
        answering.cancel()
        with pytest.raises(asyncio.CancelledError):
            await answering
        assert [e.seq for e in live.events] == [1]
        await live.append(b'{"jsonrpc":"2.0","id":2,"result":{}}', second, terminal=True)
        assert live.done
        assert [e.request_id for e in await store.read_after("live-1", 0)] == [1, 2]
    finally:
        await store.close()


async def test_progress_that_waited_in_line_behind_an_answer_is_all_published_in_order(tmp_path: Path) -> None:
    """A batch's stream: while one request's answer waits for its commit (holding the append lock), two progress
    events of the other request, then its answer, wait in line. Each must go behind the first progress event, which
    made the commit queue while they waited: a queue read before the wait made a second one and the first event was
    never published, and an answer that did not see it could be published before the progress it follows."""
    store = SqliteStore(str(tmp_path / "in-line.db"))
    await store.open()
    try:
        second = PendingRequest(2, "tools/call", "a", TOOL_A)
        record = StreamRecord("s1", "live-1", StreamKind.POST, "instance-1", (REQUEST, second), 0)
        await store.open_stream(record)
        live = LiveStream(record.copy(), store, EventIdCodec(await store.secret()), lambda _seconds: None)
        answering = asyncio.create_task(live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True))
        await asyncio.sleep(0)  # the answer is handed to the store and waits for it, holding the lock
        in_line = [asyncio.create_task(live.append(progress(n), second)) for n in (1, 2)]
        last = live.append(b'{"jsonrpc":"2.0","id":2,"result":{}}', second, terminal=True)
        await asyncio.gather(answering, *in_line, last)

        assert live.done
        assert [e.seq for e in live.events] == [1, 2, 3, 4]
        assert await store.read_after("live-1", 0) == live.events
    finally:
        await store.close()


async def test_a_stream_whose_record_cannot_be_stored_stores_and_publishes_nothing(tmp_path: Path) -> None:
    """The record is queued with the first events (``enqueue_open``) while another connection holds the write lock:
    the transaction fails, and the stream knows its record is not stored: the answer fails with
    ``StoreUnavailable`` (not the store's unknown-stream ``KeyError``), nothing is published, the stream is failed."""
    path = tmp_path / "unrecorded.db"
    store = SqliteStore(str(path))
    await store.open()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        record = StreamRecord("s1", "live-1", StreamKind.POST, "instance-1", (REQUEST,), 0)
        blocker.execute("BEGIN IMMEDIATE")
        opening = store.enqueue_open(record)
        live = LiveStream(
            record.copy(), store, EventIdCodec(await store.secret()), lambda _seconds: None, opening=opening
        )
        assert live.recording is not None
        for n in range(1, 4):
            await live.append(progress(n), REQUEST)
        with pytest.raises(StoreUnavailable, match="record of stream live-1"):
            await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)
        blocker.execute("ROLLBACK")
        assert not await live.wait_recorded()
        assert live.broken and live.events == [] and live.recording is not None
        with pytest.raises(StoreUnavailable):
            await live.append(progress(5), REQUEST)
        assert await store.get_stream("live-1") is None
    finally:
        blocker.close()
        await store.close()


async def test_a_queued_record_is_stored_with_the_first_events_and_before_them(store: EventStore) -> None:
    """A live stream given its record's pending write publishes nothing before the record is stored."""
    record = StreamRecord("s1", "live-1", StreamKind.POST, "instance-1", (REQUEST,), 0)
    opening = store.enqueue_open(record)
    live = LiveStream(record.copy(), store, EventIdCodec(await store.secret()), lambda _seconds: None, opening=opening)
    first = await live.append(progress(1), REQUEST)
    assert live.events in ([], [first]) and (live.recording is None or live.events == [])
    await live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True)
    assert await live.wait_recorded() and live.recording is None
    assert [e.seq for e in live.events] == [1, 2] and live.done
    assert await store.read_after("live-1", 0) == live.events


async def test_an_answer_waits_for_its_commit_in_its_own_task(tmp_path: Path) -> None:
    """No second task per answer (a shielded one cost more than the rest of the wait): while the store commits,
    the only new task is the one appending; the answer is published once stored."""
    store = SqliteStore(str(tmp_path / "own-task.db"))
    await store.open()
    try:
        live = await live_stream(store)
        before = asyncio.all_tasks()
        answering = asyncio.create_task(live.append(b'{"jsonrpc":"2.0","id":1,"result":{}}', REQUEST, terminal=True))
        await asyncio.sleep(0)  # the task runs up to its wait for the store
        assert not answering.done()
        assert asyncio.all_tasks() - before == {answering}
        event = await answering
        assert live.done and live.events == [event]
        assert await store.read_after("live-1", 0) == [event]
    finally:
        await store.close()
