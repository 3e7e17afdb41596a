"""Tasks on several `mcp-lossless serve` processes sharing one real redis-server: a task is one task everywhere.

Created on one replica, it is polled, denied and delivered on another exactly as on its own; a task whose
replica dies is settled ``failed`` with the execution-lost error by whichever replica is polled once the dead
one's lease has run out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from mcp_lossless.core.errors import TASK_DENIED, TASK_EXECUTION_LOST
from tests.integration.test_redis_replicas import Deployment, deployment
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer, answer, poll_until_settled
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def replicas(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Deployment, ServerProcess, ServerProcess]]:
    with contextlib.ExitStack() as stack:
        shared = deployment(redis_url, tmp_path_factory.mktemp("modern-replicas"), lease_seconds=1.0)
        a, b = shared.start(stack, "a", "b")
        yield shared, a, b


async def test_a_task_created_on_one_replica_is_polled_denied_and_delivered_on_another(
    replicas: tuple[Deployment, ServerProcess, ServerProcess], http: httpx.AsyncClient
) -> None:
    shared, a, b = replicas
    aggregate = await dev_token(http, a.base, shared.canonical)
    narrowed = await dev_token(http, b.base, shared.tool("search"))
    on_a, on_b = ModernPeer(http, a.base, aggregate), ModernPeer(http, b.base, aggregate)
    created = answer(await on_a.call("fetch", url="https://example.com/r", steps=3, delay_ms=50))["result"]
    assert created["resultType"] == "task"
    first = await on_b.task("tasks/get", created["taskId"])
    assert answer(first)["result"]["taskId"] == created["taskId"], "stored before CreateTaskResult: B finds it"
    denied = await on_b.task("tasks/get", created["taskId"], token=narrowed)
    assert denied.status == 403 and answer(denied)["error"]["code"] == TASK_DENIED
    assert answer(denied)["error"]["data"]["requiredResources"] == [shared.tool("fetch")]
    settled = await poll_until_settled(on_b, created["taskId"])
    assert settled["status"] == "completed"
    assert settled["result"]["content"][0]["text"] == "contents of https://example.com/r: 21 bytes"


async def test_a_task_whose_replica_died_ends_failed_on_the_survivor(
    replicas: tuple[Deployment, ServerProcess, ServerProcess], http: httpx.AsyncClient
) -> None:
    shared, _, b = replicas
    with contextlib.ExitStack() as stack:
        [doomed] = shared.start(stack, "doomed-tasks")
        token = await dev_token(http, b.base, shared.canonical)
        created = await ModernPeer(http, doomed.base, token).call(
            "fetch", url="https://example.com/x", steps=600, delay_ms=100
        )
        task_id = answer(created)["result"]["taskId"]
        doomed.kill()
    settled = await poll_until_settled(ModernPeer(http, b.base, token), task_id)  # working until the lease runs out
    assert settled["status"] == "failed" and settled["error"]["code"] == TASK_EXECUTION_LOST
