"""A Redis Cluster on loopback: three primaries, each with one replica, made by ``redis-cli --cluster create``.

What a test of the ``redis+cluster://`` store needs to control, beside :mod:`tests.support.redis_topology` (one
primary, one replica, Sentinels):

- **Where a key lives**: :meth:`RedisClusterNodes.primary_of` names the node serving a key's slot now.
- **A graceful failover**: :meth:`RedisClusterNodes.failover` runs ``CLUSTER FAILOVER`` on a primary's replica,
  which waits for the replica to catch up, then swaps the roles (no acknowledged write is lost).
- **A crash**: :meth:`RedisClusterNodes.kill` SIGKILLs a node; with ``cluster-node-timeout`` 1000 ms its replica
  is promoted a second or two later (:meth:`RedisClusterNodes.wait_promoted`).

Every node persists as :mod:`tests.support.redis_server` does (append-only file, ``appendfsync always``,
``noeviction``) and binds 127.0.0.1; :func:`redis_cluster` stops every process it started.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from tests.support.debian import installed_binary
from tests.support.processes import free_port
from tests.support.redis_server import RedisServer, redis_server_binary

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: a primary silent this long is failing, and its replica takes over soon after."""
CREATE_OPTIONS = ("--cluster-replicas", "1", "--cluster-yes")
"""One replica per primary, and no prompt to accept the proposed layout."""
CLI_PACKAGE = "redis-tools"
"""Debian's package with ``redis-cli`` (which ``redis-server`` depends on, so it is usually there already)."""


def redis_cli_binary() -> str:
    """The path of ``redis-cli``, installing Debian's package first when it is not there."""
    redis_server_binary()  # the server first: its package pulls in the tools
    return installed_binary("redis-cli", CLI_PACKAGE)


class RedisClusterNodes:
    """The processes of one cluster; roles change with failovers, so every question asks the nodes."""

    def __init__(self, nodes: list[RedisServer]) -> None:
        self.nodes = nodes

    @property
    def spec(self) -> str:
        """``redis+cluster://`` store spec naming every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @staticmethod
    def client(node: RedisServer) -> redis.Redis:
        """A direct (synchronous, not cluster-aware) client of one node; the caller closes it."""
        return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5, socket_connect_timeout=2)

    def by_port(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def alive(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.proc is not None]

    def role(self, node: RedisServer) -> str:
        with self.client(node) as direct:
            return str(direct.info("replication")["role"])

    def primaries(self) -> list[RedisServer]:
        return [node for node in self.alive() if self.role(node) == "master"]

    def primary_of(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot, as a live primary's ``CLUSTER SLOTS`` has it now."""
        with self.client(self.primaries()[0]) as direct:
            slot = int(direct.execute_command("CLUSTER", "KEYSLOT", key))
            ranges = direct.execute_command("CLUSTER", "SLOTS")
        for low, high, owner, *_replicas in ranges:
            if int(low) <= slot <= int(high):
                return self.by_port(int(owner[1]))
        raise AssertionError(f"no node serves slot {slot} of {key!r}")

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """The live node replicating ``primary``."""
        for node in self.alive():
            with self.client(node) as direct:
                info = direct.info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == primary.port:
                return node
        raise AssertionError(f"no live replica of 127.0.0.1:{primary.port}")

    def failover(self, primary: RedisServer, timeout: float = 20) -> RedisServer:
        """``CLUSTER FAILOVER`` on ``primary``'s replica: it catches up, then takes over. Returns the new primary once
        both nodes report their new roles."""
        replica = self.replica_of(primary)
        with self.client(replica) as direct:
            direct.execute_command("CLUSTER", "FAILOVER")
        self._wait(lambda: self.role(replica) == "master" and self.role(primary) == "slave", timeout, "failover")
        return replica

    def kill(self, node: RedisServer) -> None:
        """SIGKILL, as a crash: its connections are reset and it answers nothing more."""
        node.kill()

    def wait_promoted(self, replica: RedisServer, timeout: float = 30) -> None:
        """Return once ``replica`` is a primary and every live node reports the cluster ``ok`` again."""
        self._wait(lambda: self.role(replica) == "master" and self._all_ok(), timeout, "promotion")

    def _all_ok(self) -> bool:
        for node in self.alive():
            with self.client(node) as direct:
                if direct.cluster("info")["cluster_state"] != "ok":
                    return False
        return True

    def _all_synced(self) -> bool:
        """Every replica's link is up and the append-only file it rewrites after a sync is written (until then
        redis-server refuses a SIGTERM)."""
        for node in self.alive():
            with self.client(node) as direct:
                info, persistence = direct.info("replication"), direct.info("persistence")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
            if persistence["aof_rewrite_in_progress"] or persistence["aof_rewrite_scheduled"]:
                return False
        return True

    @staticmethod
    def _wait(ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` every 50 ms until it holds, bounded by ``timeout``: readiness of other processes."""
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster {what} not done after {timeout}s")
            time.sleep(0.05)


@contextlib.contextmanager
def redis_cluster(directory: Path, primaries: int = 3) -> Iterator[RedisClusterNodes]:
    """Start twice ``primaries`` nodes with their data under ``directory`` (each with its cluster bus on a free port
    of its own, not Redis's port + 10000), join them as a cluster with one replica per primary, and return once every
    slot is served and every replica synced; stop them all on exit."""
    binary, cli = redis_server_binary(), redis_cli_binary()
    settings = [
        "--cluster-enabled",
        "yes",
        "--cluster-node-timeout",
        str(NODE_TIMEOUT_MS),
        "--repl-diskless-sync-delay",
        "0",
    ]
    with contextlib.ExitStack() as stack:
        nodes = []
        for number in range(2 * primaries):
            node_dir = directory / f"node-{number}"
            node_dir.mkdir(parents=True)
            bus = ["--cluster-port", str(free_port()), "--cluster-config-file", str(node_dir / "nodes.conf")]
            node = RedisServer(binary, node_dir, extra_args=[*settings, *bus])
            stack.callback(node.stop)
            node.start()
            nodes.append(node)
        create = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in nodes), *CREATE_OPTIONS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
        cluster = RedisClusterNodes(nodes)
        cluster._wait(lambda: cluster._all_ok() and cluster._all_synced(), 30, "start")
        yield cluster
