"""Idempotency keys across a SIGKILL restart on SQLite (ADR 0029), over real HTTP with real dev-AS JWTs: a keyed call
whose server died during the tool's run is never run again (its duplicate gets execution lost naming the key, and
the client's ``call_tool`` one may-have-run outcome); one whose answer was stored before the kill is replayed."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.client import Client, ProgressUpdate
from mcp_lossless.client.errors import CallMayHaveRun
from mcp_lossless.client.modern import ModernClient, open_client
from mcp_lossless.client.oauth import OAuth
from mcp_lossless.core.errors import EXECUTION_LOST
from mcp_lossless.core.idempotency import KEY_PARAM, REPLAYED_META_KEY
from tests.support.charging import charging_module, runs_of
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.processes import ServerProcess, cli_server

pytestmark = pytest.mark.anyio

KEY = "5f0e9c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b"


def server_args(tmp_path: Path) -> tuple[list[str], Path]:
    module, runs = charging_module(tmp_path)
    return [f"{module}:tools", "--store", f"sqlite:{tmp_path / 'keys.db'}", "--retry-ms", "100"], runs


def keyed(request_id: int, amount: str, steps: int, key: str = KEY) -> dict[str, Any]:
    message = call(request_id, "charge", progress="p", amount=amount, steps=steps)
    message["params"][KEY_PARAM] = key
    return message


async def fresh_peer(http: httpx.AsyncClient, server: ServerProcess) -> Peer:
    peer = Peer(http, server.base, await dev_token(http, server.base, f"{server.base}/mcp"))
    initialized = await peer.initialize()
    assert initialized["capabilities"]["tools"]["idempotency"] == {}
    return peer


async def test_a_key_killed_mid_run_is_execution_lost_naming_it_and_one_answered_is_replayed(tmp_path: Path) -> None:
    args, runs = server_args(tmp_path)
    async with httpx.AsyncClient(timeout=10) as http:
        with cli_server(args, tmp_path / "first.log") as first:
            peer = await fresh_peer(http, first)
            answered = (await peer.post(keyed(1, "answered", 1, "answered-key"))).messages[-1]
            assert answered["result"]["content"][0]["text"] == "charged answered"
            started = await peer.post(keyed(2, "killed", 50), stop_after=2)  # priming + the tool's first progress
            assert runs_of(runs) == ["answered", "killed"]
            first.kill()  # SIGKILL during the tool's run

        with cli_server(args, tmp_path / "second.log", port=first.port) as second:
            again = await fresh_peer(http, second)  # a new session: the key is the principal's
            lost = (await again.post(keyed(3, "killed", 50))).messages[-1]
            assert lost["error"]["code"] == EXECUTION_LOST
            assert lost["error"]["data"] == {"reason": "execution_lost", KEY_PARAM: KEY, "resumable": False}
            replayed = (await again.post(keyed(4, "answered", 1, "answered-key"))).messages
            assert [m.get("method") for m in replayed] == [None], "no progress: the tool did not run again"
            assert replayed[-1]["result"]["content"] == answered["result"]["content"]
            assert replayed[-1]["result"]["_meta"][REPLAYED_META_KEY] is True
            assert runs_of(runs) == ["answered", "killed"], "neither key ran a second time"
            assert started.status == 200


async def charge_then_kill(client: Client | ModernClient, server: ServerProcess) -> asyncio.Task[Any]:
    """The client's keyed ``charge`` call, and ``server`` SIGKILLed once the tool runs (its first progress)."""
    running = asyncio.Event()

    def progressed(_update: ProgressUpdate) -> None:
        running.set()

    outcome = asyncio.create_task(
        client.call_tool("charge", {"amount": "once", "steps": 50}, on_progress=progressed, idempotency_key=KEY)
    )
    await running.wait()
    server.kill()
    return outcome


def assert_lost_once(ended: pytest.ExceptionInfo[CallMayHaveRun], runs: Path) -> None:
    """The killed call ran once and ended as may-have-run: the restarted server answered its re-issue under its key
    with execution lost, never running it again."""
    assert runs_of(runs) == ["once"], "the key kept the call from a second run"
    error = ended.value.error
    assert error is not None and error["code"] == EXECUTION_LOST, ended.value
    assert error["data"][KEY_PARAM] == KEY, "re-issued under its key, the server named it: never run again"


async def test_the_clients_call_across_a_sigkill_restart_ends_once_as_may_have_run(tmp_path: Path) -> None:
    args, runs = server_args(tmp_path)

    async with httpx.AsyncClient(timeout=10) as http, contextlib.AsyncExitStack() as stack:
        first = stack.enter_context(cli_server(args, tmp_path / "first.log"))
        client = await stack.enter_async_context(
            Client(f"{first.base}/mcp", auth=OAuth("dev-client", "dev-secret"), http=http, timeout=30)
        )
        outcome = await charge_then_kill(client, first)
        stack.enter_context(cli_server(args, tmp_path / "second.log", port=first.port))
        with pytest.raises(CallMayHaveRun) as ended:
            await outcome
        assert_lost_once(ended, runs)


async def test_the_modern_clients_call_rides_out_a_sigkill_restart_and_ends_once_as_may_have_run(
    tmp_path: Path,
) -> None:
    """The modern client's keyed call whose server is SIGKILLed mid-run waits (backs off) for the server started
    again on the same port and SQLite file, and gets the restarted server's one answer to its key: execution lost
    naming it, never a second run (without the wait it gave up before the server listened again)."""
    args, runs = server_args(tmp_path)

    async with httpx.AsyncClient(timeout=10) as http, contextlib.AsyncExitStack() as stack:
        first = stack.enter_context(cli_server(args, tmp_path / "first.log"))
        client = await stack.enter_async_context(
            open_client(f"{first.base}/mcp", auth=OAuth("dev-client", "dev-secret"), http=http, timeout=30)
        )
        assert isinstance(client, ModernClient)
        outcome = await charge_then_kill(client, first)
        # started off the event loop: the call meanwhile finds no server listening, as during a real restart
        restarting = cli_server(args, tmp_path / "second.log", port=first.port)
        await anyio.to_thread.run_sync(stack.enter_context, restarting)
        with pytest.raises(CallMayHaveRun) as ended:
            await outcome
        assert_lost_once(ended, runs)
