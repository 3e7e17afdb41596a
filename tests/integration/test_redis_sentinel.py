"""Redis failover, staged with real processes: the topology harness itself, and the store behind Sentinel.

tests/support/redis_topology.py starts a primary, a replica replicating through a relay the test can freeze,
an endpoint relay it can flip, and Sentinels. These tests check that the harness does what failover scenarios
rely on (a frozen link loses exactly the writes made meanwhile), and that a ``redis+sentinel://`` store, and a
``serve`` process on one, find the master again after Sentinel promoted the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from pathlib import Path

import anyio
import httpx
import pytest
import redis

from mcp_lossless.stores import StoreUnavailable, open_store
from mcp_lossless.stores.redis import RedisStore, SentinelTarget
from tests.integration.test_store_contract import event, session, stream
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.processes import ServerProcess, free_port
from tests.support.redis_topology import SERVICE, RedisTopology, redis_topology

pytestmark = pytest.mark.anyio

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
}


def test_harness_freezes_the_link_and_flips_the_endpoint_to_the_promoted_replica(tmp_path: Path) -> None:
    with (
        redis_topology(tmp_path) as topology,
        topology.client(topology.primary) as primary,
        topology.client(topology.replica) as replica,
        redis.Redis.from_url(topology.endpoint_url, socket_timeout=5) as endpoint,
    ):
        endpoint.set("before", "1")
        topology.wait_replicated()
        assert replica.get("before") == b"1"
        assert endpoint.info("server")["tcp_port"] == topology.primary.port

        topology.freeze_link()
        endpoint.set("during", "2")
        assert primary.execute_command("WAIT", 1, 300) == 0, "the replica cannot acknowledge while frozen"
        assert replica.get("during") is None
        topology.thaw_link()
        topology.wait_replicated()
        assert replica.get("during") == b"2", "thawed, the held-back writes arrive"

        topology.freeze_link()
        endpoint.set("lost", "3")
        topology.kill_primary()
        topology.promote_replica()
        topology.flip_endpoint()

        assert topology.role(topology.replica) == "master"
        assert endpoint.info("server")["tcp_port"] == topology.replica.port, "the same client now reaches it"
        assert endpoint.mget("before", "during", "lost") == [b"1", b"2", None], "the lagging replica lost 'lost'"
        endpoint.set("after", "4")
        assert replica.get("after") == b"4"


def test_sentinel_specs_are_checked_before_connecting_and_name_no_password() -> None:
    store = open_store("redis+sentinel://ann:s3cret@127.0.0.1:7001,[::1]:7002,other/mcpl/2?prefix=p&max_connections=9")
    assert isinstance(store, RedisStore)
    assert store.prefix == "p"
    target = SentinelTarget.parse(store.url)
    assert target.sentinels == (("127.0.0.1", 7001), ("::1", 7002), ("other", 26379))
    assert (target.service, target.master) == (
        "mcpl",
        {"max_connections": 9, "db": 2, "username": "ann", "password": "s3cret"},
    )
    assert "s3cret" not in store._where

    refused = {
        "redis+sentinel://127.0.0.1:7001": "name the master as /SERVICE_NAME[/DB] after the Sentinel addresses",
        "redis+sentinel://ann:s3cret/x@127.0.0.1/mcpl": "Sentinel address 1 is not HOST[:PORT] (comma-separated)",
        "redis+sentinel://a:1,a:port/mcpl": "Sentinel address 2 is not HOST[:PORT] (comma-separated)",
        "redis+sentinel://a/mcpl/zero": "database 'zero' is not a number",
        "rediss+sentinel://a/mcpl?bogus=1": "unknown setting 'bogus'",
    }
    for spec, message in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)) as raised:
            open_store(spec)
        assert "\n" not in str(raised.value) and "s3cret" not in str(raised.value)


async def test_read_only_and_noreplicas_replies_are_outages_not_errors(tmp_path: Path) -> None:
    with redis_topology(tmp_path) as topology, topology.client(topology.primary) as primary:
        store = RedisStore(topology.endpoint_url, prefix=f"t-{uuid.uuid4().hex}")
        await store.open()
        try:
            await store.put_session(session("s1"))

            primary.config_set("min-replicas-to-write", 2)  # one replica: every write is refused
            with pytest.raises(StoreUnavailable, match="NOREPLICAS"):
                await store.put_session(session("s2"))
            primary.config_set("min-replicas-to-write", 0)
            await store.put_session(session("s2"))

            topology.wait_replicated()
            topology.flip_endpoint()  # to the replica, still a replica: a demoted master answers the same
            with pytest.raises(StoreUnavailable, match="read only replica"):
                await store.put_session(session("s3"))
            assert await store.get_session("s2") == session("s2"), "reads are still served"
        finally:
            await store.close()


async def test_a_store_on_a_flipped_endpoint_leaves_the_demoted_primary_for_the_promoted_replica(
    tmp_path: Path,
) -> None:
    with redis_topology(tmp_path) as topology:
        store = RedisStore(topology.endpoint_url, prefix=f"t-{uuid.uuid4().hex}")
        await store.open()
        try:
            await store.put_session(session("s1"))
            await store.open_stream(stream("k1"))
            await store.append(event("k1", 0))
            tail = asyncio.create_task(store.wait_events("k1", 0, 20))
            await anyio.to_thread.run_sync(_wait_blocked_in_xread, topology)
            topology.wait_replicated()

            topology.promote_replica()
            topology.demote_primary()
            topology.flip_endpoint(cut=False)  # the store's connections stay on the old primary, now a replica

            await store.append(event("k1", 1))  # READONLY there: the connection is dropped, the retry resolves anew
            assert await tail == [event("k1", 1)], "the blocked read, ended by UNBLOCKED, went on on the new primary"
            await store.put_session(session("s2"))
            with topology.client(topology.replica) as promoted:
                assert promoted.exists(f"{store.prefix}:{{s2}}:session")
            assert topology.role(topology.primary) == "slave"
        finally:
            await store.close()


def _wait_blocked_in_xread(topology: RedisTopology, timeout: float = 10) -> None:
    """Until the primary holds a client blocked in XREAD (readiness of another process: nothing to await)."""
    deadline = time.monotonic() + timeout
    with topology.client(topology.primary) as primary:
        while not any(c["cmd"] == "xread" and "b" in c["flags"] for c in primary.client_list()):
            assert time.monotonic() < deadline, "no client blocked in XREAD"
            time.sleep(0.01)


async def test_store_and_server_on_sentinel_carry_on_on_the_promoted_replica(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    with contextlib.ExitStack() as stack:
        topology = stack.enter_context(redis_topology(tmp_path / "redis", sentinels=3))
        prefix = f"t-{uuid.uuid4().hex[:12]}"
        spec = f"{topology.sentinel_url}?prefix={prefix}&lease_seconds=30"
        store = open_store(spec)
        assert isinstance(store, RedisStore)
        await store.open()
        try:
            server = ServerProcess(["--store", spec, "--retry-ms", "100"], free_port(), tmp_path / "serve.log")
            stack.callback(server.stop)
            await anyio.to_thread.run_sync(server.start)
            await _carry_on(topology, store, server, prefix, http)
        finally:
            await store.close()


async def _carry_on(
    topology: RedisTopology, store: RedisStore, server: ServerProcess, prefix: str, http: httpx.AsyncClient
) -> None:
    await store.put_session(session("before"))
    with topology.client(topology.primary) as primary:
        assert primary.exists(f"{prefix}:{{before}}:session"), "Sentinel named the primary as the master"
    peer = Peer(http, server.base, await dev_token(http, server.base, f"{server.base}/mcp"))
    await peer.initialize()
    first = await peer.post(call(1, "search", query="before", steps=1, delay_ms=0))
    assert first.messages[-1]["result"]["content"][0]["text"] == "search results for 'before': 3 documents"
    topology.wait_replicated()

    topology.kill_primary()

    # Until Sentinel promotes the replica (500 ms of silence, then a vote), the master is unreachable: explicit
    # outages, which the server answers 503 + Retry-After, never a 500.
    with pytest.raises(StoreUnavailable, match=f"master '{SERVICE}' via Sentinel"):
        await store.get_session("before")
    during = [
        await peer.post(call(2, "search", query="during")),
        await Peer(http, server.base, peer.token).post(_INITIALIZE),
    ]
    for refused in during:
        assert refused.status == 503, refused.body
        assert refused.headers["retry-after"] == "1"
        assert "event store unavailable" in refused.json()["error"]["message"]

    await anyio.to_thread.run_sync(topology.wait_sentinel_master)
    assert topology.role(topology.replica) == "master"

    assert await store.get_session("before") == session("before"), "the same store object found the new master"
    await store.put_session(session("after"))
    with topology.client(topology.replica) as promoted:
        assert promoted.exists(f"{prefix}:{{after}}:session")
    again = await peer.post(call(3, "search", query="after", steps=1, delay_ms=0))
    assert again.messages[-1]["result"]["content"][0]["text"] == "search results for 'after': 3 documents"
    newcomer = Peer(http, server.base, peer.token)
    await newcomer.initialize()
    fresh = await newcomer.post(call(1, "search", query="new", steps=2, delay_ms=0))
    assert fresh.messages[-1]["result"]["content"][0]["text"] == "search results for 'new': 3 documents"
    log = server.log.read_text()
    assert "Traceback" not in log, log
