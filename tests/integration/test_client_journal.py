"""A keyed call outlives the client process that sent it (SEP-3182, ADR 0029): the journal keeps its key.

A client process (the real client, its own OAuth client-credentials token from the dev AS, over loopback HTTP)
calls a tool that is not idempotent, with a :class:`FileJournal`. The tool has started on the server when the
process is SIGKILLed. A new client object in the test's process reads the journal, re-issues the call under the
same key, and gets the first run's outcome, replayed: the tool's side effect, counted server-side, ran once, and
the journal is empty afterwards. In both eras: the legacy session client (and its blocking wrapper, for the
re-issue) and the 2026-07-28 client.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mcp_lossless.client import Client, FileJournal, OAuth, PendingCall, SyncClient, ToolResult
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.server import ServerConfig, ToolRegistry, create_app
from tests.support.uvicorn_server import lossless_server

CLIENTS = {"dev-client": "dev-secret"}
WAIT_SECONDS = 30

CLIENT_PROCESS = textwrap.dedent(
    """
    import sys, anyio
    from mcp_lossless.client import Client, FileJournal, OAuth
    from mcp_lossless.client.modern import ModernClient

    async def main(url: str, journal: str, era: str) -> None:
        kind = ModernClient if era == "modern" else Client
        async with kind(url, auth=OAuth("dev-client", "dev-secret"), journal=FileJournal(journal)) as client:
            if isinstance(client, ModernClient):
                await client.discover()
            await client.call_tool("charge", {"amount": 5}, timeout=60)

    anyio.run(main, *sys.argv[1:])
    """
)


class Charges:
    """What the tool did, counted server-side; the tool runs until the test releases it."""

    def __init__(self) -> None:
        self.runs: list[int] = []
        self.started = threading.Event()
        self.release = threading.Event()


def tools(charges: Charges) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def charge(amount: int) -> str:
        """Not idempotent: each run charges again."""
        charges.runs.append(amount)
        charges.started.set()
        await asyncio.get_running_loop().run_in_executor(None, charges.release.wait, WAIT_SECONDS)
        return f"charged {amount} (run {len(charges.runs)})"

    return registry


@pytest.fixture
def charges() -> Charges:
    return Charges()


@pytest.fixture
def server(charges: Charges) -> Iterator[str]:
    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS), tools(charges))

    with lossless_server(make) as base:
        yield f"{base}/mcp"


def resume(url: str, era: str, journal: FileJournal, call: PendingCall) -> ToolResult:
    """``call`` re-issued by a new client object of ``era`` reading the same journal."""
    if era == "sync":
        with SyncClient(url, auth=OAuth("dev-client", "dev-secret"), journal=journal) as blocking:
            return blocking.resume_pending(call, timeout=WAIT_SECONDS)
    return anyio.run(resume_async, url, era, journal, call)


async def resume_async(url: str, era: str, journal: FileJournal, call: PendingCall) -> ToolResult:
    auth = OAuth("dev-client", "dev-secret")
    if era == "modern":
        async with ModernClient(url, auth=auth, journal=journal) as modern:
            return await modern.resume_pending(call, timeout=WAIT_SECONDS)
    async with Client(url, auth=auth, journal=journal) as legacy:
        return await legacy.resume_pending(call, timeout=WAIT_SECONDS)


@pytest.mark.parametrize("era", ["legacy", "sync", "modern"])
def test_a_killed_process_pending_keyed_call_is_reissued_under_its_key_and_runs_once(
    server: str, charges: Charges, tmp_path: Path, era: str
) -> None:
    directory = tmp_path / "journal"
    process = subprocess.Popen([sys.executable, "-c", CLIENT_PROCESS, server, str(directory), era])
    try:
        assert charges.started.wait(WAIT_SECONDS), "the tool never started"
        journal = FileJournal(directory)
        [pending] = journal.calls()
        assert (pending.tool, dict(pending.arguments), pending.task_id) == ("charge", {"amount": 5}, None)
        process.send_signal(signal.SIGKILL)
        assert process.wait(WAIT_SECONDS) == -signal.SIGKILL
    finally:
        process.kill()
        process.wait()
    assert journal.calls() == [pending], "a killed process leaves its call pending"

    charges.release.set()  # the first run ends and records its outcome, whether or not the re-issue came first
    result = resume(server, era, journal, pending)

    assert result.text == "charged 5 (run 1)" and result.replayed, "the first run's outcome, replayed"
    assert charges.runs == [5], "the tool's side effect ran exactly once"
    assert journal.calls() == [], "an outcome received settles the call"
    fresh = resume(server, era, journal, PendingCall("charge", {"amount": 5}, "a-new-key"))
    assert (fresh.text, fresh.replayed, charges.runs) == ("charged 5 (run 2)", False, [5, 5]), "a new key runs again"
