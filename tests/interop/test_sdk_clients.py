"""Stock SDK clients against our server: the official Python SDK (``mcp`` 2.3) and TypeScript SDK (1.32).

Each client is used as its users use it: a bearer token from our embedded dev AS, ``initialize``,
``tools/list``, ``tools/call`` with progress, and its own automatic resume (GET + Last-Event-ID) after
the server closes the stream mid-call. Then the token is swapped for a search-only one just before that
automatic resume of a ``fetch`` stream: whatever the client does, it must end with an explicit error,
within a bound, and receive nothing of ``fetch`` after the swap.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from mcp_lossless.core.errors import DELIVERY_REFUSED
from mcp_lossless.core.protocol import RESOURCE_META_KEY
from tests.interop.scripted_server import RETRY_MS, AfterClose, ScriptedServer, scripted_server
from tests.support.mcp_http import dev_token
from tests.support.node import node_binary, ts_sdk_dir

pytestmark = pytest.mark.anyio

TS_DRIVER = Path(__file__).parent / "peers" / "ts_sdk_client.mjs"
PY_ERROR_BOUND = 5.0
"""The Python SDK gives up after two refused resumes, each ``retry`` ms apart: well under this."""
TS_CALL_TIMEOUT_MS = 4000
"""The TS SDK keeps a request pending until its timeout when resumes are refused (it never rejects it
on giving up), so the driver sets one; in-band refusals end the call long before it."""


class SwappableBearer(httpx2.Auth):
    """The token a stock client sends; a test swaps it as a user's token refresh would."""

    def __init__(self, token: str) -> None:
        self.token = token

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


@dataclass
class Observed:
    progress: list[float] = field(default_factory=list)
    after_swap: list[float] = field(default_factory=list)
    swapped_at: float | None = None


async def tokens(http: httpx.AsyncClient, server: ScriptedServer) -> tuple[str, str]:
    """A token for the whole server, and one narrowed to ``search``."""
    return (
        await dev_token(http, server.base, server.url),
        await dev_token(http, server.base, server.tool_resource("search")),
    )


async def python_call(
    server: ScriptedServer,
    auth: SwappableBearer,
    tool: str,
    arguments: dict[str, Any],
    seen: Observed,
    swap_to: str | None = None,
) -> tuple[CallToolResult | MCPError, list[str]]:
    """One stock-Python-SDK session: initialize, list tools, call ``tool`` (progress into ``seen``).

    With ``swap_to``, the client's token becomes that one as soon as progress 1 arrives. An error that
    ends the call is returned, so the session still closes normally around it.
    """

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        (seen.after_swap if seen.swapped_at is not None else seen.progress).append(progress)
        if swap_to is not None and seen.swapped_at is None and progress == 1:
            auth.token = swap_to
            seen.swapped_at = time.monotonic()

    async with (
        httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30, read=60)) as client,
        streamable_http_client(server.url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        assert init.server_info.name == "mcp-lossless"
        listed = await session.list_tools()
        names = [t.name for t in listed.tools]
        try:
            with anyio.fail_after(PY_ERROR_BOUND * 4):  # a hang fails here, with a clear TimeoutError
                return await session.call_tool(tool, arguments, progress_callback=on_progress), names
        except MCPError as exc:
            return exc, names


async def test_python_sdk_initializes_lists_and_calls_with_progress(http: httpx.AsyncClient) -> None:
    seen = Observed()
    with scripted_server() as server:
        full, _ = await tokens(http, server)
        result, names = await python_call(server, SwappableBearer(full), "search", {"query": "py-basic"}, seen)
    assert names == ["search", "fetch"]
    assert isinstance(result, CallToolResult) and not result.is_error
    assert result.content == [TextContent(type="text", text="search results for 'py-basic': 3 documents")]
    assert seen.progress == [1, 2, 3]
    assert server.recorder.resumes() == []


async def test_python_sdk_resumes_after_server_close(http: httpx.AsyncClient) -> None:
    seen = Observed()
    with scripted_server() as server:
        full, _ = await tokens(http, server)
        args = {"url": "https://example.com/py-resume", "close_at": 1}
        result, _ = await python_call(server, SwappableBearer(full), "fetch", args, seen)
    assert isinstance(result, CallToolResult)
    assert result.content == [TextContent(type="text", text="contents of https://example.com/py-resume: 29 bytes")]
    assert seen.progress == [1, 2, 3], "every progress exactly once across the close"
    resumes = server.recorder.resumes()
    assert [r.status for r in resumes] == [200], "one automatic GET + Last-Event-ID, accepted"


async def narrowed_python_call(server: ScriptedServer, full: str, narrow: str, url: str) -> tuple[MCPError, Observed]:
    seen = Observed()
    args = {"url": url, "close_at": 1}
    outcome, _ = await python_call(server, SwappableBearer(full), "fetch", args, seen, swap_to=narrow)
    ended = time.monotonic()
    assert isinstance(outcome, MCPError), f"expected an explicit error, got {outcome!r}"
    assert seen.progress == [1] and seen.swapped_at is not None
    assert seen.after_swap == [], "no fetch progress reached the client after the swap"
    assert ended - seen.swapped_at < PY_ERROR_BOUND
    return outcome, seen


async def test_python_sdk_narrowed_resume_refused_before_commit_ends_in_error(http: httpx.AsyncClient) -> None:
    with scripted_server(AfterClose.HOLD_RESUME) as server:
        full, narrow = await tokens(http, server)
        error, _ = await narrowed_python_call(server, full, narrow, "https://example.com/py-narrow-403")
    assert "reconnection attempts were exhausted" in error.error.message
    resumes = server.recorder.resumes()
    assert resumes, "the client resumed automatically"
    assert all(r.headers["authorization"] == f"Bearer {narrow}" for r in resumes), "every resume used the swap"
    assert {r.status for r in resumes} == {403}, "refused before any byte: nothing of fetch was sent"
    assert len({r.headers["last-event-id"] for r in resumes}) == 1, "the cursor never moved"
    challenge = resumes[0].response_headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and f'resource="{server.tool_resource("fetch")}"' in challenge


async def test_python_sdk_narrowed_resume_refused_in_band_ends_in_delivery_refused(http: httpx.AsyncClient) -> None:
    with scripted_server(AfterClose.AWAIT_RESUME) as server:
        full, narrow = await tokens(http, server)
        error, _ = await narrowed_python_call(server, full, narrow, "https://example.com/py-narrow-inband")
    assert error.error.code == DELIVERY_REFUSED
    data = error.error.data
    assert data["requiredResources"] == [server.tool_resource("fetch")] and data["resumable"] is True
    resumes = server.recorder.resumes()
    assert [r.status for r in resumes] == [200]
    assert resumes[0].headers["authorization"] == f"Bearer {narrow}"


def _ts_lines(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]


async def ts_call(
    server: ScriptedServer, token: str, tool: str, arguments: dict[str, Any], narrow: str | None = None
) -> list[dict[str, Any]]:
    """Run the TypeScript SDK driver (Node 22) for one call; its observations, in order."""
    command = [str(node_binary()), str(TS_DRIVER), server.url, tool, json.dumps(arguments)]
    env = {
        **os.environ,
        "MCP_TS_SDK": str(ts_sdk_dir()),
        "MCP_TOKEN": token,
        "MCP_CALL_TIMEOUT_MS": str(TS_CALL_TIMEOUT_MS),
    }
    if narrow is not None:
        command.append("1")
        env["MCP_NARROW_TOKEN"] = narrow
    with anyio.fail_after(TS_CALL_TIMEOUT_MS / 1000 + 30):
        done = await anyio.run_process(command, env=env, check=False)
    report = f"rc {done.returncode}\n{done.stdout.decode()}\n{done.stderr.decode()[-3000:]}"
    assert done.returncode == 0, report
    lines = _ts_lines(done.stdout)
    assert lines and lines[-1]["event"] == "closed", report
    return lines


def _events(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == kind]


async def test_ts_sdk_initializes_lists_and_calls_with_progress(http: httpx.AsyncClient) -> None:
    ts_sdk_dir()  # install before the server starts
    with scripted_server() as server:
        full, _ = await tokens(http, server)
        lines = await ts_call(server, full, "search", {"query": "ts-basic"})
    init = _events(lines, "initialized")[0]
    assert init["server"]["name"] == "mcp-lossless" and init["protocol"] == "2025-11-25"
    tools = _events(lines, "tools")[0]["tools"]
    assert [t["name"] for t in tools] == ["search", "fetch"]
    assert tools[1]["meta"][RESOURCE_META_KEY] == server.tool_resource("fetch")
    assert [p["progress"] for p in _events(lines, "progress")] == [1, 2, 3]
    results = _events(lines, "result")
    assert [(r["isError"], r["text"]) for r in results] == [(False, "search results for 'ts-basic': 3 documents")]


async def test_ts_sdk_resumes_after_server_close(http: httpx.AsyncClient) -> None:
    ts_sdk_dir()
    with scripted_server() as server:
        full, _ = await tokens(http, server)
        lines = await ts_call(server, full, "fetch", {"url": "https://example.com/ts-resume", "close_at": 1})
    assert [p["progress"] for p in _events(lines, "progress")] == [1, 2, 3]
    assert [r["text"] for r in _events(lines, "result")] == ["contents of https://example.com/ts-resume: 29 bytes"]
    assert _events(lines, "error") == []
    assert [r.status for r in server.recorder.resumes()] == [200]


def _after(lines: list[dict[str, Any]], marker: str) -> list[dict[str, Any]]:
    index = next(i for i, line in enumerate(lines) if line["event"] == marker)
    return lines[index + 1 :]


async def test_ts_sdk_narrowed_resume_refused_before_commit_ends_at_its_timeout(http: httpx.AsyncClient) -> None:
    ts_sdk_dir()
    with scripted_server(AfterClose.HOLD_RESUME) as server:
        full, narrow = await tokens(http, server)
        args = {"url": "https://example.com/ts-narrow-403", "close_at": 1}
        lines = await ts_call(server, full, "fetch", args, narrow)
    after = _after(lines, "swap")
    assert [e["event"] for e in after if e["event"] in ("progress", "result")] == [], "nothing of fetch after swap"
    errors = _events(after, "error")
    assert len(errors) == 1, lines
    assert errors[0]["code"] == -32001, "the SDK ends the call only at its own request timeout"
    swap_t = _events(lines, "swap")[0]["t"]
    assert errors[0]["t"] - swap_t <= TS_CALL_TIMEOUT_MS + 2000
    assert any("reconnection" in e["message"].lower() for e in _events(lines, "transport_error")), lines
    resumes = server.recorder.resumes()
    assert resumes and {r.status for r in resumes} == {403}
    assert all(r.headers["authorization"] == f"Bearer {narrow}" for r in resumes)


async def test_ts_sdk_narrowed_resume_refused_in_band_ends_in_delivery_refused(http: httpx.AsyncClient) -> None:
    ts_sdk_dir()
    with scripted_server(AfterClose.AWAIT_RESUME) as server:
        full, narrow = await tokens(http, server)
        args = {"url": "https://example.com/ts-narrow-inband", "close_at": 1}
        lines = await ts_call(server, full, "fetch", args, narrow)
    after = _after(lines, "swap")
    assert [e["event"] for e in after if e["event"] in ("progress", "result")] == [], "nothing of fetch after swap"
    errors = _events(after, "error")
    assert len(errors) == 1, lines
    assert errors[0]["code"] == DELIVERY_REFUSED
    assert errors[0]["data"]["requiredResources"] == [server.tool_resource("fetch")]
    swap_t = _events(lines, "swap")[0]["t"]
    assert errors[0]["t"] - swap_t < RETRY_MS + 3000, "ended promptly, long before the request timeout"
    resumes = server.recorder.resumes()
    assert [r.status for r in resumes] == [200]
    assert resumes[0].headers["authorization"] == f"Bearer {narrow}"
