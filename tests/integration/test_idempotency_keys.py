"""SEP-3182 idempotency keys on the legacy leg (ADR 0029), over real HTTP with real dev-AS JWTs, on the memory and
SQLite stores: a duplicate replays without running, a narrowed token is refused before any byte and the key then
answers a covering one, other arguments conflict, another principal's same key runs as new, a duplicate of a call
still running is "in progress" and names where to resume it. On Redis, two `mcp-lossless serve` replicas share
their keys: a duplicate sent to the other replica is in progress while the call runs, then replayed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcp_lossless.core.errors import EXECUTION_LOST, FORBIDDEN, IDEMPOTENCY_IN_PROGRESS, INVALID_PARAMS, LIMIT_EXCEEDED
from mcp_lossless.core.idempotency import CONFLICT, IN_PROGRESS, KEY_PARAM, REPLAYED_META_KEY
from mcp_lossless.core.limits import Limits
from mcp_lossless.server import ServerConfig, ToolContext, ToolRegistry, create_app
from mcp_lossless.server.app import LosslessApp
from mcp_lossless.stores.base import StoreUnavailable
from tests.integration.test_redis_replicas import deployment
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.orphan_keys import leave_orphan_key
from tests.support.stores import KINDS, store_spec
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

CLIENTS = {"alice": "alice-secret", "bob": "bob-secret"}
KEY = "0b5c4d1e-7f2a-4c3b-9e8d-112233445566"


class Ledger:
    """What the tools did, counted server-side."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()


def tools(ledger: Ledger) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def charge(amount: int) -> str:
        """Not idempotent: each run charges again."""
        ledger.charges.append(str(amount))
        return f"charged {amount} (run {len(ledger.charges)})"

    @registry.tool()
    async def hold(amount: int) -> str:
        """Runs until the test releases it."""
        ledger.charges.append(f"hold {amount}")
        ledger.started.set()
        await asyncio.get_running_loop().run_in_executor(None, ledger.release.wait, 10)
        return "held"

    @registry.tool()
    async def echo(text: str) -> str:
        return text

    @registry.tool()
    async def whose_key(ctx: ToolContext, n: int) -> str:
        """Says the key it runs under, as a tool passing it on to its own side effect would."""
        return ctx.idempotency_key or "unkeyed"

    return registry


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture(params=["memory", "sqlite"])
def server(request: pytest.FixtureRequest, tmp_path: Path, ledger: Ledger) -> Iterator[str]:
    spec = "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'keys.db'}"

    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store=spec, dev_clients=CLIENTS), tools(ledger))

    with lossless_server(make) as base:
        yield base


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def peer(http: httpx.AsyncClient, base: str, client: str = "alice", *resources: str) -> Peer:
    token = await dev_token(http, base, *(resources or (f"{base}/mcp",)), client=(client, CLIENTS[client]))
    found = Peer(http, base, token)
    initialized = await found.initialize()
    assert initialized["capabilities"]["tools"]["idempotency"] == {}
    return found


def keyed(request_id: int, tool: str, key: str = KEY, **arguments: Any) -> dict[str, Any]:
    message = call(request_id, tool, **arguments)
    message["params"][KEY_PARAM] = key
    return message


async def test_a_duplicate_after_completion_replays_the_outcome_without_running(
    server: str, http: httpx.AsyncClient, ledger: Ledger
) -> None:
    alice = await peer(http, server)
    first = (await alice.post(keyed(1, "charge", amount=5))).messages[-1]
    assert first["result"]["content"][0]["text"] == "charged 5 (run 1)"
    assert REPLAYED_META_KEY not in first["result"].get("_meta", {})
    other_session = await peer(http, server)  # a key is the principal's, not the session's
    again = (await other_session.post(keyed(7, "charge", amount=5.0))).messages[-1]  # 5 == 5.0
    assert again["id"] == 7 and again["result"]["content"] == first["result"]["content"]
    assert again["result"]["_meta"][REPLAYED_META_KEY] is True
    assert ledger.charges == ["5"]


async def test_a_narrowed_token_is_refused_before_any_byte_and_the_key_then_answers_a_covering_one(
    server: str, http: httpx.AsyncClient, ledger: Ledger
) -> None:
    alice = await peer(http, server)
    await alice.post(keyed(1, "charge", amount=5))
    narrowed = await dev_token(http, server, f"{server}/mcp/tools/echo", client=("alice", CLIENTS["alice"]))
    refused = await alice.post(keyed(2, "charge", amount=5), token=narrowed)
    assert refused.status == 403 and not refused.events
    assert "insufficient_scope" in refused.headers["www-authenticate"]
    assert refused.json()["error"]["code"] == FORBIDDEN and "charged" not in refused.body.decode()
    replayed = (await alice.post(keyed(3, "charge", amount=5))).messages[-1]
    assert replayed["result"]["content"][0]["text"] == "charged 5 (run 1)"
    assert ledger.charges == ["5"]


async def test_other_arguments_conflict_and_another_principals_same_key_runs_as_new(
    server: str, http: httpx.AsyncClient, ledger: Ledger
) -> None:
    alice = await peer(http, server)
    await alice.post(keyed(1, "charge", amount=5))
    conflict = (await alice.post(keyed(2, "charge", amount=6))).messages[-1]
    assert conflict["error"]["code"] == INVALID_PARAMS
    assert conflict["error"]["data"] == {"type": CONFLICT, KEY_PARAM: KEY}
    other_tool = (await alice.post(keyed(3, "echo", text="5"))).messages[-1]
    assert other_tool["error"]["data"]["type"] == CONFLICT
    bob = await peer(http, server, "bob")
    theirs = (await bob.post(keyed(1, "charge", amount=6))).messages[-1]
    assert theirs["result"]["content"][0]["text"] == "charged 6 (run 2)"
    assert REPLAYED_META_KEY not in theirs["result"].get("_meta", {})
    assert ledger.charges == ["5", "6"]


async def test_a_duplicate_of_a_running_call_is_in_progress_and_names_its_stream(
    server: str, http: httpx.AsyncClient, ledger: Ledger
) -> None:
    alice = await peer(http, server)
    first = asyncio.create_task(alice.post(keyed(1, "hold", amount=1)))
    assert await asyncio.to_thread(ledger.started.wait, 10)  # the tool started: its key was recorded before
    busy = (await alice.post(keyed(2, "hold", amount=1))).messages[-1]
    error = busy["error"]
    assert error["code"] == IDEMPOTENCY_IN_PROGRESS
    assert error["data"]["type"] == IN_PROGRESS and error["data"][KEY_PARAM] == KEY
    assert error["data"]["retryAfter"] >= 1 and error["data"]["lastEventId"]
    ledger.release.set()
    assert (await first).messages[-1]["result"]["content"][0]["text"] == "held"
    done = (await alice.post(keyed(3, "hold", amount=1))).messages[-1]
    assert done["result"]["_meta"][REPLAYED_META_KEY] is True
    assert ledger.charges == ["hold 1"]


async def test_a_tool_sees_the_key_it_runs_under(server: str, http: httpx.AsyncClient) -> None:
    alice = await peer(http, server)
    keyed_run = (await alice.post(keyed(1, "whose_key", "k-seen", n=1))).messages[-1]
    assert keyed_run["result"]["content"][0]["text"] == "k-seen"
    unkeyed_run = (await alice.post(call(2, "whose_key", n=2))).messages[-1]
    assert unkeyed_run["result"]["content"][0]["text"] == "unkeyed"


async def test_a_batch_carries_keys_too(server: str, http: httpx.AsyncClient, ledger: Ledger) -> None:
    alice = Peer(http, server, await dev_token(http, server, f"{server}/mcp", client=("alice", CLIENTS["alice"])))
    alice.version = "2025-03-26"
    await alice.initialize()
    batch = [keyed(1, "charge", "k-1", amount=1), keyed(2, "charge", "k-2", amount=2)]
    first = {m["id"]: m for m in (await alice.post(batch)).messages}
    again = {
        m["id"]: m
        for m in (await alice.post([keyed(3, "charge", "k-1", amount=1), keyed(4, "echo", text="x")])).messages
    }
    assert again[3]["result"]["content"] == first[1]["result"]["content"]
    assert again[3]["result"]["_meta"][REPLAYED_META_KEY] is True
    assert sorted(ledger.charges) == ["1", "2"]


async def test_redis_replicas_share_keys_a_duplicate_on_b_is_in_progress_then_replayed_without_running(
    redis_url: str, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    with contextlib.ExitStack() as stack:
        shared = deployment(redis_url, tmp_path, lease_seconds=1.0)
        a, b = shared.start(stack, "a", "b")
        token = await dev_token(http, a.base, shared.canonical)
        on_a, on_b = Peer(http, a.base, token), Peer(http, b.base, token)
        for replica in (on_a, on_b):
            assert (await replica.initialize())["capabilities"]["tools"]["idempotency"] == {}
        first = call(1, "search", progress="p", query="once", steps=60, delay_ms=50)
        first["params"][KEY_PARAM] = KEY
        started = await on_a.post(first, stop_after=2)  # the priming event and one progress: the tool runs on A

        duplicate = {**first, "id": 2}
        busy = (await on_b.post(duplicate)).messages[-1]
        assert busy["error"]["code"] == IDEMPOTENCY_IN_PROGRESS, busy
        assert busy["error"]["data"]["type"] == IN_PROGRESS and busy["error"]["data"][KEY_PARAM] == KEY

        answered = (await on_a.resume(started.ids[-1])).messages[-1]
        assert answered["result"]["content"][0]["text"] == "search results for 'once': 3 documents"
        replayed = await on_b.post({**first, "id": 3})
        assert [m.get("method") for m in replayed.messages] == [None], "no progress: the tool did not run on B"
        result = replayed.messages[-1]
        assert result["id"] == 3 and result["result"]["content"] == answered["result"]["content"]
        assert result["result"]["_meta"][REPLAYED_META_KEY] is True
        other = await on_b.post({**first, "id": 4, "params": {**first["params"], "arguments": {"query": "x"}}})
        assert other.messages[-1]["error"]["data"] == {"type": CONFLICT, KEY_PARAM: KEY}


@pytest.fixture
def bounded(ledger: Ledger) -> Iterator[tuple[str, LosslessApp]]:
    """A memory-store server holding at most two keys and one running call per principal."""
    limits = Limits(idempotency_keys_per_principal=2, calls_per_principal=1)
    apps: list[LosslessApp] = []

    def make(port: int) -> object:
        apps.append(
            create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS, limits=limits), tools(ledger))
        )
        return apps[-1]

    with lossless_server(make) as base:
        yield base, apps[0]


async def test_keys_past_the_principals_bound_are_refused_as_every_limit_is(
    bounded: tuple[str, LosslessApp], http: httpx.AsyncClient, ledger: Ledger
) -> None:
    base, app = bounded
    alice = await peer(http, base)
    for n in (1, 2):
        assert "result" in (await alice.post(keyed(n, "charge", f"k-{n}", amount=n))).messages[-1]
    refused = await alice.post(keyed(3, "charge", "k-3", amount=3))
    assert refused.status == 429 and refused.headers["retry-after"] == "60"
    error = refused.json()["error"]
    assert error["code"] == LIMIT_EXCEEDED
    assert error["data"] == {"limit": "idempotency_keys_per_principal", "maximum": 2, "retryAfter": 60}
    assert 'mcp_lossless_limit_refusals_total{limit="idempotency_keys_per_principal"} 1.0' in (
        app.state.metrics.render().decode()
    )
    replayed = (await alice.post(keyed(4, "charge", "k-1", amount=1))).messages[-1]
    assert replayed["result"]["_meta"][REPLAYED_META_KEY] is True, "a key repeated records nothing: not refused"
    assert "result" in (await alice.post(call(5, "charge", amount=5))).messages[-1], "an unkeyed call is not bounded"
    bob = await peer(http, base, "bob")
    assert "result" in (await bob.post(keyed(1, "charge", "k-3", amount=3))).messages[-1], "nor another principal"
    assert ledger.charges == ["1", "2", "5", "3"]


async def test_a_key_that_cannot_be_stored_is_a_503_that_leaves_no_call_counted(
    bounded: tuple[str, LosslessApp], http: httpx.AsyncClient, ledger: Ledger
) -> None:
    """At ``calls_per_principal = 1``, a keyed call refused 503 (its key's record not stored) must not stay counted
    as running: the next call would be refused 429."""
    base, app = bounded
    store = app.state.store
    opened = store.enqueue_open

    def failing(record: Any, keys: Any = ()) -> asyncio.Future[None]:
        if not keys:
            return opened(record, keys)
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(StoreUnavailable("the test's store refuses keyed records"))
        return failed

    alice = await peer(http, base)
    store.enqueue_open = failing  # type: ignore[method-assign]
    try:
        refused = await alice.post(keyed(1, "charge", amount=1))
    finally:
        store.enqueue_open = opened  # type: ignore[method-assign]
    assert refused.status == 503 and ledger.charges == []
    assert app.state.sessions.running_calls(alice_principal(app)) == 0
    answered = (await alice.post(keyed(2, "charge", amount=1))).messages[-1]
    assert answered["result"]["content"][0]["text"] == "charged 1 (run 1)", "the key was not held either"


def alice_principal(app: LosslessApp) -> Any:
    [principal] = {session.principal for session in app.state.sessions.all()}
    return principal


@pytest.fixture(params=KINDS)
def served_app(request: pytest.FixtureRequest, tmp_path: Path, ledger: Ledger) -> Iterator[tuple[str, LosslessApp]]:
    spec = store_spec(request, tmp_path)
    apps: list[LosslessApp] = []

    def make(port: int) -> object:
        apps.append(create_app(ServerConfig(port=port, store=spec, dev_clients=CLIENTS), tools(ledger)))
        return apps[-1]

    with lossless_server(make) as base:
        yield base, apps[0]


async def test_a_key_left_owned_by_this_live_server_with_nothing_running_is_execution_lost_not_in_progress(
    served_app: tuple[str, LosslessApp], http: httpx.AsyncClient, ledger: Ledger
) -> None:
    """Failover finding 8 (docs/reliability.md): a keyed POST answered 503 whose key survived on the promoted
    replica names a stream this live server owns and does not run. Its duplicates are execution lost naming the
    key (settled as a dead owner's stream is), never "in progress" for the key's 24 h, and never run."""
    base, app = served_app
    alice = await peer(http, base)
    [session] = app.state.sessions.all()
    await leave_orphan_key(app, session.principal, KEY, "charge", {"amount": 1}, session.id)
    for n in (1, 2):
        lost = (await alice.post(keyed(n, "charge", amount=1))).messages[-1]
        assert lost["error"]["code"] == EXECUTION_LOST, lost
        assert lost["error"]["data"] == {"reason": "execution_lost", KEY_PARAM: KEY, "resumable": False}
    assert ledger.charges == []
