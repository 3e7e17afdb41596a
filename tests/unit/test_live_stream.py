"""A live stream's lifecycle as its own methods: writers attach and step aside, a close is honoured once, the
stream ends, and a finished stream is forgotten by one rule. The real memory store and codec, no network."""

from __future__ import annotations

import asyncio

import pytest

from mcp_lossless.core.eventids import EventIdCodec
from mcp_lossless.core.events import PendingRequest, StreamKind, StreamRecord
from mcp_lossless.core.principal import ANONYMOUS
from mcp_lossless.server.sessions import ServerSession
from mcp_lossless.server.streams import LiveStream
from mcp_lossless.server.writer import LiveSource
from mcp_lossless.stores.memory import MemoryStore

pytestmark = pytest.mark.anyio
CALL = PendingRequest(1, "tools/call", "search", frozenset({"https://mcp.example/tools/search"}))


async def opened(requests: tuple[PendingRequest, ...] = (CALL,)) -> tuple[ServerSession, LiveStream]:
    store = MemoryStore()
    record = StreamRecord("session-1", "stream-key-0123456789", StreamKind.POST, "me", requests, 0)
    await store.open_stream(record)
    live = LiveStream(record, store, EventIdCodec(b"s" * 32), lambda _: None)
    session = ServerSession("session-1", ANONYMOUS, "2025-11-25")
    session.live[record.stream] = live
    return session, live


async def test_a_newer_writer_takes_over_and_an_older_one_cannot_detach_it() -> None:
    _, live = await opened()
    first = live.attach_writer()
    second = live.attach_writer()
    assert second > first and live.writer == second
    live.detach_writer(first)
    assert live.writer == second
    live.detach_writer(second)
    assert live.writer is None


async def test_a_close_request_is_honoured_once_and_only_by_the_current_writer() -> None:
    _, live = await opened()
    old = live.attach_writer()
    current = live.attach_writer()
    live.request_close()
    assert not live.take_close_request(old)
    assert live.take_close_request(current)
    assert not live.take_close_request(current)


async def test_a_writer_superseded_or_asked_to_close_stops() -> None:
    _, live = await opened()
    source = LiveSource(live, 0, has_cursor=True)
    live.request_close()
    assert source.ready() is None  # honoured: the client holds an id to resume from
    assert source.ready() == []  # once
    newer = LiveSource(live, 0, has_cursor=True)
    assert source.ready() is None and newer.ready() == []


async def test_a_close_before_the_client_holds_an_id_waits_for_the_next_event() -> None:
    _, live = await opened()
    source = LiveSource(live, 0, has_cursor=False)  # no priming below 2025-11-25
    live.request_close()
    assert source.ready() == []
    waiting = asyncio.ensure_future(source.wait())
    await asyncio.sleep(0)
    assert not waiting.done()  # nothing to act on yet: no busy loop
    event = await live.append(b'{"progress": 1}', CALL)
    await asyncio.wait_for(waiting, 1)
    assert source.ready() == [event]
    assert source.ready() is None  # now the client can resume from that event: the close is honoured


async def test_end_wakes_the_writer_and_ends_its_source() -> None:
    _, live = await opened()
    source = LiveSource(live, 0, has_cursor=True)
    waiting = asyncio.ensure_future(source.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    live.end()
    await asyncio.wait_for(waiting, 1)
    assert live.done and source.ready() is None


async def test_a_finished_stream_is_forgotten_only_once_no_request_of_it_runs() -> None:
    session, live = await opened()
    running = asyncio.ensure_future(asyncio.sleep(10))
    session.tasks[CALL.request_id] = running  # type: ignore[assignment]
    session.forget_if_finished(live)
    assert live.record.stream in session.live  # not done
    await live.append(b'{"result": {}}', CALL, terminal=True)
    assert live.done and live.record.completed and live.record.answered == {1}
    session.forget_if_finished(live)
    assert live.record.stream in session.live  # its request's task still runs (recording, or the POST's own)
    del session.tasks[CALL.request_id]
    running.cancel()
    session.forget_if_finished(live)
    assert live.record.stream not in session.live


async def test_answers_are_in_the_snapshot_while_the_stream_runs_and_in_the_record_once_it_completes() -> None:
    other = PendingRequest(2, "ping")
    _, live = await opened((CALL, other, CALL))  # a batch may repeat an id
    await live.append(b"{}", other, terminal=True)
    assert live.snapshot().answered == {2} and not live.done
    await live.append(b"{}", CALL, terminal=True)
    assert live.done and live.record.answered == {1, 2} == live.snapshot().answered
