"""The modern leg's task poll in process, through an ASGI transport (no uvicorn): each outcome of
:func:`~mcp_lossless.core.tasks.decide_poll` as the wire shows it, and what the adapter writes for it.

Tasks are put in the server's task store directly, so each test sets up exactly the record the decision sees:
its principal, its tool's requirement, its owner (this process, or a replica that is gone).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from mcp_lossless.core.errors import INVALID_PARAMS, TASK_DENIED, TASK_EXECUTION_LOST
from mcp_lossless.core.principal import Principal
from mcp_lossless.core.tasks import (
    POLL_NOTED_WITHIN,
    UNKNOWN_MESSAGE,
    Requirement,
    TaskRecord,
    TaskStatus,
    advance,
    new_task,
)
from mcp_lossless.server.app import LosslessApp, create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.observability import now
from tests.integration.conftest import CLIENTS
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer, answer

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8000"
MCP = f"{BASE}/mcp"
FETCH = f"{MCP}/tools/fetch"


@dataclass
class Server:
    app: LosslessApp
    http: httpx.AsyncClient
    owner: ModernPeer
    """The dev client, holding a token for the whole server."""
    narrowed: str
    """The dev client's token for another tool only."""
    stranger: ModernPeer
    principal: Principal
    """The dev client's principal (whose tasks these are)."""

    async def put(self, task_id: str, owner: str | None = None, status: TaskStatus = TaskStatus.WORKING) -> TaskRecord:
        """A task of the dev client's for the fetch tool, owned by ``owner`` (default: this process), made and settled
        long enough ago for its owner's poll to restart its TTL (ADR 0039: not within ``POLL_NOTED_WITHIN``)."""
        modern = self.app.modern
        at = now() - 2 * POLL_NOTED_WITHIN
        record = new_task(
            task_id, self.principal, "fetch", Requirement(frozenset({FETCH})), owner or modern.state.instance, at, 60
        )
        if status is TaskStatus.COMPLETED:
            record = advance(record, status, at, result={"content": [{"type": "text", "text": "the result"}]})
        await modern.tasks.store.create(record)
        return record

    async def stored(self, task_id: str) -> TaskRecord:
        record = await self.app.modern.tasks.store.get(task_id)
        assert record is not None
        return record


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    app = create_app(ServerConfig(store="memory", dev_clients=CLIENTS))
    await app.startup()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
            whole = await dev_token(http, BASE, MCP)
            narrowed = await dev_token(http, BASE, f"{MCP}/tools/search")
            mallory = await dev_token(http, BASE, MCP, client=("mallory", CLIENTS["mallory"]))
            owner = ModernPeer(http, BASE, whole)
            yield Server(app, http, owner, narrowed, ModernPeer(http, BASE, mallory), principal_of(whole))
    finally:
        await app.shutdown()


def principal_of(token: str) -> Principal:
    """The principal of a token the server accepts (read from its claims: the signature is the server's business)."""
    claims = orjson.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    return Principal(claims["iss"], claims["sub"], claims["client_id"])


def error_of(read: Any) -> dict[str, Any]:
    error: dict[str, Any] = answer(read)["error"]
    return error


async def test_the_owner_gets_its_task_and_its_poll_restarts_the_ttl(server: Server) -> None:
    created = await server.put("t-mine", status=TaskStatus.COMPLETED)
    got = await server.owner.task("tasks/get", "t-mine")
    assert got.status == 200, got.body
    result = answer(got)["result"]
    assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "the result"
    assert (await server.stored("t-mine")).seen_at > created.seen_at, "the poll was noted: the TTL restarts"


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
async def test_another_principals_task_reads_exactly_as_no_task(server: Server, method: str) -> None:
    created = await server.put("t-theirs")
    stranger = server.stranger
    theirs = await stranger.send(stranger.message(method, {"taskId": "t-theirs"}, request_id=3))
    missing = await stranger.send(stranger.message(method, {"taskId": "t-never"}, request_id=3))
    assert theirs.status == missing.status == 200 and theirs.body == missing.body
    assert error_of(theirs) == {"code": INVALID_PARAMS, "message": UNKNOWN_MESSAGE}
    assert await server.stored("t-theirs") == created, "a stranger's look writes nothing"


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
async def test_a_token_that_stopped_covering_the_tool_is_denied_and_the_task_kept(server: Server, method: str) -> None:
    created = await server.put("t-narrow", status=TaskStatus.COMPLETED)
    denied = await server.owner.request(method, {"taskId": "t-narrow"}, token=server.narrowed)
    assert denied.status == 403
    error = error_of(denied)
    assert error["code"] == TASK_DENIED and error["data"]["requiredResources"] == [FETCH]
    assert f'resource="{FETCH}"' in denied.headers["www-authenticate"]
    assert b"the result" not in denied.body
    kept = await server.stored("t-narrow")
    assert kept.status is TaskStatus.COMPLETED and kept.seen_at > created.seen_at, "denied, and its TTL restarted"


async def test_a_task_whose_process_is_gone_is_settled_lost_before_it_is_answered(server: Server) -> None:
    await server.put("t-orphan", owner="a-replica-that-died")
    got = answer(await server.owner.task("tasks/get", "t-orphan"))["result"]
    assert got["status"] == "failed" and got["error"]["code"] == TASK_EXECUTION_LOST
    stored = await server.stored("t-orphan")
    assert stored.status is TaskStatus.FAILED, "stored failed, so every replica answers the same"


async def test_a_task_this_process_no_longer_runs_is_lost_too(server: Server) -> None:
    await server.put("t-dropped")  # owned by this process, which runs no such task
    got = answer(await server.owner.task("tasks/get", "t-dropped"))["result"]
    assert got["status"] == "failed" and got["error"]["data"]["reason"] == "execution_lost"


async def test_cancelling_a_task_of_a_dead_replica_keeps_the_first_outcome(server: Server) -> None:
    await server.put("t-cancel", owner="a-replica-that-died")
    acknowledged = await server.owner.task("tasks/cancel", "t-cancel")
    assert answer(acknowledged)["result"] == {"resultType": "complete"}
    assert (await server.stored("t-cancel")).status is TaskStatus.FAILED, "settled lost first: the cancel lands on it"
