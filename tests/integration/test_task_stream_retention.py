"""A task's event stream lives as long as its task, not ``session_idle_seconds`` from its creation: the stream's
session is never touched by a request, so the idle sweep once deleted it 30 minutes into a task that lives an
hour, and the running tool's next progress raised ``KeyError`` into it (the task failed, its result lost). Past the
task's TTL the sweep deletes the stream as any idle session's; a tool still running then goes on, its outcome is
the task's, and ``tasks/stream`` answers ``events_gone``. The sweep is driven with the instants it would be run at
(``SessionRegistry.expire``), the tool released by the test: no clock waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from mcp_lossless.core.task_stream import EVENTS_GONE, stream_of
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.sqlite import SqliteStore
from tests.integration.test_modern_asgi_tasks import answer, create_task, polled_until
from tests.support.in_process import InProcess, in_process

pytestmark = pytest.mark.anyio

TTL = 3600.0
"""The tasks' TTL (``create_task`` checks the 3,600,000 ms every task is created with)."""


class Steps:
    """The test's hand on the tool: it reports progress each time it is let go, and returns at the last."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.reported = asyncio.Event()


@pytest.fixture(params=["memory", "sqlite"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[InProcess, EventStore, Steps]]:
    steps = Steps()
    registry: ToolRegistry = demo_tools()

    @registry.tool(task=True)
    async def long_job(ctx: ToolContext) -> str:
        """Two progress reports, each when the test lets it go, then its result."""
        for n in (1, 2):
            await steps.go.wait()
            steps.go.clear()
            await ctx.report_progress(n, 2)
            steps.reported.set()
        return "done"

    store: EventStore = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "tasks.db"))
    async with in_process(store, registry) as server:
        yield server, store, steps
        steps.go.set()


async def step(steps: Steps) -> None:
    """Let the tool report its next progress, and wait until it did (a backstop bound: a tool that failed never
    reports)."""
    steps.reported.clear()
    steps.go.set()
    with anyio.fail_after(10):
        await steps.reported.wait()


async def test_a_tasks_stream_outlives_the_idle_sweep_until_its_ttl(
    served: tuple[InProcess, EventStore, Steps],
) -> None:
    server, store, steps = served
    peer = server.peer()
    created = time.time()
    task_id = await create_task(peer, "long_job")
    idle = server.app.config.session_idle_seconds
    assert idle < TTL
    # The sweep an hour in (a session idle since then: half an hour before): the task's stream is kept
    assert await server.app.state.sessions.expire(created + TTL - idle) == 0
    assert await store.get_stream(stream_of(task_id)) is not None
    await step(steps)
    await step(steps)
    result = await polled_until(peer, task_id, "working")
    assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "done"
    streamed = await peer.task("tasks/stream", task_id)
    kinds = [m["params"]["type"].rsplit(".", 1)[1] for m in streamed.messages if m.get("method")]
    assert kinds == ["status", "progress", "progress", "outcome"], streamed.messages


async def test_a_task_running_past_its_streams_end_keeps_its_outcome(
    served: tuple[InProcess, EventStore, Steps],
) -> None:
    server, store, steps = served
    peer = server.peer()
    task_id = await create_task(peer, "long_job")
    await step(steps)
    # The sweep past the task's TTL: its stream goes as any idle session's, while its tool still runs
    assert await server.app.state.sessions.expire(time.time() + TTL + 1) == 1
    assert await store.get_stream(stream_of(task_id)) is None
    await step(steps)  # its progress has no stream to go to: neither the tool nor the task fails
    result = await polled_until(peer, task_id, "working")
    assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "done"
    streamed = await peer.task("tasks/stream", task_id)
    assert answer(streamed)["error"]["data"] == {"reason": "events_gone", "taskId": task_id, "earliestSeq": None}
    assert answer(streamed)["error"]["code"] == EVENTS_GONE
