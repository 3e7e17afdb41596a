"""A shared store on Redis: several server replicas see the same sessions, streams and events.

Key layout (``P`` is the prefix; ``{sid}`` is a Redis Cluster hash tag, so one session's keys share a slot):

- ``P:secret`` — the event-id MAC secret, created with ``SET NX`` so every replica uses the first one.
- ``P:sessions`` — sorted set session id → last_seen, what :meth:`RedisStore.expire_sessions` scans.
- ``P:instance:<id>`` — a replica's lease, refreshed every ``lease_seconds / 3`` while it runs.
- ``P:streamidx:<stream>`` — stream key → session id. Event ids name only the stream, so this one extra
  lookup (cached in process: the mapping never changes) finds the session slot of a stream.
- ``P:{sid}:session`` — hash: the principal binding, protocol version, created/last_seen; it expires
  ``retention_seconds`` after the last touch.
- ``P:{sid}:streams`` — sorted set of the session's streams, scored by when their keys expire
  (``+inf`` while open), so deleting a session finds every stream still retained.
- ``P:{sid}:s:<stream>`` — hash: the stream record (kind, owner, requests, last, first, done; ``keep``, when
  its idempotency keys expire, for a keyed stream) and one ``a:<request id JSON>`` field per answered request.
- ``P:{sid}:e:<stream>`` — a Redis Stream holding the events. Event ``seq`` is stored at entry id
  ``<seq>-1``: ids order by their first part, so entries order by position and "after ``seq``" is the
  exclusive id ``(<seq>-1`` for XRANGE and ``<seq>-1`` for XREAD (``0-0``, the only id below ``0-1``, is
  not a valid entry id, hence the ``-1``). Every entry has the same six fields in the same order
  (``i`` compact event id, ``r`` request id JSON, ``t`` tool JSON, ``g`` resource tags JSON, ``x``
  terminal, ``d`` data), which lets Redis store the field names once per node instead of per entry.
- ``P:key:<SHA-256 of the principal and key>`` — an idempotency key (ADR 0029): JSON ``[tool, arguments hash,
  session id, stream, request id, created, expires]``, expiring with the key. Written with ``SET NX`` in the
  pipeline of its stream's record, after the record, so that whoever finds the key finds the stream too, and
  exactly one of several concurrent first uses (on any replica) holds it; a loser deletes its stream record.

Appends run as one Lua script on the session's slot: the entry, ``last``, the answered request and the
advanced ``first`` after a length trim are written together or not at all. The script also refuses a
position already written with other content, so an instance that lost its stream to another one
(lease expired, stream claimed and ended) cannot overwrite the explicit error the other one stored.

Reads are all-or-error: a cursor below ``first`` raises :class:`EventsEvicted`, and so does a read that
finds fewer entries than the record says exist (keys evicted by a ``maxmemory-policy`` other than
``noeviction``). Every Redis failure (refused, reset, timed out, loading, read-only, out of memory)
raises :class:`StoreUnavailable`; the client reconnects on the next call once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import orjson
from redis import exceptions as rx
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.sentinel import DEMOTED_MASTER_UNBLOCKED_ERROR
from redis.typing import EncodableT

from ..core.events import Loss, StoredEvent, StreamKind, StreamRecord
from ..core.idempotency import KeyRecord, StreamTarget
from ..core.principal import Principal
from ._codec import (
    CACHE_LIMIT,
    Interner,
    compact_event_id,
    decode_requests,
    encode_json,
    encode_requests,
    encode_tags,
    full_event_id,
)
from .base import EventsEvicted, EventsLost, KeyTaken, SessionRecord, StoreUnavailable, StreamTakenOver
from .held import ExpiringHeld, HeldKeys

log = logging.getLogger("mcp_lossless.stores.redis")

SOCKET_TIMEOUT = 2.0
"""Seconds a reply may take: a hung Redis becomes a 503 quickly instead of a stalled request."""
CONNECT_TIMEOUT = 1.0
_RETRIES = 1
"""One quick retry: a pooled connection that died with a Redis restart is replaced transparently."""
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
"""Specs naming Sentinels and a service rather than one Redis: the master is looked up by name."""
SENTINEL_PORT = 26379
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
"""Specs naming nodes of a Redis Cluster: any of them tells redis-py the slot map, and it routes each key."""
REDIS_PORT = 6379
_SENTINEL_SETTINGS = ("sentinel_username", "sentinel_password")
"""Query parameters of a ``redis+sentinel://`` spec that are the Sentinels' own credentials, not the master's."""
_OUTAGE_REPLIES = ("MISCONF", "NOREPLICAS", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "LOADING")
"""Error replies that mean "cannot serve now" rather than "bad command" (OOM and READONLY have classes)."""

_MARK_COMPLETE = """
local function mark_complete(ms, expiry, stream)
  local keep = tonumber(redis.call('HGET', KEYS[1], 'keep') or '0')
  if keep > tonumber(expiry) then
    ms = tonumber(ms) + math.ceil((keep - tonumber(expiry)) * 1000)
    expiry = keep
  end
  redis.call('HSET', KEYS[1], 'done', 1)
  redis.call('PEXPIRE', KEYS[1], ms)
  redis.call('PEXPIRE', KEYS[2], ms)
  redis.call('ZADD', KEYS[3], expiry, stream)
end
"""
"""What completing a stream means, for the scripts that do it. KEYS: record, events, session's streams. A keyed
stream is kept until its keys expire (``keep``) if that is later than the retention: a key's outcome is its
stream's answer."""

_DROP_KEY = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
"""KEYS: an idempotency key. ARGV: the value this process set. Deletes the key only if it is still that one."""

_APPEND = (
    _MARK_COMPLETE
    + """
local record = redis.call('HMGET', KEYS[1], 'last', 'lost')
local last = record[1]
if not last then return 'unknown' end
if record[2] then return 'taken' end
local seq = tonumber(ARGV[1])
local id = ARGV[1] .. '-1'
if seq <= tonumber(last) then
  local found = redis.call('XRANGE', KEYS[2], id, id)
  if #found == 1 and found[1][2][12] == ARGV[7] then
    redis.call('HSET', KEYS[1], 'last', last)
    return 'duplicate'
  end
  return 'taken'
end
if seq ~= tonumber(last) + 1 then return {'gap', tonumber(last)} end
local maxlen = tonumber(ARGV[9])
if maxlen > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', maxlen, id,
    'i', ARGV[2], 'r', ARGV[3], 't', ARGV[4], 'g', ARGV[5], 'x', ARGV[6], 'd', ARGV[7])
  local first = seq - maxlen + 1
  if first > tonumber(redis.call('HGET', KEYS[1], 'first')) then
    redis.call('HSET', KEYS[1], 'first', first)
  end
else
  redis.call('XADD', KEYS[2], id,
    'i', ARGV[2], 'r', ARGV[3], 't', ARGV[4], 'g', ARGV[5], 'x', ARGV[6], 'd', ARGV[7])
end
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'last', seq, ARGV[8], 1)
else
  redis.call('HSET', KEYS[1], 'last', seq)
end
if ARGV[10] ~= '' then mark_complete(ARGV[10], ARGV[11], ARGV[12]) end
return 'ok'
"""
)
"""KEYS: record, events, session's streams. ARGV: seq, i, r, t, g, x, d, answered field or '', maxlen (0: none),
then, when the event completes the stream: retention ms or '', expiry time, stream key.

A retried append whose first attempt was stored (reply lost) finds its own entry: ``duplicate``, fine (a
completing one completed the stream in that same first attempt); it writes ``last`` again, so that a ``WAIT``
after it waits for replicas to hold that entry too. A gap answers with the last position the store holds: it
lost the positions after it (:class:`EventsLost`). A stream ended as lost takes no more events (``taken``).
"""

_MARK_LOST = (
    _MARK_COMPLETE
    + """
local record = redis.call('HMGET', KEYS[1], 'owner', 'done')
if not record[1] then return 'unknown' end
if record[2] ~= '1' then
  if record[1] ~= ARGV[1] then return 'taken' end
  redis.call('HSET', KEYS[1], 'lost', ARGV[2])
  mark_complete(ARGV[3], ARGV[4], ARGV[5])
end
return 'ok'
"""
)
"""KEYS: record, events, session's streams. ARGV: expected owner, loss, then ``mark_complete``'s. A stream already
ended is left as it is, so a retry, or another replica ending it too, is safe."""

_COMPLETE = (
    _MARK_COMPLETE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
mark_complete(ARGV[1], ARGV[2], ARGV[3])
return 1
"""
)
"""KEYS: record, events, session's streams. ARGV: retention ms, expiry time, stream key."""

_OUTLIVE = """
local keep = tonumber(redis.call('HGET', KEYS[1], 'keep') or '0')
if keep <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 0
end
if redis.call('HGET', KEYS[1], 'done') ~= '1' then
  redis.call('HSET', KEYS[1], 'lost', ARGV[2], 'done', 1)
end
local at = math.ceil(keep * 1000)
redis.call('PEXPIREAT', KEYS[1], at)
redis.call('PEXPIREAT', KEYS[2], at)
return at
"""
"""KEYS: a stream's record and events, its session being deleted. ARGV: now, the loss of a running stream. A stream
its live idempotency keys keep (``keep``) outlives the session until they expire (their expiry in ms; a running
one ended as lost: the session's calls end with it); any other goes (0)."""

_TOUCH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'seen', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
"""KEYS: session. ARGV: last_seen, retention ms. Never creates a partial session hash."""


_QueuedAppend = tuple[StoredEvent, bool, "asyncio.Future[None]"]
_PIPELINE_LIMIT = 32
"""Appends one pipeline carries at most. Encoding a pipeline and parsing its replies run on the event loop
without a pause, ~0.3 ms per append on a busy 2-core box: at 1,024 a flood held the loop for 20-100 ms at a
time (issue 11, H1); at 32 the longest stall under a 50,000-step flood is ~35 ms, for the same throughput."""


def _append_outcome(event: StoredEvent, reply: Any) -> Exception | None:
    """What the append script's reply means for the appending task: ``None`` when the event is stored."""
    if reply in (b"ok", b"duplicate"):
        return None
    if reply == b"unknown":  # its record was written before any of its events were handed over: the store lost it
        return EventsLost(f"stream {event.stream} is unknown to the store at its position {event.seq}", None)
    if reply == b"taken":
        return StreamTakenOver(
            f"position {event.seq} of stream {event.stream} was already written by another instance, or the stream"
            " was ended as lost"
        )
    if isinstance(reply, list) and reply[:1] == [b"gap"]:
        held = int(reply[1])
        message = f"the store holds stream {event.stream} up to {held}, not {event.seq - 1}: it lost events"
        return EventsLost(message, held)
    if isinstance(reply, rx.NoScriptError) or (isinstance(reply, Exception) and is_outage(reply)):
        # NOSCRIPT after the script was loaded: the batch reached another node (a failover between the two)
        return StoreUnavailable(f"redis store unavailable: {reply}")
    return reply if isinstance(reply, Exception) else RuntimeError(f"append script answered {reply!r}")


def _seq_of(entry_id: bytes) -> int:
    return int(entry_id[: entry_id.index(b"-")])


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://[user:pass@]host[:port][,host[:port]...]/SERVICE[/DB][?settings]`` spec names.

    ``user:pass`` and the redis-py settings are the master's (as in a ``redis://`` spec); the Sentinels get
    their own credentials from ``sentinel_username`` / ``sentinel_password`` and, with ``rediss+sentinel://``,
    TLS and the ``ssl_*`` settings as the master does.
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    master: dict[str, Any]
    """redis-py connection settings of the master: ``db``, credentials, ``ssl``, query settings."""
    sentinel: dict[str, Any]
    """redis-py connection settings of each Sentinel."""

    @classmethod
    def parse(cls, url: str) -> SentinelTarget:
        """Split ``url``; a malformed one is a one-line :class:`ValueError` that never repeats the password."""
        scheme, _, rest = url.partition("://")
        netloc, slash, tail = rest.partition("/")
        path, _, query = tail.partition("?")
        if "?" in netloc:
            raise ValueError("redis+sentinel store: the spec needs /SERVICE_NAME after the Sentinel addresses")
        userinfo, _, hosts = netloc.rpartition("@")
        sentinels = tuple(
            _address("redis+sentinel store: Sentinel", number, host, SENTINEL_PORT)
            for number, host in enumerate(hosts.split(","), 1)
        )
        names = path.split("/") if slash else []
        if not 1 <= len(names) <= 2 or not names[0]:
            raise ValueError("redis+sentinel store: name the master as /SERVICE_NAME[/DB] after the Sentinel addresses")
        settings = dict(parse_qsl(query, keep_blank_values=True))
        own = [name for name in _SENTINEL_SETTINGS if name in settings]
        sentinel: dict[str, Any] = {name.removeprefix("sentinel_"): settings.pop(name) for name in own}
        master: dict[str, Any] = dict(parse_url(f"redis://localhost?{urlencode(settings)}"))  # redis-py's typing
        del master["host"]
        if len(names) == 2 and "db" not in master:  # a db query setting wins, as redis-py does for redis://
            if not names[1].isdigit():
                raise ValueError(f"redis+sentinel store: database {names[1]!r} is not a number")
            master["db"] = int(names[1])
        if userinfo:
            user, has_password, password = userinfo.partition(":")
            if user:
                master["username"] = unquote(user)
            if has_password:
                master["password"] = unquote(password)
        if scheme == "rediss+sentinel":
            master["ssl"] = True
            sentinel.update({name: value for name, value in master.items() if name.startswith("ssl")})
        return cls(sentinels, unquote(names[0]), master, sentinel)

    def check(self) -> None:
        """Refuse a setting redis-py does not know now, rather than at the first connection (a TypeError then)."""
        settings = {name: value for name, value in self.master.items() if name != "ssl"}
        pool = ConnectionPool(connection_class=SSLConnection if self.master.get("ssl") else Connection, **settings)
        pool.connection_class(**pool.connection_kwargs)  # what the pool itself takes (max_connections) it keeps

    def describe(self) -> str:
        """For messages: the service and Sentinel addresses, never a credential."""
        return f"master {self.service!r} via Sentinel {','.join(f'{host}:{port}' for host, port in self.sentinels)}"


def _address(what: str, number: int, text: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[IPv6]:port`` (the port defaults to ``default_port``).

    A bad one is named by its number, not its text: a password with an unescaped ``/`` or ``@`` would end up
    in the addresses, and messages never show a password.
    """
    malformed = False
    if text.startswith("["):
        host, _, after = text[1:].partition("]")
        malformed = bool(after) and not after.startswith(":")
        port = after[1:] if after else str(default_port)
    else:
        host, colon, port = text.rpartition(":")
        if not colon:
            host, port = text, str(default_port)
    if malformed or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} address {number} is not HOST[:PORT] (comma-separated)")
    return host, int(port)


@dataclass(frozen=True)
class ClusterTarget:
    """What a ``redis+cluster://[user:pass@]host[:port][,host[:port]...][/][?settings]`` spec names: startup nodes
    (any reachable one tells redis-py the slot map) and the redis-py settings of every node connection
    (``rediss+cluster://``: TLS). A cluster has one database, so the spec has no ``/DB``.
    """

    nodes: tuple[tuple[str, int], ...]
    settings: dict[str, Any]

    @classmethod
    def parse(cls, url: str) -> ClusterTarget:
        """Split ``url``; a malformed one is a one-line :class:`ValueError` that never repeats the password."""
        scheme, _, rest = url.partition("://")
        netloc, _, tail = rest.partition("/")
        netloc, _, query = netloc.partition("?")
        path, _, path_query = tail.partition("?")
        if path:
            raise ValueError("redis+cluster store: a cluster has one database: nothing goes after the node addresses")
        userinfo, _, hosts = netloc.rpartition("@")
        nodes = tuple(
            _address("redis+cluster store: node", number, host, REDIS_PORT)
            for number, host in enumerate(hosts.split(","), 1)
        )
        settings: dict[str, Any] = dict(parse_url(f"redis://localhost?{query or path_query}"))  # redis-py's typing
        del settings["host"]
        if userinfo:
            user, has_password, password = userinfo.partition(":")
            if user:
                settings["username"] = unquote(user)
            if has_password:
                settings["password"] = unquote(password)
        if scheme == "rediss+cluster":
            settings["ssl"] = True
        return cls(nodes, settings)

    def client(self, **defaults: Any) -> RedisCluster:
        """A cluster client of these nodes; the spec's settings win over ``defaults``, as in a ``redis://`` spec."""
        startup = [ClusterNode(host, port) for host, port in self.nodes]
        try:
            return RedisCluster(startup_nodes=startup, **{**defaults, **self.settings})
        except rx.RedisClusterException as exc:  # e.g. db=1: a cluster has only database 0
            raise ValueError(f"redis+cluster store: {exc}") from None

    def node_client(self, host: str, port: int, **defaults: Any) -> Redis:
        """A plain (not cluster-aware) client of one node, with the same settings as the cluster client's."""
        return Redis(host=host, port=port, **{**defaults, **self.settings})

    def describe(self) -> str:
        """For messages: the startup nodes, never a credential."""
        return "Redis Cluster via " + ",".join(f"{host}:{port}" for host, port in self.nodes)


_OUTAGE_ERRORS = (
    rx.ConnectionError,  # refused, reset, LOADING, no master known to Sentinel, a demoted master (redis-py's mapping)
    rx.TimeoutError,
    TimeoutError,
    rx.OutOfMemoryError,
    rx.ReadOnlyError,
    rx.ClusterDownError,  # MASTERDOWN too: a replica cut off from its master, with replica-serve-stale-data no
    rx.TryAgainError,
    rx.SlotNotCoveredError,  # a cluster with a slot no live primary serves (a failover not done yet)
    rx.RedisClusterUnreachableError,  # no startup or known node answers
)
"""redis-py's classes for "Redis cannot serve now"; they carry the reply without its code, so a prefix test misses
them."""


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means "Redis cannot serve now" (retry later) rather than a bad command.

    Replies redis-py has no class for (NOREPLICAS, MISCONF, BUSY) are told by their code, also when a pipeline
    prefixed them with ``Command # N (…) of pipeline caused error:``.
    """
    if isinstance(exc, _OUTAGE_ERRORS):
        return True
    reply = str(exc).rpartition(" of pipeline caused error: ")[2]
    return isinstance(exc, rx.ResponseError) and reply.startswith(_OUTAGE_REPLIES)


class _PrimaryConnection(Connection):
    """A connection to the node a ``redis://`` name points at, dropped once that node answers as a replica.

    A managed Redis fails over by moving its endpoint's DNS name to the promoted node; the old one may live on
    as a replica. Connections made before the flip still reach it, and it refuses every write (``READONLY``)
    or ends a blocking read (``UNBLOCKED``) without closing them: a pooled connection would keep answering
    "unavailable" for as long as it lives. Dropping it makes the next connection resolve the name again, as
    redis-py's Sentinel connections do when their master is demoted.
    """

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except rx.ReadOnlyError as exc:
            await self.disconnect()
            raise rx.ConnectionError(f"the node is a read-only replica now: {exc}") from exc
        except rx.ResponseError as exc:
            if not str(exc).startswith(DEMOTED_MASTER_UNBLOCKED_ERROR):
                raise
            await self.disconnect()
            raise rx.ConnectionError(f"the node became a replica: {exc}") from exc


class _PrimarySSLConnection(_PrimaryConnection, SSLConnection):
    """:class:`_PrimaryConnection` over TLS (``rediss://``)."""


class _SentinelMaster(Redis):
    """A client of the master that Sentinel names; closing it also closes its connections to the Sentinels."""

    discovery: Sentinel | None = None
    """The Sentinels' clients (not ``sentinel``: that is the SENTINEL command's method)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            if self.discovery is not None:
                await self.discovery.aclose()


RedisClient = Redis | RedisCluster
"""A client of one Redis master (direct or found through Sentinel) or of a Redis Cluster."""


def connect(url: str, *, socket_timeout: float | None, socket_connect_timeout: float, **settings: Any) -> RedisClient:
    """A client of the Redis master ``url`` names: ``redis://`` / ``rediss://`` directly, ``redis+sentinel://``
    through Sentinel. There every new connection asks the Sentinels for the master's address, so after a
    failover the next command reaches the promoted replica; until then a dead or demoted master is a
    connection error (redis-py turns a READONLY reply from a demoted master into one, and so does
    :class:`_PrimaryConnection` for ``redis://``), which the stores report as :class:`StoreUnavailable`.
    ``redis+cluster://`` is redis-py's cluster client: it routes each command by its key's slot, follows
    ``MOVED`` replies and refreshes its slot map after a failover.
    Settings in the URL win over the keyword arguments, as redis-py's do.
    """
    defaults = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout, **settings}
    if url.startswith(CLUSTER_SCHEMES):
        return ClusterTarget.parse(url).client(**defaults)
    if not url.startswith(SENTINEL_SCHEMES):
        primary = _PrimarySSLConnection if url.startswith("rediss://") else _PrimaryConnection
        return Redis.from_url(url, connection_class=primary, **defaults)
    target = SentinelTarget.parse(url)
    sentinel_settings = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": socket_connect_timeout}
    sentinel = Sentinel(target.sentinels, sentinel_kwargs={**sentinel_settings, **target.sentinel})
    master = sentinel.master_for(target.service, redis_class=_SentinelMaster, **{**defaults, **target.master})
    client = cast(_SentinelMaster, master)
    client.discovery = sentinel
    return client


class _Writes:
    """The write pipeline of one store operation, ended by ``WAIT`` (:meth:`RedisStore._acknowledge`): one pipeline,
    except on a Redis Cluster with ``wait_replicas``.

    ``WAIT`` counts the replicas holding the writes sent before it *on its own connection*, and on a cluster it is a
    node's own. redis-py's cluster pipeline may send a command again on another connection (after ``MOVED`` or
    ``ASK``, or a retry after a slot map refresh) and routes a keyless ``WAIT`` by a rule of its own, so a ``WAIT`` in
    it could confirm writes it did not cover. With ``cluster`` given, each write goes instead on a plain pipeline to
    the primary the cluster client's slot map names for its key, and each of those pipelines ends with its own
    ``WAIT``: the node's writes and their acknowledgement share one connection. A write whose slot moved meanwhile is
    answered ``MOVED`` and never sent elsewhere: the operation is an outage (retried, as every write is), and the
    cluster client corrects its slot map first (:meth:`RedisStore._correct_slots`).
    """

    def __init__(self, store: RedisStore, cluster: RedisCluster | None) -> None:
        self._store = store
        self._cluster = cluster
        self._pipes: dict[str, Pipeline | ClusterPipeline] = {}
        self._keys: dict[str, list[str]] = {}
        """Keys written per pipeline: what :meth:`RedisStore._correct_slots` asks about after a failure."""
        self._order: list[tuple[str, int]] = []
        """Each command's pipeline and place in it, in the order they were queued."""

    def on(self, key: str) -> Pipeline | ClusterPipeline:
        """The pipeline for the next command, a write of ``key``: queue exactly one command on it."""
        if self._cluster is None:
            name = ""
            make = functools.partial(self._store._r.pipeline, transaction=False)
        else:
            node = self._cluster.get_node_from_key(key)
            if node is None:
                raise rx.SlotNotCoveredError(f"no primary serves the slot of {key}")
            name = node.name
            make = functools.partial(self._store._node_client(node).pipeline, transaction=False)
        pipe = self._pipes.get(name)
        if pipe is None:
            pipe = self._pipes[name] = make()
        self._keys.setdefault(name, []).append(key)
        self._order.append((name, len(pipe)))
        return pipe

    async def execute(self, *, raise_on_error: bool = True) -> list[Any]:
        """Every reply in the order the commands were queued, errors among them unless ``raise_on_error`` (then the
        first is raised). A pipeline whose ``WAIT`` fell short, or in which a slot had moved, answers
        :class:`StoreUnavailable` for each of its commands, and one that failed as a whole its error: the other
        pipelines' replies stand, so one node's outage does not hold back writes the others acknowledged."""
        names = list(self._pipes)
        for pipe in self._pipes.values():
            self._store._acknowledge(pipe)
        outcomes: list[list[Any] | BaseException]
        if len(self._pipes) == 1:  # the usual case, and all there is without a cluster: no task for one pipeline
            try:
                outcomes = [await self._pipes[names[0]].execute(raise_on_error=False)]
            except Exception as exc:
                outcomes = [exc]
        else:
            sent = [pipe.execute(raise_on_error=False) for pipe in self._pipes.values()]
            outcomes = await asyncio.gather(*sent, return_exceptions=True)
        misrouted = [name for name, outcome in zip(names, outcomes, strict=True) if _misrouted(outcome)]
        if self._cluster is not None and misrouted:
            await self._store._correct_slots([self._keys[name][0] for name in misrouted])
        replies = {name: self._replies(name, outcome) for name, outcome in zip(names, outcomes, strict=True)}
        ordered = [replies[name][place] for name, place in self._order]
        errors = [reply for reply in ordered if isinstance(reply, Exception)]
        if raise_on_error and errors:
            raise errors[0]
        return ordered

    def _replies(self, name: str, outcome: list[Any] | BaseException) -> list[Any]:
        count = len(self._keys[name])
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):  # cancelled: not a reply
                raise outcome
            return [outcome] * count
        try:
            replies = self._store._acknowledged(outcome)
        except StoreUnavailable as exc:  # not held by enough replicas: none of this pipeline counts as stored
            return [exc] * count
        if self._cluster is not None and _misrouted(replies):
            moved = StoreUnavailable(f"redis store at {self._store._where}: a slot moved under a write to {name}")
            return [moved] * count
        return replies


def _misrouted(outcome: Any) -> bool:
    """Whether a node pipeline failed as a whole (its node may be gone), or a write in it met a slot served elsewhere
    now (``MOVED``, or ``ASK`` while the slot migrates: redis-py's ``MovedError`` is an ``AskError``)."""
    return isinstance(outcome, BaseException) or any(isinstance(reply, rx.AskError) for reply in outcome)


class RedisStore:
    """The :class:`~mcp_lossless.stores.base.EventStore` shared by every replica pointed at one Redis."""

    shared = True

    PARAMETERS: ClassVar[dict[str, type]] = {
        "prefix": str,
        "retention_seconds": float,
        "max_events_per_stream": int,
        "lease_seconds": float,
        "wait_replicas": int,
        "wait_timeout_ms": int,
    }
    """Store settings a ``redis://``, ``redis+sentinel://`` or ``redis+cluster://`` spec may carry as query
    parameters (others go to redis-py, or are the Sentinels' credentials)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "mcpl",
        retention_seconds: float = 3600,
        max_events_per_stream: int | None = 10_000,
        lease_seconds: float = 5.0,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError("redis prefix must be non-empty and free of '{' and '}' (they mark hash tags)")
        if retention_seconds <= 0 or lease_seconds <= 0:
            raise ValueError("retention_seconds and lease_seconds must be positive")
        if max_events_per_stream is not None and max_events_per_stream < 1:
            raise ValueError("max_events_per_stream must be at least 1")
        if wait_replicas < 0 or wait_timeout_ms < 1:
            raise ValueError("wait_replicas must be 0 or more and wait_timeout_ms at least 1 (WAIT 0 blocks for ever)")
        self.url = url
        self.prefix = prefix
        self.retention_seconds = retention_seconds
        self.max_events_per_stream = max_events_per_stream
        self.lease_seconds = lease_seconds
        self.wait_replicas = wait_replicas
        """Replicas that must hold a write (``WAIT``) before it counts as stored: before an event is published, a
        stream or session record is used (0: the primary's word, as Redis replication is asynchronous)."""
        self.wait_timeout_ms = wait_timeout_ms
        self._cluster = ClusterTarget.parse(url) if url.startswith(CLUSTER_SCHEMES) else None
        if url.startswith(SENTINEL_SCHEMES):
            self._where = SentinelTarget.parse(url).describe()
        elif self._cluster is not None:
            self._where = self._cluster.describe()
        else:
            parts = urlsplit(url)
            self._where = f"{parts.hostname}:{parts.port or 6379}"
        """For messages: never the URL, which may carry a password."""
        self._redis: RedisClient | None = None
        self._nodes: dict[str, Redis] = {}
        """Plain clients of cluster primaries, by node name, for acknowledged writes (see :class:`_Writes`)."""
        self._blocking: RedisClient | None = None
        """Connections for XREAD BLOCK: no socket timeout, bounded per call instead."""
        self._secret: bytes | None = None
        self._instance: str | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._sids: dict[str, str] = {}
        """Stream key → session id; never changes for a key, so it is cached."""
        self._interner = Interner()
        self._scripts: dict[str, AsyncScript] = {}
        self._queued: dict[str, deque[_QueuedAppend]] = {}
        """Appends waiting for a pipeline, by stream, each stream's in position order (see :meth:`_next_batch`)."""
        self._flusher: asyncio.Task[None] | None = None
        self._opening: dict[str, asyncio.Task[None]] = {}
        """Stream records being written (:meth:`enqueue_open`), by stream: its appends wait for it."""
        self._held_keys = HeldKeys()
        """The keys this process recorded, for ``idempotency_keys_per_principal`` (Redis expires them itself)."""
        self._held = ExpiringHeld(retention_seconds)
        """What each principal's sessions hold in Redis through this process's writes (docs/decisions/0026)."""

    @classmethod
    def from_spec(cls, spec: str) -> RedisStore:
        """``redis://[user:pass@]host:port[/db][?prefix=P&retention_seconds=S&...]`` (``rediss://`` for TLS), or
        ``redis+sentinel://[user:pass@]host:port[,host:port...]/SERVICE[/db][?...]`` (``rediss+sentinel://``), or
        ``redis+cluster://[user:pass@]host:port[,host:port...][?...]`` (``rediss+cluster://``)."""
        parts = urlsplit(spec)
        settings: dict[str, Any] = {}
        passed = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            kind = cls.PARAMETERS.get(name)
            if kind is None:
                passed.append((name, value))
                continue
            if name == "max_events_per_stream" and value.lower() in ("", "none", "0"):
                settings[name] = None
                continue
            try:
                settings[name] = kind(value)
            except ValueError:
                raise ValueError(f"redis store: {name}={value!r} is not a valid {kind.__name__}") from None
        sentinel = spec.startswith(SENTINEL_SCHEMES)
        if sentinel or spec.startswith(CLUSTER_SCHEMES):  # not through urlunsplit, which would drop an empty
            url = spec.partition("?")[0] + (f"?{urlencode(passed)}" if passed else "")  # address list's '//'
        else:
            url = urlunsplit(parts._replace(query=urlencode(passed)))
        try:  # redis-py takes the rest, but would refuse an unknown one only when it first connects: check it now
            if sentinel:
                SentinelTarget.parse(url).check()
            elif spec.startswith(CLUSTER_SCHEMES):  # neither makes a connection: nodes are first reached when used
                target = ClusterTarget.parse(url)
                target.client()
                target.node_client("localhost", REDIS_PORT)
            else:
                pool = ConnectionPool.from_url(url)
                pool.connection_class(**pool.connection_kwargs)
        except TypeError as exc:
            name = str(exc).rpartition("argument ")[2]
            known = ", ".join([*cls.PARAMETERS, *(_SENTINEL_SETTINGS if sentinel else ())])
            raise ValueError(f"redis store: unknown setting {name} (the store's: {known}; or redis-py's)") from None
        return cls(url, **settings)

    # -- plumbing ------------------------------------------------------------------------------------

    def _client(self, socket_timeout: float | None) -> RedisClient:
        """A client of the master: with Sentinel, each new connection looks the master up again (:func:`connect`)."""
        return connect(
            self.url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), _RETRIES),
        )

    @property
    def _r(self) -> RedisClient:
        if self._redis is None:
            raise RuntimeError("RedisStore used before open()")
        return self._redis

    @property
    def client(self) -> RedisClient:
        """The open store's client of the master, its pool and its Sentinel discovery included: what the facets
        keeping keys beside the store's own use (:mod:`.tasks_redis`), so they fail over with it."""
        return self._r

    @property
    def where(self) -> str:
        """The store's address for messages (never the URL, which may carry a password)."""
        return self._where

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn "Redis cannot serve now" into :class:`StoreUnavailable`; let real bugs through."""
        try:
            yield
        except (rx.RedisError, rx.RedisClusterException, TimeoutError) as exc:
            if not is_outage(exc):
                raise
            raise StoreUnavailable(f"redis store at {self._where} unavailable: {exc or type(exc).__name__}") from exc

    async def _script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """Run a Lua script by hash, loading it again after a Redis restart emptied the script cache."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._r.register_script(source)
        with self._guard():
            return await script(keys=keys, args=args)

    def _key(self, sid: str, kind: str, stream: str = "") -> str:
        return f"{self.prefix}:{{{sid}}}:{kind}{stream}"

    def _idx_key(self, stream: str) -> str:
        return f"{self.prefix}:streamidx:{stream}"

    @property
    def _sessions_key(self) -> str:
        return f"{self.prefix}:sessions"

    def _instance_key(self, instance: str) -> str:
        return f"{self.prefix}:instance:{instance}"

    def _remember(self, stream: str, sid: str) -> None:
        if len(self._sids) >= CACHE_LIMIT:
            self._sids.clear()
        self._sids[stream] = sid

    async def _sid(self, stream: str) -> str | None:
        sid = self._sids.get(stream)
        if sid is None:
            with self._guard():
                raw = cast(bytes | None, await self._r.get(self._idx_key(stream)))
            if raw is None:
                return None
            sid = raw.decode()
            self._remember(stream, sid)
        return sid

    async def writes(self) -> _Writes:
        """A write pipeline for one operation, acknowledged by ``wait_replicas`` replicas before it counts (this
        store's and its facets', :mod:`.tasks_redis`): :class:`_Writes` per node on a cluster with ``wait_replicas``."""
        if self._cluster is None or not self.wait_replicas:
            return _Writes(self, None)
        cluster = cast(RedisCluster, self._r)
        await cluster.initialize()  # the slot map on first use; later at once, unless a refresh is due
        return _Writes(self, cluster)

    def _node_client(self, node: ClusterNode) -> Redis:
        client = self._nodes.get(node.name)
        if client is None:
            assert self._cluster is not None
            client = self._nodes[node.name] = self._cluster.node_client(
                node.host,
                int(node.port),
                socket_timeout=SOCKET_TIMEOUT,
                socket_connect_timeout=CONNECT_TIMEOUT,
                retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), _RETRIES),
            )
        return client

    async def _correct_slots(self, keys: list[str]) -> None:
        """After a plain node pipeline failed or met a moved slot: one command per key through the cluster client,
        which follows ``MOVED`` and refreshes its slot map after a failover, so the next attempt goes to the node
        that serves the key now. Its own failure changes nothing: the caller reports the outage anyway."""
        for key in keys:
            with contextlib.suppress(rx.RedisError, rx.RedisClusterException, TimeoutError):
                await self._r.exists(key)

    def _acknowledge(self, pipe: Pipeline | ClusterPipeline) -> None:
        """End ``pipe`` with ``WAIT`` for :attr:`wait_replicas`: it covers every write sent on the pipeline's
        connection before it, so one ``WAIT`` acknowledges a whole batch."""
        if self.wait_replicas:
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)

    def _acknowledged(self, replies: list[Any]) -> list[Any]:
        """The replies of a pipeline :meth:`_acknowledge` ended, without ``WAIT``'s; :class:`StoreUnavailable` when
        fewer replicas than :attr:`wait_replicas` held its writes in time (an outage: nothing of it counts as
        stored, and a retry of the same writes is safe)."""
        if not self.wait_replicas:
            return replies
        held = replies[-1]
        if isinstance(held, Exception) or int(held) < self.wait_replicas:
            raise StoreUnavailable(
                f"redis store at {self._where}: {held} of {self.wait_replicas} replicas acknowledged the write"
                f" within {self.wait_timeout_ms} ms"
            )
        return replies[:-1]

    @property
    def _retention_ms(self) -> int:
        return math.ceil(self.retention_seconds * 1000)

    # -- lifecycle -----------------------------------------------------------------------------------

    async def open(self) -> None:
        self._redis = self._client(SOCKET_TIMEOUT)
        self._blocking = self._client(None)

    async def close(self) -> None:
        if self._flusher is not None:  # let queued appends reach Redis (or fail) before the connections go
            await asyncio.wait([self._flusher], timeout=2 * SOCKET_TIMEOUT)
            if self._flusher is not None:
                self._flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._flusher
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self._instance is not None and self._redis is not None:
            with contextlib.suppress(rx.RedisError):
                await self._redis.delete(self._instance_key(self._instance))
            self._instance = None
        for client in (self._redis, self._blocking, *self._nodes.values()):
            if client is not None:
                await client.aclose()
        self._redis = self._blocking = None
        self._nodes.clear()
        self._scripts.clear()

    async def secret(self) -> bytes:
        if self._secret is None:
            key = f"{self.prefix}:secret"
            with self._guard():
                await self._r.set(key, os.urandom(32), nx=True)
                value = cast(bytes | None, await self._r.get(key))
            if value is None or len(value) < 16:
                raise StoreUnavailable(f"redis store at {self._where}: the event-id secret {key} is missing")
            self._secret = value
        return self._secret

    async def claim_once(self, name: str, ttl_ms: int) -> bool:
        """True the first time ``name`` is claimed within ``ttl_ms`` (``SET NX PX``): every replica sees one
        claim. The DPoP replay cache uses it so a proof replayed to another replica is refused too."""
        with self._guard():
            return bool(await self._r.set(f"{self.prefix}:once:{name}", b"1", nx=True, px=ttl_ms))

    # -- sessions ------------------------------------------------------------------------------------

    async def put_session(self, record: SessionRecord) -> None:
        p = record.principal
        key = self._key(record.session_id, "session")
        with self._guard():
            writes = await self.writes()
            writes.on(self._sessions_key).zadd(self._sessions_key, {record.session_id: record.last_seen})
            writes.on(key).hset(
                key,
                mapping={
                    "iss": p.issuer,
                    "sub": p.subject,
                    "cid": p.client_id,
                    "ver": record.protocol_version,
                    "created": repr(record.created_at),
                    "seen": repr(record.last_seen),
                },
            )
            writes.on(key).pexpire(key, self._retention_ms)
            await writes.execute()
        self._held.counts.bind(record.session_id, p)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        with self._guard():
            raw = cast(dict[bytes, bytes], await self._r.hgetall(self._key(session_id, "session")))
        if not raw:
            self._held.forget(session_id)  # deleted or expired by another replica
            return None
        f = {k.decode(): v.decode() for k, v in raw.items()}
        principal = Principal(f["iss"], f["sub"], f["cid"])
        self._held.counts.bind(session_id, principal)
        return SessionRecord(session_id, principal, f["ver"], float(f["created"]), float(f["seen"]))

    def stored_bytes(self, principal: Principal) -> int:
        return self._held.held(principal) + self._held_keys.bytes(principal, time.time)

    async def touch_session(self, session_id: str, now: float) -> None:
        touched = await self._script(_TOUCH, [self._key(session_id, "session")], [repr(now), self._retention_ms])
        if touched:
            with self._guard():
                await self._r.zadd(self._sessions_key, {session_id: now}, xx=True)

    async def delete_session(self, session_id: str) -> None:
        with self._guard():
            await self._r.zrem(self._sessions_key, session_id)
        await self._purge([session_id])

    async def expire_sessions(self, idle_before: float) -> list[str]:
        """Idle sessions by the ``P:sessions`` index, so ones whose hash already expired are swept too.

        Every replica sweeps; ``ZREM`` decides which one deletes (and reports) each session. Forgets the keys
        this process counted that expired (Redis expires the keys themselves).
        """
        self._held_keys.purge(time.time())
        with self._guard():
            candidates = cast(list[bytes], await self._r.zrangebyscore(self._sessions_key, "-inf", f"({idle_before!r}"))
            if not candidates:
                return []
            async with self._r.pipeline(transaction=False) as pipe:
                for sid in candidates:
                    pipe.zrem(self._sessions_key, sid)
                removed = await pipe.execute()
        gone = [sid.decode() for sid, won in zip(candidates, removed, strict=True) if won]
        await self._purge(gone)
        return gone

    async def _purge(self, session_ids: list[str]) -> None:
        """Delete the sessions' hashes and every stream they still have, with its index key, but for the streams
        their live idempotency keys keep (:data:`_OUTLIVE`)."""
        if not session_ids:
            return
        with self._guard():
            async with self._r.pipeline(transaction=False) as pipe:
                for sid in session_ids:
                    pipe.zrange(self._key(sid, "streams"), 0, -1)
                listed = await pipe.execute()
        owned = [(sid, raw.decode()) for sid, streams in zip(session_ids, listed, strict=True) for raw in streams]
        calls: list[tuple[list[str], list[EncodableT]]] = [
            ([self._key(sid, "s:", stream), self._key(sid, "e:", stream)], [repr(time.time()), Loss.OWNER.value])
            for sid, stream in owned
        ]
        kept = await self._scripted(_OUTLIVE, calls) if calls else []
        for reply in kept:
            if isinstance(reply, Exception):
                with self._guard():
                    raise reply
        with self._guard():
            async with self._r.pipeline(transaction=False) as pipe:
                for sid, streams in zip(session_ids, listed, strict=True):
                    self._held.forget(sid, (raw.decode() for raw in streams))
                    pipe.delete(self._key(sid, "session"), self._key(sid, "streams"))
                for (_sid, stream), until in zip(owned, kept, strict=True):
                    if until:  # found through its index until its keys expire (ADR 0029)
                        pipe.pexpireat(self._idx_key(stream), until)
                        continue
                    pipe.delete(self._idx_key(stream))
                    self._sids.pop(stream, None)
                await pipe.execute()

    # -- streams -------------------------------------------------------------------------------------

    async def open_stream(self, record: StreamRecord, keys: Sequence[KeyRecord] = ()) -> None:
        """Create ``record``'s stream; opening an existing key starts it afresh, as the memory store does.

        Open streams carry no TTL: a call may stay silent longer than the retention. Their keys go with
        their session, or expire after :meth:`complete_stream` (a keyed one not before its idempotency keys).
        ``keys`` are set after the record, each only if no one holds it (:class:`KeyTaken` otherwise): in its
        pipeline, which Redis runs in order, or on a cluster once the record is written (one round trip more).
        """
        sid = record.session_id
        rk = self._key(sid, "s:", record.stream)
        streams = self._key(sid, "streams")
        fields: dict[EncodableT, EncodableT] = {
            "kind": record.kind.value,
            "owner": record.owner,
            "req": encode_requests(record.requests),
            "last": record.last_seq,
            "first": record.last_seq + 1,
            "done": int(record.completed),
        }
        fields.update({"a:" + encode_json(rid).decode(): 1 for rid in record.answered})
        if keys:
            fields["keep"] = repr(max(key.expires for key in keys))
        idx = self._idx_key(record.stream)
        values = [self._key_value(key, sid) for key in keys]
        with self._guard():
            writes = await self.writes()
            writes.on(idx).set(idx, sid)
            writes.on(rk).delete(rk, self._key(sid, "e:", record.stream))
            writes.on(rk).hset(rk, mapping=fields)
            writes.on(streams).zremrangebyscore(streams, "-inf", repr(time.time()))
            writes.on(streams).zadd(streams, {record.stream: math.inf})
            if keys and self._cluster is not None:
                # A key's slot is not its session's: on a cluster another node holds it, and the nodes' pipelines
                # run concurrently. The record goes first, acknowledged, so whoever finds the key finds its stream.
                await writes.execute()
                writes = await self.writes()
            for key, value in zip(keys, values, strict=True):  # each only if no one holds it: one first use wins
                name = self._key_name(key.principal, key.key)
                writes.on(name).set(name, value, nx=True, pxat=math.ceil(key.expires * 1000))
            try:
                replies = await writes.execute()
            except StoreUnavailable:
                if keys:  # not acknowledged (WAIT short), yet maybe set: the call is refused, so its keys must go
                    with contextlib.suppress(StoreUnavailable):  # or they would answer "in progress" for 24 h
                        await self._unopen(record, keys, values)
                raise
        if not all(replies[len(replies) - len(keys) :]):
            await self._unopen(record, keys, values)
            raise KeyTaken(f"another request holds an idempotency key of stream {record.stream}")
        for key in keys:
            self._held_keys.add(key.principal, key.key, key.expires)
        if keys:  # a 2026-07-28 keyed call's own stream (its own session id) counts for its key's principal
            self._held.counts.bind(sid, keys[0].principal)
        self._remember(record.stream, sid)
        self._held.opened(sid, record.stream)

    async def _unopen(self, record: StreamRecord, keys: Sequence[KeyRecord], values: list[bytes]) -> None:
        """Undo an open that lost a key to another process: its stream record and the keys it did set go."""
        sid, stream = record.session_id, record.stream
        with self._guard():
            async with self._r.pipeline(transaction=False) as pipe:  # rare: EVAL, no script cache to keep
                for key, value in zip(keys, values, strict=True):
                    pipe.eval(_DROP_KEY, 1, self._key_name(key.principal, key.key), value)
                pipe.delete(self._key(sid, "s:", stream), self._key(sid, "e:", stream), self._idx_key(stream))
                pipe.zrem(self._key(sid, "streams"), stream)
                await pipe.execute()

    def _key_name(self, principal: Principal, key: str) -> str:
        """Hashed: a key string is the client's (any length, any character), and the name must be a plain one."""
        identity = orjson.dumps([principal.issuer, principal.subject, principal.client_id, key])
        return f"{self.prefix}:key:{hashlib.sha256(identity).hexdigest()}"

    @staticmethod
    def _key_value(key: KeyRecord, sid: str) -> bytes:
        """The stream's session goes with it: the stream-to-session index expires with the retention, the keyed
        stream only with its key."""
        assert isinstance(key.target, StreamTarget), "a key recorded with a stream names that stream"
        target = key.target
        return orjson.dumps(
            [key.tool, key.arguments_hash, sid, target.stream, target.request_id, key.created, key.expires]
        )

    idempotency_keys = True
    keys_durable_when_queued = False

    def enqueue_open(
        self, record: StreamRecord, keys: Sequence[KeyRecord] = (), session: SessionRecord | None = None
    ) -> asyncio.Future[None]:
        """:meth:`open_stream` in a task of its own (after :meth:`put_session` of ``session``, if given); appends
        enqueued after it go in a pipeline sent once it is done, so the record is in Redis before any of its events
        (or they are refused: unknown stream)."""
        key = record.stream
        copy = record.copy()  # as it is now: its stream goes on
        task = asyncio.ensure_future(
            self.open_stream(copy, keys) if session is None else self._open_in(session, copy, keys)
        )
        self._opening[key] = task
        task.add_done_callback(lambda _done: self._opened(key, task))
        return task

    async def _open_in(self, session: SessionRecord, record: StreamRecord, keys: Sequence[KeyRecord]) -> None:
        await self.put_session(session)
        await self.open_stream(record, keys)

    def _opened(self, key: str, task: asyncio.Task[None]) -> None:
        if self._opening.get(key) is task:
            del self._opening[key]

    def lacks_key(self, principal: Principal, key: str, now: float) -> bool:
        return False  # another replica may hold it: only Redis can tell

    def keys_held(self, principal: Principal, now: float) -> int:
        return self._held_keys.held(principal, now)

    async def get_key(self, principal: Principal, key: str, now: float) -> KeyRecord | None:
        with self._guard():
            raw = cast(bytes | None, await self._r.get(self._key_name(principal, key)))
        if raw is None:
            return None
        tool, arguments_hash, sid, stream, request_id, created, expires = orjson.loads(raw)
        if expires <= now:
            return None
        self._remember(stream, sid)  # its index may be gone: the key keeps its stream longer than the retention
        return KeyRecord(principal, key, tool, arguments_hash, StreamTarget(stream, request_id), created, expires)

    async def get_stream(self, stream: str) -> StreamRecord | None:
        sid = await self._sid(stream)
        if sid is None:
            return None
        with self._guard():
            raw = cast(dict[bytes, bytes], await self._r.hgetall(self._key(sid, "s:", stream)))
        if not raw:
            self._sids.pop(stream, None)
            return None
        answered = frozenset(orjson.loads(k[2:]) for k in raw if k.startswith(b"a:"))
        return StreamRecord(
            sid,
            stream,
            StreamKind(raw[b"kind"].decode()),
            raw[b"owner"].decode(),
            decode_requests(raw[b"req"]),
            int(raw[b"last"]),
            raw[b"done"] == b"1",
            answered,
            Loss(raw[b"lost"].decode()) if b"lost" in raw else None,
        )

    def enqueue(self, event: StoredEvent, completes: bool = False) -> asyncio.Future[None]:
        """Queue ``event`` for the next pipeline; the future resolves once Redis ran its append script."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queued.get(event.stream)
        if queue is None:
            queue = self._queued[event.stream] = deque()
        queue.append((event, completes, future))
        self._held.appended(event.session_id, event.stream, len(event.data), completes)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_appends())
        return future

    async def append(self, event: StoredEvent, completes: bool = False) -> None:
        await self.enqueue(event, completes)

    async def _flush_appends(self) -> None:
        """Send what is queued as one pipeline of append scripts, one pipeline in flight at a time.

        One pipeline at a time keeps each stream's appends in position order (Redis runs a pipeline's
        commands in order), and whatever queues up while one is in flight goes into the next: under load
        many appends share a round trip, alone an append costs one as before.
        """
        queued = self._queued
        batch: list[_QueuedAppend] = []
        try:
            while queued:
                batch = self._next_batch()
                if not batch:  # every stream with appends queued is still being opened
                    await asyncio.wait([self._opening[key] for key in queued if key in self._opening])
                    continue
                try:
                    outcomes = await self._append_batch(batch)
                except Exception as exc:  # StoreUnavailable (the pipeline failed), or a bug: each append fails
                    outcomes = [exc] * len(batch)
                for (_event, _completes, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if outcome is None:
                        future.set_result(None)
                    else:
                        future.set_exception(outcome)
                batch = []
        finally:
            self._flusher = None
            stopped = StoreUnavailable(f"redis store at {self._where} closed with appends pending")
            for _event, _completes, future in [*batch, *(append for queue in queued.values() for append in queue)]:
                if not future.done():
                    future.set_exception(stopped)
            if batch:
                queued.clear()

    def _next_batch(self) -> list[_QueuedAppend]:
        """Up to :data:`_PIPELINE_LIMIT` queued appends, taking the streams in turn (one each, round and round):
        a stream with hundreds queued delays another stream's next append by one pipeline, not by all of its
        own (issue 11, H1: a flooding tool's appends held another client's answer for ~8 pipelines)."""
        queued = self._queued
        opening = self._opening
        batch: list[_QueuedAppend] = []
        held: dict[str, deque[_QueuedAppend]] = {}
        while queued and len(batch) < _PIPELINE_LIMIT:
            stream = next(iter(queued))
            queue = queued.pop(stream)
            if stream in opening:  # its record is not written yet: its appends wait (enqueue_open)
                held[stream] = queue
                continue
            batch.append(queue.popleft())
            if queue:
                queued[stream] = queue  # to the back of the turn
        queued.update(held)
        return batch

    async def _scripted(self, source: str, calls: list[tuple[list[str], list[EncodableT]]]) -> list[Any]:
        """Run ``calls`` (keys, arguments) of the Lua script ``source`` as one acknowledged write (:class:`_Writes`);
        its replies, errors among them. A node that lacks the script (Redis restarted, or a replica was promoted
        since it was loaded) answers NOSCRIPT: the script is loaded (on every primary of a cluster) and the
        pipeline sent again, once; the scripts are safe to run twice."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._r.register_script(source)
        for attempt in range(2):
            with self._guard():
                writes = await self.writes()
                for keys, args in calls:
                    writes.on(keys[0]).evalsha(script.sha, len(keys), *keys, *args)
                replies = await writes.execute(raise_on_error=False)
            if attempt or not any(isinstance(reply, rx.NoScriptError) for reply in replies):
                break
            with self._guard():
                await self._r.script_load(source)
        return replies

    async def _append_batch(self, batch: list[_QueuedAppend]) -> list[Exception | None]:
        replies = await self._scripted(_APPEND, [self._append_call(event, completes) for event, completes, _ in batch])
        completed = [
            event.stream
            for (event, completes, _future), reply in zip(batch, replies, strict=True)
            if completes and reply in (b"ok", b"duplicate")
        ]
        if completed:
            with self._guard():
                async with self._r.pipeline(transaction=False) as pipe:
                    for stream in completed:
                        pipe.pexpire(self._idx_key(stream), self._retention_ms)
                    await pipe.execute()
        return [
            _append_outcome(event, reply) for (event, _completes, _future), reply in zip(batch, replies, strict=True)
        ]

    def _append_call(self, event: StoredEvent, completes: bool) -> tuple[list[str], list[EncodableT]]:
        answered = b""
        if event.terminal and event.request_id is not None:
            answered = b"a:" + encode_json(event.request_id)
        sid, stream = event.session_id, event.stream
        keys = [self._key(sid, "s:", stream), self._key(sid, "e:", stream), self._key(sid, "streams")]
        args: list[EncodableT] = [
            event.seq,
            compact_event_id(event.stream, event.seq, event.event_id),
            encode_json(event.request_id),
            encode_json(event.tool),
            encode_tags(event.resources),
            int(event.terminal),
            event.data,
            answered,
            self.max_events_per_stream or 0,
            *(self._completion(stream) if completes else ("", "", "")),
        ]
        return keys, args

    async def complete_stream(self, stream: str) -> None:
        sid = await self._sid(stream)
        if sid is None:
            return
        keys = [self._key(sid, "s:", stream), self._key(sid, "e:", stream), self._key(sid, "streams")]
        if await self._script(_COMPLETE, keys, list(self._completion(stream))):
            await self._expire_index(stream)
        self._held.completed(stream)

    def _completion(self, stream: str) -> tuple[int, str, str]:
        """The arguments of ``mark_complete``: retention ms, when the stream's keys expire, its key."""
        return self._retention_ms, repr(time.time() + self.retention_seconds), stream

    async def _expire_index(self, stream: str) -> None:
        """The stream-to-session index lives outside the session's hash slot: its expiry follows the script's."""
        with self._guard():
            await self._r.pexpire(self._idx_key(stream), self._retention_ms)

    async def read_after(self, stream: str, seq: int) -> list[StoredEvent]:
        sid = await self._sid(stream)
        if sid is None:
            return []
        with self._guard():
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.hmget(self._key(sid, "s:", stream), ["first", "last"])
                pipe.xrange(self._key(sid, "e:", stream), min="-" if seq < 0 else f"({seq}-1")
                (raw_first, raw_last), entries = await pipe.execute()
        if raw_first is None:
            return []
        first, last = int(raw_first), int(raw_last)
        if seq + 1 < first:
            raise EventsEvicted(f"events {seq + 1}..{first - 1} of stream {stream} were evicted")
        if len(entries) != max(0, last - seq):
            raise EventsEvicted(
                f"stream {stream} records events up to {last} but Redis holds {len(entries)} after {seq}"
                " (keys evicted? run Redis with maxmemory-policy noeviction)"
            )
        return self._decode(sid, stream, entries)

    def _decode(self, sid: str, stream: str, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[StoredEvent]:
        value, tags = self._interner.value, self._interner.tags
        events = []
        for entry_id, f in entries:
            seq = _seq_of(entry_id)
            event_id = full_event_id(stream, seq, f[b"i"].decode())
            rid, tool, terminal = value(f[b"r"]), value(f[b"t"]), f[b"x"] == b"1"
            events.append(StoredEvent(sid, stream, seq, event_id, f[b"d"], rid, tool, tags(f[b"g"]), terminal))
        return events

    async def wait_events(self, stream: str, seq: int, block_seconds: float) -> list[StoredEvent]:
        """Events after ``seq`` at once if there are any, else an ``XREAD BLOCK`` for up to ``block_seconds``.

        XREAD from the explicit id ``<seq>-1`` cannot miss an append that lands between the first read
        and the block. If more than ``max_events_per_stream`` arrive meanwhile, the gap raises
        :class:`EventsEvicted` rather than skipping events.
        """
        events = await self.read_after(stream, seq)
        if events or block_seconds <= 0:
            return events
        sid = await self._sid(stream)
        if sid is None or self._blocking is None:
            return []
        key = self._key(sid, "e:", stream)
        with self._guard():
            async with asyncio.timeout(block_seconds + SOCKET_TIMEOUT):
                reply = await self._blocking.xread(
                    {key: f"{seq}-1" if seq >= 0 else "0-0"}, block=max(1, math.ceil(block_seconds * 1000))
                )
        if not reply:
            return []
        entries = cast(list[list[Any]], reply)[0][1]
        events = self._decode(sid, stream, entries)
        if events[0].seq != seq + 1:
            raise EventsEvicted(f"events {seq + 1}..{events[0].seq - 1} of stream {stream} were evicted")
        return events

    # -- ownership -----------------------------------------------------------------------------------

    async def register_instance(self, instance: str) -> None:
        """Take the lease ``P:instance:<instance>`` and keep it alive until :meth:`close`.

        While Redis is unreachable the lease cannot be refreshed; once it has expired, other replicas may
        end this instance's calls with "execution lost". A later append by this instance to such a stream
        then fails with :class:`StreamTakenOver` instead of overwriting that error.
        """
        key = self._instance_key(instance)
        lease_ms = math.ceil(self.lease_seconds * 1000)
        with self._guard():
            await self._r.set(key, b"1", px=lease_ms)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._instance = instance
        self._heartbeat = asyncio.create_task(self._keep_lease(key, lease_ms))

    async def _keep_lease(self, key: str, lease_ms: int) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                previous = await self._r.set(key, b"1", px=lease_ms, get=True)
            except rx.RedisError as exc:
                log.warning("cannot refresh lease %s at %s: %s", key, self._where, exc)
                continue
            if previous is None:
                log.warning("lease %s had expired: other replicas may have ended this instance's calls", key)

    async def owner_alive(self, owner: str) -> bool:
        with self._guard():
            return bool(await self._r.exists(self._instance_key(owner)))

    async def mark_lost(self, stream: str, owner: str, loss: Loss) -> StreamRecord | None:
        sid = await self._sid(stream)
        if sid is None:
            return None
        keys = [self._key(sid, "s:", stream), self._key(sid, "e:", stream), self._key(sid, "streams")]
        [reply] = await self._scripted(_MARK_LOST, [(keys, [owner, loss.value, *self._completion(stream)])])
        if isinstance(reply, Exception):
            with self._guard():  # an outage is StoreUnavailable; anything else is a bug, raised as it is
                raise reply
        if reply == b"taken":
            raise StreamTakenOver(f"stream {stream} is produced by another instance than {owner}")
        if reply == b"ok":
            await self._expire_index(stream)
        return await self.get_stream(stream)
