"""What a task costs the SQLite store's writer thread: each trip to it (a batch, one transaction) is a thread hand-over
both ways and a commit, the dearest part of a task on that store. The task's record is queued with its event
stream, the stream's session and its first event, so a task is stored in one batch (ADR 0040), not four;
a poll reads the task and notes its owner's poll (the TTL restarts) in one, not two; the outcome is stored with its
event in one (ADR 0037), not two, and a task found terminal keeps its first outcome and gets that one's event.

The tool holds until the test releases it, so nothing of its run is written while the trips are counted; the
batches are counted on the real store, by wrapping the writer thread's own step.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from mcp_lossless.core.task_stream import stream_of
from mcp_lossless.core.tasks import POLL_NOTED_WITHIN, TaskStatus, advance
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.modern import tasks as modern_tasks
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores.sqlite import SqliteStore
from tests.integration.test_modern_asgi_tasks import answer, create_task, polled_until
from tests.support.in_process import InProcess, in_process

pytestmark = pytest.mark.anyio


class Counted(SqliteStore):
    """The SQLite store, counting the batches its writer thread serves."""

    batches = 0

    def _serve(self, db: sqlite3.Connection, batch: list[object], loop: asyncio.AbstractEventLoop) -> bool:  # type: ignore[override]
        self.batches += 1
        return super()._serve(db, batch, loop)  # type: ignore[arg-type]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[InProcess, Counted, asyncio.Event]]:
    release = asyncio.Event()
    registry: ToolRegistry = demo_tools()

    @registry.tool(task=True)
    async def quiet_task(ctx: ToolContext) -> str:
        """A task that writes nothing until the test releases it."""
        await release.wait()
        return "released"

    store = Counted(str(tmp_path / "commits.db"))
    async with in_process(store, registry) as server:
        yield server, store, release
        release.set()


async def test_a_task_is_stored_in_one_trip_to_the_writer(served: tuple[InProcess, Counted, asyncio.Event]) -> None:
    server, store, release = served
    peer = server.peer()
    first = await create_task(peer, "quiet_task")  # the first task of a process also purges the expired ones
    before = store.batches
    second = await create_task(peer, "quiet_task")
    assert store.batches - before == 1  # the record, the stream's session, the stream and its first event (ADR 0040)
    stream = await store.get_stream(stream_of(second))
    session = await store.get_session(stream_of(second))
    record = await server.tasks.get(second)
    assert stream is not None and session is not None and record is not None and session.principal == record.principal
    release.set()
    for task_id in (first, second):
        result = await polled_until(peer, task_id, "working")
        assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "released"


async def test_a_poll_is_one_trip_to_the_writer(
    served: tuple[InProcess, Counted, asyncio.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, store, _ = served
    clock = [time.time()]
    monkeypatch.setattr(modern_tasks, "now", lambda: clock[0])
    owner, stranger = server.peer(), server.peer(server.mallory)
    task_id = await create_task(owner, "quiet_task")
    clock[0] += 2 * POLL_NOTED_WITHIN  # late enough for the owner's poll to restart the TTL (ADR 0039)
    for peer in (owner, stranger, owner):  # the owner's poll reads and restarts the TTL in one write
        before = store.batches
        await peer.task("tasks/get", task_id)
        assert store.batches - before == 1
    seen = await server.tasks.get(task_id)
    assert seen is not None and seen.seen_at > seen.created_at


async def _outcome_events(store: Counted, task_id: str) -> list[dict[str, object]]:
    """The payloads of the task's stream's terminal events (its outcome, exactly one when all is well)."""
    events = await store.read_after(stream_of(task_id), -1)
    assert events and events[-1].terminal
    return [orjson.loads(event.data)["params"]["payload"] for event in events if event.terminal]


async def test_an_outcome_and_its_event_are_one_trip_to_the_writer(
    served: tuple[InProcess, Counted, asyncio.Event],
) -> None:
    server, store, release = served
    peer = server.peer()
    task_id = await create_task(peer, "quiet_task")
    run = server.app.modern.tasks.running[task_id]
    before = store.batches
    release.set()
    await asyncio.wait({run})  # the tool returned and its outcome was stored, event included
    assert store.batches - before == 1  # the record's update and the outcome event, one transaction
    result = await polled_until(peer, task_id, "working")
    assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "released"
    [outcome] = await _outcome_events(store, task_id)
    assert outcome["status"] == "completed" and outcome["result"] == result["result"]


async def test_a_task_found_terminal_keeps_its_first_outcome_and_its_event(
    served: tuple[InProcess, Counted, asyncio.Event],
) -> None:
    server, store, release = served
    peer = server.peer()
    task_id = await create_task(peer, "quiet_task")
    run = server.app.modern.tasks.running[task_id]
    record = await server.tasks.get(task_id)
    assert record is not None
    cancelled = advance(record, TaskStatus.CANCELLED, time.time(), message="cancelled on another replica")
    assert await server.tasks.update(cancelled) is not None  # as another replica would, before the tool returns
    release.set()
    await asyncio.wait({run})
    result = answer(await peer.task("tasks/get", task_id))["result"]
    assert result["status"] == "cancelled" and "result" not in result
    [outcome] = await _outcome_events(store, task_id)  # the stored outcome's event, none of the tool's result
    assert outcome == {"status": "cancelled"}
