"""Tasks in Redis, visible to every replica: one hash per task, ``P:task:<id>``, written by Lua scripts.

Fields: ``record`` (the core's serialized task), ``terminal`` (``0``/``1``), ``seen`` (the owner's last
poll, kept outside the record so a poll is one small script), ``ttl`` and ``exp`` (seconds; empty for
unlimited). The key expires by itself a grace period after ``exp``, so an abandoned task costs nothing;
before that the core's own expiry answers for it. The scripts keep the store's two rules atomic on
every replica: a terminal task is never overwritten, and ``seen`` only moves forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

from redis import exceptions as rx

from ..core.tasks import TaskRecord, decode_task, encode_task
from .base import StoreUnavailable
from .redis import Client, connect, is_outage

EXPIRY_GRACE_SECONDS = 60.0
"""Redis drops a task this long after the core considers it expired (clock skew between replicas)."""

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


def _number(value: float | None) -> str:
    return "" if value is None else repr(value)


class RedisTaskStore:
    def __init__(self, url: str, *, prefix: str = "mcpl") -> None:
        self.url = url
        self.prefix = prefix
        self._redis: Client | None = None

    async def open(self) -> None:
        self._redis = connect(self.url, socket_timeout=5.0, socket_connect_timeout=2.0)  # any redis store spec

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    @contextlib.contextmanager
    def _guard(self) -> Iterator[Client]:
        if self._redis is None:
            raise RuntimeError("RedisTaskStore used before open()")
        try:
            yield self._redis
        except (
            rx.RedisError,
            rx.RedisClusterException,
            TimeoutError,
        ) as exc:  # NOREPLICAS (min-replicas-to-write), MISCONF… as well
            if not is_outage(exc):
                raise
            raise StoreUnavailable(f"redis task store unavailable: {exc or type(exc).__name__}") from exc

    def _key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def _fields(self, record: TaskRecord) -> list[Any]:
        terminal = "1" if record.status.terminal else "0"
        ttl, expires = _number(record.ttl), _number(record.expires_at)
        return [encode_task(record), terminal, repr(record.seen_at), ttl, expires, repr(EXPIRY_GRACE_SECONDS)]

    async def create(self, record: TaskRecord) -> None:
        body, terminal, seen, ttl, exp, _ = self._fields(record)
        key = self._key(record.task_id)
        with self._guard() as r:
            async with r.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"record": body, "terminal": terminal, "seen": seen, "ttl": ttl, "exp": exp})
                if record.expires_at is not None:
                    pipe.pexpireat(key, round((record.expires_at + EXPIRY_GRACE_SECONDS) * 1000))
                await pipe.execute()

    async def get(self, task_id: str) -> TaskRecord | None:
        with self._guard() as r:
            body, seen = cast(list[bytes | None], await r.hmget(self._key(task_id), ["record", "seen"]))
        if body is None or seen is None:
            return None
        record = decode_task(body)
        return replace(record, seen_at=max(record.seen_at, float(seen)))

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        with self._guard() as r:
            await r.eval(_UPDATE, 1, self._key(record.task_id), *self._fields(record))
        return await self.get(record.task_id)

    async def touch(self, task_id: str, now: float) -> None:
        with self._guard() as r:
            await r.eval(_TOUCH, 1, self._key(task_id), repr(now), repr(EXPIRY_GRACE_SECONDS))

    async def purge_expired(self, now: float) -> int:
        return 0  # Redis expires the keys itself
