"""What a task costs the SQLite store's writer thread: each trip to it (a batch, one transaction) is a thread hand-over
both ways and a commit, the dearest part of a task on that store. The task's record is queued with its event
stream's session, so a task is stored in two batches (record and session; stream record and first event), not four;
a poll reads the task and notes its owner's poll (the TTL restarts) in one, not two.

The tool holds until the test releases it, so nothing of its run is written while the trips are counted; the
batches are counted on the real store, by wrapping the writer thread's own step.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores.sqlite import SqliteStore
from tests.integration.test_modern_asgi_tasks import create_task, polled_until
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


async def test_a_task_is_stored_in_two_trips_to_the_writer(served: tuple[InProcess, Counted, asyncio.Event]) -> None:
    server, store, release = served
    peer = server.peer()
    first = await create_task(peer, "quiet_task")  # the first task of a process also purges the expired ones
    before = store.batches
    second = await create_task(peer, "quiet_task")
    assert store.batches - before == 2  # the record with the stream's session, then the stream with its first event
    release.set()
    for task_id in (first, second):
        result = await polled_until(peer, task_id, "working")
        assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "released"


async def test_a_poll_is_one_trip_to_the_writer(served: tuple[InProcess, Counted, asyncio.Event]) -> None:
    server, store, _ = served
    owner, stranger = server.peer(), server.peer(server.mallory)
    task_id = await create_task(owner, "quiet_task")
    for peer in (owner, stranger, owner):  # the owner's poll reads and restarts the TTL in one write
        before = store.batches
        await peer.task("tasks/get", task_id)
        assert store.batches - before == 1
    seen = await server.tasks.get(task_id)
    assert seen is not None and seen.seen_at > seen.created_at
