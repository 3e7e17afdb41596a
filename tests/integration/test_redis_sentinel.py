"""Redis failover, staged with real processes: the topology harness itself, and the store behind Sentinel.

tests/support/redis_topology.py starts a primary, a replica replicating through a relay the test can freeze,
an endpoint relay it can flip, and Sentinels. These tests check that the harness does what failover scenarios
rely on (a frozen link loses exactly the writes made meanwhile), and that a ``redis+sentinel://`` store, and a
``serve`` process on one, find the master again after Sentinel promoted the replica.
"""

from __future__ import annotations

from pathlib import Path

import redis

from tests.support.redis_topology import redis_topology


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
