"""The store factories: an event store from its ``--store`` spec, the task store beside an event store.

Kept apart from the interfaces (``base``, ``tasks``), which the backends import: a factory imports every backend,
so a factory in an interface module would close an import circle through each of them.
"""

from __future__ import annotations

import sys

from .base import EventStore
from .tasks import TaskStore

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


def task_store_beside(events: EventStore) -> TaskStore:
    """The task store that is a facet of ``events`` (ADR 0028): the same SQLite file, writer thread and schema; the
    same Redis client and prefix; process memory for the memory store (and for any other event store: pass a task
    store for it).

    A Redis event store can only exist once its module was imported, so that module is looked up, never
    imported: a SQLite server does not load the Redis client library for its tasks either.
    """
    from .sqlite import SqliteStore

    if isinstance(events, SqliteStore):
        from .tasks_sqlite import SqliteTaskStore

        return SqliteTaskStore(events)
    redis = sys.modules.get(f"{__package__}.redis")
    if redis is not None and isinstance(events, redis.RedisStore):
        from .tasks_redis import RedisTaskStore

        return RedisTaskStore(events)
    from .tasks_memory import MemoryTaskStore

    return MemoryTaskStore()
