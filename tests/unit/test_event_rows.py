"""A replay over the memory store reads its rows (:class:`~mcp_lossless.core.events.EventRows`, ADR 0020), never
the events they stand for: framing, authorization and the answered requests must come out exactly as from the
events themselves, whatever the rows, the tag table, the token and the batches."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core import frames
from mcp_lossless.core.events import EventRows, Row, StoredEvent, StreamKind, StreamRecord, answered_in
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.replay import DeliveryGate, plan_replay
from mcp_lossless.core.resources import AudiencePolicy
from mcp_lossless.stores.memory import MemoryStore

CANONICAL = "https://mcp.example/mcp"
UNIVERSE = [f"https://mcp.example/tools/{name}" for name in "abc"] + ["scope read", "scope write"]
POLICY = AudiencePolicy(CANONICAL, UNIVERSE[:3])
ALICE = Principal("https://issuer.example", "alice", "client-1")
IDS = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)
PAYLOADS = st.one_of(st.just(b""), st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" ")))
TAG_TABLES = st.lists(st.frozensets(st.sampled_from(UNIVERSE)), min_size=1, max_size=5, unique=True)
AUDIENCES = st.frozensets(st.sampled_from([*UNIVERSE[:3], CANONICAL, "https://elsewhere.example"]))
SCOPES = st.frozensets(st.sampled_from(["read", "write"]))


@st.composite
def event_rows(draw: st.DrawFn) -> EventRows:
    tags = draw(TAG_TABLES)
    row = st.tuples(
        IDS,
        PAYLOADS,
        st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)),
        st.one_of(st.none(), st.just("search")),
        st.integers(0, len(tags) - 1),
        st.booleans(),
    )
    rows: list[Row] = draw(st.lists(row, max_size=25))
    return EventRows("s1", "k1", draw(st.integers(0, 1 << 40)), rows, tuple(tags))


def single_frames(events: list[StoredEvent], retry_ms: int) -> bytes:
    return b"".join(frames.sse(e.event_id, e.data, None if e.data else retry_ms) for e in events)


@given(event_rows(), st.integers(0, 100_000), st.integers(0, 30), st.integers(0, 30))
def test_frames_from_rows_are_the_events_single_frames(rows: EventRows, retry_ms: int, start: int, stop: int) -> None:
    events = list(rows)
    assert frames.sse_events(rows, retry_ms) == single_frames(events, retry_ms) == frames.sse_events(events, retry_ms)
    part = rows[start:stop]
    assert isinstance(part, EventRows)
    assert frames.sse_events(part, retry_ms) == single_frames(events[start:stop], retry_ms)


@given(event_rows(), st.integers(0, 30), st.integers(0, 30))
def test_rows_are_the_events_they_stand_for(rows: EventRows, start: int, stop: int) -> None:
    events = list(rows)
    assert [e.seq for e in events] == list(range(rows.first_seq, rows.first_seq + len(rows.rows)))
    assert all(e.resources is rows.tags[row[4]] for e, row in zip(events, rows.rows, strict=True))
    assert rows == events and events == rows and rows[start:stop] == events[start:stop]
    assert [rows[i] for i in range(-len(events), len(events))] == events + events
    assert answered_in(rows) == answered_in(events)
    assert answered_in(events) == [e.request_id for e in events if e.terminal and e.request_id is not None]
    with pytest.raises(IndexError):
        rows[len(events)]


@given(event_rows(), AUDIENCES, SCOPES, st.lists(st.integers(1, 6), max_size=6))
def test_authorization_of_rows_decides_as_of_the_events(
    rows: EventRows, audience: frozenset[str], scopes: frozenset[str], sizes: list[int]
) -> None:
    events = list(rows)
    grant = Grant(ALICE, audience, expires_at=1000.0, scopes=scopes)
    assert plan_replay(rows, grant, POLICY, "c") == plan_replay(events, grant, POLICY, "c")
    tags = set(rows.tags) | {frozenset()}
    assert plan_replay(rows, grant, POLICY, "c", tags) == plan_replay(events, grant, POLICY, "c", tags)
    by_rows, by_events = DeliveryGate(grant, POLICY, "start"), DeliveryGate(grant, POLICY, "start")
    position = 0
    for size in [*sizes, len(events)]:
        decided = by_rows.admit(rows[position : position + size], 10.0)
        assert decided == by_events.admit(events[position : position + size], 10.0)
        assert by_rows.last_delivered == by_events.last_delivered
        if decided[1] is not None:
            break
        position += size
    expired = DeliveryGate(grant, POLICY, "start")
    assert expired.admit(rows, 2000.0) == DeliveryGate(grant, POLICY, "start").admit(events, 2000.0)


def test_the_memory_store_replays_its_held_rows_as_the_events_appended() -> None:
    async def run() -> None:
        store = MemoryStore()
        await store.open_stream(StreamRecord("s1", "k1", StreamKind.POST, "me"))
        tool = frozenset({"https://mcp.example/tools/a"})
        appended = [
            StoredEvent("s1", "k1", seq, f"k1.{seq}.mac", b"{}" if seq else b"", 7, "a", tags, seq == 5)
            for seq, tags in enumerate([frozenset(), tool, tool, frozenset(), tool, tool])
        ]
        for event in appended:
            await store.append(event)
        replayed = await store.read_after("k1", 1)
        assert isinstance(replayed, EventRows)
        assert list(replayed) == appended[2:]
        assert replayed.tags == (frozenset(), tool)
        assert await store.read_after("k1", 5) == []

    asyncio.run(run())
