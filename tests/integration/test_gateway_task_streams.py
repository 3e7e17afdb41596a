"""The gateway offers ``tasks/stream`` (SEP-2694) for the tasks it runs, under the server's rule: replayed and followed
against the token of the stream request, event by event (real HTTP, real JWTs from the gateway's dev AS).

The gateway is an ordinary server whose tools call upstreams (ADR 0013): an exposed tool that may not run twice is
a task for 2026-07-28 clients, its upstream progress is reported through its ``ToolContext`` and so becomes the
task's progress events, tagged with the exposed tool's resource. Here the upstream is our own server running a
``charge`` that may not run twice (a task there too), which the gateway's modern client follows by its own
``tasks/stream``.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.core.errors import TASK_DENIED
from mcp_lossless.core.task_stream import STREAM_EXTENSION
from mcp_lossless.gateway import UpstreamConfig, create_gateway
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from tests.integration.test_task_streams import OUTCOME, PROGRESS, events_of, stream
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer, answer
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio
CLIENTS = {"dev-client": "dev-secret"}


def charging() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(idempotent=False, task=True)
    async def charge(ctx: ToolContext, account: str, steps: int, delay_ms: int) -> str:
        """Charge ``account`` in ``steps`` reported steps, each after ``delay_ms`` (the work a tool does)."""
        for step in range(1, steps + 1):
            await anyio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, steps, f"charge step {step}/{steps}")
        return f"charged {account}"

    @registry.tool(idempotent=True, read_only=True)
    async def balance(ctx: ToolContext, account: str) -> str:
        """The balance of ``account``: the other tool, which a narrowed token covers."""
        return f"{account}: 0"

    return registry


@pytest.fixture
def gateway() -> Iterator[str]:
    """Our server with no authorization (loopback) as the upstream ``up``, and the gateway before it."""

    def upstream(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", issuer=None), charging())

    with lossless_server(upstream) as up:

        def make(port: int) -> object:
            config = ServerConfig(port=port, store="memory", dev_clients=CLIENTS)
            return create_gateway(config, [UpstreamConfig("up", url=f"{up}/mcp")])

        with lossless_server(make) as base:
            yield base


async def test_the_gateway_streams_its_tasks_under_the_stream_requests_token(
    http: httpx.AsyncClient, gateway: str
) -> None:
    """Acceptance 1 of issue 29 through the gateway: a task of ``up_charge`` created under the aggregate token, its
    stream cut after the 2nd progress event, resumed under a token for ``up_balance`` only (403, -31041 naming
    ``up_charge`` and the cursor, nothing of the task), then under a covering token: the rest once, the outcome."""
    mcp = f"{gateway}/mcp"
    peer = ModernPeer(http, gateway, await dev_token(http, gateway, mcp))
    discovered = answer(await peer.request("server/discover"))["result"]
    assert STREAM_EXTENSION in discovered["capabilities"]["extensions"]
    created = answer(await peer.call("up_charge", account="acct-1", steps=5, delay_ms=60))["result"]
    assert created["resultType"] == "task", "a tool that may not run twice is a task"
    task_id = created["taskId"]

    first = events_of(await stream(peer, task_id, cut_after_progress=2))
    assert [e["seq"] for e in first] == list(range(len(first)))
    assert [e["payload"]["progress"] for e in first if e["type"] == PROGRESS] == [1, 2], "upstream progress"
    cursor = first[-1]["seq"]

    narrowed = await dev_token(http, gateway, f"{mcp}/tools/up_balance")
    denied = await stream(peer, task_id, cursor, token=narrowed)
    assert denied.status == 403 and f'resource="{mcp}/tools/up_charge"' in denied.headers["www-authenticate"]
    error = orjson.loads(denied.body)["error"]
    assert error["code"] == TASK_DENIED and error["data"]["taskId"] == task_id and error["data"]["lastSeq"] == cursor
    assert error["data"]["requiredResources"] == [f"{mcp}/tools/up_charge"]
    assert b"charge step" not in denied.body and b"charged" not in denied.body

    rest = await stream(peer, task_id, cursor)
    tail = events_of(rest)
    assert [e["seq"] for e in tail] == list(range(cursor + 1, cursor + 1 + len(tail))), "each remaining seq once"
    assert [e["payload"]["progress"] for e in tail if e["type"] == PROGRESS] == [3, 4, 5]
    assert tail[-1]["type"] == OUTCOME and tail[-1]["payload"]["status"] == "completed"
    assert tail[-1]["payload"]["result"]["content"][0]["text"] == "charged acct-1"
    assert rest.messages[-1]["result"] == {"resultType": "complete"}
