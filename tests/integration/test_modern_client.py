"""Our 2026-07-28 client against our dual-era server (real HTTP, real JWTs from the least-privilege dev AS): the
era probe, tasks polled to their result, re-authorization on a task denial, resuming a persisted task id."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as ServerToolError

from mcp_lossless.client import Client, OAuth, ToolFailed, ToolResult
from mcp_lossless.client.modern import ModernClient, open_client
from mcp_lossless.core.errors import TASK_DENIED
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.recording import RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio


@dataclass
class Served:
    url: str
    recorder: RecordingTransport
    http: httpx.AsyncClient


def config(port: int) -> ServerConfig:
    return ServerConfig(port=port, store="memory", least_privilege=True, dev_clients={"dev-client": "dev-secret"})


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    sock = loopback_socket()
    app = create_app(config(sock.getsockname()[1]))
    assert app.modern is not None
    app.modern.tasks.poll_ms = 50
    with serve_app(app, sock=sock, lifespan="on") as base:
        recorder = RecordingTransport()
        async with httpx.AsyncClient(transport=recorder, timeout=10) as http:
            yield Served(f"{base}/mcp", recorder, http)


@pytest.fixture
def legacy_only() -> Iterator[str]:
    """The same server with its modern leg off: what a 2025-11-25-only server answers to the probe."""
    sock = loopback_socket()
    app = create_app(config(sock.getsockname()[1]))
    app.transport.modern = None
    with serve_app(app, sock=sock, lifespan="on") as base:
        yield f"{base}/mcp"


async def test_the_probe_picks_the_modern_era_and_a_task_is_polled_to_its_result(served: Served) -> None:
    started: list[tuple[str, str]] = []
    progress: list[float] = []
    auth = OAuth("dev-client", "dev-secret")
    async with open_client(served.url, auth=auth, http=served.http, on_task=lambda *t: started.append(t)) as client:
        assert isinstance(client, ModernClient)
        found = await client.call_tool(
            "search", {"query": "q", "steps": 2, "delay_ms": 0}, on_progress=lambda u: progress.append(u.progress)
        )
        assert found.text == "search results for 'q': 3 documents" and progress == [1, 2]
        fetched = await client.call_tool("fetch", {"url": "https://example.com/a", "steps": 3, "delay_ms": 30})
    assert fetched.text == "contents of https://example.com/a: 21 bytes"
    assert [name for _, name in started] == ["fetch"], "search ran within its request, fetch as a task"
    sent = [e.sent_json() for e in served.recorder.to("/mcp")]
    assert sent[0]["method"] == "server/discover" and all(m["method"] != "initialize" for m in sent)
    assert all(e.headers.get("mcp-session-id") is None for e in served.recorder.to("/mcp")), "stateless throughout"


async def test_a_task_denial_is_repaired_with_a_fresh_grant_and_the_same_task_id(served: Served) -> None:
    url = served.url
    auth = OAuth("dev-client", "dev-secret")
    created = anyio.Event()
    outcome: list[ToolResult] = []
    async with ModernClient(url, auth=auth, http=served.http, on_task=lambda *_: created.set()) as client:
        await client.list_tools()
        async with anyio.create_task_group() as group:

            async def run() -> None:
                outcome.append(
                    await client.call_tool("fetch", {"url": "https://example.com/n", "steps": 4, "delay_ms": 100})
                )

            group.start_soon(run)
            await created.wait()
            await auth.narrow([f"{url}/tools/search"])  # a real refresh answered with aud = search only
    assert outcome[0].text == "contents of https://example.com/n: 21 bytes"
    polls = [e for e in served.recorder.to("/mcp") if (e.sent_json() or {}).get("method") == "tasks/get"]
    denied = [e for e in polls if e.status == 403]
    assert denied, "a poll under the narrowed token was denied"
    assert denied[0].received_json()["error"]["code"] == TASK_DENIED
    assert all(b"contents of" not in e.received for e in denied), "nothing of the result under the narrowed token"
    after = polls[polls.index(denied[-1]) + 1 :]
    task_id = denied[0].sent_json()["params"]["taskId"]
    assert after and all(e.sent_json()["params"]["taskId"] == task_id for e in after), "the same task, polled on"
    assert f"{url}/tools/fetch" in after[-1].audience, "under a fresh grant covering fetch"


async def test_a_restarted_client_resumes_polling_a_persisted_task(served: Served) -> None:
    persisted: dict[str, str] = {}
    auth = OAuth("dev-client", "dev-secret")
    async with ModernClient(
        served.url, auth=auth, http=served.http, on_task=lambda t, n: persisted.update({n: t})
    ) as first:
        with anyio.move_on_after(0.3):  # the process "dies" while it polls
            await first.call_tool("fetch", {"url": "https://example.com/p", "steps": 5, "delay_ms": 100})
    assert "fetch" in persisted
    async with ModernClient(served.url, auth=OAuth("dev-client", "dev-secret"), http=served.http) as second:
        result = await second.resume_task("fetch", persisted["fetch"])
    assert result.text == "contents of https://example.com/p: 21 bytes"


async def test_a_legacy_server_gets_the_session_client_and_the_verdict_is_cached(legacy_only: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        async with open_client(legacy_only, auth=OAuth("dev-client", "dev-secret"), http=http) as client:
            assert isinstance(client, Client)
            result = await client.call_tool("fetch", {"url": "https://example.com/l", "steps": 1, "delay_ms": 0})
            assert result.text == "contents of https://example.com/l: 21 bytes"
            assert client.server.session_id is not None
        recorder = RecordingTransport()
        async with (
            httpx.AsyncClient(transport=recorder, timeout=10) as again,
            open_client(legacy_only, auth=OAuth("dev-client", "dev-secret"), http=again) as client,
        ):
            assert isinstance(client, Client)
        assert all((e.sent_json() or {}).get("method") != "server/discover" for e in recorder.to("/mcp")), "cached"


async def test_our_client_speaks_2026_07_28_with_the_python_sdk_server() -> None:
    """The official ``mcp`` 2.3 server is dual-era: the probe lands on its modern leg, calls run there."""
    server = MCPServer("sdk-modern-peer")

    @server.tool()
    async def count(n: int, ctx: Context) -> str:
        """Count to n, reporting each step."""
        for step in range(1, n + 1):
            await ctx.report_progress(step, n)
        return f"counted to {n}"

    @server.tool()
    async def broken() -> str:
        raise ServerToolError("the tool failed on purpose")

    recorder = RecordingTransport()
    with serve_app(server.streamable_http_app()) as base:
        async with (
            httpx.AsyncClient(transport=recorder, timeout=10) as http,
            open_client(f"{base}/mcp", http=http) as client,
        ):
            assert isinstance(client, ModernClient)
            steps: list[float] = []
            result = await client.call_tool("count", {"n": 3}, on_progress=lambda u: steps.append(u.progress))
            with pytest.raises(ToolFailed, match="on purpose"):
                await client.call_tool("broken")
    assert result.text == "counted to 3"
    assert steps == [1, 2, 3], "progress on the request's own SSE stream"
    posted = [e.sent_json()["method"] for e in recorder.to("/mcp")]
    assert posted[0] == "server/discover" and "initialize" not in posted
