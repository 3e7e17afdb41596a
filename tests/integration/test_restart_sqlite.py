"""Acceptance 3: SIGKILL mid-call with the SQLite store, restart, resume: stored events, then EXECUTION_LOST."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from mcp_lossless.core.errors import EXECUTION_LOST
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.processes import cli_server

pytestmark = pytest.mark.anyio


async def test_killed_server_restarts_with_every_event_resumable_then_execution_lost(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    args = ["--store", f"sqlite:{db}", "--retry-ms", "100"]
    async with httpx.AsyncClient(timeout=10) as http:
        with cli_server(args, tmp_path / "first.log") as first:
            mcp = f"{first.base}/mcp"
            peer = Peer(http, first.base, await dev_token(http, first.base, mcp))
            await peer.initialize()
            fetch = call(5, "fetch", progress="p", url="https://example.com/big", steps=50, delay_ms=40)
            started = await peer.post(fetch, stop_after=4)  # priming + 3 progress events
            cursor = started.ids[1]  # resume from an earlier event: events 2..n must come back from disk
            # Let a few more events be stored (none read) before the kill: wait for them by resuming on the live stream.
            more = await peer.resume(started.ids[-1], stop_after=2)
            assert len(more.ids) == 2
            first.kill()
            stored_last = more.ids[-1]

        with cli_server(args, tmp_path / "second.log", port=first.port) as second:
            narrowed = await dev_token(http, second.base, f"{mcp}/tools/search")
            peer.token = await dev_token(http, second.base, mcp)

            refused = await peer.resume(cursor, token=narrowed)
            assert refused.status == 403, "authorization tags survived the restart"
            assert refused.json()["requiredResources"] == [f"{mcp}/tools/fetch"]

            replay = await peer.resume(cursor)
            assert replay.status == 200
            progress = [m["params"]["progress"] for m in replay.messages if m.get("method") == "notifications/progress"]
            assert progress[:4] == [2, 3, 4, 5] and progress == list(range(2, len(progress) + 2))
            assert stored_last in replay.ids
            final = replay.messages[-1]
            assert final["id"] == 5 and final["error"]["code"] == EXECUTION_LOST
            assert final["error"]["data"] == {"reason": "execution_lost", "requestId": 5, "resumable": False}
            # ADR 0025: the outcome is the stream record's, at no position the dead process may have given
            assert replay.events[-1].id is None, "the lost-execution error names no position"

            again = await peer.resume(cursor)
            assert again.ids == replay.ids, "a second resume sees the same log: EXECUTION_LOST is recorded once"
            assert again.messages[-1] == final
            at_end = await peer.resume(replay.ids[-1])  # from the last stored event: only the outcome, again
            assert at_end.status == 200 and at_end.ids == [] and at_end.messages == [final]
