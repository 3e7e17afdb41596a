"""What one principal can make the event store hold is bounded (``stored_bytes_per_principal``) in every store, and a
SQLite file as a whole (``max_bytes``): the attack of the second attack pass (one client flooding big progress events
grew a SQLite file at 48 MB/s) is refused at its bound within seconds, over real HTTP with real dev-AS JWTs, while
another principal's calls go on; what the store releases (DELETE, idle expiry, retention, trims) is released from
the count, so the bound never ratchets."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from mcp_lossless.core.errors import LIMIT_EXCEEDED
from mcp_lossless.core.events import PendingRequest, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.limits import STORAGE_RETRY_SECONDS, Limits
from mcp_lossless.core.principal import Principal
from mcp_lossless.server import ServerConfig, ToolContext, ToolRegistry, create_app
from mcp_lossless.stores.base import EventStore, SessionRecord, StoreFull
from mcp_lossless.stores.held import ROW_BYTES, STREAM_BYTES
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

CLIENTS = {"flood": "flood-secret", "honest": "honest-secret"}
BOUND = 4 * 1024 * 1024
LIMITS = Limits(stored_bytes_per_principal=BOUND)
CHUNK = 64 * 1024
"""Each flooding progress event's message: 64 KiB, the attack pass's size."""
ALICE = Principal("https://issuer.example", "alice", "client-1")
BOB = Principal("https://issuer.example", "bob", "client-2")


def flood_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool()
    async def flood(count: int, ctx: ToolContext) -> str:
        """Reports ``count`` progress events of 64 KiB each, as fast as the server takes them."""
        chunk = "x" * CHUNK
        for step in range(count):
            await ctx.report_progress(step, count, chunk)
        return "flooded"

    @tools.tool()
    async def echo(text: str) -> str:
        """Answers at once."""
        return text

    return tools


@pytest.fixture(params=["memory", "sqlite", "redis"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    spec = "memory"
    if request.param == "sqlite":
        spec = f"sqlite:{tmp_path / 'bound.db'}"
    elif request.param == "redis":
        spec = f"{request.getfixturevalue('redis_url')}?prefix=bound-{uuid.uuid4().hex}"

    def make(port: int) -> object:
        config = ServerConfig(port=port, store=spec, dev_clients=CLIENTS, limits=LIMITS)
        return create_app(config, flood_tools())

    with lossless_server(make) as base:
        yield base


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def _peer(http: httpx.AsyncClient, base: str, client: str) -> Peer:
    peer = Peer(http, base, await dev_token(http, base, f"{base}/mcp", client=(client, CLIENTS[client])))
    await peer.initialize()
    return peer


def _refusal_data() -> dict[str, object]:
    return {"limit": "stored_bytes_per_principal", "maximum": BOUND, "retryAfter": STORAGE_RETRY_SECONDS}


async def test_a_principal_flooding_the_store_is_refused_at_its_bound_and_another_goes_on(
    server: str, http: httpx.AsyncClient
) -> None:
    flooder = await _peer(http, server, "flood")
    honest = await _peer(http, server, "honest")

    started = time.monotonic()
    read = await flooder.post(call(1, "flood", "p", count=10 * BOUND // CHUNK))
    elapsed = time.monotonic() - started
    assert read.status == 200
    *progress, last = read.messages
    assert last["id"] == 1 and last["error"]["code"] == LIMIT_EXCEEDED  # the call ends with the refusal, explicitly
    assert last["error"]["data"] == _refusal_data()
    assert all(m["method"] == "notifications/progress" for m in progress)
    assert BOUND // (2 * CHUNK) <= len(progress) <= BOUND // CHUNK  # stopped at the bound, not before it
    assert elapsed < 10, elapsed

    again = await flooder.post(call(2, "flood", "p", count=5))  # its next call is refused at its first progress
    assert [m["error"]["data"] for m in again.messages] == [_refusal_data()]
    big = await flooder.post(call(3, "echo", text="y" * 2 * CHUNK))  # an answer past the bound: the refusal instead
    assert big.messages[-1]["error"]["data"] == _refusal_data()

    answer = await honest.post(call(1, "echo", text="still served"))  # another principal is unaffected
    assert answer.messages[-1]["result"]["content"][0]["text"] == "still served"

    replay = await flooder.resume(read.ids[0])  # what was acknowledged stays deliverable: all from the priming id
    assert [m.get("id") for m in replay.messages] == [None] * len(progress) + [1]  # after the priming event
    assert replay.messages[-1]["error"]["code"] == LIMIT_EXCEEDED

    metrics = await http.get(f"{server}/metrics")
    assert 'mcp_lossless_limit_refusals_total{limit="stored_bytes_per_principal"}' in metrics.text

    deleted = await http.delete(flooder.url, headers=flooder.headers())  # DELETE releases what the session held
    assert deleted.status_code == 204
    renewed = await _peer(http, server, "flood")
    answer = await renewed.post(call(1, "flood", "p", count=10))
    assert len(answer.messages) == 11 and answer.messages[-1]["result"]["content"][0]["text"] == "flooded"
    for peer in (renewed, honest):
        await http.delete(peer.url, headers=peer.headers())


# -- each store's count --------------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventStore]:
    opened: EventStore
    if request.param == "memory":
        opened = MemoryStore()
    elif request.param == "sqlite":
        opened = SqliteStore(str(tmp_path / "count.db"))
    else:
        opened = RedisStore(request.getfixturevalue("redis_url"), prefix=f"count-{uuid.uuid4().hex}")
    await opened.open()
    yield opened
    await opened.close()


async def _fill(store: EventStore, session_id: str, principal: Principal, events: int, size: int = 1000) -> str:
    """A session of ``principal`` with one completed stream of ``events`` events of ``size`` bytes; its key."""
    await store.put_session(SessionRecord(session_id, principal, "2025-11-25", 50.0, 100.0))
    key = f"{session_id}-stream"
    request = PendingRequest(1, "tools/call", "t", frozenset({"https://mcp.example"}))
    await store.open_stream(StreamRecord(session_id, key, StreamKind.POST, "instance", (request,)))
    for seq in range(events):
        last = seq == events - 1
        event_id = f"{key}.{seq:x}.mac"
        event = StoredEvent(session_id, key, seq, event_id, bytes(size), 1, "t", request.resources, last)
        await store.append(event, completes=last)
    return key


async def test_each_store_counts_a_principal_s_events_and_releases_them_with_its_session(store: EventStore) -> None:
    await _fill(store, "s1", ALICE, 5)
    await _fill(store, "s2", ALICE, 3)
    await _fill(store, "s3", BOB, 2)
    assert store.stored_bytes(ALICE) >= 8 * 1000
    assert 2 * 1000 <= store.stored_bytes(BOB) < store.stored_bytes(ALICE)

    await store.delete_session("s1")
    assert 3 * 1000 <= store.stored_bytes(ALICE) < 5 * 1000
    assert set(await store.expire_sessions(idle_before=200.0)) == {"s2", "s3"}
    assert store.stored_bytes(ALICE) == 0 and store.stored_bytes(BOB) == 0


async def test_sqlite_counts_exactly_and_releases_what_trims_and_retention_remove(tmp_path: Path) -> None:
    now = [1000.0]
    path = str(tmp_path / "retention.db")
    store = SqliteStore(path, retention_seconds=60, max_events_per_stream=3, clock=lambda: now[0])
    await store.open()
    try:
        await _fill(store, "s1", ALICE, 10)  # trimmed to its last 3 events as it goes
        assert store.stored_bytes(ALICE) == STREAM_BYTES + 3 * (1000 + ROW_BYTES)
        await _fill(store, "s2", ALICE, 1)
        held = store.stored_bytes(ALICE)
    finally:
        await store.close()

    reopened = SqliteStore(path, retention_seconds=60, clock=lambda: now[0])
    await reopened.open()  # counted again from the file
    try:
        assert reopened.stored_bytes(ALICE) == held
        now[0] += 120
        await reopened.sweep()  # retention removes both completed streams
        assert reopened.stored_bytes(ALICE) == 0
    finally:
        await reopened.close()


async def test_a_sqlite_file_at_max_bytes_refuses_writes_as_full_and_takes_them_again_once_room_is_freed(
    tmp_path: Path,
) -> None:
    store = SqliteStore(str(tmp_path / "full.db"), max_bytes=2 * 1024 * 1024)
    await store.open()
    try:
        with pytest.raises(StoreFull, match="is full: it holds its max_bytes=2097152"):
            await _fill(store, "s1", ALICE, 100, size=64 * 1024)
        await store.delete_session("s1")
        await store.sweep()
        await _fill(store, "s2", BOB, 3, size=64 * 1024)
        assert store.stored_bytes(BOB) == STREAM_BYTES + 3 * (64 * 1024 + ROW_BYTES)
    finally:
        await store.close()


def test_sqlite_max_bytes_is_a_store_setting() -> None:
    assert SqliteStore.from_spec("f.db?max_bytes=1048576").max_bytes == 1024 * 1024
    assert SqliteStore.from_spec("f.db?max_bytes=none").max_bytes is None
    assert SqliteStore.from_spec("f.db").max_bytes == 4 * 1024**3
    with pytest.raises(ValueError, match="max_bytes must be at least"):
        SqliteStore("f.db", max_bytes=1000)
