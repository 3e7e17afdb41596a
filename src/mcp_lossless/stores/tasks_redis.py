"""Tasks in Redis, visible to every replica: a facet of :class:`~.redis.RedisStore`, on its client.

The facet uses the event store's client (its connection pool, its Sentinel discovery, its timeouts and retries),
so a ``redis+sentinel://`` store keeps its tasks on the master Sentinel names and follows it through a failover,
as its events do (ADR 0028). It opens and closes nothing: the event store's owner does.

One hash per task, ``P:task:<id>``, written by Lua scripts. Fields: ``record`` (the core's serialized task),
``terminal`` (``0``/``1``), ``seen`` (the owner's last poll, kept outside the record so a poll is one small
script), ``ttl`` and ``exp`` (seconds; empty for unlimited). The key expires by itself a grace period after
``exp``, so an abandoned task costs nothing; before that the core's own expiry answers for it. The scripts keep
the store's two rules atomic on every replica: a terminal task is never overwritten, and ``seen`` only moves
forward. Each script touches one key only, so a task's writes stay within its hash slot.

``P:tasks`` indexes the tasks by their expiry as created (``+inf`` for unlimited): its size is the count the
``max_tasks`` limit is held to, and :meth:`RedisTaskStore.purge_expired` reads the candidates from it. A poll
only ever moves a task's expiry later, so a score is never later than the expiry it stands for; the purge reads
the true one from the hash before it deletes (and scores the task again if a poll moved it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

from redis import exceptions as rx

from ..core.principal import Principal
from ..core.tasks import TaskRecord, decode_task, encode_task, noted, owned, seen
from .base import StoreUnavailable
from .redis import RedisClient, RedisStore, is_outage
from .tasks import DEFAULT_MAX_TASKS, TaskLimitReached, limit_message

EXPIRY_GRACE_SECONDS = 60.0
"""Redis drops a task this long after the core considers it expired (clock skew between replicas)."""
PURGE_CHUNK = 500
"""Expired candidates one round of :meth:`RedisTaskStore.purge_expired` reads and checks."""

_CREATE = """
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'terminal', ARGV[2], 'seen', ARGV[3], 'ttl', ARGV[4], 'exp', ARGV[5])
if ARGV[5] ~= '' then
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.floor((tonumber(ARGV[5]) + tonumber(ARGV[6])) * 1000)))
end
return 1
"""
"""ARGV: as :data:`_UPDATE`'s. The hash and its expiry in one step: a task never lingers without one."""

_UPDATE = """
local cur = redis.call('HMGET', KEYS[1], 'terminal', 'seen')
if not cur[1] then return 0 end
if cur[1] == '1' then return 1 end
local seen = ARGV[3]
if tonumber(cur[2]) > tonumber(seen) then seen = cur[2] end
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'terminal', ARGV[2], 'seen', seen, 'ttl', ARGV[4], 'exp', ARGV[5])
if ARGV[4] == '' then redis.call('PERSIST', KEYS[1]) return 2 end
local exp = math.max(tonumber(ARGV[5]), tonumber(seen) + tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'exp', string.format('%.6f', exp))
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.floor((exp + tonumber(ARGV[6])) * 1000)))
return 2
"""
"""ARGV: record, terminal, seen, ttl, expiry (all from the record; empty for unlimited), grace seconds."""

_TOUCH = """
local cur = redis.call('HMGET', KEYS[1], 'seen', 'ttl', 'exp')
if not cur[1] then return 0 end
local now = tonumber(ARGV[1])
if now <= tonumber(cur[1]) then return 1 end
redis.call('HSET', KEYS[1], 'seen', ARGV[1])
if cur[2] ~= '' then
  local exp = math.max(tonumber(cur[3]), now + tonumber(cur[2]))
  redis.call('HSET', KEYS[1], 'exp', string.format('%.6f', exp))
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.floor((exp + tonumber(ARGV[2])) * 1000)))
end
return 2
"""
"""ARGV: now, grace seconds. The expiry moves to ``now + ttl`` at least, like the core's rule."""

_PURGE_ONE = """
local exp = redis.call('HGET', KEYS[1], 'exp')
if not exp then return 'gone' end
if exp ~= '' and tonumber(exp) < tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) return 'gone' end
return exp
"""
"""ARGV: now. Deletes the task if it expired before ``now``; else returns its expiry (empty: unlimited)."""

_GONE = b"gone"


def _number(value: float | None) -> str:
    return "" if value is None else repr(value)


class RedisTaskStore:
    """The tasks of ``events``' Redis under its prefix, at most ``max_tasks`` of them."""

    def __init__(self, events: RedisStore, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        if max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self.events = events
        self.prefix = events.prefix
        self.max_tasks = max_tasks
        self._index = f"{self.prefix}:tasks"

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @contextlib.contextmanager
    def _guard(self) -> Iterator[RedisClient]:
        try:
            yield self.events.client
        except (
            rx.RedisError,
            rx.RedisClusterException,
            TimeoutError,
        ) as exc:  # NOREPLICAS (min-replicas-to-write), MISCONF… as well
            if not is_outage(exc):
                raise
            where = self.events.where
            raise StoreUnavailable(f"redis task store at {where} unavailable: {exc or type(exc).__name__}") from exc

    def _key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def _fields(self, record: TaskRecord) -> list[Any]:
        terminal = "1" if record.status.terminal else "0"
        ttl, expires = _number(record.ttl), _number(record.expires_at)
        return [encode_task(record), terminal, repr(record.seen_at), ttl, expires, repr(EXPIRY_GRACE_SECONDS)]

    async def create(self, record: TaskRecord) -> None:
        with self._guard() as r:
            if await r.zcard(self._index) >= self.max_tasks:
                await self.purge_expired(record.created_at)
                if await r.zcard(self._index) >= self.max_tasks:
                    raise TaskLimitReached(limit_message(self.max_tasks))
            score = float("inf") if record.expires_at is None else record.expires_at
            writes = await self.events.writes()  # acknowledged as the event store's writes are (wait_replicas)
            writes.on(self._index).zadd(self._index, {record.task_id: score})  # counted before it exists
            key = self._key(record.task_id)
            writes.on(key).eval(_CREATE, 1, key, *self._fields(record))
            await writes.execute()

    async def get(self, task_id: str) -> TaskRecord | None:
        with self._guard() as r:
            body, polled = cast(list[bytes | None], await r.hmget(self._key(task_id), ["record", "seen"]))
        if body is None or polled is None:
            return None
        record = decode_task(body)
        return seen(record, float(polled))

    async def poll(self, task_id: str, principal: Principal, now: float) -> TaskRecord | None:
        record = await self.get(task_id)
        if record is None or not owned(record, task_id, principal, now) or not noted(record, now):
            return record
        await self._touch(task_id, now)  # its script only moves seen_at forward, whatever another replica wrote
        return seen(record, now)

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        with self._guard():
            writes = await self.events.writes()  # a task's outcome counts once the replicas hold it
            key = self._key(record.task_id)
            writes.on(key).eval(_UPDATE, 1, key, *self._fields(record))
            await writes.execute()
        return await self.get(record.task_id)

    async def _touch(self, task_id: str, now: float) -> None:
        with self._guard() as r:
            await r.eval(_TOUCH, 1, self._key(task_id), repr(now), repr(EXPIRY_GRACE_SECONDS))

    async def purge_expired(self, now: float) -> int:
        """Delete the indexed tasks expired before ``now`` (Redis may have dropped their hashes already, a grace
        period after; they count as purged here all the same, as they would have in the other stores)."""
        purged = 0
        with self._guard() as r:
            while True:
                due = cast(list[bytes], await r.zrangebyscore(self._index, "-inf", f"({now!r}", 0, PURGE_CHUNK))
                if not due:
                    return purged
                async with r.pipeline(transaction=False) as pipe:
                    for task_id in due:
                        pipe.eval(_PURGE_ONE, 1, self._key(task_id.decode()), repr(now))
                    found = cast(list[bytes], await pipe.execute())
                gone = [task_id for task_id, exp in zip(due, found, strict=True) if exp == _GONE]
                later = {task_id: float(exp or "inf") for task_id, exp in zip(due, found, strict=True) if exp != _GONE}
                async with r.pipeline(transaction=False) as pipe:
                    if gone:
                        pipe.zrem(self._index, *gone)
                    if later:  # polled since: scored by the expiry its polls moved it to
                        pipe.zadd(self._index, later, xx=True)
                    await pipe.execute()
                purged += len(gone)
                if len(due) < PURGE_CHUNK:
                    return purged
