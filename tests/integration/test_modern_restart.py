"""Issue 13 acceptance 3: SIGKILL during a running task with the SQLite store, restart, poll: ``failed`` with
the execution-lost error (a finished task: ``completed``), never ``working`` forever."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from mcp_lossless.core.errors import TASK_EXECUTION_LOST
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer, answer, poll_until_settled
from tests.support.processes import cli_server

pytestmark = pytest.mark.anyio


async def test_a_task_killed_with_its_process_ends_failed_and_a_finished_one_stays_completed(tmp_path: Path) -> None:
    args = ["--store", f"sqlite:{tmp_path / 'events.db'}"]
    async with httpx.AsyncClient(timeout=10) as http:
        with cli_server(args, tmp_path / "first.log") as first:
            mcp = f"{first.base}/mcp"
            peer = ModernPeer(http, first.base, await dev_token(http, first.base, mcp))
            running = answer(await peer.call("fetch", url="https://example.com/long", steps=600, delay_ms=100))
            finished = answer(await peer.call("fetch", url="https://example.com/short", steps=0, delay_ms=0))
            assert running["result"]["resultType"] == finished["result"]["resultType"] == "task"
            assert (await poll_until_settled(peer, finished["result"]["taskId"]))["status"] == "completed"
            still = answer(await peer.task("tasks/get", running["result"]["taskId"]))["result"]
            assert still["status"] == "working"
            first.kill()

        with cli_server(args, tmp_path / "second.log", port=first.port) as second:
            peer.token = await dev_token(http, second.base, mcp)
            lost = answer(await peer.task("tasks/get", running["result"]["taskId"]))["result"]
            assert lost["status"] == "failed" and lost["resultType"] == "complete"
            assert lost["error"]["code"] == TASK_EXECUTION_LOST
            assert lost["error"]["data"] == {
                "reason": "execution_lost",
                "taskId": running["result"]["taskId"],
                "resumable": False,
            }
            again = answer(await peer.task("tasks/get", running["result"]["taskId"]))["result"]
            assert again.pop("ttlMs") >= lost.pop("ttlMs"), "each poll restarts the TTL"
            assert again == lost, "settled once: every later poll sees the same failure"
            kept = answer(await peer.task("tasks/get", finished["result"]["taskId"]))["result"]
            assert kept["status"] == "completed"
            assert kept["result"]["content"][0]["text"] == "contents of https://example.com/short: 25 bytes"
