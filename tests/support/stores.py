"""One event store of each kind for tests that run against every store: the kind a parametrized fixture names."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore

KINDS = ["memory", "sqlite", "redis"]
"""The ``params`` of such a fixture."""


def store_of_kind(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> EventStore:
    """A new store of the kind ``request.param`` names: SQLite in ``tmp_path``, Redis (the session's redis-server)
    under a key prefix of its own starting with ``prefix``."""
    if request.param == "memory":
        return MemoryStore()
    if request.param == "sqlite":
        return SqliteStore(str(tmp_path / "events.db"))
    return RedisStore(request.getfixturevalue("redis_url"), prefix=f"{prefix}-{uuid.uuid4().hex}")


def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A server's ``store`` setting of the kind ``request.param`` names, as :func:`store_of_kind` makes them."""
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'events.db'}"
    return f"{request.getfixturevalue('redis_url')}?prefix=spec-{uuid.uuid4().hex}"
