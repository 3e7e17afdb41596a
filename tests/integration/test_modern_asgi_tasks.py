"""The 2026-07-28 leg's tasks and its refusals in process, through the app's ASGI surface (no uvicorn), on the
memory and SQLite stores: a task created and delivered to its owner; ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` answered for an unknown id, for another principal's id exactly as for an unknown one, for a token
that stopped covering the tool with the SEP-2643 denial naming what is missing, and for a task whose process is gone
(settled lost); input delivered to a waiting task; the limits (``-32044`` with ``{limit, maximum}``); and, on the
raw ASGI interface, a refusal that is the whole response, a disconnect that cancels the request, ``tasks/stream``
(every event, then the answer; a stranger's task unknown; a narrowed token 403 before any event) and
``subscriptions/listen`` (watching only what the token may poll, pushing the outcome).

Tools that must be running while a test speaks wait on events the test sets: nothing here waits on time. Records
a decision must see (a task of a process that is gone) are put in the task store the app was given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from time import time, time_ns
from typing import Any

import anyio
import anyio.lowlevel
import orjson
import pytest

from mcp_lossless.core.errors import (
    EXECUTION_LOST,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    LIMIT_EXCEEDED,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    TASK_DENIED,
    TASK_EXECUTION_LOST,
    TOOL_FORBIDDEN,
)
from mcp_lossless.core.limits import Limits
from mcp_lossless.core.tasks import POLL_NOTED_WITHIN, Requirement, TaskRecord, TaskStatus, new_task
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.keys import stamp
from mcp_lossless.server.modern import tasks as modern_tasks
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores.base import EventStore
from tests.support.in_process import BASE, MCP, InProcess, in_process, principal_of, raw_post, tool_resource
from tests.support.mcp_http import dev_token
from tests.support.modern_http import TASKS, ModernPeer, answer, assert_replacement_envelope, json_of, rpc_error
from tests.support.stores import store_of_kind

pytestmark = pytest.mark.anyio

UNKNOWN = "Failed to retrieve task: Task not found"
FETCH = tool_resource("fetch")
HOLD = tool_resource("hold")
HOLD_TASK = tool_resource("hold_task")
ELICITING: dict[str, Any] = {
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}, "elicitation": {}}
}
"""The ``_meta`` of a client that declares it answers elicitations (and the tasks extension)."""
TASK_METHODS = ["tasks/get", "tasks/update", "tasks/cancel"]
DEAD = "a-replica-that-died"
"""An owner no store has a lease for: a process that is gone."""


@dataclass
class Gates:
    """What the held tools wait on and report: set by the test, never timed."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    runs: list[str] = field(default_factory=list)
    """The ``count`` tool's runs, by argument."""


def tools(gates: Gates) -> ToolRegistry:
    registry = demo_tools()

    async def held(ctx: ToolContext) -> str:
        await ctx.report_progress(0, 1, "holding")
        gates.started.set()
        try:
            await gates.release.wait()
        except asyncio.CancelledError:
            gates.cancelled.set()
            raise
        return "released"

    @registry.tool()
    async def hold(ctx: ToolContext) -> str:
        """Runs within its request until the test releases it."""
        return await held(ctx)

    @registry.tool(task=True)
    async def hold_task(ctx: ToolContext) -> str:
        """A task that runs until the test releases it."""
        return await held(ctx)

    @registry.tool()
    async def count(ctx: ToolContext, label: str) -> str:
        """Notes each run: a replay of its key must not run it again."""
        gates.runs.append(label)
        return f"run {len(gates.runs)}: {label}"

    @registry.tool(task=True, scopes=("files:write",))
    async def write_task(ctx: ToolContext) -> str:
        """A task that needs the ``files:write`` scope besides its resource; runs until released."""
        return await held(ctx)

    @registry.tool(task=True)
    async def approve(ctx: ToolContext, item: str) -> str:
        """A task that waits for its owner's approval (``tasks/update``)."""
        answered = await ctx.request("elicitation/create", {"message": f"Approve {item}?", "requestedSchema": {}})
        return f"{item}: {answered['action']}"

    return registry


@asynccontextmanager
async def serve(store: EventStore, gates: Gates, limits: Limits | None = None) -> AsyncIterator[InProcess]:
    async with in_process(store, tools(gates), limits=limits or Limits()) as server:
        yield server
        gates.release.set()  # a held tool ends before the server does


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> EventStore:
    return store_of_kind(request, tmp_path, "asgi-tasks")


@pytest.fixture
async def server(store: EventStore, gates: Gates) -> AsyncIterator[InProcess]:
    async with serve(store, gates) as served:
        yield served


def assert_task_denied(
    denied: Any,
    request_id: int,
    task_id: str,
    *,
    reason: str,
    covers: str,
    names: str,
    resources: list[str],
    scopes: list[str],
) -> None:
    """A task's owner whose token does not cover what the task needs (``covers`` in the message, ``names`` the
    challenge's parameter): 403 with the exact challenge, TASK_DENIED with the exact data, and the SEP-2643
    envelope asking for a replacement token that holds ``resources`` and ``scopes``."""
    assert denied.status == 403
    message = (
        f"task {task_id} not delivered: the token does not cover {covers}; "
        "the task is kept: re-authorize and poll the same task id"
    )
    assert denied.headers["www-authenticate"] == (
        f'Bearer error="insufficient_scope", error_description="{message}", {names}, '
        'resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp"'
    )
    body = json_of(denied)
    envelope = body["error"]["data"]["authorization"]
    assert body == rpc_error(
        request_id, TASK_DENIED, message,
        {"reason": reason, "taskId": task_id, "resumable": True, "requiredResources": resources,
         "requiredScopes": scopes, "authorization": envelope,
         "_meta": {"io.modelcontextprotocol/authorization": envelope}},
    )  # fmt: skip
    assert_replacement_envelope(envelope, resources=resources, scopes=scopes)


async def create_task(peer: ModernPeer, tool: str = "fetch", **arguments: Any) -> str:
    read = await peer.call(tool, **arguments)
    assert read.status == 200, read.body
    created = answer(read)["result"]
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert set(created) == {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs", "resultType"}
    assert (created["ttlMs"], created["pollIntervalMs"]) == (3_600_000, 500)
    task_id: str = created["taskId"]
    return task_id


async def polled_until(peer: ModernPeer, task_id: str, *waiting: str) -> dict[str, Any]:
    """``tasks/get`` while the task is in one of ``waiting``: each poll a whole request, and a turn of the loop
    between polls, in which the task's own work goes on (no timed wait: the test's bound is only a backstop)."""
    with anyio.fail_after(10):
        while True:
            result: dict[str, Any] = answer(await peer.task("tasks/get", task_id))["result"]
            if result["status"] not in waiting:
                return result
            await anyio.lowlevel.checkpoint()


async def put(server: InProcess, task_id: str, owner: str, at: float | None = None) -> TaskRecord:
    """A working task of the dev client's for ``fetch``, owned by ``owner``, as a replica would have stored it
    ``at`` (now unless given), kept 60 s after its last change or poll."""
    requirement = Requirement(frozenset({FETCH}))
    record = new_task(
        task_id, principal_of(server.whole), "fetch", requirement, owner, time() if at is None else at, 60
    )
    await server.tasks.create(record)
    return record


# -- delivered to its owner -------------------------------------------------------------------------------------


async def test_a_task_is_created_then_delivered_whole_to_its_owner(
    server: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's poll restarts the TTL, but only once it would move it by more than ``POLL_NOTED_WITHIN`` (the
    task module's clock is the test's): a poll right after the task settled writes nothing."""
    clock = [time()]
    monkeypatch.setattr(modern_tasks, "now", lambda: clock[0])
    peer = server.peer()
    task_id = await create_task(peer, url="https://example.com/a", steps=0)
    result = await polled_until(peer, task_id, "working")
    seen = await server.tasks.get(task_id)
    assert seen is not None
    clock[0] += POLL_NOTED_WITHIN / 2
    await peer.task("tasks/get", task_id)
    assert await server.tasks.get(task_id) == seen, "a poll within POLL_NOTED_WITHIN of the last change writes nothing"
    clock[0] += POLL_NOTED_WITHIN
    await peer.task("tasks/get", task_id)
    polled = await server.tasks.get(task_id)
    assert polled is not None and polled.seen_at == clock[0], "the owner's poll restarts the TTL"
    assert result.pop("ttlMs") >= 3_600_000 and result.pop("createdAt") <= result.pop("lastUpdatedAt")
    assert result == {
        "taskId": task_id,
        "status": "completed",
        "pollIntervalMs": 500,
        "result": {
            "content": [{"type": "text", "text": "contents of https://example.com/a: 21 bytes"}],
            "isError": False,
        },
        "resultType": "complete",
    }


async def test_a_completed_task_was_last_updated_when_it_completed(
    server: InProcess, gates: Gates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lastUpdatedAt`` of a completed task is when it completed, not when its tool started: the completion's
    time was read before the tool's result was awaited, so a task that ran an hour said it ended as it began
    (and its retention counted from its start). The task module's clock is the test's, moved while the tool runs."""
    clock = [time()]
    monkeypatch.setattr(modern_tasks, "now", lambda: clock[0])
    peer = server.peer()
    task_id = await create_task(peer, "hold_task")
    await gates.started.wait()
    clock[0] += 100.0
    gates.release.set()
    result = await polled_until(peer, task_id, "working")
    assert result["status"] == "completed", result
    created, updated = (
        datetime.fromisoformat(result[k].replace("Z", "+00:00")) for k in ("createdAt", "lastUpdatedAt")
    )
    assert (updated - created).total_seconds() == pytest.approx(100.0, abs=0.01), result


async def test_task_ids_begin_with_the_time_they_were_made(server: InProcess) -> None:
    """ADR 0039: a task id is a stream key (its time in milliseconds, then 144 random bits), so the SQLite file's
    task rows and its streams' go at the end of their B-trees, not on a random page each."""
    peer = server.peer()
    ids = []
    for _ in range(3):
        before = time_ns() // 1_000_000
        ids.append(await create_task(peer, url="https://example.com/a", steps=0))
        after = time_ns() // 1_000_000
        assert stamp(before) <= ids[-1][:8] <= stamp(after) and len(ids[-1]) == 32, ids[-1]
    assert len(set(ids)) == 3


# -- who may look at a task ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", TASK_METHODS)
async def test_an_unknown_id_is_invalid_params_and_echoes_nothing(server: InProcess, method: str) -> None:
    peer = server.peer()
    read = await peer.send(peer.message(method, {"taskId": "t-never"}, request_id=1))
    assert read.status == 200 and "www-authenticate" not in read.headers
    assert json_of(read) == rpc_error(1, INVALID_PARAMS, UNKNOWN)


@pytest.mark.parametrize("method", TASK_METHODS)
async def test_another_principals_task_is_answered_byte_for_byte_as_an_unknown_one(
    server: InProcess, gates: Gates, method: str
) -> None:
    owner = server.peer()
    task_id = await create_task(owner, "hold_task")
    await gates.started.wait()
    before = await server.tasks.get(task_id)
    stranger = server.peer(server.mallory)
    theirs = await stranger.send(stranger.message(method, {"taskId": task_id}, request_id=2))
    random = await stranger.send(stranger.message(method, {"taskId": "0" * len(task_id)}, request_id=2))
    assert (theirs.status, theirs.body, dict(theirs.headers)) == (random.status, random.body, dict(random.headers))
    assert json_of(theirs) == rpc_error(2, INVALID_PARAMS, UNKNOWN)
    assert await server.tasks.get(task_id) == before, "a stranger's look writes nothing"
    assert not gates.cancelled.is_set(), "and cancels nothing"


@pytest.mark.parametrize("method", TASK_METHODS)
async def test_a_narrowed_token_is_denied_naming_what_is_missing_and_the_task_is_kept(
    server: InProcess, gates: Gates, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [time()]
    monkeypatch.setattr(modern_tasks, "now", lambda: clock[0])
    peer = server.peer()
    task_id = await create_task(peer, "hold_task")
    await gates.started.wait()
    before = await server.tasks.get(task_id)
    assert before is not None
    clock[0] += 2 * POLL_NOTED_WITHIN  # the denied look comes late enough to restart the TTL
    update = {"inputResponses": {"k": {"action": "accept"}}} if method == "tasks/update" else {}
    denied = await peer.send(peer.message(method, {"taskId": task_id, **update}, request_id=3), token=server.narrowed)
    assert_task_denied(
        denied, 3, task_id, reason="insufficient_audience", covers=HOLD_TASK, names=f'resource="{HOLD_TASK}"',
        resources=[HOLD_TASK], scopes=[],
    )  # fmt: skip
    assert not gates.cancelled.is_set(), "a denied cancel cancels nothing"
    kept = await server.tasks.get(task_id)
    assert kept is not None and kept.status is TaskStatus.WORKING and kept.input_responses == before.input_responses
    assert kept.seen_at > before.seen_at, "its owner asked: the TTL restarts, denied or not"
    gates.release.set()
    delivered = await polled_until(peer, task_id, "working")
    assert delivered["status"] == "completed" and delivered["result"]["content"][0]["text"] == "released"


@pytest.mark.parametrize("method", TASK_METHODS)
async def test_an_expired_task_is_answered_to_its_owner_as_an_unknown_one(server: InProcess, method: str) -> None:
    """Past its TTL (a minute after its last change or poll), even its owner's poll finds nothing, and says so as
    for an id never issued; the stored record is not revived (no poll restarts a TTL that ended)."""
    stored = await put(server, "t-expired", DEAD, at=time() - 120)
    peer = server.peer()
    read = await peer.send(peer.message(method, {"taskId": "t-expired"}, request_id=21))
    never = await peer.send(peer.message(method, {"taskId": "t-nevers"}, request_id=21))
    assert (
        (read.status, read.body)
        == (never.status, never.body)
        == (200, orjson.dumps(rpc_error(21, INVALID_PARAMS, UNKNOWN)))
    )
    after = await server.tasks.get("t-expired")
    assert after is None or after == stored, "neither settled lost nor touched"


async def test_cancelling_a_completed_task_keeps_its_result(server: InProcess) -> None:
    peer = server.peer()
    task_id = await create_task(peer, url="https://e/c", steps=0)
    done = await polled_until(peer, task_id, "working")
    read = await peer.send(peer.message("tasks/cancel", {"taskId": task_id}, request_id=22))
    assert json_of(read) == {"jsonrpc": "2.0", "id": 22, "result": {"resultType": "complete"}}
    again = answer(await peer.task("tasks/get", task_id))["result"]
    assert (again["status"], again["result"]) == ("completed", done["result"]), "the first outcome stays"


async def test_a_token_that_lost_the_tools_scope_is_denied_naming_the_scope(server: InProcess, gates: Gates) -> None:
    scoped = await dev_token(server.http, BASE, MCP, scope="files:write")
    peer = server.peer(scoped)
    task_id = await create_task(peer, "write_task")
    await gates.started.wait()
    denied = await peer.send(peer.message("tasks/get", {"taskId": task_id}, request_id=23), token=server.whole)
    assert_task_denied(
        denied, 23, task_id, reason="insufficient_scope", covers="scope files:write", names='scope="files:write"',
        resources=[], scopes=["files:write"],
    )  # fmt: skip
    gates.release.set()
    assert (await polled_until(peer, task_id, "working"))["status"] == "completed", "the scoped token gets it"


# -- a task whose process is gone -----------------------------------------------------------------------------


@pytest.mark.parametrize("owner", [DEAD, "this-process"])
async def test_a_task_whose_process_is_gone_is_settled_lost_before_it_is_answered(
    server: InProcess, owner: str
) -> None:
    """A task of a replica without a lease, or of this process that does not run it (a restart), is failed with
    the execution-lost error, stored so, and only then answered."""
    owner = server.app.state.instance if owner == "this-process" else owner
    await put(server, "t-orphan", owner)
    peer = server.peer()
    got = answer(await peer.send(peer.message("tasks/get", {"taskId": "t-orphan"}, request_id=4)))
    result = got["result"]
    for moving in ("ttlMs", "createdAt", "lastUpdatedAt"):
        result.pop(moving)
    assert got == {
        "jsonrpc": "2.0",
        "id": 4,
        "result": {
            "taskId": "t-orphan",
            "status": "failed",
            "statusMessage": "the server process running this task ended",
            "pollIntervalMs": 500,
            "error": {
                "code": TASK_EXECUTION_LOST,
                "message": "execution lost: the process running this task ended before it finished; "
                "the tool may have run",
                "data": {"reason": "execution_lost", "taskId": "t-orphan", "resumable": False},
            },
            "resultType": "complete",
        },
    }
    stored = await server.tasks.get("t-orphan")
    assert stored is not None and stored.status is TaskStatus.FAILED, "stored failed: every replica answers the same"


@pytest.mark.parametrize("method", ["tasks/update", "tasks/cancel"])
async def test_an_update_or_cancel_of_a_lost_task_is_acknowledged_and_the_loss_kept(
    server: InProcess, method: str
) -> None:
    await put(server, "t-gone", DEAD)
    peer = server.peer()
    read = await peer.send(peer.message(method, {"taskId": "t-gone"}, request_id=5))
    assert read.status == 200 and json_of(read) == {"jsonrpc": "2.0", "id": 5, "result": {"resultType": "complete"}}
    stored = await server.tasks.get("t-gone")
    assert stored is not None and stored.status is TaskStatus.FAILED, "settled lost first: the first outcome stays"


# -- the owner's update and cancel --------------------------------------------------------------------------


async def test_the_owner_cancels_a_running_task(server: InProcess, gates: Gates) -> None:
    peer = server.peer()
    task_id = await create_task(peer, "hold_task")
    await gates.started.wait()
    read = await peer.send(peer.message("tasks/cancel", {"taskId": task_id}, request_id=6))
    assert json_of(read) == {"jsonrpc": "2.0", "id": 6, "result": {"resultType": "complete"}}
    settled = await polled_until(peer, task_id, "working")
    assert gates.cancelled.is_set()
    assert (settled["status"], "result" in settled, "error" in settled) == ("cancelled", False, False)


async def test_input_the_owner_delivers_with_tasks_update_reaches_the_waiting_task(server: InProcess) -> None:
    peer = server.peer()
    params = {"name": "approve", "arguments": {"item": "invoice"}, "_meta": ELICITING}
    created = answer(await peer.send(peer.message("tools/call", params)))["result"]
    assert created["resultType"] == "task"
    task_id = created["taskId"]
    waiting = await polled_until(peer, task_id, "working")
    assert waiting["status"] == "input_required"
    [(key, asked)] = waiting["inputRequests"].items()
    assert asked == {"method": "elicitation/create", "params": {"message": "Approve invoice?", "requestedSchema": {}}}
    update = {"taskId": task_id, "inputResponses": {key: {"action": "accept"}}}
    read = await peer.send(peer.message("tasks/update", update, request_id=7))
    assert json_of(read) == {"jsonrpc": "2.0", "id": 7, "result": {"resultType": "complete"}}
    done = await polled_until(peer, task_id, "working", "input_required")
    assert done["status"] == "completed" and done["result"]["content"] == [{"type": "text", "text": "invoice: accept"}]


# -- limits -----------------------------------------------------------------------------------------------------


async def test_a_call_past_the_principals_cap_is_429_naming_the_limit(store: EventStore, gates: Gates) -> None:
    async with serve(store, gates, Limits(calls_per_principal=1)) as server:
        peer = server.peer()
        async with anyio.create_task_group() as group:
            group.start_soon(peer.call, "hold")
            await gates.started.wait()
            read = await peer.send(peer.message("tools/call", {"name": "search", "arguments": {"query": "q"}}, 8))
            gates.release.set()
        assert (read.status, read.headers["retry-after"]) == (429, "1")
        assert json_of(read) == rpc_error(
            8, LIMIT_EXCEEDED, "this principal would run more than 1 requests at once",
            {"limit": "calls_per_principal", "maximum": 1, "retryAfter": 1},
        )  # fmt: skip
        after = await peer.send(peer.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 0}}))
        assert after.status == 200, "the held call's count was released when it ended"


async def test_a_task_past_the_running_cap_is_503_naming_the_limit(store: EventStore, gates: Gates) -> None:
    async with serve(store, gates, Limits(running_tasks=1)) as server:
        peer = server.peer()
        await create_task(peer, "hold_task")
        await gates.started.wait()
        read = await peer.send(peer.message("tools/call", {"name": "fetch", "arguments": {"url": "u"}}, 9))
        assert (read.status, read.headers["retry-after"]) == (503, "5")
        assert json_of(read) == rpc_error(
            9, LIMIT_EXCEEDED, "this server runs 1 tasks, the most allowed; retry later",
            {"limit": "running_tasks", "maximum": 1, "retryAfter": 5},
        )  # fmt: skip


async def test_a_task_the_store_has_no_room_for_is_503_and_leaves_no_stream(store: EventStore, gates: Gates) -> None:
    async with serve(store, gates) as server:
        server.tasks.max_tasks = 1  # type: ignore[attr-defined]  # the memory and SQLite stores' bound
        peer = server.peer()
        await create_task(peer, "hold_task")
        await gates.started.wait()  # its progress event stored: the principal's stored bytes are settled
        principal = principal_of(server.whole)
        held = store.stored_bytes(principal)
        read = await peer.send(peer.message("tools/call", {"name": "fetch", "arguments": {"url": "u"}}, 9))
        assert (read.status, read.headers["retry-after"]) == (503, "5")
        assert json_of(read) == rpc_error(9, INTERNAL_ERROR, "the server holds 1 tasks, its limit")
        # The refused task's event stream was opened beside its record (one write on SQLite), and went with it.
        assert store.stored_bytes(principal) == held


async def test_a_key_is_replayed_and_one_past_the_principals_bound_is_429(store: EventStore, gates: Gates) -> None:
    async with serve(store, gates, Limits(idempotency_keys_per_principal=1)) as server:
        peer = server.peer(tasks=False)

        def keyed(key: str, label: str) -> dict[str, Any]:
            params = {"name": "count", "arguments": {"label": label}, "idempotencyKey": key}
            return peer.message("tools/call", params, request_id=16)

        ran = {"content": [{"type": "text", "text": "run 1: a"}], "isError": False, "resultType": "complete"}
        first = await peer.send(keyed("k1", "a"))
        assert (first.status, json_of(first)) == (200, {"jsonrpc": "2.0", "id": 16, "result": ran})
        again = await peer.send(keyed("k1", "a"))
        replayed = {**ran, "_meta": {"io.github.mcp-lossless/replayed": True}}
        assert (again.status, json_of(again)) == (200, {"jsonrpc": "2.0", "id": 16, "result": replayed})
        past = await peer.send(keyed("k2", "b"))
        assert (past.status, past.headers["retry-after"]) == (429, "60")
        assert json_of(past) == rpc_error(
            16, LIMIT_EXCEEDED,
            "this principal holds 1 idempotency keys, at most 1 allowed; retry later, as they expire",
            {"limit": "idempotency_keys_per_principal", "maximum": 1, "retryAfter": 60},
        )  # fmt: skip
        empty = await peer.send(keyed("", "c"))
        assert json_of(empty) == rpc_error(
            16, INVALID_PARAMS, "idempotencyKey must be a non-empty string of at most 255 characters"
        )
        assert gates.runs == ["a"], "the replay ran nothing; the refused calls ran nothing"


async def test_a_keyed_task_is_created_once_and_its_key_is_the_principals_own(server: InProcess) -> None:
    """The retry under a key gets the same task (marked replayed); other arguments under it conflict; another
    principal's same key is its own; a token that does not cover the tool gets the 403, not the task."""
    peer, stranger = server.peer(), server.peer(server.mallory)

    def keyed(who: ModernPeer, url: str, request_id: int) -> dict[str, Any]:
        params = {"name": "fetch", "arguments": {"url": url, "steps": 0}, "idempotencyKey": "k"}
        return who.message("tools/call", params, request_id=request_id)

    created = json_of(await peer.send(keyed(peer, "https://e/a", 31)))["result"]
    assert created["resultType"] == "task"
    replayed = await peer.send(keyed(peer, "https://e/a", 32))
    expected = {**created, "_meta": {"io.github.mcp-lossless/replayed": True}}
    assert json_of(replayed) == {"jsonrpc": "2.0", "id": 32, "result": expected}
    conflict = await peer.send(keyed(peer, "https://e/other", 33))
    assert json_of(conflict) == rpc_error(
        33, INVALID_PARAMS, "idempotency key 'k' was used with another tool or other arguments",
        {"type": "idempotency_key_conflict", "idempotencyKey": "k"},
    )  # fmt: skip
    theirs = json_of(await stranger.send(keyed(stranger, "https://e/a", 34)))["result"]
    assert theirs["resultType"] == "task" and theirs["taskId"] != created["taskId"] and "_meta" not in theirs
    narrowed = await peer.send(keyed(peer, "https://e/a", 35), token=server.narrowed)
    assert narrowed.status == 403 and created["taskId"].encode() not in narrowed.body
    assert json_of(narrowed)["error"]["code"] == TOOL_FORBIDDEN


# -- the raw ASGI interface ---------------------------------------------------------------------------------


async def test_a_refusal_is_the_whole_response_before_any_other_byte(server: InProcess, gates: Gates) -> None:
    """A call the token does not cover: one start (403, the challenge) and one final body, nothing else sent, and
    the tool never started."""
    peer = server.peer(server.narrowed)
    message = peer.message("tools/call", {"name": "hold", "arguments": {}}, request_id=10)
    exchange = await raw_post(server.app, orjson.dumps(message), peer.headers(message))
    assert [m["type"] for m in exchange.sent] == ["http.response.start", "http.response.body"]
    assert exchange.sent[1].get("more_body", False) is False
    assert exchange.status == 403 and exchange.headers[b"content-type"] == b"application/json"
    assert b'resource="' + HOLD.encode() + b'"' in exchange.headers[b"www-authenticate"]
    assert orjson.loads(exchange.body)["error"]["code"] == TOOL_FORBIDDEN
    assert not gates.started.is_set()


async def test_a_client_that_leaves_cancels_its_modern_request(server: InProcess, gates: Gates) -> None:
    """The stateless leg has nothing to resume: the client closing the response cancels the tool."""
    peer = server.peer()
    message = peer.message("tools/call", {"name": "hold", "arguments": {}, "_meta": {"progressToken": 1}})

    def streaming(sent: list[Any]) -> bool:
        return any(m["type"] == "http.response.body" and m.get("body") for m in sent)

    async def cancelled() -> None:
        with anyio.fail_after(10):
            await gates.cancelled.wait()

    exchange = await raw_post(server.app, orjson.dumps(message), peer.headers(message), leave=streaming, left=cancelled)
    assert exchange.status == 200 and exchange.headers[b"content-type"] == b"text/event-stream"
    assert gates.cancelled.is_set() and not gates.release.is_set()
    assert b"notifications/progress" in exchange.body and b"released" not in exchange.body


# -- the streams: tasks/stream and subscriptions/listen ---------------------------------------------------------


def sse_messages(body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body (every event here is one ``data:`` line, with no id: none resumes)."""
    events = [block for block in body.decode().split("\n\n") if block]
    assert all(event.startswith("data: ") and "\n" not in event for event in events), events
    return [orjson.loads(event.removeprefix("data: ")) for event in events]


async def test_a_tasks_stream_gives_its_owner_every_event_then_its_answer(server: InProcess) -> None:
    peer = server.peer()
    task_id = await create_task(peer, url="https://e/a", steps=2, delay_ms=0)
    message = peer.message("tasks/stream", {"taskId": task_id}, request_id=11)
    exchange = await raw_post(server.app, orjson.dumps(message), peer.headers(message))
    assert exchange.status == 200 and exchange.headers[b"content-type"] == b"text/event-stream"
    related = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    payloads = [
        ("status", {"status": "working"}),
        ("progress", {"progress": 1, "total": 2, "message": "fetch step 1/2"}),
        ("progress", {"progress": 2, "total": 2, "message": "fetch step 2/2"}),
        ("outcome", {"status": "completed",
                     "result": {"content": [{"type": "text", "text": "contents of https://e/a: 11 bytes"}],
                                "isError": False}}),
    ]  # fmt: skip
    events = [
        {"jsonrpc": "2.0", "method": "notifications/tasks/event",
         "params": {"seq": seq, "taskId": task_id, "type": f"io.github.mcp-lossless.task.{kind}", "payload": payload,
                    "_meta": related}}
        for seq, (kind, payload) in enumerate(payloads)
    ]  # fmt: skip
    assert sse_messages(exchange.body) == [*events, {"jsonrpc": "2.0", "id": 11, "result": {"resultType": "complete"}}]


async def test_a_tasks_stream_of_another_principals_task_is_an_unknown_one(server: InProcess) -> None:
    task_id = await create_task(server.peer(), url="https://e/a", steps=0)
    stranger = server.peer(server.mallory)
    bodies = []
    for asked in (task_id, "0" * len(task_id)):
        message = stranger.message("tasks/stream", {"taskId": asked}, request_id=12)
        exchange = await raw_post(server.app, orjson.dumps(message), stranger.headers(message))
        assert exchange.status == 200 and b"www-authenticate" not in exchange.headers
        bodies.append(exchange.body)
    assert bodies[0] == bodies[1]
    assert orjson.loads(bodies[0]) == rpc_error(12, INVALID_PARAMS, UNKNOWN)


async def test_a_tasks_stream_for_a_narrowed_token_is_403_before_any_event(server: InProcess) -> None:
    peer = server.peer()
    task_id = await create_task(peer, url="https://e/a", steps=0)
    message = peer.message("tasks/stream", {"taskId": task_id}, request_id=13)
    exchange = await raw_post(server.app, orjson.dumps(message), peer.headers(message, server.narrowed))
    assert [m["type"] for m in exchange.sent] == ["http.response.start", "http.response.body"]
    assert exchange.status == 403
    body = orjson.loads(exchange.body)
    envelope = body["error"]["data"]["authorization"]
    text = (
        f"task {task_id} events not delivered: the token does not cover {FETCH}; re-authorize and stream from its start"
    )
    assert body == rpc_error(
        13, TASK_DENIED, text,
        {"reason": "insufficient_audience", "taskId": task_id, "lastSeq": None, "resumable": True,
         "requiredResources": [FETCH], "requiredScopes": [], "authorization": envelope,
         "_meta": {"io.modelcontextprotocol/authorization": envelope}},
    )  # fmt: skip
    assert (
        exchange.headers[b"www-authenticate"]
        == (
            f'Bearer error="insufficient_scope", error_description="{text}", resource="{FETCH}", '
            'resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp"'
        ).encode()
    )


NOT_TASK_IDS = "notifications.taskIds must be a list of task id strings"


@pytest.mark.parametrize(
    ("tasks", "watched", "status", "error"),
    [
        (False, ["t"], 400, {"code": MISSING_REQUIRED_CLIENT_CAPABILITY,
                             "message": "Missing required client capability",
                             "data": {"requiredCapabilities": {"extensions": {TASKS: {}}}}}),
        (True, "t", 400, {"code": INVALID_PARAMS, "message": NOT_TASK_IDS}),
        (True, ["t", 1], 400, {"code": INVALID_PARAMS, "message": NOT_TASK_IDS}),
    ],
    ids=["without-the-extension", "not-a-list", "not-strings"],
)  # fmt: skip
async def test_a_listen_stream_asking_for_tasks_it_cannot_have_is_refused_before_any_byte(
    server: InProcess, tasks: bool, watched: Any, status: int, error: dict[str, Any]
) -> None:
    peer = server.peer(tasks=tasks)
    message = peer.message("subscriptions/listen", {"notifications": {"taskIds": watched}}, request_id=15)
    exchange = await raw_post(server.app, orjson.dumps(message), peer.headers(message))
    assert [m["type"] for m in exchange.sent] == ["http.response.start", "http.response.body"]
    assert exchange.status == status
    assert orjson.loads(exchange.body) == {"jsonrpc": "2.0", "id": 15, "error": error}


async def test_a_listen_stream_watches_only_the_tasks_its_token_may_poll_and_pushes_their_outcome(
    server: InProcess, gates: Gates
) -> None:
    peer = server.peer()
    mine = await create_task(peer, "hold_task")
    await gates.started.wait()
    theirs = await create_task(server.peer(server.mallory), url="https://e/b", steps=0)
    asked = {"notifications": {"taskIds": [mine, theirs, "t-never", mine]}}
    message = peer.message("subscriptions/listen", asked, request_id=14)

    def pushed(sent: list[Any]) -> bool:
        """Release the task once the acknowledgement is out; leave once its outcome is pushed."""
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        if b"notifications/subscriptions/acknowledged" in body:
            gates.release.set()
        return b'"completed"' in body

    with anyio.fail_after(10):
        exchange = await raw_post(server.app, orjson.dumps(message), peer.headers(message), leave=pushed)
    assert exchange.status == 200 and exchange.headers[b"content-type"] == b"text/event-stream"
    ack, *pushes = sse_messages(exchange.body)
    subscription = {"io.modelcontextprotocol/subscriptionId": 14}
    assert ack == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": {"taskIds": [mine]}, "_meta": subscription},
    }, "another principal's id and an unknown one are left out alike"
    assert pushes and all(p["method"] == "notifications/tasks" for p in pushes)
    assert {p["params"]["taskId"] for p in pushes} == {mine}
    final = pushes[-1]["params"]
    assert (final["status"], final["result"]["content"], final["_meta"]) == (
        "completed", [{"type": "text", "text": "released"}], subscription
    )  # fmt: skip


async def test_a_drain_ends_calls_in_their_requests_and_records_running_tasks_lost(
    server: InProcess, gates: Gates
) -> None:
    """At a drain's deadline (here at once) each call running in its request answers execution lost on its stream
    and each running task is recorded lost, so every client has its one outcome before the process goes."""
    peer = server.peer()
    task_id = await create_task(peer, "hold_task")
    await gates.started.wait()
    gates.started.clear()
    message = peer.message("tools/call", {"name": "hold", "arguments": {}, "_meta": {"progressToken": 1}}, 41)
    exchanges = []

    async def call() -> None:
        exchanges.append(await raw_post(server.app, orjson.dumps(message), peer.headers(message)))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        await gates.started.wait()
        await server.app.drain(0)
    [exchange] = exchanges
    assert exchange.status == 200 and gates.cancelled.is_set()
    assert sse_messages(exchange.body) == [
        {"jsonrpc": "2.0", "method": "notifications/progress",
         "params": {"progressToken": 1, "progress": 0, "total": 1, "message": "holding"}},
        rpc_error(41, EXECUTION_LOST,
                  "execution lost: the process running this request ended before it answered; the tool may have run",
                  {"reason": "execution_lost", "requestId": 41, "resumable": False}),
    ]  # fmt: skip
    lost = answer(await peer.task("tasks/get", task_id))["result"]
    assert (lost["status"], lost["error"]["code"]) == ("failed", TASK_EXECUTION_LOST)


async def test_a_drain_waits_for_a_keyed_call_whose_client_left_and_its_duplicate_gets_the_replay(
    server: InProcess, gates: Gates
) -> None:
    """A keyed call runs detached from its request; SIGTERM's drain gives it its time like any other call, so its
    answer is stored and the retry under its key is replayed, not told the execution was lost. The tool is
    released the moment the drain starts; the drain must not be over (nor count it lost) before it finished."""
    peer = server.peer(tasks=False)
    keyed = {"name": "hold", "arguments": {}, "idempotencyKey": "drained", "_meta": {"progressToken": 1}}
    message = peer.message("tools/call", keyed, request_id=42)
    with anyio.fail_after(10):
        await raw_post(server.app, orjson.dumps(message), peer.headers(message), leave=lambda sent: len(sent) > 1)
        await gates.started.wait()  # the client left after its first progress: the call runs on
    seen: dict[str, Any] = {}

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            event = getattr(record, "fields", {}).get("event")
            if event == "draining":
                gates.release.set()
            elif event == "drained":
                seen.update(getattr(record, "fields", {}), running=len(server.app.modern.keyed.running))

    logger, watch = logging.getLogger("mcp_lossless"), Watch()
    level = logger.level
    logger.addHandler(watch)
    logger.setLevel(logging.INFO)  # the drain's decisions are logged at info
    try:
        with anyio.fail_after(10):
            await server.app.drain(30)
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)
    assert (seen["execution_lost"], seen["running"]) == (0, 0), "the drain waited for the keyed call"
    again = await peer.send(message)
    assert json_of(again) == {"jsonrpc": "2.0", "id": 42, "result": {
        "content": [{"type": "text", "text": "released"}], "isError": False, "resultType": "complete",
        "_meta": {"io.github.mcp-lossless/replayed": True},
    }}  # fmt: skip
    assert not gates.cancelled.is_set()


async def test_a_keyed_call_counts_once_under_calls_per_principal(store: EventStore, gates: Gates) -> None:
    """A keyed call runs in a task of its own besides its request: it takes its request's place under the cap,
    not a second one (with a cap of 2, one keyed call running leaves room for another, which then runs)."""
    async with serve(store, gates, Limits(calls_per_principal=2)) as server:
        peer = server.peer(tasks=False)
        held = peer.message("tools/call", {"name": "hold", "arguments": {}, "idempotencyKey": "h"}, request_id=1)
        counted = {"name": "count", "arguments": {"label": "a"}, "idempotencyKey": "c"}
        async with anyio.create_task_group() as group:
            group.start_soon(peer.send, held)
            with anyio.fail_after(10):
                await gates.started.wait()
            second = await peer.send(peer.message("tools/call", counted, request_id=2))
            gates.release.set()
        assert json_of(second)["result"]["content"] == [{"type": "text", "text": "run 1: a"}]
        assert gates.runs == ["a"]
