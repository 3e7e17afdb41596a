"""The Redis store on a Redis Cluster (``redis+cluster://``), with real processes: three primaries, one replica each.

Sessions spread over the slots (each session's keys share its ``{sid}`` hash tag, so they land on one node, and
different sessions on different nodes), a call resumed on another mcp-lossless replica, and a primary failed over
under live calls: gracefully (``CLUSTER FAILOVER`` on its replica: it catches up first, nothing is lost, every call
completes) and by a crash (SIGKILL, the replica promoted by the cluster a second or two later: every call still ends
in exactly one explicit outcome, and no event id is ever sent with two contents). The store's contract runs on a
cluster too (tests/integration/test_store_contract.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from mcp_lossless.core.errors import DELIVERY_REFUSED, EXECUTION_LOST
from mcp_lossless.stores import StoreUnavailable
from mcp_lossless.stores.redis import RedisStore
from tests.integration.test_redis_failover import LiveRead, contents, outcome, posting
from tests.integration.test_redis_replicas import Deployment, on
from tests.integration.test_redis_wait import stopped
from tests.integration.test_store_contract import event, session, stream
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.processes import ServerProcess, free_port
from tests.support.redis_cluster import RedisClusterNodes, redis_cluster
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

STEPS = 30
DELAY_MS = 100
CALLS = 6
"""Sessions, each with one call: more than enough for every primary to serve some (asserted)."""


def test_a_cluster_spec_is_checked_before_connecting() -> None:
    with pytest.raises(ValueError, match=r"^redis store: unknown setting 'bogus'"):
        RedisStore.from_spec("redis+cluster://127.0.0.1:7000?bogus=1")
    with pytest.raises(ValueError, match=r"^redis\+cluster store: node address 2 is not HOST"):
        RedisStore.from_spec("redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:x")
    with pytest.raises(ValueError, match=r"^redis\+cluster store: a cluster has one database"):
        RedisStore.from_spec("redis+cluster://127.0.0.1:7000/1")
    store = RedisStore.from_spec("rediss+cluster://u:s3cret@10.0.0.1,10.0.0.2:7001?prefix=p&ssl_cert_reqs=none")
    assert store.prefix == "p"
    assert "s3cret" not in store._where and "10.0.0.1:6379,10.0.0.2:7001" in store._where


@contextlib.contextmanager
def deployed(
    spec: str, directory: Path, *names: str, settings: str = ""
) -> Iterator[tuple[Deployment, list[ServerProcess]]]:
    """mcp-lossless replicas on the cluster, with a prefix of their own (a dead replica's lease runs out after 1 s)."""
    with contextlib.ExitStack() as stack:
        store = f"{spec}?prefix=cl-{uuid.uuid4().hex[:12]}&lease_seconds=1{settings}"
        shared = Deployment(store, directory / "dev-keys.json", f"http://127.0.0.1:{free_port()}/mcp", directory)
        yield shared, shared.start(stack, *names)


@pytest.fixture
def own_cluster() -> Iterator[RedisClusterNodes]:
    """A cluster for one test that fails a node over (the shared one keeps its topology for the others)."""
    with tempfile.TemporaryDirectory(prefix="mcpl-cluster-") as directory, redis_cluster(Path(directory)) as cluster:
        yield cluster


def session_node(cluster: RedisClusterNodes, shared: Deployment, peer: Peer) -> int:
    """The port of the primary serving ``peer``'s session hash (every key of the session shares its slot)."""
    prefix = shared.store.partition("prefix=")[2].partition("&")[0]
    return cluster.primary_of(f"{prefix}:{{{peer.session_id}}}:session").port


async def test_sessions_spread_over_the_primaries_and_a_call_resumes_on_another_replica(
    redis_cluster_nodes: RedisClusterNodes, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    with deployed(redis_cluster_nodes.spec, tmp_path, "a", "b") as (shared, (a, b)):
        token = await dev_token(http, a.base, shared.canonical)
        peers = [Peer(http, a.base, token) for _ in range(CALLS)]
        for peer in peers:
            await peer.initialize()
        nodes = {session_node(redis_cluster_nodes, shared, peer) for peer in peers}
        assert len(nodes) >= 2, f"{CALLS} sessions all on one node: {nodes}"

        peer = peers[0]
        payload = call(7, "fetch", progress="p", url="https://example.com", steps=STEPS, delay_ms=20)
        started = await peer.post(payload, stop_after=4)  # the client drops after 4 events; A runs on
        resumed = await on(b, peer).resume(started.ids[-1])
        assert resumed.status == 200
        final = outcome(resumed, 7)
        assert final["result"]["content"][0]["text"].startswith("contents of https://example.com"), final
        progress = [
            m["params"]["progress"]
            for read in (started, resumed)
            for m in read.messages
            if m.get("method") == "notifications/progress"
        ]
        assert progress == list(range(1, STEPS + 1)), "every progress exactly once, in order, across the replicas"
        contents(started, resumed)


async def live_calls(
    cluster: RedisClusterNodes,
    http: httpx.AsyncClient,
    tmp_path: Path,
    fail: Callable[[RedisServer], object],
    settings: str = "",
) -> list[tuple[LiveRead, bool]]:
    """Start one call per session on replicas A and B in turn, let each send a few events, run ``fail(primary)``
    on the primary that serves the first session, and return each call's read once every call has ended, with
    whether its session was on the failed primary."""
    with deployed(cluster.spec, tmp_path, "a", "b", settings=settings) as (shared, (a, b)):
        token = await dev_token(http, a.base, shared.canonical)
        peers = [Peer(http, (a, b)[n % 2].base, token) for n in range(CALLS)]
        for peer in peers:
            await peer.initialize()
        failing = cluster.by_port(session_node(cluster, shared, peers[0]))
        on_failing = [session_node(cluster, shared, peer) == failing.port for peer in peers]
        calls = [
            posting(peer, call(5, "fetch", progress="p", url="https://example.com", steps=STEPS, delay_ms=DELAY_MS))
            for peer in peers
        ]
        async with anyio.create_task_group() as tg:
            for _live, run in calls:
                tg.start_soon(run)
            for live, _run in calls:
                await live.until(lambda r: len(r.progress()) >= 3)
            await anyio.to_thread.run_sync(fail, failing)
            with anyio.fail_after(45):  # no hang: every stream ends, by its answer or an explicit error
                for live, _run in calls:
                    await live.ended.wait()
        return [(live, failed) for (live, _run), failed in zip(calls, on_failing, strict=True)]


@pytest.mark.parametrize("settings", ["", "&wait_replicas=1&wait_timeout_ms=500"], ids=["unacknowledged", "wait"])
async def test_a_graceful_failover_mid_stream_loses_nothing_and_every_call_completes(
    own_cluster: RedisClusterNodes, http: httpx.AsyncClient, tmp_path: Path, settings: str
) -> None:
    # CLUSTER FAILOVER waits for the replica to catch up and leaves the old primary as its replica: with wait_replicas
    # the new primary has a replica to acknowledge from the start
    reads = await live_calls(own_cluster, http, tmp_path, own_cluster.failover, settings)
    assert any(failed for _, failed in reads)
    for live, _ in reads:
        final = outcome(live.read, 5)
        assert final["result"]["content"][0]["text"].startswith("contents of https://example.com"), final
        assert live.progress() == list(range(1, STEPS + 1)), "every progress exactly once, in order"
    contents(*(live.read for live, _ in reads))


async def test_a_primary_killed_mid_stream_ends_every_call_in_one_explicit_outcome(
    own_cluster: RedisClusterNodes, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    def crash(primary: RedisServer) -> None:
        replica = own_cluster.replica_of(primary)
        own_cluster.kill(primary)
        own_cluster.wait_promoted(replica)

    reads = await live_calls(own_cluster, http, tmp_path, crash)
    for live, failed in reads:
        final = outcome(live.read, 5)
        progress = live.progress()
        assert progress == list(range(1, len(progress) + 1)), "nothing skipped, nothing twice"
        if "result" in final:
            assert len(progress) == STEPS
        else:  # explicit, with its cause, and without an id: the client's cursor stays on what it holds
            assert failed, f"a call on another primary failed: {final}"
            assert final["error"]["code"] in (EXECUTION_LOST, DELIVERY_REFUSED), final
            assert live.read.events[-1].id is None
    assert any(failed for _, failed in reads) and not all(failed for _, failed in reads)
    contents(*(live.read for live, _ in reads))


async def test_acknowledged_writes_wait_on_each_primary_that_took_them(own_cluster: RedisClusterNodes) -> None:
    """``wait_replicas=1`` on a cluster: each primary's writes are acknowledged by its own replica. With one replica
    stopped, writes to its primary's slots are an outage (never published), writes to the other primaries in the very
    same pipeline batch are stored."""
    store = RedisStore.from_spec(f"{own_cluster.spec}?prefix=ack&wait_replicas=1&wait_timeout_ms=300")
    await store.open()
    try:
        sessions = [f"s{n}" for n in range(CALLS)]
        for sid in sessions:
            await store.put_session(session(sid))
            await store.open_stream(stream(f"k-{sid}", sid))
        await asyncio.gather(*(store.enqueue(event(f"k-{sid}", 0, session_id=sid)) for sid in sessions))
        primaries = {sid: own_cluster.primary_of(f"ack:{{{sid}}}:session") for sid in sessions}
        for sid, primary in primaries.items():  # acknowledged: the replica of the session's primary holds it now
            with own_cluster.client(own_cluster.replica_of(primary)) as direct:
                direct.execute_command("READONLY")
                assert direct.xlen(f"ack:{{{sid}}}:e:k-{sid}") == 1

        lagging, *others = list(dict.fromkeys(primaries.values()))
        assert others, "the sessions all landed on one primary"
        held_back = next(sid for sid, primary in primaries.items() if primary is lagging)
        going_on = next(sid for sid, primary in primaries.items() if primary is not lagging)
        with stopped(own_cluster.replica_of(lagging)):  # both appends in one batch: each node answers for its own
            stored, refused = await asyncio.gather(
                store.enqueue(event(f"k-{going_on}", 1, session_id=going_on)),
                store.enqueue(event(f"k-{held_back}", 1, session_id=held_back)),
                return_exceptions=True,
            )
        assert stored is None
        assert isinstance(refused, StoreUnavailable) and "0 of 1 replicas acknowledged" in str(refused), refused
        await store.append(event(f"k-{held_back}", 1, session_id=held_back))  # the retry, once the replica answers
        for sid in (going_on, held_back):
            assert [e.seq for e in await store.read_after(f"k-{sid}", -1)] == [0, 1]
    finally:
        await store.close()
