"""SEP-3182 idempotency keys on the 2026-07-28 leg (ADR 0029), over real HTTP with real dev-AS JWTs, on the memory and
SQLite stores: ``server/discover`` declares ``tools.idempotency``; a keyed inline call outlives its broken request
connection (a duplicate is "in progress" while it runs, then replayed, and the tool ran once); a keyed call that
creates a task, repeated, returns the same task; a key whose record cannot be stored is a 503 that leaves no call
counted; our ModernClient re-issues under the same key after a broken request stream and gets the one run's result."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.client import OAuth
from mcp_lossless.client.modern import ModernClient, open_client
from mcp_lossless.core.errors import EXECUTION_LOST, IDEMPOTENCY_IN_PROGRESS, INVALID_PARAMS
from mcp_lossless.core.idempotency import CONFLICT, IN_PROGRESS, KEY_PARAM, REPLAYED_META_KEY
from mcp_lossless.core.limits import Limits
from mcp_lossless.server import ServerConfig, ToolRegistry, create_app
from mcp_lossless.server.app import LosslessApp
from mcp_lossless.server.tools import ToolContext
from mcp_lossless.stores.base import StoreUnavailable
from tests.support.mcp_http import Peer, StreamRead, dev_token
from tests.support.modern_http import ModernPeer, answer, poll_until_settled
from tests.support.orphan_keys import leave_orphan_key
from tests.support.proxy import CuttingProxy, Fault
from tests.support.stores import KINDS, store_spec
from tests.support.uvicorn_server import loopback_socket, serve_app

pytestmark = pytest.mark.anyio

CLIENTS = {"alice": "alice-secret", "bob": "bob-secret"}
KEY = "6a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


class Ledger:
    """What the tools did, counted server-side."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()


def tools(ledger: Ledger) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def charge(ctx: ToolContext, amount: int, steps: int = 0) -> str:
        """Not idempotent: each run charges again; ``steps`` progress notifications 50 ms apart first."""
        ledger.runs.append(f"charge {amount}")
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps)
            await asyncio.sleep(0.05)
        return f"charged {amount} (run {len(ledger.runs)})"

    @registry.tool()
    async def hold(amount: int) -> str:
        """Runs until the test releases it."""
        ledger.runs.append(f"hold {amount}")
        ledger.started.set()
        await asyncio.get_running_loop().run_in_executor(None, ledger.release.wait, 10)
        return "held"

    @registry.tool()
    async def bulky(n: int) -> str:
        """An answer of 3,000 bytes: what a keyed call's own stream holds for its key's retention."""
        return str(n) * 3000

    @registry.tool(task=True)
    async def export(amount: int) -> str:
        """Runs as a task for a client that declared the extension."""
        ledger.runs.append(f"export {amount}")
        return f"exported {amount}"

    return registry


@dataclass
class Served:
    base: str
    app: LosslessApp
    ledger: Ledger


def serve(store: str, limits: Limits | None = None) -> Iterator[Served]:
    ledger = Ledger()
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = ServerConfig(port=port, store=store, dev_clients=CLIENTS, limits=limits or Limits())
    app = create_app(config, tools(ledger))
    with serve_app(app, sock=sock, lifespan="on") as base:
        yield Served(base, app, ledger)


@pytest.fixture(params=["memory", "sqlite"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    yield from serve("memory" if request.param == "memory" else f"sqlite:{tmp_path / 'keys.db'}")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def peer(http: httpx.AsyncClient, served: Served, client: str = "alice") -> ModernPeer:
    token = await dev_token(http, served.base, f"{served.base}/mcp", client=(client, CLIENTS[client]))
    return ModernPeer(http, served.base, token)


async def keyed(peer: ModernPeer, tool: str, key: str = KEY, **arguments: Any) -> StreamRead:
    return await peer.request("tools/call", {"name": tool, "arguments": arguments, KEY_PARAM: key})


async def test_discover_declares_the_capability_and_an_inline_duplicate_replays_without_running(
    served: Served, http: httpx.AsyncClient
) -> None:
    alice = await peer(http, served)
    discovered = answer(await alice.request("server/discover"))["result"]
    assert discovered["capabilities"]["tools"]["idempotency"] == {}
    first = answer(await keyed(alice, "charge", amount=5))["result"]
    assert first["content"][0]["text"] == "charged 5 (run 1)" and REPLAYED_META_KEY not in first.get("_meta", {})
    again = answer(await keyed(alice, "charge", amount=5.0))  # 5 == 5.0
    assert again["result"]["content"] == first["content"] and again["result"]["_meta"][REPLAYED_META_KEY] is True
    conflict = answer(await keyed(alice, "charge", amount=6))["error"]
    assert conflict["code"] == INVALID_PARAMS and conflict["data"] == {"type": CONFLICT, KEY_PARAM: KEY}
    bob = await peer(http, served, "bob")
    theirs = answer(await keyed(bob, "charge", amount=6))["result"]
    assert theirs["content"][0]["text"] == "charged 6 (run 2)", "another principal's same key is another key"
    assert served.ledger.runs == ["charge 5", "charge 6"]


async def test_a_keyed_call_outlives_its_broken_request_and_its_retry_finds_it_running_then_answered(
    served: Served, http: httpx.AsyncClient
) -> None:
    alice = await peer(http, served)
    first = asyncio.create_task(keyed(alice, "hold", amount=1))
    assert await asyncio.to_thread(served.ledger.started.wait, 10)  # the tool runs: its key was recorded before
    first.cancel()  # the request's connection breaks
    with pytest.raises(asyncio.CancelledError):
        await first
    busy = answer(await keyed(alice, "hold", amount=1))["error"]
    assert busy["code"] == IDEMPOTENCY_IN_PROGRESS
    assert busy["data"]["type"] == IN_PROGRESS and busy["data"][KEY_PARAM] == KEY and busy["data"]["retryAfter"] >= 1
    served.ledger.release.set()
    with anyio.fail_after(20):
        while "error" in (done := answer(await keyed(alice, "hold", amount=1))):  # the protocol's own wait
            assert done["error"]["code"] == IDEMPOTENCY_IN_PROGRESS
            await anyio.sleep(done["error"]["data"]["retryAfter"])
    assert done["result"]["content"][0]["text"] == "held", "not cancelled with its request: answered"
    assert done["result"]["_meta"][REPLAYED_META_KEY] is True
    assert served.ledger.runs == ["hold 1"]


async def test_a_keyed_call_that_creates_a_task_repeated_returns_the_same_task(
    served: Served, http: httpx.AsyncClient
) -> None:
    alice = await peer(http, served)
    created = answer(await keyed(alice, "export", amount=3))["result"]
    assert created["resultType"] == "task"
    again = answer(await keyed(alice, "export", amount=3))["result"]
    assert again["resultType"] == "task" and again["taskId"] == created["taskId"]
    assert again["_meta"][REPLAYED_META_KEY] is True
    settled = await poll_until_settled(alice, created["taskId"])
    assert settled["status"] == "completed"
    assert served.ledger.runs == ["export 3"], "one task, one run"


async def test_a_key_that_cannot_be_stored_is_a_503_after_which_the_principals_count_is_free(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """At ``calls_per_principal = 1``: the modern leg counts the call before recording its key, so the 503 must
    release that count, or the principal's next call is refused 429."""
    for served in serve("memory", Limits(calls_per_principal=1)):
        store = served.app.state.store
        opened = store.enqueue_open
        alice = await peer(http, served)
        store.enqueue_open = refusing_keys(opened)  # type: ignore[method-assign]
        try:
            refused = await keyed(alice, "charge", amount=1)
        finally:
            store.enqueue_open = opened  # type: ignore[method-assign]
        assert refused.status == 503 and served.ledger.runs == []
        answered = answer(await keyed(alice, "charge", amount=1))
        assert answered["result"]["content"][0]["text"] == "charged 1 (run 1)", "not 429: the count was released"


def refusing_keys(opened: Any) -> Any:
    """``enqueue_open`` failing every record that carries a key (an outage for exactly those writes)."""

    def failing(record: Any, keys: Any = ()) -> asyncio.Future[None]:
        if not keys:
            return opened(record, keys)  # type: ignore[no-any-return]
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(StoreUnavailable("the test's store refuses keyed records"))
        return failed

    return failing


async def test_the_modern_client_reissues_under_the_same_key_after_a_broken_request_stream(tmp_path: Path) -> None:
    ledger = Ledger()
    sock = loopback_socket()
    port = sock.getsockname()[1]
    cuts = 0

    def cut_the_first_progress(_number: int) -> Fault | None:
        nonlocal cuts
        cuts += 1
        return Fault(cut=True) if cuts == 1 else None

    async with CuttingProxy(port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        config = ServerConfig(port=port, public_url=url, store=f"sqlite:{tmp_path / 'keys.db'}", dev_clients=CLIENTS)
        with serve_app(create_app(config, tools(ledger)), sock=sock, lifespan="on"):
            async with httpx.AsyncClient(timeout=30) as http:
                auth = OAuth("alice", CLIENTS["alice"])
                async with open_client(url, auth=auth, http=http) as client:
                    assert isinstance(client, ModernClient)
                    proxy.reset(cut_the_first_progress)
                    result = await client.call_tool("charge", {"amount": 9, "steps": 10}, on_progress=lambda _u: None)
    assert proxy.stats.cut_at == [1], "the request stream broke once, at the tool's first progress"
    assert result.text == "charged 9 (run 1)" and result.replayed, "the one run's result, replayed under its key"
    assert ledger.runs == ["charge 9"]


async def test_a_keyed_calls_own_stream_counts_under_its_principals_stored_bytes(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """Its answer is held for the key's retention: under a 20,000-byte bound, 3 KB answers are refused 429 once the
    principal's streams hold it, as on a legacy session (before, all 20 were served and the count stayed 0)."""
    for store in ("memory", f"sqlite:{tmp_path / 'bound.db'}"):
        for served in serve(store, Limits(stored_bytes_per_principal=20_000)):
            alice = await peer(http, served)
            statuses = [(await keyed(alice, "bulky", key=f"bulky-{n}", n=n % 10)).status for n in range(20)]
            assert 429 in statuses, statuses
            assert statuses.index(429) < 10 and set(statuses) == {200, 429}, statuses


@pytest.fixture(params=KINDS)
def served_any(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    yield from serve(store_spec(request, tmp_path))


async def test_a_key_left_owned_by_this_live_server_with_nothing_running_is_execution_lost_not_in_progress(
    served_any: Served, http: httpx.AsyncClient
) -> None:
    """Failover finding 8 (docs/reliability.md) on this leg: a keyed call answered 503 whose key survived on the
    promoted replica names a stream of its own that this live server owns and does not run. Its duplicates are
    execution lost naming the key (settled as a dead owner's stream is), never "in progress", and never run."""
    alice = await peer(http, served_any)
    await Peer(http, served_any.base, alice.token).initialize()  # a legacy session: where this test reads the principal
    [session] = served_any.app.state.sessions.all()
    await leave_orphan_key(served_any.app, session.principal, KEY, "charge", {"amount": 1}, None)
    for _ in range(2):
        lost = answer(await keyed(alice, "charge", amount=1))
        assert lost["error"]["code"] == EXECUTION_LOST, lost
        assert lost["error"]["data"] == {"reason": "execution_lost", KEY_PARAM: KEY, "resumable": False}
    assert served_any.ledger.runs == []


async def test_a_keyed_answer_committed_as_the_drain_ends_its_call_is_the_keys_outcome(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """The drain's deadline ends each keyed call still running (``ModernLeg.end_running``). One whose answer was
    being stored then: the write went on (SQLite's writer commits what was queued), so its key held the answer and
    a re-issue got it, while the waiting client had been told execution lost. The drain is injected at the one point
    that shows it, with no sleep: the answer's write has committed, its waiter has not resumed (the drain's first
    step is queued before the waiter hears of the write: the loop runs callbacks in the order they were queued).
    Now the commit decides: both get the answer, and the tool ran once. (A call ended before it answered is still
    execution lost: ``test_drain.py``.) SQLite: the memory store's write resolves at once, leaving no such point."""
    with contextlib.contextmanager(serve)(f"sqlite:{tmp_path / 'keys.db'}") as served:
        await _drained_while_stored(served, http)


async def _drained_while_stored(served: Served, http: httpx.AsyncClient) -> None:
    alice = await peer(http, served)
    app = served.app
    store = app.state.store
    enqueue = store.enqueue
    drains: list[asyncio.Task[None]] = []

    def enqueue_then_drain(event: Any, completes: bool = False) -> asyncio.Future[None]:
        stored = enqueue(event, completes)
        if not completes:
            return stored
        loop = asyncio.get_running_loop()
        heard: asyncio.Future[None] = loop.create_future()  # what the keyed answer's waiter awaits

        def relay(_stored: asyncio.Future[None]) -> None:
            if not heard.done():  # (cancelled with its waiter)
                heard.set_result(stored.result())

        def committed(_stored: asyncio.Future[None]) -> None:
            drains.append(loop.create_task(app.drain(0)))  # its deadline passed: its first step ends what runs
            loop.call_soon(relay, stored)  # then the waiter hears its write committed

        stored.add_done_callback(committed)
        return heard

    store.enqueue = enqueue_then_drain  # type: ignore[method-assign]
    try:
        first = answer(await keyed(alice, "charge", amount=7))
    finally:
        store.enqueue = enqueue  # type: ignore[method-assign]
    assert len(drains) == 1, "the server drained as the answer's write committed"
    assert "error" not in first, first  # was execution lost, for an answer its key held
    assert first["result"]["content"][0]["text"] == "charged 7 (run 1)"
    again = answer(await keyed(alice, "charge", amount=7))["result"]
    assert again["content"] == first["result"]["content"] and again["_meta"][REPLAYED_META_KEY] is True
    assert served.ledger.runs == ["charge 7"]
