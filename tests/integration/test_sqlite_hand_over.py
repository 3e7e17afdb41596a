"""When the SQLite store hands queued work to its thread: once a turn of the loop queued no more, or a full hand-over
is queued. Calls answered a few per turn from many clients then share one transaction (ADR 0023), work queued alone
waits one turn, and a tool reporting progress in a tight loop has its events committed while it goes on; its events
queued together share one future."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mcp_lossless.core.events import PendingRequest, StoredEvent, StreamRecord
from mcp_lossless.stores.base import SessionRecord
from mcp_lossless.stores.held import ROW_BYTES, STREAM_BYTES
from mcp_lossless.stores.sqlite import _HAND_OVER_AT, SqliteStore
from tests.integration.test_store_contract import ALICE, TOOL_A, TOOL_BC, event, stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(str(tmp_path / "hand-over.db"))
    await opened.open()
    yield opened
    await opened.close()


def count_batches(store: SqliteStore) -> list[int]:
    """The sizes of the batches the writer thread serves from now on (its ``_serve``, wrapped)."""
    sizes: list[int] = []
    serve: Callable[..., bool] = store._serve

    def counted(db: sqlite3.Connection, batch: list[Any], loop: asyncio.AbstractEventLoop) -> bool:
        sizes.append(len(batch))
        return serve(db, batch, loop)

    store._serve = counted  # type: ignore[method-assign]
    return sizes


CALL = PendingRequest(1, "tools/call", "a", TOOL_A)


def call(key: str) -> StreamRecord:
    """A POST's stream as the server opens it: one request, its priming event at position 0."""
    return replace(stream(key, requests=(CALL,)), last_seq=0)


def answer(key: str) -> StoredEvent:
    return event(key, 1, request_id=1, terminal=True)


async def test_calls_answered_turn_after_turn_share_one_transaction(store: SqliteStore) -> None:
    """A call answered at once queues its stream's record and its answer; calls from many clients arrive a few per
    turn: all of them go in one transaction, handed over by the first turn that queues nothing."""
    keys = [f"call-{n}" for n in range(8)]
    batches = count_batches(store)
    written = []
    for turn, key in enumerate(keys, start=1):
        written += [store.enqueue_open(call(key)), store.enqueue(answer(key), True)]
        await asyncio.sleep(0)
        assert len(store._pending) == 2 * turn, "handed over while each turn still queued more"
    await asyncio.gather(*written)
    assert batches == [2 * len(keys)]
    for key in keys:
        assert await store.read_after(key, 0) == [answer(key)]
        record = await store.get_stream(key)
        assert record is not None and record.completed


async def test_work_queued_alone_waits_one_turn(store: SqliteStore) -> None:
    await store.open_stream(call("alone"))
    batches = count_batches(store)
    written = store.enqueue(answer("alone"), True)
    await asyncio.sleep(0)
    assert store._pending == [], "a lone write was held past the turn that queued nothing more"
    await written
    assert batches == [1]


async def test_a_tight_progress_loop_is_handed_over_while_it_goes_on(store: SqliteStore) -> None:
    """16 events a turn (a tool's progress loop yields every 16): handed over each time a full hand-over is queued,
    not held until the tool stops or waits for them."""
    await store.open_stream(call("loop"))
    written = []
    queued = []
    seq = 0
    for _turn in range(3 * _HAND_OVER_AT // 16):
        for _ in range(16):
            seq += 1
            written.append(store.enqueue(event("loop", seq)))
        await asyncio.sleep(0)
        queued.append(store._queued_ops)
    assert max(queued) <= _HAND_OVER_AT
    assert sum(1 for before, after in itertools.pairwise(queued) if after < before) >= 2, "held while the loop went on"
    await asyncio.gather(*written)
    assert [e.seq for e in await store.read_after("loop", 0)] == list(range(1, seq + 1))


async def test_progress_events_of_a_stream_queued_together_share_one_future(store: SqliteStore) -> None:
    await store.open_stream(call("a"))
    await store.open_stream(call("b"))
    first = store.enqueue(event("a", 1))
    second = store.enqueue(event("a", 2))
    other = store.enqueue(event("b", 1))  # another stream's between: a's next one has a future of its own
    third = store.enqueue(event("a", 3))
    last = store.enqueue(event("a", 4, request_id=1, terminal=True), True)
    assert second is first
    assert len({id(first), id(other), id(third), id(last)}) == 4
    await asyncio.gather(first, other, third, last)
    assert [e.seq for e in await store.read_after("a", 0)] == [1, 2, 3, 4]
    record = await store.get_stream("a")
    assert record is not None and record.completed


async def test_a_shared_future_fails_if_any_of_its_events_is_refused(store: SqliteStore) -> None:
    await store.open_stream(call("gap"))
    shared = store.enqueue(event("gap", 1))
    assert store.enqueue(event("gap", 3)) is shared  # position 2 is missing: this one is refused
    with pytest.raises(ValueError, match="position 3"):
        await shared
    assert [e.seq for e in await store.read_after("gap", 0)] == [1]
    await store.append(event("gap", 1))  # storing what shared the failed future again is safe
    await store.append(event("gap", 2))
    assert [e.seq for e in await store.read_after("gap", 0)] == [1, 2]


async def test_a_batch_stored_one_write_at_a_time_fails_a_run_if_any_of_its_events_is_refused(
    store: SqliteStore,
) -> None:
    """A transaction that fails with a bug has each write stored alone (``_serve``'s fallback): a run of progress
    events (one write, one future) fails with the refusal of any of its events and keeps the ones before it, a clean
    write beside it succeeds, and only the broken write fails with its own error."""
    await store.open_stream(call("gap"))
    await store.open_stream(call("clean"))
    run = store.enqueue(event("gap", 1))
    assert store.enqueue(event("gap", 3)) is run  # position 2 is missing: this one is refused
    clean = store.enqueue(event("clean", 1))

    def bug(_db: sqlite3.Connection) -> None:
        raise RuntimeError("a bug in a write")

    broken = store.run_write(bug)
    with pytest.raises(ValueError, match="position 3"):
        await run
    await clean
    with pytest.raises(RuntimeError, match="a bug"):
        await broken
    assert [e.seq for e in await store.read_after("gap", 0)] == [1]
    assert [e.seq for e in await store.read_after("clean", 0)] == [1]


async def test_a_run_mixing_requests_and_a_retried_position_stores_each_event_as_it_came(store: SqliteStore) -> None:
    """A run (progress of one stream queued one after another) may change request and tags, or repeat a stored
    position (an identical retry): each event is stored with its own request id and tags, the retry is no refusal."""
    await store.open_stream(call("mixed"))
    events = [
        event("mixed", 1, request_id=1),
        event("mixed", 2, request_id=1),
        event("mixed", 3, request_id="two", tags=TOOL_BC),
        event("mixed", 4, request_id=1),
    ]
    queued = [*events, events[-1], event("mixed", 5, request_id=1)]
    writes = [store.enqueue(e) for e in queued]
    assert len({id(write) for write in writes}) == 1
    await writes[0]
    assert await store.read_after("mixed", 0) == [*events, queued[-1]]


async def test_a_run_counts_for_its_principal_as_it_is_queued_and_exactly_once_stored_and_trimmed(
    tmp_path: Path,
) -> None:
    """Each event of a run counts for its principal as soon as it is queued (the bound sees a flood as it goes);
    once the run is written the count is what the file holds, the events trimmed meanwhile released."""
    trimming = SqliteStore(str(tmp_path / "run.db"), max_events_per_stream=3)
    await trimming.open()
    try:
        await trimming.put_session(SessionRecord("s1", ALICE, "2025-11-25", 50.0, 100.0))
        await trimming.open_stream(call("run"))
        events = [event("run", seq, request_id=1) for seq in range(1, 11)]
        sizes = [len(e.data) + ROW_BYTES for e in events]
        writes = []
        for count, queued in enumerate(events, start=1):
            writes.append(trimming.enqueue(queued))
            assert trimming.stored_bytes(ALICE) == STREAM_BYTES + sum(sizes[:count])
        assert len({id(write) for write in writes}) == 1
        await writes[0]
        assert trimming.stored_bytes(ALICE) == STREAM_BYTES + sum(sizes[-3:])
        assert await trimming.read_after("run", 7) == events[-3:]
    finally:
        await trimming.close()


async def test_a_run_whose_session_count_was_emptied_meanwhile_counts_its_next_events_again(tmp_path: Path) -> None:
    """Bytes queued before their session was bound are never counted, yet land (a keyed stream's events queued before
    the writer bound its session): landing empties the session's count, which a run still queuing took its first
    events' bytes in. The run's next events are counted again, in the count the bound reads, not in the emptied one
    (a flood would otherwise run ahead of the bound by what is in flight)."""
    counted = SqliteStore(str(tmp_path / "emptied.db"))
    await counted.open()
    try:
        await counted.put_session(SessionRecord("s1", ALICE, "2025-11-25", 50.0, 100.0))
        await counted.open_stream(call("run"))
        first, second, third = (event("run", seq, request_id=1) for seq in (1, 2, 3))
        run = counted.enqueue(first)
        assert counted.enqueue(second) is run
        counted._counts.landed({"s1": 10 * (len(first.data) + ROW_BYTES)})  # uncounted bytes landing: emptied
        assert counted.stored_bytes(ALICE) == STREAM_BYTES
        assert counted.enqueue(third) is run
        assert counted.stored_bytes(ALICE) == STREAM_BYTES + len(third.data) + ROW_BYTES
        await run
    finally:
        await counted.close()
