"""Client input on the 2026-07-28 leg over real HTTP with real signed JWTs: multi round-trip requests (the
sealed ``requestState`` bound to its principal), tasks that wait ``input_required`` under the task layer's
authorization (every store) and pushed to listen streams under the same rule, the running-task cap, and
``x-mcp-header`` validation."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.core.errors import HEADER_MISMATCH, INVALID_PARAMS, LIMIT_EXCEEDED, TASK_DENIED
from mcp_lossless.core.limits import Limits
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from tests.integration.conftest import CLIENTS
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer, answer, meta
from tests.support.processes import free_port
from tests.support.stores import KINDS, store_of_kind
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
RUNS: list[str] = []
"""What ``book`` did, run by run: a retry runs the tool again from its start."""


def tools() -> ToolRegistry:
    registry = demo_tools()

    @registry.tool()
    async def book(ctx: ToolContext, city: str) -> str:
        """Asks the traveller's name, then whether to confirm: two rounds."""
        RUNS.append(city)
        name = await ctx.request("elicitation/create", {"message": "Name?", "requestedSchema": NAME_SCHEMA})
        sure = await ctx.request("elicitation/create", {"message": "Sure?", "requestedSchema": {"type": "object"}})
        return f"booked {city} for {name['content']['name']} ({sure['action']})"

    @registry.tool(task=True)
    async def approve(ctx: ToolContext, item: str) -> str:
        """A task that waits for its owner's approval."""
        answer = await ctx.request("elicitation/create", {"message": f"Approve {item}?", "requestedSchema": {}})
        return f"{item}: {answer['action']}"

    @registry.tool()
    async def paced(ctx: ToolContext, steps: int = 3) -> str:
        """Reports progress between awaits inside an asyncio timeout; says whether it stayed in one task."""
        first = asyncio.current_task()
        async with asyncio.timeout(10):
            for step in range(1, steps + 1):
                await ctx.report_progress(step, steps)
                await asyncio.sleep(0.01)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(5)  # its own timeout fires: the tool, not the request, sees it
        return f"paced {steps}, one task: {asyncio.current_task() is first}"

    region = {"type": "string", "x-mcp-header": "Region"}
    schema = {"type": "object", "properties": {"region": region, "n": {"type": "integer", "x-mcp-header": "N"}}}

    @registry.tool(input_schema=schema)
    async def routed(region: str, n: int | None = None) -> str:
        """Mirrors ``region`` and ``n`` into headers."""
        return f"{region}/{n}"

    return registry


def serve(store: EventStore, limits: Limits | None = None) -> Iterator[str]:
    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", dev_clients=CLIENTS, limits=limits or Limits())
        return create_app(config, tools(), store=store)

    with lossless_server(make) as url:
        yield url


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    yield from serve(MemoryStore())


@pytest.fixture(params=KINDS)
def any_store_base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from serve(store_of_kind(request, tmp_path, "input"))


async def poll_while(peer: ModernPeer, task_id: str, *statuses: str) -> dict[str, Any]:
    """``tasks/get`` at the server's ``pollIntervalMs`` while the task is in one of ``statuses``."""
    with anyio.fail_after(10):
        while True:
            polled: dict[str, Any] = answer(await peer.task("tasks/get", task_id))["result"]
            if polled["status"] not in statuses:
                return polled
            await anyio.sleep(polled["pollIntervalMs"] / 1000)


def with_elicitation(peer: ModernPeer) -> ModernPeer:
    """The peer's requests declare that the client can answer elicitations (and the tasks extension)."""
    capabilities = {**meta()["io.modelcontextprotocol/clientCapabilities"], "elicitation": {}}
    original = peer.message

    def message(method: str, params: dict[str, Any] | None = None, request_id: int | None = None) -> dict[str, Any]:
        sent = original(method, params, request_id)
        sent["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = capabilities
        return sent

    peer.message = message  # type: ignore[method-assign]
    return peer


async def test_a_call_asks_round_by_round_and_the_state_is_bound_to_its_principal(
    http: httpx.AsyncClient, base: str
) -> None:
    alice = with_elicitation(ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp")))
    mallory_token = await dev_token(http, base, f"{base}/mcp", client=("mallory", CLIENTS["mallory"]))
    mallory = with_elicitation(ModernPeer(http, base, mallory_token))
    RUNS.clear()
    call = {"name": "book", "arguments": {"city": "Oslo"}}

    first = answer(await alice.request("tools/call", call))["result"]
    assert first["resultType"] == "input_required" and "content" not in first
    (key,) = first["inputRequests"]
    assert first["inputRequests"][key]["method"] == "elicitation/create"
    name = {key: {"action": "accept", "content": {"name": "Alice"}}}

    stolen = await mallory.request("tools/call", {**call, "requestState": first["requestState"]})
    error = answer(stolen)["error"]
    assert error["code"] == INVALID_PARAMS and "another principal" in error["message"], "no replay across users"
    other_city = {"name": "book", "arguments": {"city": "Rome"}, "requestState": first["requestState"]}
    assert answer(await alice.request("tools/call", other_city))["error"]["code"] == INVALID_PARAMS

    retry = {**call, "inputResponses": name, "requestState": first["requestState"]}
    second = answer(await alice.request("tools/call", retry))["result"]
    assert second["resultType"] == "input_required" and key not in second["inputRequests"], "the next question"
    (key2,) = second["inputRequests"]
    assert second["requestState"] != first["requestState"]
    done = await alice.request(
        "tools/call",
        {**call, "inputResponses": {key2: {"action": "accept"}}, "requestState": second["requestState"]},
    )
    result = answer(done)["result"]
    assert result["resultType"] == "complete"
    assert result["content"][0]["text"] == "booked Oslo for Alice (accept)", "the first answer rode in the state"
    assert RUNS == ["Oslo", "Oslo", "Oslo"], "each round runs the tool from its start; a refused state runs nothing"

    bare = ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp"), tasks=False)
    undeclared = await bare.request("tools/call", call)
    assert undeclared.status == 400 and answer(undeclared)["error"]["code"] == -32021, "never ask undeclared input"


async def test_a_task_waits_for_input_and_each_poll_and_update_is_authorized(
    http: httpx.AsyncClient, any_store_base: str
) -> None:
    base = any_store_base
    aggregate = await dev_token(http, base, f"{base}/mcp")
    narrowed = await dev_token(http, base, f"{base}/mcp/tools/search")
    peer = with_elicitation(ModernPeer(http, base, aggregate))
    created = answer(await peer.call("approve", item="invoice-7"))["result"]
    assert created["resultType"] == "task" and "inputRequests" not in created
    task_id = created["taskId"]
    polled = await poll_while(peer, task_id, "working")
    assert polled["status"] == "input_required"
    (key,) = polled["inputRequests"]
    assert polled["inputRequests"][key]["params"]["message"] == "Approve invoice-7?"

    denied = await peer.task("tasks/get", task_id, token=narrowed)
    assert denied.status == 403 and answer(denied)["error"]["code"] == TASK_DENIED
    assert b"invoice-7" not in denied.body, "not a byte of the task's state, its input requests included"
    update = {"taskId": task_id, "inputResponses": {key: {"action": "accept"}}}
    refused = await peer.request("tasks/update", update, token=narrowed)
    assert refused.status == 403 and answer(refused)["error"]["code"] == TASK_DENIED
    still = answer(await peer.task("tasks/get", task_id))["result"]
    assert still["status"] == "input_required" and key in still["inputRequests"], "a denied update delivers nothing"

    ack = answer(await peer.request("tasks/update", update))["result"]
    assert ack == {"resultType": "complete"}
    polled = await poll_while(peer, task_id, "working", "input_required")
    assert polled["status"] == "completed" and polled["result"]["content"][0]["text"] == "invoice-7: accept"


async def test_past_the_running_task_cap_a_task_is_refused_with_503(http: httpx.AsyncClient) -> None:
    for base in serve(MemoryStore(), Limits(running_tasks=1)):
        peer = with_elicitation(ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp")))
        first = answer(await peer.call("approve", item="a"))["result"]
        refused = await peer.call("approve", item="b")
        assert refused.status == 503 and refused.headers["retry-after"] == "5"
        error = answer(refused)["error"]
        assert error["code"] == LIMIT_EXCEEDED and error["data"]["limit"] == "running_tasks"
        assert error["data"]["maximum"] == 1
        assert answer(await peer.task("tasks/cancel", first["taskId"]))["result"] == {"resultType": "complete"}
        assert (await poll_while(peer, first["taskId"], "working", "input_required"))["status"] == "cancelled"
        for _ in range(100):  # the cancelled task leaves the process just after its outcome is stored
            again = await peer.call("approve", item="c")
            if again.status != 503:
                break
            await anyio.sleep(0.05)
        assert answer(again)["result"]["resultType"] == "task", "the slot is free again"


async def test_mirrored_parameters_must_match_their_headers(http: httpx.AsyncClient, base: str) -> None:
    peer = ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp"))
    message = peer.message("tools/call", {"name": "routed", "arguments": {"region": "eu west", "n": 42}})
    ok = await peer.send(message, headers={"mcp-param-region": "eu west", "mcp-param-n": "42.0"})
    assert ok.status == 200 and answer(ok)["result"]["content"][0]["text"] == "eu west/42", ok.body
    encoded = await peer.send(message, headers={"mcp-param-region": "=?base64?ZXUgd2VzdA==?=", "mcp-param-n": "42"})
    assert encoded.status == 200, encoded.body
    for headers in (
        {"mcp-param-n": "42"},
        {"mcp-param-region": "eu east", "mcp-param-n": "42"},
        {"mcp-param-region": "eu west", "mcp-param-n": "41"},
        {"mcp-param-region": "=?base64?ZXUgd2VzdA?=", "mcp-param-n": "42"},
    ):
        read = await peer.send(message, headers=headers)
        assert read.status == 400 and answer(read)["error"]["code"] == HEADER_MISMATCH, headers
    only_region = peer.message("tools/call", {"name": "routed", "arguments": {"region": "x", "n": None}})
    assert (await peer.send(only_region, headers={"mcp-param-region": "x"})).status == 200, "null: no header"


@contextlib.asynccontextmanager
async def listening(
    peer: ModernPeer, token: str, task_ids: list[str]
) -> AsyncIterator[Callable[[], Awaitable[dict[str, Any]]]]:
    """A ``subscriptions/listen`` stream for ``task_ids``; yields a function that reads its next message."""
    message = peer.message("subscriptions/listen", {"notifications": {"taskIds": task_ids}})
    headers = peer.headers(message, token)
    async with peer.http.stream("POST", peer.url, content=orjson.dumps(message), headers=headers) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
        lines = response.aiter_lines()

        async def next_message() -> dict[str, Any]:
            async for line in lines:
                if line.startswith("data:"):
                    found: dict[str, Any] = orjson.loads(line[5:])
                    return found
            raise AssertionError("the listen stream ended")

        yield next_message


async def test_task_state_is_pushed_only_to_a_listen_stream_whose_token_covers_the_task(
    http: httpx.AsyncClient, any_store_base: str
) -> None:
    base = any_store_base
    aggregate = await dev_token(http, base, f"{base}/mcp")
    narrowed = await dev_token(http, base, f"{base}/mcp/tools/search")
    mallory = await dev_token(http, base, f"{base}/mcp", client=("mallory", CLIENTS["mallory"]))
    peer = with_elicitation(ModernPeer(http, base, aggregate))
    task_id = answer(await peer.call("approve", item="po-9"))["result"]["taskId"]
    with anyio.fail_after(20):
        for token in (narrowed, mallory):
            async with listening(peer, token, [task_id]) as next_message:
                ack = await next_message()
                assert ack["method"] == "notifications/subscriptions/acknowledged"
                assert ack["params"]["notifications"]["taskIds"] == [], "agreed to nothing the token may not see"

        async with listening(peer, aggregate, [task_id, uuid.uuid4().hex]) as next_message:
            ack = await next_message()
            assert ack["params"]["notifications"]["taskIds"] == [task_id], "an unknown id is not agreed to"
            pushed = await next_message()
            while pushed["params"]["status"] == "working":
                pushed = await next_message()
            assert pushed["method"] == "notifications/tasks" and pushed["params"]["taskId"] == task_id
            assert pushed["params"]["status"] == "input_required"
            (key,) = pushed["params"]["inputRequests"]
            assert "resultType" not in pushed["params"], "the DetailedTask itself, as tasks/get has it"
            update = {"taskId": task_id, "inputResponses": {key: {"action": "accept"}}}
            assert answer(await peer.request("tasks/update", update))["result"] == {"resultType": "complete"}
            while (pushed := await next_message())["params"]["status"] != "completed":
                assert pushed["params"]["status"] in ("working", "input_required"), pushed
            assert pushed["params"]["result"]["content"][0]["text"] == "po-9: accept"


async def test_a_call_that_waits_streams_its_progress_in_order_and_keeps_its_own_timeouts(
    http: httpx.AsyncClient, base: str
) -> None:
    """A call not answered at once goes on in its request's task: its timeouts and the order of its
    notifications hold, and the answer comes last on the stream."""
    peer = ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp"), tasks=False)
    read = await peer.request("tools/call", {"name": "paced", "arguments": {}, "_meta": {"progressToken": "t"}})
    assert read.headers["content-type"] == "text/event-stream"
    assert [m["params"]["progress"] for m in read.messages[:-1]] == [1, 2, 3]
    final = read.messages[-1]["result"]
    assert final["resultType"] == "complete" and final["content"][0]["text"] == "paced 3, one task: True"
    quiet = answer(await peer.call("paced", steps=1))["result"]
    assert quiet["content"][0]["text"] == "paced 1, one task: True", "no progress token: JSON, same answer"


async def test_an_answer_given_to_another_replica_reaches_the_waiting_task(
    http: httpx.AsyncClient, redis_url: str, tmp_path: Path
) -> None:
    """Two servers on one Redis: the task waits on A, its tasks/update reaches B, A's tool goes on with it."""
    prefix, keys = f"input-{uuid.uuid4().hex}", tmp_path / "dev-keys.json"
    canonical = f"http://127.0.0.1:{free_port()}/mcp"

    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", dev_clients=CLIENTS, dev_keys=str(keys), public_url=canonical)
        return create_app(config, tools(), store=RedisStore(redis_url, prefix=prefix))

    with lossless_server(make) as a, lossless_server(make) as b:
        token = await dev_token(http, a, canonical)
        on_a, on_b = with_elicitation(ModernPeer(http, a, token)), with_elicitation(ModernPeer(http, b, token))
        task_id = answer(await on_a.call("approve", item="via-b"))["result"]["taskId"]
        polled = await poll_while(on_b, task_id, "working")
        assert polled["status"] == "input_required"
        (key,) = polled["inputRequests"]
        update = {"taskId": task_id, "inputResponses": {key: {"action": "accept"}}}
        assert answer(await on_b.request("tasks/update", update))["result"] == {"resultType": "complete"}
        done = await poll_while(on_b, task_id, "working", "input_required")
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "via-b: accept"
