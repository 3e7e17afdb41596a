from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.in_process import CLIENTS
from tests.support.redis_cluster import RedisClusterNodes, redis_cluster
from tests.support.redis_server import RedisServer, redis_server
from tests.support.uvicorn_server import lossless_server


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """Our server on loopback: embedded dev AS, memory store, demo tools, two dev clients."""

    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS, retry_ms=200))

    with lossless_server(make) as url:
        yield url


@pytest.fixture(scope="session")
def redis() -> Iterator[RedisServer]:
    """A real redis-server (Debian's package, installed if missing) on a free loopback port, persistence on."""
    with redis_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis: RedisServer) -> str:
    return redis.url


@pytest.fixture(scope="session")
def redis_cluster_nodes() -> Iterator[RedisClusterNodes]:
    """A Redis Cluster on loopback, three primaries with one replica each; tests that fail nodes over make their own."""
    with tempfile.TemporaryDirectory(prefix="mcpl-cluster-") as directory, redis_cluster(Path(directory)) as cluster:
        yield cluster
