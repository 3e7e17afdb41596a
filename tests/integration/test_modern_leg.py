"""The 2026-07-28 leg over real HTTP with real signed JWTs: validation, stateless calls, tasks, and the task
layer's authorization (issue 13 acceptance 1, 2 and 4; 3 is the SIGKILL test in test_modern_restart.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.core.errors import (
    DELIVERY_REFUSED,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    TASK_DENIED,
    TOOL_FORBIDDEN,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from tests.integration.conftest import CLIENTS
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.modern_http import MODERN, ModernPeer, answer, meta, poll_until_settled
from tests.support.stores import KINDS, store_of_kind
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

TTL = 1.0
"""The servers' task TTL in these tests: short, so that "longer than the TTL" takes a second."""
CANCELLED = threading.Event()
"""Set by the ``hold`` tool when it is cancelled (the server runs in another thread)."""


def tools_with_hold() -> Any:
    registry = demo_tools()

    @registry.tool()
    async def hold(ctx: ToolContext, seconds: float = 5.0) -> str:
        """Report progress once, then wait; tells the test if it was cancelled."""
        await ctx.report_progress(0, 1, "holding")
        try:
            await anyio.sleep(seconds)
        except BaseException:
            CANCELLED.set()
            raise
        return "held"

    @registry.tool()
    async def close_early(ctx: ToolContext) -> str:
        """Closes its stream (SEP-1699) before it answers."""
        ctx.close_stream()
        return "answered after the close"

    @registry.tool(task=True)
    async def close_early_task(ctx: ToolContext) -> str:
        """Closes its stream (SEP-1699) before it answers; a task."""
        ctx.close_stream()
        return "answered after the close"

    return registry


def serve(store: EventStore) -> Iterator[str]:
    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", dev_clients=CLIENTS, retry_ms=200)
        app = create_app(config, tools_with_hold(), store=store)
        assert app.modern is not None
        app.modern.tasks.ttl = TTL
        return app

    with lossless_server(make) as url:
        yield url


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    yield from serve(MemoryStore())


@pytest.fixture(params=KINDS)
def any_store_base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from serve(store_of_kind(request, tmp_path, "modern"))


async def tokens(http: httpx.AsyncClient, base: str) -> tuple[str, str]:
    mcp = f"{base}/mcp"
    return await dev_token(http, base, mcp), await dev_token(http, base, f"{mcp}/tools/search")


def error_of(read: Any) -> dict[str, Any]:
    error: dict[str, Any] = answer(read)["error"]
    return error


# -- the modern wire --------------------------------------------------------------------------------


async def test_discover_names_both_eras_and_the_tasks_extension(http: httpx.AsyncClient, base: str) -> None:
    peer = ModernPeer(http, base, (await tokens(http, base))[0])
    read = await peer.request("server/discover")
    assert read.status == 200 and "mcp-session-id" not in read.headers, "no session is minted"
    result = answer(read)["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"] == [MODERN, "2025-11-25", "2025-06-18", "2025-03-26"]
    assert result["capabilities"]["extensions"] == {
        "io.modelcontextprotocol/tasks": {},
        "io.modelcontextprotocol/structured-authorization-denials": {},
        "io.modelcontextprotocol/task-event-streams": {},
    }
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-lossless"
    assert (result["ttlMs"], result["cacheScope"]) == (0, "private"), "what a principal sees depends on its token"
    listed = answer(await peer.request("tools/list"))["result"]
    assert listed["resultType"] == "complete" and {t["name"] for t in listed["tools"]} >= {"fetch", "search"}
    assert (listed["ttlMs"], listed["cacheScope"]) == (0, "private")


async def test_every_malformed_modern_request_gets_its_code(http: httpx.AsyncClient, base: str) -> None:
    peer = ModernPeer(http, base, (await tokens(http, base))[0])
    ping = peer.message("tools/list")

    bare = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    missing = await peer.send(bare)
    assert missing.status == 400 and error_of(missing)["code"] == INVALID_PARAMS, "_meta is required"
    no_caps = {**bare, "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}}
    assert error_of(await peer.send(no_caps))["code"] == INVALID_PARAMS

    for headers in ({"mcp-protocol-version": None}, {"mcp-protocol-version": "2025-11-25"}, {"mcp-method": None}):
        read = await peer.send(ping, headers=headers)
        assert read.status == 400 and error_of(read)["code"] == HEADER_MISMATCH, headers
    assert error_of(await peer.send(ping, headers={"mcp-method": "server/discover"}))["code"] == HEADER_MISMATCH

    search = peer.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 0}})
    for name in (None, "fetch", "=?base64?not base64!?="):
        read = await peer.send(search, headers={"mcp-name": name})
        assert read.status == 400 and error_of(read)["code"] == HEADER_MISMATCH, name
    encoded = await peer.send(search, headers={"mcp-name": "=?base64?c2VhcmNo?="})
    assert encoded.status == 200 and answer(encoded)["result"]["resultType"] == "complete"

    future = {**ping, "params": {"_meta": meta(version="2099-01-01")}}
    read = await peer.send(future, headers={"mcp-protocol-version": "2099-01-01"})
    assert read.status == 400 and error_of(read)["code"] == UNSUPPORTED_PROTOCOL_VERSION
    assert error_of(read)["data"] == {
        "supported": [MODERN, "2025-11-25", "2025-06-18", "2025-03-26"],
        "requested": "2099-01-01",
    }

    removed = ("initialize", "ping", "logging/setLevel", "resources/subscribe", "tasks/result", "tasks/list")
    for method in (*removed, "resources/list", "initialized"):
        read = await peer.request(method, {"taskId": "x"} if method.startswith("tasks/") else {})
        assert read.status == 404 and error_of(read)["code"] == METHOD_NOT_FOUND, method

    plain = ModernPeer(http, base, peer.token, tasks=False)
    read = await plain.task("tasks/get", "anything")
    assert read.status == 400 and error_of(read)["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert error_of(read)["data"] == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


async def test_a_stateless_call_answers_in_its_response(http: httpx.AsyncClient, base: str) -> None:
    aggregate, narrowed = await tokens(http, base)
    peer = ModernPeer(http, base, aggregate, tasks=False)
    read = await peer.call("fetch", url="https://example.com/a", steps=1, delay_ms=0)
    result = answer(read)["result"]
    assert result["resultType"] == "complete", "a task tool runs within the request for a client without the extension"
    assert result["content"][0]["text"] == "contents of https://example.com/a: 21 bytes"
    progress = await peer.request(
        "tools/call",
        {"name": "search", "arguments": {"query": "q", "steps": 2, "delay_ms": 0}, "_meta": {"progressToken": "p"}},
    )
    assert progress.headers["content-type"] == "text/event-stream" and progress.ids == [], "nothing to resume"
    assert [m["params"]["progress"] for m in progress.messages[:-1]] == [1, 2]
    assert progress.messages[-1]["result"]["resultType"] == "complete"

    refused = await peer.call("fetch", token=narrowed, url="https://example.com/a")
    assert refused.status == 403 and error_of(refused)["code"] == TOOL_FORBIDDEN
    assert f'resource="{base}/mcp/tools/fetch"' in refused.headers["www-authenticate"]


async def test_a_disconnect_cancels_a_modern_request(http: httpx.AsyncClient, base: str) -> None:
    CANCELLED.clear()
    peer = ModernPeer(http, base, (await tokens(http, base))[0])
    message = peer.message("tools/call", {"name": "hold", "arguments": {"seconds": 30}, "_meta": {"progressToken": 1}})
    async with http.stream("POST", peer.url, content=orjson.dumps(message), headers=peer.headers(message)) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                break  # the tool runs: leave, closing the connection
    assert await anyio.to_thread.run_sync(CANCELLED.wait, 5), "the tool was cancelled when the client left"


# -- tasks ------------------------------------------------------------------------------------------


async def create_fetch_task(peer: ModernPeer, url: str = "https://example.com/a") -> dict[str, Any]:
    read = await peer.call("fetch", url=url, steps=1, delay_ms=0)
    assert read.status == 200, read.body
    created: dict[str, Any] = answer(read)["result"]
    assert created["resultType"] == "task" and created["status"] == "working"
    return created


async def test_a_narrowed_token_is_denied_resumably_and_the_result_outlives_the_naive_ttl(
    http: httpx.AsyncClient, any_store_base: str
) -> None:
    """Acceptance 1, on every store: denied (403, TASK_DENIED naming fetch and the task, no result byte), kept
    past createdAt + ttl while its owner re-authorizes, then delivered whole to a covering token."""
    base = any_store_base
    aggregate, narrowed = await tokens(http, base)
    peer = ModernPeer(http, base, aggregate)
    created = await create_fetch_task(peer)
    task_id = created["taskId"]
    assert created["ttlMs"] == TTL * 1000
    started = time.time()
    denials = 0
    while time.time() - started < 2 * TTL:  # time must pass here: the point is a wait longer than the TTL
        denied = await peer.task("tasks/get", task_id, token=narrowed)
        assert denied.status == 403, denied.body
        error = error_of(denied)
        assert error["code"] == TASK_DENIED and not -32768 <= error["code"] <= -32000
        envelope = error["data"].pop("authorization")
        assert error["data"] == {
            "reason": "insufficient_audience",
            "taskId": task_id,
            "requiredResources": [f"{base}/mcp/tools/fetch"],
            "requiredScopes": [],
            "resumable": True,
            "_meta": {"io.modelcontextprotocol/authorization": envelope},
        }
        assert envelope["reason"] == "insufficient_authorization", "SEP-2643's envelope on every denied poll"
        challenge = denied.headers["www-authenticate"]
        assert 'error="insufficient_scope"' in challenge and f'resource="{base}/mcp/tools/fetch"' in challenge
        assert b"contents of" not in denied.body and b"example.com/a" not in denied.body, "not a byte of the result"
        denials += 1
        await anyio.sleep(TTL / 3)
    assert denials >= 5
    settled = await poll_until_settled(peer, task_id)
    assert settled["status"] == "completed" and settled["resultType"] == "complete"
    assert settled["result"]["content"][0]["text"] == "contents of https://example.com/a: 21 bytes"
    assert time.time() > started + TTL, "past createdAt + ttl: the naive rule would have expired it"
    assert settled["ttlMs"] > TTL * 1000, "ttlMs reports the true deadline, counted from createdAt"


async def test_another_principals_poll_is_answered_like_a_random_id(http: httpx.AsyncClient, base: str) -> None:
    """Acceptance 2: same status, code and message (the whole body, with the same JSON-RPC id)."""
    aggregate, _ = await tokens(http, base)
    mallory = await dev_token(http, base, f"{base}/mcp", client=("mallory", CLIENTS["mallory"]))
    task_id = (await create_fetch_task(ModernPeer(http, base, aggregate)))["taskId"]
    stranger = ModernPeer(http, base, mallory)
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        theirs = await stranger.send(stranger.message(method, {"taskId": task_id}, request_id=7))
        random = await stranger.send(stranger.message(method, {"taskId": uuid.uuid4().hex}, request_id=7))
        assert theirs.status == random.status == 200
        assert theirs.body == random.body, "no existence oracle"
        assert error_of(theirs)["code"] == INVALID_PARAMS
        assert "www-authenticate" not in theirs.headers and "www-authenticate" not in random.headers
    owner = ModernPeer(http, base, aggregate)
    assert (await poll_until_settled(owner, task_id))["status"] == "completed", "the stranger cancelled nothing"


async def test_the_owner_cancels_a_running_task(http: httpx.AsyncClient, base: str) -> None:
    peer = ModernPeer(http, base, (await tokens(http, base))[0])
    read = await peer.call("fetch", url="https://example.com/slow", steps=100, delay_ms=100)
    task_id = answer(read)["result"]["taskId"]
    ack = await peer.task("tasks/cancel", task_id)
    assert answer(ack)["result"] == {"resultType": "complete"}
    settled = await poll_until_settled(peer, task_id)
    assert settled["status"] == "cancelled" and "result" not in settled and "error" not in settled
    assert answer(await peer.task("tasks/update", task_id))["result"] == {"resultType": "complete"}


async def test_close_stream_is_refused_in_a_request_and_needs_nothing_in_a_task(
    http: httpx.AsyncClient, base: str
) -> None:
    # it was ignored: the tool believed its connection freed while the response held it to the end of the call
    peer = ModernPeer(http, base, (await tokens(http, base))[0])
    error = error_of(await peer.call("close_early"))
    assert error["code"] == INTERNAL_ERROR and "runs as a task there (task=True)" in error["message"]
    task_id = answer(await peer.call("close_early_task"))["result"]["taskId"]
    settled = await poll_until_settled(peer, task_id)
    assert settled["status"] == "completed"
    assert settled["result"]["content"][0]["text"] == "answered after the close"


async def test_legacy_and_modern_clients_share_one_process(http: httpx.AsyncClient, base: str) -> None:
    """Acceptance 4: a legacy session (stream cut, resumed) and modern calls and tasks, concurrently."""
    aggregate, narrowed = await tokens(http, base)
    legacy = Peer(http, base, aggregate)
    await legacy.initialize()
    modern = ModernPeer(http, base, aggregate)
    outcomes: dict[str, Any] = {}

    async def legacy_call() -> None:
        started = await legacy.post(
            call(3, "fetch", progress="p", url="https://example.com/l", steps=6, delay_ms=50), stop_after=2
        )
        refused = await legacy.resume(started.ids[-1], token=narrowed)
        if refused.status != 403:  # the call still runs: refused in band at its first event, without an id
            assert refused.messages[-1]["error"]["code"] == DELIVERY_REFUSED and refused.ids == []
        assert not any("result" in m for m in refused.messages), "the legacy leg keeps per-event authorization"
        resumed = await legacy.resume(started.ids[-1])
        outcomes["legacy"] = resumed.messages[-1]

    async def modern_call() -> None:
        outcomes["modern"] = answer(await modern.call("search", query="m", steps=3, delay_ms=50))

    async def modern_task() -> None:
        outcomes["task"] = await poll_until_settled(
            modern, (await create_fetch_task(modern, "https://example.com/t"))["taskId"]
        )

    async with anyio.create_task_group() as group:
        for work in (legacy_call, modern_call, modern_task):
            group.start_soon(work)
    assert outcomes["legacy"]["id"] == 3
    assert outcomes["legacy"]["result"]["content"][0]["text"] == "contents of https://example.com/l: 21 bytes"
    assert "resultType" not in outcomes["legacy"]["result"], "the legacy leg speaks its own revision"
    assert outcomes["modern"]["result"]["content"][0]["text"] == "search results for 'm': 3 documents"
    assert outcomes["task"]["result"]["content"][0]["text"] == "contents of https://example.com/t: 21 bytes"
    legacy_ping = await legacy.post({"jsonrpc": "2.0", "id": 9, "method": "ping"})
    assert legacy_ping.messages[-1] == {"jsonrpc": "2.0", "id": 9, "result": {}}, "the session outlived it all"
