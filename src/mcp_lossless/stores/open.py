"""Building a store from its ``--store`` spec; kept apart from the interface, which no backend imports back."""

from __future__ import annotations

from .base import EventStore


def open_store(spec: str) -> EventStore:
    """Build a store from a CLI spec: ``memory``, ``sqlite:PATH[?settings]``, ``redis://…[?settings]`` or
    ``redis+sentinel://SENTINELS/SERVICE[/DB][?settings]`` (the master found by name, again after a failover).

    Each backend is imported only when chosen: the Redis client library is not loaded by a SQLite server.
    """
    if spec == "memory":
        from .memory import MemoryStore

        return MemoryStore()
    if spec.startswith("sqlite:"):
        from .sqlite import SqliteStore

        return SqliteStore.from_spec(spec.removeprefix("sqlite:"))
    if spec.startswith(("redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://")):
        from .redis import RedisStore

        return RedisStore.from_spec(spec)
    raise ValueError(
        f"unknown store {spec!r}: use memory, sqlite:PATH[?S=V], redis://HOST:PORT[/DB][?S=V] or "
        "redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB][?S=V]"
    )
