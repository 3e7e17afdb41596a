"""Our client against the official TypeScript SDK server (``@modelcontextprotocol/sdk`` 1.32.2, Node 22).

The server is ``peers/ts_sdk_server.mjs``, a child process: ``McpServer`` + ``StreamableHTTPServerTransport``
(stateful, a per-session event store, ``retry: 200``), with ``search`` and ``fetch`` tools that report
progress and can close their own SSE stream mid-call (SEP-1699 polling), then wait until the client has
resumed it. The server prints one JSON line per HTTP request and per replay, so the tests check what really
went over the wire (GET + Last-Event-ID, a single POST per call, DELETE) from the server's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio
import httpx
import pytest

from mcp_lossless.client import Client, DeadlineExceeded, ProgressUpdate, SessionLost, ToolFailed
from mcp_lossless.client.transport import Backoff
from tests.support.node import node_binary, ts_sdk_dir

pytestmark = pytest.mark.anyio

SERVER_SCRIPT = Path(__file__).parent / "peers" / "ts_sdk_server.mjs"
READY_TIMEOUT = 30.0
"""Node's start and the SDK's import take about a second; the bound only catches a broken peer."""
OBSERVE_TIMEOUT = 5.0
"""How long to wait for the server's log line of a request the client has already had answered."""
CALL_TIMEOUT = 10.0

Entry = dict[str, Any]


class ServerLog:
    """The server's stdout as it arrives: the port from its ready line, then its JSON observations."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.ended = False
        self._entries: list[Entry] = []
        self._changed = threading.Condition()

    def follow(self, stdout: IO[str]) -> None:
        """Reader thread body: one line at a time until the process closes its stdout."""
        for line in stdout:
            with self._changed:
                if line.startswith("ready "):
                    self.port = int(line.split()[1])
                elif line.startswith("{"):
                    self._entries.append(json.loads(line))
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait_ready(self, timeout: float) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: self.port is not None or self.ended, timeout)
            return self.port

    def entries(self, match: Callable[[Entry], bool]) -> list[Entry]:
        with self._changed:
            return [e for e in self._entries if match(e)]

    async def wait_for(self, match: Callable[[Entry], bool], count: int = 1) -> list[Entry]:
        """The matching entries once there are at least ``count``; fails after :data:`OBSERVE_TIMEOUT`."""

        def wait() -> list[Entry]:
            with self._changed:
                self._changed.wait_for(lambda: len(self.entries(match)) >= count or self.ended, OBSERVE_TIMEOUT)
                return self.entries(match)

        found = await anyio.to_thread.run_sync(wait)
        assert len(found) >= count, f"the server logged {len(found)} of {count} expected lines"
        return found


@dataclass
class TsServer:
    url: str
    log: ServerLog

    def requests(self, session: str | None, method: str) -> Callable[[Entry], bool]:
        """A matcher for the HTTP requests of ``method`` the server received on ``session``."""
        return lambda e: e["event"] == "request" and e["session"] == session and e["method"] == method

    def tool_calls(self, session: str | None) -> list[Entry]:
        match = self.requests(session, "POST")
        return self.log.entries(lambda e: match(e) and e["rpc"] == "tools/call")


@pytest.fixture(scope="module")
def ts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TsServer]:
    stderr_path = tmp_path_factory.mktemp("ts-sdk-server") / "stderr.txt"
    env = {**os.environ, "MCP_TS_SDK": str(ts_sdk_dir())}
    log = ServerLog()
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [str(node_binary()), str(SERVER_SCRIPT), "0"], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
    assert process.stdout is not None
    reader = threading.Thread(target=log.follow, args=(process.stdout,), daemon=True)
    reader.start()
    try:
        port = log.wait_ready(READY_TIMEOUT)
        if port is None:
            raise RuntimeError(f"the TS SDK server did not get ready (rc {process.poll()}):\n{stderr_path.read_text()}")
        yield TsServer(f"http://127.0.0.1:{port}/mcp", log)
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        reader.join(5)
        process.stdout.close()


def client_for(server: TsServer) -> Client:
    return Client(server.url, timeout=CALL_TIMEOUT, backoff=Backoff(initial=0.05, maximum=0.5))


async def test_initialize_negotiates_latest_and_lists_tools(ts_server: TsServer) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            assert client.server.protocol_version == "2025-11-25"
            assert client.server.info == {"name": "ts-sdk-peer", "version": "1.0.0"}
            session = client.server.session_id
            assert session
            tools = {t.name: t for t in await client.list_tools()}
        (listing,) = await ts_server.log.wait_for(
            lambda e: ts_server.requests(session, "POST")(e) and e["rpc"] == "tools/list"
        )
        await ts_server.log.wait_for(ts_server.requests(session, "DELETE"))
    assert set(tools) == {"search", "fetch"}
    assert tools["search"].input_schema["required"] == ["query"]
    assert tools["fetch"].input_schema["required"] == ["url"]
    assert listing["protocolVersion"] == "2025-11-25"
    assert "application/json" in listing["accept"] and "text/event-stream" in listing["accept"]


async def test_tools_call_with_progress(ts_server: TsServer) -> None:
    updates: list[ProgressUpdate] = []
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            session = client.server.session_id
            result = await client.call_tool("search", {"query": "alpha", "steps": 3}, on_progress=updates.append)
    assert result.text == "search results for 'alpha'"
    expected = [(i, 3, f"search 'alpha' step {i}") for i in (1, 2, 3)]
    assert [(u.progress, u.total, u.message) for u in updates] == expected
    assert len(ts_server.tool_calls(session)) == 1
    assert ts_server.log.entries(ts_server.requests(session, "GET")) == [], "no resume was needed"


async def test_resume_after_server_initiated_close(ts_server: TsServer) -> None:
    updates: list[float] = []
    url = "https://example.com/ts-resume"
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            session = client.server.session_id
            result = await client.call_tool(
                "fetch", {"url": url, "steps": 4, "close_at": 1}, on_progress=lambda u: updates.append(u.progress)
            )
        (resume,) = await ts_server.log.wait_for(ts_server.requests(session, "GET"))
        cursor = resume["lastEventId"]
        (replay,) = await ts_server.log.wait_for(lambda e: e["event"] == "replay" and e["after"] == cursor)
    assert result.text == f"contents of {url}"
    assert updates == [1, 2, 3, 4], "each progress exactly once, across the close and the resume"
    assert cursor, "the client resumed with GET + Last-Event-ID"
    assert resume["accept"] == "text/event-stream" and resume["protocolVersion"] == "2025-11-25"
    assert cursor.startswith(f"{replay['stream']}:"), "it resumed the call's own stream"
    assert len(ts_server.tool_calls(session)) == 1, "resumed, never re-sent"


async def test_concurrent_calls_each_get_their_own_result(ts_server: TsServer) -> None:
    queries = ["one", "two", "three"]
    progress: dict[str, list[tuple[float, str | None]]] = {q: [] for q in queries}
    results: dict[str, str] = {}
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            session = client.server.session_id

            async def one(query: str) -> None:
                def note(update: ProgressUpdate) -> None:
                    progress[query].append((update.progress, update.message))

                arguments = {"query": query, "steps": 3, "close_at": 1}
                results[query] = (await client.call_tool("search", arguments, on_progress=note)).text

            async with anyio.create_task_group() as tg:
                for query in queries:
                    tg.start_soon(one, query)
        resumes = await ts_server.log.wait_for(ts_server.requests(session, "GET"), count=len(queries))
    assert results == {q: f"search results for '{q}'" for q in queries}
    assert progress == {q: [(i, f"search '{q}' step {i}") for i in (1, 2, 3)] for q in queries}
    streams = {r["lastEventId"].rsplit(":", 1)[0] for r in resumes}
    assert len(resumes) == len(streams) == len(queries), "one resume per call, each of its own stream"
    assert len(ts_server.tool_calls(session)) == len(queries)


async def test_invalid_arguments_are_a_typed_tool_error(ts_server: TsServer) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            with pytest.raises(ToolFailed) as caught:
                await client.call_tool("search", {"query": "x", "steps": 0})
    assert "steps" in caught.value.reason


def cancelled(label: str) -> Callable[[Entry], bool]:
    return lambda e: e["event"] == "cancelled" and e["label"] == label


async def test_deadline_cancels_the_call_on_the_server(ts_server: TsServer) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            session = client.server.session_id
            with pytest.raises(DeadlineExceeded):
                await client.call_tool("search", {"query": "deadline", "steps": 50, "delay_ms": 100}, timeout=0.5)
            await ts_server.log.wait_for(cancelled("search 'deadline'"))  # before the DELETE: by the notice
        (notice,) = await ts_server.log.wait_for(
            lambda e: ts_server.requests(session, "POST")(e) and e["rpc"] == "notifications/cancelled"
        )
    assert notice["protocolVersion"] == "2025-11-25"


async def test_closing_right_after_a_deadline_sends_the_cancel_before_the_delete(ts_server: TsServer) -> None:
    """A server that kept tools running after DELETE would otherwise never hear the cancel."""
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            session = client.server.session_id
            with pytest.raises(DeadlineExceeded):
                await client.call_tool("search", {"query": "leaving", "steps": 50, "delay_ms": 100}, timeout=0.5)
        await ts_server.log.wait_for(ts_server.requests(session, "DELETE"))
    order = [
        e.get("rpc") or e["method"]
        for e in ts_server.log.entries(ts_server.requests(session, "POST"))
        + ts_server.log.entries(ts_server.requests(session, "DELETE"))
    ]
    entries = ts_server.log.entries(
        lambda e: (
            (ts_server.requests(session, "POST")(e) and e.get("rpc") == "notifications/cancelled")
            or ts_server.requests(session, "DELETE")(e)
        )
    )
    assert [e.get("rpc") or e["method"] for e in entries] == ["notifications/cancelled", "DELETE"], order


async def test_caller_cancellation_is_forwarded(ts_server: TsServer) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client:
            with anyio.move_on_after(0.5):
                await client.call_tool("search", {"query": "abandoned", "steps": 50, "delay_ms": 100})
            await ts_server.log.wait_for(cancelled("search 'abandoned'"))


async def test_session_lost_mid_call_is_may_have_run(ts_server: TsServer) -> None:
    """The session ends (DELETE by someone else) while ``fetch`` runs: the resume gets 404.

    The TS tools carry no ``idempotentHint``, so the client must not run ``fetch`` again on the new session.
    """
    url = "https://example.com/ts-lost"
    started = anyio.Event()
    with anyio.fail_after(CALL_TIMEOUT):
        async with client_for(ts_server) as client, httpx.AsyncClient(timeout=5) as raw:
            old_session = client.server.session_id

            async def end_session() -> None:
                await started.wait()
                response = await raw.delete(ts_server.url, headers={"mcp-session-id": old_session or ""})
                assert response.status_code == 200

            async with anyio.create_task_group() as tg:
                tg.start_soon(end_session)
                with pytest.raises(SessionLost) as caught:
                    arguments = {"url": url, "steps": 50, "delay_ms": 100}
                    await client.call_tool("fetch", arguments, on_progress=lambda _: started.set())
            assert (await client.call_tool("search", {"query": "after"})).text == "search results for 'after'"
            new_session = client.server.session_id
        await ts_server.log.wait_for(cancelled(f"fetch {url}"))  # the SDK aborts handlers when a session ends
    assert "may have run" in caught.value.reason
    assert new_session not in (None, old_session)
    assert [c["tool"] for c in ts_server.tool_calls(old_session)] == ["fetch"]
    assert [c["tool"] for c in ts_server.tool_calls(new_session)] == ["search"], "fetch was not re-run"
