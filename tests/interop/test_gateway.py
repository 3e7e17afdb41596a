"""Issue 14: the gateway in front of real upstreams — the official SDK server over Streamable HTTP (legacy leg
with an event store) and over stdio, FastMCP over Streamable HTTP, and ``@modelcontextprotocol/server-everything``
over stdio.

Each upstream runs as its own process; the gateway is our server under uvicorn on loopback, with the
embedded dev AS minting the clients' tokens, and its own static credential for the SDK HTTP upstream.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.client import BearerToken
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.core.errors import DELIVERY_REFUSED, EXECUTION_LOST, REQUEST_CANCELLED, UPSTREAM_FAILED
from mcp_lossless.core.protocol import RESOURCE_META_KEY, SCOPES_META_KEY
from mcp_lossless.gateway import UpstreamConfig
from tests.interop.peers.fastmcp_upstream import build_fastmcp_app
from tests.support.gateway_deployment import Deployment, sdk_upstream, serve_gateway
from tests.support.mcp_http import Peer, StreamRead, call, dev_token, read_events
from tests.support.node import everything_server, node_binary
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

pytestmark = pytest.mark.anyio

UPSTREAM_TOKEN = "gateway-own-upstream-credential"
TOKEN_ENV = "MCP_LOSSLESS_TEST_UPSTREAM_TOKEN"
MODERN_VERSION_META = "io.modelcontextprotocol/protocolVersion"
SDK_STDIO = [sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    fast_sock = loopback_socket()
    fast_url = f"{base_url(fast_sock)}/mcp"
    with sdk_upstream(tmp_path_factory.mktemp("sdk"), UPSTREAM_TOKEN, TOKEN_ENV) as (sdk, auth):
        upstreams = [
            # The SDK's legacy leg (its event store, resumable streams, notifications/cancelled), by configuration.
            UpstreamConfig(name="sdk", url=sdk.url, auth=auth, deny=frozenset({"hang"}), timeout=60, era="legacy"),
            # The same server negotiated (modern first): its 2026-07-28 leg.
            UpstreamConfig(name="modern", url=sdk.url, auth=auth, deny=frozenset({"hang"}), timeout=30, sessions=1),
            # A server that predates 2026-07-28 (the SDK's legacy leg alone): the negotiation falls back.
            UpstreamConfig(
                name="old", url=sdk.legacy_url, auth=auth, allow=frozenset({"work"}), timeout=30, sessions=1
            ),
            UpstreamConfig(
                name="guarded",
                url=sdk.url,
                auth=auth,
                allow=frozenset({"work", "lookup"}),
                scopes={"*": ("docs:read",), "work": ("docs:write",)},
                sessions=1,
            ),
            UpstreamConfig(name="stuck", url=sdk.url, auth=auth, allow=frozenset({"hang"}), timeout=1.5, era="legacy"),
            UpstreamConfig(name="pysdk", command=(*SDK_STDIO,), deny=frozenset({"hang"}), timeout=30),
            UpstreamConfig(name="fast", url=fast_url, timeout=8),
            UpstreamConfig(
                name="everything",
                command=(str(node_binary()), str(everything_server()), "stdio"),
                prefix="ev_",
                allow=frozenset({"echo", "trigger-long-running-operation"}),
                timeout=30,
            ),
        ]
        with (
            serve_app(build_fastmcp_app(), sock=fast_sock, lifespan="on"),
            serve_gateway(upstreams, sdk, retry_ms=200) as d,
        ):
            yield d


async def session(http: httpx.AsyncClient, d: Deployment, *exposed: str) -> Peer:
    resources = [d.resource(name) for name in exposed] or [d.mcp]
    peer = Peer(http, d.url, await dev_token(http, d.url, *resources))
    await peer.initialize()
    return peer


async def eventually(probe: Callable[[], Any]) -> Any:
    """``probe()`` (or its awaited value) once it is truthy: for what another process does after an answer,
    which sends no event this test could await (the upstream's log of what it received; a refreshed list)."""
    with anyio.fail_after(5):
        for _ in itertools.count():
            value = probe()
            value = await value if inspect.isawaitable(value) else value
            if value:
                return value
            await anyio.sleep(0.02)
    raise AssertionError("unreachable")


def answer(read: StreamRead, request_id: int) -> dict[str, object]:
    matches = [m for m in read.messages if m.get("id") == request_id and ("result" in m or "error" in m)]
    assert len(matches) == 1, read.messages
    return matches[0]


def progress_of(read: StreamRead, token: str) -> list[float]:
    return [
        m["params"]["progress"]
        for m in read.messages
        if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token
    ]


async def test_sdk_http_upstream_initialize_list_and_call_with_progress(deployment: Deployment, http) -> None:
    d = deployment
    peer = await session(http, d)
    listed = await peer.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    tools = {t["name"]: t for t in answer(listed, 1)["result"]["tools"]}  # type: ignore[index]
    assert {"sdk_work", "sdk_lookup", "sdk_grow", "stuck_hang", "ev_echo", "pysdk_work", "fast_tally"} <= set(tools)
    assert "sdk_hang" not in tools and "stuck_work" not in tools, "allow and deny lists apply"
    assert "ev_get-sum" not in tools
    for name, tool in tools.items():
        assert tool["_meta"][RESOURCE_META_KEY] == d.resource(name), name
    assert tools["sdk_work"]["inputSchema"]["properties"]["label"]["type"] == "string", "the upstream's own schema"
    assert tools["sdk_lookup"]["annotations"]["idempotentHint"] is True

    token = await dev_token(http, d.url, d.resource("sdk_work"))
    before = len(d.sdk.authorizations())
    done = await peer.post(call(2, "sdk_work", progress="p", label="a", steps=3, delay_ms=20), token=token)
    assert done.status == 200
    assert answer(done, 2)["result"]["content"][0]["text"] == "work a done"  # type: ignore[index]
    assert progress_of(done, "p") == [1, 2, 3]
    logs = [m["params"] for m in done.messages if m.get("method") == "notifications/message"]
    assert [(entry["level"], entry["data"]) for entry in logs] == [("info", "work a started")], "upstream logs pass on"
    seen = d.sdk.authorizations()[before:]
    assert seen, "the call reached the upstream"
    assert set(seen) == {f"Bearer {UPSTREAM_TOKEN}"}, "the upstream only ever sees the gateway's own credential"
    assert all(token not in (value or "") and (peer.token or "") not in (value or "") for value in seen)


async def test_stdio_and_fastmcp_upstreams_list_and_call_with_progress(deployment: Deployment, http) -> None:
    d = deployment
    peer = await session(http, d)
    echoed = await peer.post(call(1, "ev_echo", message="hello"))
    assert answer(echoed, 1)["result"]["content"][0]["text"] == "Echo: hello"  # type: ignore[index]
    slow = await peer.post(call(2, "ev_trigger-long-running-operation", progress="t", duration=0.3, steps=3))
    assert progress_of(slow, "t") == [1, 2, 3]
    assert "completed" in answer(slow, 2)["result"]["content"][0]["text"]  # type: ignore[index]
    tallied = await peer.post(call(4, "fast_tally", progress="f", numbers=[1, 2, 3]))
    assert progress_of(tallied, "f") == [1, 2, 3]
    assert answer(tallied, 4)["result"]["structuredContent"] == {"result": 6}  # type: ignore[index]
    worked = await peer.post(call(3, "pysdk_work", progress="w", label="s", steps=2, delay_ms=10))
    assert progress_of(worked, "w") == [1, 2]
    assert answer(worked, 3)["result"]["content"][0]["text"] == "work s done"  # type: ignore[index]


async def test_seed_scenario_narrowed_resume_refused_then_covering_resume_completes_once(
    deployment: Deployment, http
) -> None:
    d = deployment
    peer = await session(http, d, "sdk_work", "sdk_lookup")
    # 600 ms a step: the call still runs when the narrowed resume arrives, on a loaded box too (at 150 ms it
    # could end first, and the resume was then refused before commit: a correct answer this test does not check)
    first = await peer.post(call(5, "sdk_work", progress="p", label="slow", steps=4, delay_ms=600), stop_after=2)
    assert first.status == 200 and len(first.ids) == 2  # priming + progress 1, then the connection is dropped
    cursor = first.ids[-1]

    narrowed = await dev_token(http, d.url, d.resource("sdk_lookup"))
    refused = await peer.resume(cursor, token=narrowed)
    # The tool is still running, so the resume is committed (200) and refused in band at its next event.
    assert refused.status == 200 and refused.ids == [], "no event of the call delivered, no id to advance past"
    assert not progress_of(refused, "p") and not any("done" in e.data for e in refused.events)
    error = answer(refused, 5)["error"]
    assert error["code"] == DELIVERY_REFUSED  # type: ignore[index]
    data = error["data"]  # type: ignore[index]
    assert data["requiredResources"] == [d.resource("sdk_work")], "names the gateway's resource for the called tool"
    assert data["resumable"] is True and data["lastEventId"] == cursor

    covering = await dev_token(http, d.url, d.resource("sdk_work"))
    rest = await peer.resume(cursor, token=covering)
    assert rest.status == 200
    ids = first.ids + rest.ids
    assert len(ids) == len(set(ids)), "no event twice"
    assert progress_of(first, "p") + progress_of(rest, "p") == [1, 2, 3, 4]
    assert answer(rest, 5)["result"]["content"][0]["text"] == "work slow done"  # type: ignore[index]


async def test_an_upstream_stream_that_breaks_is_resumed_upstream_with_its_own_last_event_id(
    deployment: Deployment, http
) -> None:
    d = deployment
    peer = await session(http, d)
    before = len(d.sdk.resumes())
    done = await peer.post(call(1, "sdk_polled", progress="p", label="r", steps=3))
    assert answer(done, 1)["result"]["content"][0]["text"] == "polled r done"  # type: ignore[index]
    assert progress_of(done, "p") == [1, 2, 3], "nothing lost across the upstream's broken stream"
    assert len(d.sdk.resumes()) > before, "the gateway resumed the upstream stream (GET + Last-Event-ID)"


async def test_a_clients_cancel_becomes_an_upstream_cancel(deployment: Deployment, http) -> None:
    d = deployment
    peer = await session(http, d)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9, "reason": "enough"}}

    async def cancel_at_first_progress(read: StreamRead) -> None:
        note = await http.post(peer.url, content=orjson.dumps(cancel), headers=peer.headers())
        assert note.status_code == 202

    with anyio.fail_after(10):
        read = await read_with(
            peer, call(9, "sdk_work", progress="c", label="cancelled", steps=50), cancel_at_first_progress
        )
    error = answer(read, 9)["error"]
    assert error["code"] == REQUEST_CANCELLED  # type: ignore[index]
    cancels = await eventually(lambda: [m for m in d.sdk.messages() if m["method"] == "notifications/cancelled"])
    calls = [
        m for m in d.sdk.messages() if m["method"] == "tools/call" and m["params"]["arguments"]["label"] == "cancelled"
    ]
    assert len(calls) == 1 and cancels[-1]["params"]["requestId"] == calls[0]["params"]["_meta"]["progressToken"]


async def test_hung_upstream_ends_the_call_with_the_deadline_error(deployment: Deployment, http) -> None:
    peer = await session(http, deployment)
    with anyio.fail_after(6):
        read = await peer.post(call(1, "stuck_hang"))
    error = answer(read, 1)["error"]
    assert error["code"] == UPSTREAM_FAILED  # type: ignore[index]
    assert error["data"] == {"reason": "deadline", "upstream": "stuck", "mayHaveRun": True}  # type: ignore[index]


async def test_stdio_list_changed_refreshes_the_exposed_list(deployment: Deployment, http) -> None:
    peer = await session(http, deployment)
    grown = await peer.post(call(1, "pysdk_grow", name="sprout"))
    assert answer(grown, 1)["result"]["content"][0]["text"] == "added sprout"  # type: ignore[index]

    async def listed() -> dict[str, dict[str, Any]]:
        read = await peer.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = {t["name"]: t for t in answer(read, 2)["result"]["tools"]}  # type: ignore[index]
        return tools if "pysdk_sprout" in tools else {}

    tools = await eventually(listed)
    assert tools["pysdk_sprout"]["_meta"][RESOURCE_META_KEY] == deployment.resource("pysdk_sprout")
    sprout = await peer.post(
        call(3, "pysdk_sprout"), token=await dev_token(http, deployment.url, deployment.resource("pysdk_sprout"))
    )
    assert answer(sprout, 3)["result"]["content"][0]["text"] == "sprout grown"  # type: ignore[index]


async def test_upstream_eras_are_negotiated_modern_first_with_legacy_fallback(deployment: Deployment, http) -> None:
    d = deployment
    assert d.gateway.upstreams["modern"].era == "modern", "the SDK's 2026-07-28 leg, found by server/discover"
    assert d.gateway.upstreams["old"].era == "legacy", "a server that predates 2026-07-28: the handshake instead"
    assert d.gateway.upstreams["sdk"].era == "legacy", "configured"
    assert d.gateway.upstreams["pysdk"].era == "modern", "the SDK's stdio server: server/discover over the pipe"
    assert d.gateway.upstreams["everything"].era == "legacy", "server-everything refuses the probe: initialize"
    metrics = (await http.get(f"{d.url}/metrics")).text
    for upstream, era in (("modern", "modern"), ("old", "legacy"), ("pysdk", "modern"), ("everything", "legacy")):
        other = "legacy" if era == "modern" else "modern"
        assert f'mcp_lossless_gateway_upstream_era{{era="{era}",upstream="{upstream}"}} 1.0' in metrics, upstream
        assert f'mcp_lossless_gateway_upstream_era{{era="{other}",upstream="{upstream}"}} 0.0' in metrics, upstream
    peer = await session(http, d)
    listed = await peer.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    tools = {t["name"]: t for t in answer(listed, 1)["result"]["tools"]}  # type: ignore[index]
    assert {"modern_work", "modern_lookup", "modern_grow", "old_work"} <= set(tools)
    assert "modern_hang" not in tools and "old_lookup" not in tools
    for name in ("modern_work", "modern_lookup", "old_work"):
        assert tools[name]["_meta"][RESOURCE_META_KEY] == d.resource(name)
    assert tools["modern_work"]["inputSchema"]["properties"]["label"]["type"] == "string"

    done = await peer.post(call(2, "modern_work", progress="m", label="m", steps=3, delay_ms=20))
    assert answer(done, 2)["result"]["content"][0]["text"] == "work m done"  # type: ignore[index]
    assert progress_of(done, "m") == [1, 2, 3], "the modern upstream's progress, on the client's stream"
    logs = [m["params"] for m in done.messages if m.get("method") == "notifications/message"]
    assert [(entry["level"], entry["data"]) for entry in logs] == [("info", "work m started")], "and its log"
    old = await peer.post(call(3, "old_work", progress="o", label="o", steps=2, delay_ms=10))
    assert answer(old, 3)["result"]["content"][0]["text"] == "work o done"  # type: ignore[index]
    assert progress_of(old, "o") == [1, 2]

    def upstream_call(label: str) -> dict[str, Any]:
        calls = [
            m
            for m in d.sdk.messages()
            if m["method"] == "tools/call" and m["params"]["arguments"].get("label") == label
        ]
        assert len(calls) == 1, calls
        return calls[0]["params"]

    assert upstream_call("m")["_meta"][MODERN_VERSION_META] == "2026-07-28", "sent as a 2026-07-28 request"
    assert MODERN_VERSION_META not in upstream_call("o").get("_meta", {}), "sent on a legacy session"
    methods = [m["method"] for m in d.sdk.messages()]
    assert "server/discover" in methods and "initialize" in methods


async def test_the_gateways_own_modern_leg_lists_and_calls_with_tasks_and_progress(
    deployment: Deployment, http
) -> None:
    d = deployment
    tasks: list[tuple[str, str]] = []
    token = await dev_token(http, d.url, d.mcp)
    async with ModernClient(
        d.mcp, auth=BearerToken(token), http=http, on_task=lambda task_id, name: tasks.append((task_id, name))
    ) as client:
        await client.discover()
        tools = {t.name: t for t in await client.list_tools()}
        assert tools["modern_work"].resource == d.resource("modern_work")
        assert tools["sdk_lookup"].resource == d.resource("sdk_lookup")
        seen: list[float] = []
        looked = await client.call_tool(
            "sdk_lookup", {"key": "z", "steps": 3, "delay_ms": 10}, on_progress=lambda u: seen.append(u.progress)
        )
        assert looked.text == "value of z" and seen == [1, 2, 3], "idempotent: within the request, with progress"
        assert tasks == []
        worked = await client.call_tool("modern_work", {"label": "t", "steps": 2, "delay_ms": 10})
        assert worked.text == "work t done"
        assert [name for _, name in tasks] == ["modern_work"], "not idempotent: it ran as a task, polled to its end"


async def test_http_upstream_list_changed_refreshes_and_the_gateway_tells_its_clients_on_both_eras(
    deployment: Deployment, http
) -> None:
    d = deployment
    peer = await session(http, d)
    token = await dev_token(http, d.url, d.mcp)
    legacy_open, legacy_told = anyio.Event(), anyio.Event()
    modern_open, modern_told = anyio.Event(), anyio.Event()

    async def legacy_listener() -> None:
        headers = peer.headers(accept="text/event-stream")
        headers.pop("content-type")
        async with http.stream("GET", peer.url, headers=headers, timeout=30) as response:
            assert response.status_code == 200
            legacy_open.set()
            buffer = ""
            async for chunk in response.aiter_text():
                buffer += chunk
                if "notifications/tools/list_changed" in buffer:
                    legacy_told.set()
                    return

    def on_modern(note: dict[str, Any]) -> None:
        if note["method"] == "notifications/tools/list_changed":
            modern_told.set()

    async with ModernClient(d.mcp, auth=BearerToken(token), http=http) as client, anyio.create_task_group() as tg:
        tg.start_soon(legacy_listener)
        tg.start_soon(client.listen, {"toolsListChanged": True}, on_modern, modern_open.set)
        with anyio.fail_after(10):
            await legacy_open.wait()
            await modern_open.wait()
        grown = await peer.post(call(1, "sdk_grow", name="leaf"))
        assert answer(grown, 1)["result"]["content"][0]["text"] == "added leaf"  # type: ignore[index]
        with anyio.fail_after(10):
            await legacy_told.wait()
            await modern_told.wait()
        tg.cancel_scope.cancel()

    async def listed() -> dict[str, dict[str, Any]]:
        read = await peer.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = {t["name"]: t for t in answer(read, 2)["result"]["tools"]}  # type: ignore[index]
        return tools if {"sdk_leaf", "modern_leaf"} <= set(tools) else {}

    tools = await eventually(listed)  # the legacy session's GET stream and the modern listen stream, each
    for name in ("sdk_leaf", "modern_leaf"):
        assert tools[name]["_meta"][RESOURCE_META_KEY] == d.resource(name)
        leaf = await peer.post(call(3, name), token=await dev_token(http, d.url, d.resource(name)))
        assert answer(leaf, 3)["result"]["content"][0]["text"] == "leaf grown"  # type: ignore[index]


async def scoped_token(http: httpx.AsyncClient, d: Deployment, scope: str) -> str:
    """A real signed JWT of the gateway's dev AS for the whole gateway, holding ``scope``."""
    form = [("grant_type", "client_credentials"), ("resource", d.mcp)] + ([("scope", scope)] if scope else [])
    response = await http.post(
        f"{d.url}/dev-as/token",
        content=urlencode(form),
        headers={"content-type": "application/x-www-form-urlencoded"},
        auth=("dev-client", "dev-secret"),
    )
    assert response.status_code == 200, response.text
    value: str = response.json()["access_token"]
    return value


async def test_config_scopes_per_exposed_tool_are_required_of_the_token(deployment: Deployment, http) -> None:
    d = deployment
    reader = await scoped_token(http, d, "docs:read")
    peer = Peer(http, d.url, reader)
    await peer.initialize()
    listed = await peer.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    tools = {t["name"]: t for t in answer(listed, 1)["result"]["tools"]}  # type: ignore[index]
    assert tools["guarded_lookup"]["_meta"][SCOPES_META_KEY] == ["docs:read"]
    assert tools["guarded_work"]["_meta"][SCOPES_META_KEY] == ["docs:read", "docs:write"]
    assert SCOPES_META_KEY not in tools["sdk_work"]["_meta"]

    looked = await peer.post(call(2, "guarded_lookup", key="g", steps=0))
    assert answer(looked, 2)["result"]["content"][0]["text"] == "value of g"  # type: ignore[index]
    before = len(d.sdk.messages())
    refused = await peer.post(call(3, "guarded_work", label="g", steps=0))
    assert refused.status == 403
    error = refused.json()["error"]
    envelope = error["data"].pop("authorization")  # SEP-2643's, beside our own fields (ADR 0031)
    assert error["data"].pop("_meta") == {"io.modelcontextprotocol/authorization": envelope}
    assert envelope["reason"] == "insufficient_authorization"
    assert error["data"] == {"requiredResources": [], "requiredScopes": ["docs:write"]}
    assert error["message"] == "token lacks scope docs:write"
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="docs:read docs:write"' in challenge

    bare = await scoped_token(http, d, "")
    unscoped = await peer.post(call(4, "guarded_lookup", key="h", steps=0), token=bare)
    assert unscoped.status == 403 and unscoped.json()["error"]["data"]["requiredScopes"] == ["docs:read"]
    assert not any(
        m["method"] == "tools/call" and m["params"]["arguments"].get("label") == "g" for m in d.sdk.messages()[before:]
    ), "a refused call never reaches the upstream"

    writer = await scoped_token(http, d, "docs:read docs:write")
    worked = await peer.post(call(5, "guarded_work", label="w", steps=0), token=writer)
    assert answer(worked, 5)["result"]["content"][0]["text"] == "work w done"  # type: ignore[index]
    prm = (await http.get(f"{d.url}/.well-known/oauth-protected-resource/mcp/tools/guarded_work")).json()
    assert prm["scopes_supported"] == ["docs:read", "docs:write"]


async def test_stdio_child_killed_mid_call(deployment: Deployment, http) -> None:
    d = deployment
    peer = await session(http, d)
    pysdk = d.gateway.upstreams["pysdk"]
    everything = d.gateway.upstreams["everything"]

    # a non-idempotent call: explicit execution lost, within the deadline, never a clean end or a hang
    lost = await call_and_kill(peer, call(1, "pysdk_work", progress="w", label="k", steps=20, delay_ms=100), pysdk.pid)
    error = answer(lost, 1)["error"]
    assert error["code"] == EXECUTION_LOST and error["data"]["upstream"] == "pysdk"  # type: ignore[index]

    # an idempotent call: re-issued on the restarted child under a new id, and it succeeds
    restarts = pysdk.restarts
    again = await call_and_kill(
        peer, call(2, "ev_trigger-long-running-operation", progress="t", duration=2, steps=10), everything.pid
    )
    assert "completed" in answer(again, 2)["result"]["content"][0]["text"]  # type: ignore[index]
    assert everything.restarts >= 1 and pysdk.restarts >= restarts


async def until_upstream_up(http: httpx.AsyncClient, d: Deployment, name: str) -> None:
    """Until the gateway's ``upstream_up`` gauge says ``name`` answers again: a poll of what the gateway saw of
    another process (its breaker's probe), bounded."""
    pattern = re.compile(rf'^mcp_lossless_gateway_upstream_up\{{upstream="{name}"\}} 1(\.0)?$', re.M)
    with anyio.fail_after(30):
        for _ in itertools.count():  # another process's state: there is no event to await
            if pattern.search((await http.get(f"{d.url}/metrics")).text):
                return
            await anyio.sleep(0.05)


async def read_with(
    peer: Peer, payload: dict[str, object], at_first_progress: Callable[[StreamRead], Awaitable[None]]
) -> StreamRead:
    """POST ``payload`` and read its stream to the end; ``at_first_progress`` runs beside it at the first progress."""
    read = StreamRead(0)
    fired = False
    async with (
        anyio.create_task_group() as tg,
        peer.http.stream("POST", peer.url, headers=peer.headers(), content=orjson.dumps(payload)) as response,
    ):
        read.status = response.status_code

        def fire_at_first_progress(read: StreamRead) -> None:
            nonlocal fired
            if not fired and any(m.get("method") == "notifications/progress" for m in read.messages):
                fired = True
                tg.start_soon(at_first_progress, read)

        await read_events(response, read, fire_at_first_progress)
    assert fired, "the call reported progress before it ended"
    return read


async def call_and_kill(
    peer: Peer,
    payload: dict[str, object],
    pid: int | None,
    *,
    then: Callable[[], None] | None = None,
    deadline: float = 20,
) -> StreamRead:
    """POST ``payload``; SIGKILL ``pid`` at the call's first progress event (then run ``then`` in a thread, e.g. a
    restart, while the call goes on); the stream must end within ``deadline``."""
    assert pid is not None

    async def kill(_: StreamRead) -> None:
        os.kill(pid, signal.SIGKILL)
        if then is not None:
            await anyio.to_thread.run_sync(then)

    with anyio.fail_after(deadline):
        return await read_with(peer, payload, kill)


async def test_sdk_http_upstream_sigkilled_mid_call(deployment: Deployment, http) -> None:
    d = deployment
    peer = await session(http, d)
    assert d.sdk.proc is not None
    work = call(1, "sdk_work", progress="w", label="k", steps=50, delay_ms=100)
    lost = await call_and_kill(peer, work, d.sdk.proc.pid, deadline=30)
    error = answer(lost, 1)["error"]
    assert error["code"] == EXECUTION_LOST, error  # type: ignore[index]
    assert error["data"] == {"reason": "execution_lost", "requestId": 1, "resumable": False, "upstream": "sdk"}  # type: ignore[index]

    d.sdk.restart_after_death()
    await until_upstream_up(http, d, "sdk")  # the breaker's probe saw it back (a call sooner fails at once, by design)
    lookup = call(2, "sdk_lookup", progress="l", key="k", steps=10, delay_ms=100)
    again = await call_and_kill(peer, lookup, d.sdk.proc.pid, then=d.sdk.restart_after_death, deadline=70)
    assert answer(again, 2)["result"]["content"][0]["text"] == "value of k", "re-issued upstream once it was back"  # type: ignore[index]
    assert set(d.sdk.authorizations()) == {f"Bearer {UPSTREAM_TOKEN}"}
