"""Building a store from its ``--store`` spec; kept apart from the interface, which no backend imports back."""

from __future__ import annotations

from .base import EventStore

_REDIS_SCHEMES = (
    "redis://",
    "rediss://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
)


def open_store(spec: str) -> EventStore:
    """Build a store from a CLI spec: ``memory``, ``sqlite:PATH[?settings]``, ``redis://…[?settings]``,
    ``redis+sentinel://SENTINELS/SERVICE[/DB][?settings]`` (the master found by name, again after a failover) or
    ``redis+cluster://NODES[?settings]`` (a Redis Cluster, any of its nodes to start from).

    Each backend is imported only when chosen: the Redis client library is not loaded by a SQLite server.
    """
    if spec == "memory":
        from .memory import MemoryStore

        return MemoryStore()
    if spec.startswith("sqlite:"):
        from .sqlite import SqliteStore

        return SqliteStore.from_spec(spec.removeprefix("sqlite:"))
    if spec.startswith(_REDIS_SCHEMES):
        from .redis import RedisStore

        return RedisStore.from_spec(spec)
    raise ValueError(
        f"unknown store {spec!r}: use memory, sqlite:PATH[?S=V], redis://HOST:PORT[/DB][?S=V], "
        "redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB][?S=V] or redis+cluster://HOST:PORT[,HOST:PORT…][?S=V]"
    )
