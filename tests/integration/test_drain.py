"""Issue 31 item 4: SIGTERM drains a real ``serve`` process.

Ten legacy calls stream on one session and five 2026-07-28 tasks run, half of each short enough to finish within
``--drain-seconds``, half not. SIGTERM: the process stops accepting, the short ones finish, the others end as
execution lost at the deadline, and it exits soon after. Every stream ends with its request's one answer (a
result or -32003, never cut), and every task's outcome is recorded: a new process on the same store answers each
poll with the task's result or its execution-lost error.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.client import OAuth
from mcp_lossless.client.errors import CallMayHaveRun
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.core.errors import EXECUTION_LOST, TASK_EXECUTION_LOST
from tests.support.mcp_http import Peer, StreamRead, call, dev_token, read_events
from tests.support.modern_http import ModernPeer
from tests.support.processes import free_port, started_cli_server

pytestmark = pytest.mark.anyio

DRAIN_SECONDS = 4.0
SHORT = {"steps": 4, "delay_ms": 250}
"""About one second: finishes within the drain."""
LONG = {"steps": 300, "delay_ms": 200}
"""A minute: still running at the drain's deadline."""
EXIT_SLACK = 10.0
"""The exit after the deadline: ending what is left, uvicorn's shutdown, the store's close, on a shared box."""


async def stream_call(peer: Peer, request_id: int, arguments: dict[str, object], started: anyio.Event) -> StreamRead:
    """One call's stream read to its end; ``started`` is set at its first progress."""
    read = StreamRead(0)
    payload = call(request_id, "fetch", progress=f"p{request_id}", url=f"https://example.com/{request_id}", **arguments)
    async with peer.http.stream("POST", peer.url, headers=peer.headers(), content=orjson.dumps(payload)) as response:
        read.status = response.status_code
        await read_events(response, read, lambda read: _progressed(read) and started.set())
    return read


def _progressed(read: StreamRead) -> bool:
    return any(m.get("method") == "notifications/progress" for m in read.messages)


async def start_task(
    http: httpx.AsyncClient, base: str, i: int, arguments: dict[str, object], tasks: dict[int, str]
) -> None:
    """A 2026-07-28 call of ``fetch`` that becomes a task: its id kept in ``tasks``, then the client leaves it
    running in the server (its outcome is polled later, from another process)."""
    created = anyio.Event()

    def hook(task_id: str, _name: str) -> None:
        tasks[i] = task_id
        created.set()

    url = f"https://example.com/t{i}"
    auth = OAuth("dev-client", "dev-secret")
    async with (
        ModernClient(f"{base}/mcp", auth=auth, http=http, on_task=hook) as client,
        anyio.create_task_group() as polling,
    ):
        polling.start_soon(client.call_tool, "fetch", {"url": url, **arguments})
        with anyio.fail_after(30):
            await created.wait()
        polling.cancel_scope.cancel()


def answer_of(read: StreamRead, request_id: int) -> dict[str, object]:
    answers = [m for m in read.messages if m.get("id") == request_id and ("result" in m or "error" in m)]
    assert len(answers) == 1, f"request {request_id}: a cut stream, no answer: {read.messages[-3:]}"
    return answers[0]


async def test_sigterm_drains_running_calls_and_tasks_and_every_client_gets_its_one_outcome(tmp_path: Path) -> None:
    port = free_port()
    store = f"sqlite:{tmp_path / 'drain.db'}"
    args = ["--port", str(port), "--store", store, "--drain-seconds", str(DRAIN_SECONDS)]
    base = f"http://127.0.0.1:{port}"
    reads: dict[int, StreamRead] = {}
    tasks: dict[int, str] = {}
    async with httpx.AsyncClient(timeout=120) as http:
        with started_cli_server(args) as (proc, _):
            peer = Peer(http, base, await dev_token(http, base, f"{base}/mcp"))
            await peer.initialize()
            started = [anyio.Event() for _ in range(10)]

            async def legacy(i: int) -> None:
                reads[i] = await stream_call(peer, i, SHORT if i < 5 else LONG, started[i])

            async with anyio.create_task_group() as calls:
                for i in range(10):
                    calls.start_soon(legacy, i)
                with anyio.fail_after(60):
                    for event in started:
                        await event.wait()
                for i in range(5):
                    await start_task(http, base, i, SHORT if i < 3 else LONG, tasks)
                terminated = time.monotonic()
                proc.send_signal(signal.SIGTERM)
            status = await anyio.to_thread.run_sync(proc.wait, DRAIN_SECONDS + EXIT_SLACK)
            took = time.monotonic() - terminated
        assert status == -signal.SIGTERM
        assert took < DRAIN_SECONDS + EXIT_SLACK, f"exited {took:.1f} s after SIGTERM"

        for i in range(10):
            answer = answer_of(reads[i], i)
            if i < 5:
                assert answer["result"]["content"][0]["text"].startswith("contents of"), answer  # type: ignore[index]
            else:
                assert answer["error"]["code"] == EXECUTION_LOST, answer  # type: ignore[index]

        with started_cli_server(["--port", str(port), "--store", store]):
            for i, task_id in sorted(tasks.items()):
                async with ModernClient(f"{base}/mcp", auth=OAuth("dev-client", "dev-secret"), http=http) as client:
                    if i < 3:
                        result = await client.resume_task("fetch", task_id, timeout=30)
                        assert result.text.startswith("contents of"), result
                    else:
                        with pytest.raises(CallMayHaveRun) as lost:
                            await client.resume_task("fetch", task_id, timeout=30)
                        assert lost.value.error is not None and lost.value.error["code"] == TASK_EXECUTION_LOST
    assert sorted(tasks) == [0, 1, 2, 3, 4]


async def test_a_keyed_2026_call_past_the_drain_ends_as_execution_lost_on_its_open_request(tmp_path: Path) -> None:
    """Every ``ModernClient`` call to our server is keyed (SEP-3182), and a keyed call runs detached from its
    request: the drain's deadline must end it too, its waiting client answered execution lost on the stream it
    reads. Before, only unkeyed calls and tasks were ended: the keyed one ran on, uvicorn's own shutdown timeout
    cut the response with a traceback in the log, and the client got no outcome (a cut stream)."""
    port = free_port()
    drain = 1.0
    args = ["--port", str(port), "--store", f"sqlite:{tmp_path / 'keyed.db'}", "--drain-seconds", str(drain)]
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=60) as http:
        with started_cli_server(args) as (proc, _):
            peer = ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp"))
            message = peer.message(
                "tools/call",
                {
                    "name": "search",
                    "arguments": {"query": "q", **LONG},
                    "idempotencyKey": "drained-key",
                    "_meta": {"progressToken": "p"},
                },
            )
            read = StreamRead(0)
            terminated = False

            def terminate_at_first_progress(read: StreamRead) -> None:
                nonlocal terminated
                if not terminated and any(m.get("method") for m in read.messages):
                    proc.send_signal(signal.SIGTERM)  # at its first progress: running, keyed, waited for
                    terminated = True

            content = orjson.dumps(message)
            async with http.stream("POST", peer.url, headers=peer.headers(message), content=content) as response:
                read.status = response.status_code
                await read_events(response, read, terminate_at_first_progress)
            status = await anyio.to_thread.run_sync(proc.wait, drain + EXIT_SLACK)
        assert status == -signal.SIGTERM
    answer = answer_of(read, message["id"])
    assert answer["error"]["code"] == EXECUTION_LOST, answer  # type: ignore[index]
