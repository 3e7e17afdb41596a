"""The event stores side by side: Redis (two fsync policies) vs SQLite vs memory, in one run.

    .venv/bin/python benchmarks/stores.py            # full run (a minute or two)
    .venv/bin/python benchmarks/stores.py --quick    # smoke run: small counts

Measures, with the same events (a 150-byte progress notification, one tool's resource tag, a real
HMAC event id) for every store:

- appends/s: one stream and 16 streams at once, each append awaited before the next, and queued as a
  tool's progress events are (up to 256 per stream waiting for the store, which batches them);
- replayed events/s: ``read_after`` of a whole 10,000-event stream;
- resume latency p50/p99 over HTTP: a GET + Last-Event-ID replaying a finished 20-event call, served by
  *another* replica for Redis, by the same server for SQLite and memory (which cannot have replicas);
- Redis memory per 10,000 events (``INFO memory`` before/after), in one stream and spread over 100;
- the cost of replica acknowledgement: against a primary and a replica following it (``REPLICAOF``), the
  appends above and ``tools/call`` over SSE through a ``serve`` process (closed loop at 1 and 16 concurrent
  calls, and a 1,000-step progress stream), with ``wait_replicas=0`` and ``wait_replicas=1`` interleaved.

Each redis-server (Debian's package, installed if missing) runs on a free loopback port with a temporary
directory, as in the tests, started and stopped by this script. Writes ``benchmarks/RESULTS-stores.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.processes import ServerProcess, free_port  # noqa: E402
from tests.support.redis_server import RedisServer, redis_server_binary  # noqa: E402

import loadgen  # noqa: E402  (benchmarks/, the script's own directory)
from mcp_lossless.core.eventids import EventIdCodec  # noqa: E402
from mcp_lossless.core.events import StoredEvent, StreamKind, StreamRecord  # noqa: E402
from mcp_lossless.stores.base import EventStore  # noqa: E402
from mcp_lossless.stores.memory import MemoryStore  # noqa: E402
from mcp_lossless.stores.redis import RedisStore  # noqa: E402
from mcp_lossless.stores.sqlite import SqliteStore  # noqa: E402

TAGS = frozenset({"http://127.0.0.1:8000/mcp/tools/search"})
CODEC = EventIdCodec(b"benchmark-secret-of-32-bytes!!!!")
SESSION = "b" * 43
REPORT = ROOT / "benchmarks" / "RESULTS-stores.md"
KEPT = "## Group commit"
"""The report's sections from this heading on come from ``store_commits.py`` and survive a rerun of this script."""


def progress(stream: str, seq: int) -> StoredEvent:
    data = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "tok-1", "progress": seq, "total": 100000, "message": f"search step {seq}"},
        }
    )
    return StoredEvent(
        SESSION, stream, seq, CODEC.encode(stream, seq, CODEC.stream_mac(SESSION, stream)), data, 7, "search", TAGS
    )


def stream_key(n: int) -> str:
    return f"bench-stream-{n:06d}-xxxx"  # 22 characters, like a real stream key


async def open_record(store: EventStore, key: str) -> None:
    await store.open_stream(StreamRecord(SESSION, key, StreamKind.POST, "bench-instance"))


# --- store-level throughput ---------------------------------------------------------------------------


IN_FLIGHT = 256
"""Appends one stream keeps queued, as a tool's progress calls do (``server/streams.py`` UNCOMMITTED_LIMIT)."""


async def append_rate(store: EventStore, streams: int, per_stream: int, first: int, *, queued: bool) -> float:
    """Events/s appended: each awaited before the next (``queued=False``), or queued with up to ``IN_FLIGHT``
    per stream unstored, which lets the store batch them (group commit, pipelines)."""
    keys = [stream_key(first + n) for n in range(streams)]
    for key in keys:
        await open_record(store, key)
    batches = [[progress(key, seq) for seq in range(per_stream)] for key in keys]

    async def one(events: list[StoredEvent]) -> None:
        if not queued:
            for event in events:
                await store.append(event)
            return
        pending: deque[asyncio.Future[None]] = deque()
        for event in events:
            pending.append(store.enqueue(event))
            if len(pending) >= IN_FLIGHT:
                await pending.popleft()
        await asyncio.gather(*pending)

    started = time.perf_counter()
    await asyncio.gather(*(one(b) for b in batches))
    return streams * per_stream / (time.perf_counter() - started)


async def replay_rate(store: EventStore, key: str, events: int, rounds: int) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        got = await store.read_after(key, -1)
        assert len(got) == events, (len(got), events)
    return events * rounds / (time.perf_counter() - started)


async def throughput(stores: dict[str, Callable[[], Awaitable[EventStore]]], n: int, rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, make in stores.items():
        store = await make()
        try:
            sequential = await append_rate(store, 1, n, 0, queued=False)
            concurrent = await append_rate(store, 16, n // 16, 100, queued=False)
            queued_1 = await append_rate(store, 1, n, 200, queued=True)
            queued_16 = await append_rate(store, 16, n // 16, 300, queued=True)
            replay = await replay_rate(store, stream_key(0), n, rounds)
        finally:
            await store.close()
        results[name] = {
            "append_1": sequential,
            "append_16": concurrent,
            "queued_1": queued_1,
            "queued_16": queued_16,
            "replay": replay,
        }
        print(
            f"{name:16} append 1 stream {sequential:9.0f}/s  16 streams {concurrent:9.0f}/s  "
            f"queued {queued_1:9.0f}/s  {queued_16:9.0f}/s  replay {replay:9.0f}/s"
        )
    return results


# --- Redis memory ---------------------------------------------------------------------------------------


async def redis_memory(url: str) -> dict[str, Any]:
    from redis.asyncio import Redis

    raw = Redis.from_url(url)
    results: dict[str, Any] = {}
    try:
        for label, streams in (("1 stream", 1), ("100 streams", 100)):
            store = RedisStore(url, prefix=f"mem-{streams}", max_events_per_stream=None)
            await store.open()
            before = int((await raw.info("memory"))["used_memory"])
            per = 10_000 // streams
            for n in range(streams):
                key = stream_key(n)
                await open_record(store, key)
                for seq in range(per):
                    await store.append(progress(key, seq))
            after = int((await raw.info("memory"))["used_memory"])
            events_key = f"mem-{streams}:{{{SESSION}}}:e:{stream_key(0)}"
            usage = await raw.memory_usage(events_key, samples=0)
            await store.close()
            results[label] = {"total": after - before, "events_key": usage, "per_stream_events": per}
            print(f"redis memory, {label}: {(after - before) / 1e6:.2f} MB per 10,000 events")
    finally:
        await raw.aclose()
    return results


# --- resume latency over HTTP ---------------------------------------------------------------------------


def serve_args(store: str, canonical: str) -> list[str]:
    return ["--store", store, "--auth", "none", "--public-url", canonical, "--log-level", "warning"]


@contextlib.contextmanager
def replicas(store: str, count: int, logs: Path) -> Iterator[list[ServerProcess]]:
    canonical = f"http://127.0.0.1:{free_port()}/mcp"
    servers = [ServerProcess(serve_args(store, canonical), free_port(), logs / f"r{n}.log") for n in range(count)]
    try:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(ServerProcess.start, servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2025-11-25",
}


async def finished_call(http: httpx.AsyncClient, base: str) -> tuple[str, str]:
    """A session with one finished 20-event call; returns the session id and the first event id."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
    response = await http.post(f"{base}/mcp", content=orjson.dumps(init), headers=HEADERS)
    session = response.headers["mcp-session-id"]
    params = {"name": "search", "arguments": {"query": "q", "steps": 19, "delay_ms": 0}, "_meta": {"progressToken": 1}}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    response = await http.post(
        f"{base}/mcp", content=orjson.dumps(message), headers={**HEADERS, "mcp-session-id": session}
    )
    first = next(line[4:] for line in response.text.splitlines() if line.startswith("id: "))
    return session, first


async def resume_latency(producer: str, resumer: str, count: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=30) as http:
        session, first = await finished_call(http, producer)
        headers = {**HEADERS, "mcp-session-id": session, "last-event-id": first, "accept": "text/event-stream"}
        samples = []
        for n in range(count + 20):
            started = time.perf_counter()
            response = await http.get(f"{resumer}/mcp", headers=headers)
            elapsed = time.perf_counter() - started
            replayed = sum(1 for line in response.text.splitlines() if line.startswith("id: "))
            assert response.status_code == 200 and replayed == 20, (response.status_code, replayed)
            if n >= 20:  # warm-up: connections, caches
                samples.append(elapsed)
    samples.sort()
    return {
        "p50_ms": statistics.median(samples) * 1000,
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000,
    }


async def latencies(redis_url: str, work: Path, count: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with replicas(f"{redis_url}?prefix=latency", 2, work) as (a, b):
        results["redis, other replica"] = await resume_latency(a.base, b.base, count)
    with replicas(f"sqlite:{work / 'latency.db'}", 1, work) as (single,):
        results["sqlite, same server"] = await resume_latency(single.base, single.base, count)
    with replicas("memory", 1, work) as (single,):
        results["memory, same server"] = await resume_latency(single.base, single.base, count)
    for name, value in results.items():
        print(f"resume {name:22} p50 {value['p50_ms']:.2f} ms  p99 {value['p99_ms']:.2f} ms")
    return results


# --- replica acknowledgement ----------------------------------------------------------------------------

WAITS = (0, 1)
"""The ``wait_replicas`` settings compared: the primary's word alone, and one replica holding every batch."""


@contextlib.contextmanager
def primary_and_replica(binary: str, work: Path) -> Iterator[RedisServer]:
    """A primary and a replica following it on loopback, persisting as the other Redis here (AOF, everysec);
    yields the primary once the replica has synced, so that ``WAIT 1`` can be answered from the first write."""
    primary = RedisServer(
        binary, work / "primary", appendfsync="everysec", extra_args=["--repl-diskless-sync-delay", "0"]
    )
    replica = RedisServer(
        binary, work / "replica", appendfsync="everysec", extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
    )
    with contextlib.ExitStack() as stack:
        for server in (primary, replica):
            server.directory.mkdir(parents=True)
            stack.callback(server.stop)
            server.start()
        wait_synced(replica)
        yield primary


def wait_synced(replica: RedisServer, timeout: float = 30) -> None:
    """Return once the replica's link is up and the append-only file it rewrites after a sync is written (until
    then redis-server refuses a SIGTERM). Readiness of another process: polled, bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    with redis.Redis(host="127.0.0.1", port=replica.port, socket_timeout=5) as direct:
        while True:
            linked = direct.info("replication").get("master_link_status") == "up"
            persistence = direct.info("persistence")
            if linked and not persistence["aof_rewrite_in_progress"] and not persistence["aof_rewrite_scheduled"]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replica did not sync with the primary in {timeout}s")
            time.sleep(0.05)


async def acknowledged_appends(url: str, n: int, reps: int) -> dict[int, dict[str, float]]:
    """Median appends/s per ``wait_replicas`` setting; the settings alternate within each rep, so the box's
    drift hits both alike. Awaited one by one, each append waits for its own ``WAIT``; queued, one ``WAIT``
    ends each pipeline of up to 32 appends."""
    samples: dict[int, dict[str, list[float]]] = {wait: {} for wait in WAITS}
    for rep in range(reps):
        for wait in WAITS:
            store = RedisStore(url, prefix=f"ack{wait}-{rep}", max_events_per_stream=None, wait_replicas=wait)
            await store.open()
            try:
                rates = {
                    "append_1": await append_rate(store, 1, n // 5, 0, queued=False),
                    "queued_1": await append_rate(store, 1, n, 200, queued=True),
                    "queued_16": await append_rate(store, 16, n // 16, 300, queued=True),
                }
            finally:
                await store.close()
            for name, rate in rates.items():
                samples[wait].setdefault(name, []).append(rate)
    results = {
        wait: {name: statistics.median(values) for name, values in rates.items()} for wait, rates in samples.items()
    }
    for wait, value in results.items():
        print(
            f"redis wait_replicas={wait}  append 1 stream {value['append_1']:9.0f}/s  "
            f"queued {value['queued_1']:9.0f}/s  {value['queued_16']:9.0f}/s"
        )
    return results


async def acknowledged_calls(url: str, work: Path, reps: int, quick: bool) -> dict[int, dict[str, float]]:
    """``tools/call`` through a ``serve`` process on the replicated Redis, per ``wait_replicas`` setting: a fresh
    server per (rep, setting), alternating; medians over the reps."""
    warmup, duration, steps, calls = (0.5, 1.5, 200, 2) if quick else (1.0, 4.0, 1000, 3)
    samples: dict[int, dict[str, list[float]]] = {wait: {} for wait in WAITS}
    for rep in range(reps):
        for wait in WAITS:
            spec = f"{url}?prefix=call{wait}-{rep}&wait_replicas={wait}"
            with replicas(spec, 1, work) as (server,):
                assert server.proc is not None
                target, pid = loadgen.Target("127.0.0.1", server.port), server.proc.pid
                one = await loadgen.echo(target, pid, 1, warmup, duration)
                many = await loadgen.echo(target, pid, 16, warmup, duration)
                progress = await loadgen.stream(target, pid, steps, calls)
            for result in (one, many, progress):
                if result["errors"]:
                    raise RuntimeError(f"wait_replicas={wait}: {result['errors']} errors: {result['error_samples']}")
            for result in (one, many):
                if result["content_types"] != ["text/event-stream"]:
                    raise RuntimeError(f"tools/call answered {result['content_types']}, not over SSE")
            figures = {
                "rps_1": one["rps"],
                "p50_1": one["p50_ms"],
                "cpu_1": one["server_cpu_us_per_request"],
                "rps_16": many["rps"],
                "p50_16": many["p50_ms"],
                "p99_16": many["p99_ms"],
                "cpu_16": many["server_cpu_us_per_request"],
                "events": progress["events_per_s"],
                "cpu_event": progress["server_cpu_us_per_event"],
            }
            for name, figure in figures.items():
                samples[wait].setdefault(name, []).append(figure)
    results = {
        wait: {name: statistics.median(values) for name, values in figures.items()} for wait, figures in samples.items()
    }
    for wait, value in results.items():
        print(
            f"serve wait_replicas={wait}  c=1 {value['rps_1']:7.0f} rps p50 {value['p50_1']:.2f} ms  "
            f"c=16 {value['rps_16']:7.0f} rps p50 {value['p50_16']:.2f} ms  progress {value['events']:7.0f} events/s"
        )
    return results


# --- report ---------------------------------------------------------------------------------------------


def render(results: dict[str, Any], args: argparse.Namespace, redis_version: str) -> str:
    t = results["throughput"]
    lines = [
        "# Event stores: Redis vs SQLite vs memory",
        "",
        f"Run {results['started']} (UTC) at commit {results['commit']}, {'quick' if args.quick else 'full'} run, "
        f"command: `.venv/bin/python benchmarks/stores.py{' --quick' if args.quick else ''}`.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other work (load average "
        f"{results['load']:.1f} at start), Linux {platform.release()}, "
        f"Python {platform.python_version()} on uvloop, redis-py with hiredis; {redis_version} on loopback, AOF on.",
        "",
        f"Events: {len(progress('x' * 22, 1).data)}-byte progress notifications with one resource tag and an HMAC "
        "event id, as the server stores them. Stores are driven directly (no HTTP) for throughput; SQLite runs",
        "WAL with `synchronous=NORMAL` (no fsync per commit), memory is the in-process default.",
        "",
        "## Throughput",
        "",
        "| store | appends/s awaited one by one: 1 stream · 16 streams at once | appends/s queued "
        f"(≤ {IN_FLIGHT} in flight per stream, as a tool's progress): 1 stream · 16 streams "
        "| replayed events/s (10,000-event stream) |",
        "|---|---|---|---|",
    ]
    for name, value in t.items():
        lines.append(
            f"| {name} | {value['append_1']:,.0f} · {value['append_16']:,.0f} | "
            f"{value['queued_1']:,.0f} · {value['queued_16']:,.0f} | {value['replay']:,.0f} |"
        )
    lines += [
        "",
        "Awaited one by one, an append is one round trip: to Redis (a Lua script: entry, record and trim",
        "together) or to the SQLite writer thread and its commit, so one stream is bound by latency. Queued,",
        "the store batches what arrives while it is busy into one pipeline / one transaction (group commit),",
        "which is how the server appends progress events. On this VM a Redis round trip costs the client",
        "150-200 us of CPU, mostly in socket system calls.",
        "",
        "## Resume latency",
        "",
        "GET + Last-Event-ID replaying a finished call (20 events) with `--auth none`; Redis is served by the",
        f"replica that did *not* run the call. {results['resumes']} sequential resumes after 20 warm-up ones.",
        "",
        "| store, where | p50 | p99 |",
        "|---|---|---|",
    ]
    for name, value in results["latency"].items():
        lines.append(f"| {name} | {value['p50_ms']:.2f} ms | {value['p99_ms']:.2f} ms |")
    lines += [
        "",
        "## Redis memory per 10,000 events",
        "",
        "`used_memory` (INFO memory) after minus before appending 10,000 events, with the stream records and",
        "index keys they need; `MEMORY USAGE` is Redis's own estimate for one events key (the Redis Stream).",
        "",
        "| layout | used_memory growth | per event | events key (MEMORY USAGE) |",
        "|---|---|---|---|",
    ]
    for name, value in results["memory"].items():
        total = value["total"]
        lines.append(
            f"| 10,000 events in {name} | {total / 1e6:.2f} MB | {total / 10_000:.0f} B | "
            f"{value['events_key'] / 1e3:.0f} kB for {value['per_stream_events']:,} events |"
        )
    lines += ["", *render_acknowledgement(results)]
    return "\n".join(lines)


def render_acknowledgement(results: dict[str, Any]) -> list[str]:
    appends, calls = results["appends_acknowledged"], results["calls_acknowledged"]
    off, on = (appends[wait] for wait in WAITS)
    call_off, call_on = (calls[wait] for wait in WAITS)
    lines = [
        "## Replica acknowledgement: `wait_replicas=1` beside `0`",
        "",
        f"Same run: {results['started']} (UTC), commit {results['commit']}, `.venv/bin/python benchmarks/stores.py"
        f"{' --quick' if results['quick'] else ''}`.",
        "",
        "A primary and one replica following it (`REPLICAOF`), both redis-server processes on loopback with AOF",
        "`everysec`, started by the script; the replica stays linked for both settings, so the only difference",
        "is the `WAIT 1 <wait_timeout_ms>` that ends each write pipeline with `wait_replicas=1`.",
        f"The settings alternate: appends {results['ack_reps']} reps each ({results['events']:,} events queued,",
        f"{results['events'] // 5:,} awaited), medians; `serve` a fresh process per (rep, setting),",
        f"{results['call_reps']} reps each, medians: a closed loop of `search` calls answered over SSE at 1 and 16",
        "concurrent calls, and `fetch` calls with progress (the loadgen of `benchmarks/run.py`). The primary ran",
        f"{results['waits']:,} `WAIT` commands in all (INFO commandstats), every one for `wait_replicas=1`.",
        "",
        "The 2 cores were shared with other sessions' work (load average "
        f"{results['ack_load'][0]:.1f} → {results['ack_load'][1]:.1f} over this section): wall rates swing between",
        "reps, so the ratios of CPU per call and of median latency are the steadier figures.",
        "",
        "| measure | `wait_replicas=0` | `wait_replicas=1` | 1 ÷ 0 |",
        "|---|---|---|---|",
    ]
    rows = [
        ("store: appends/s awaited one by one, 1 stream", off["append_1"], on["append_1"], "{:,.0f}"),
        (f"store: appends/s queued (≤ {IN_FLIGHT} in flight), 1 stream", off["queued_1"], on["queued_1"], "{:,.0f}"),
        ("store: appends/s queued, 16 streams at once", off["queued_16"], on["queued_16"], "{:,.0f}"),
        ("serve: tools/call over SSE, c=1: calls/s", call_off["rps_1"], call_on["rps_1"], "{:,.0f}"),
        ("serve: tools/call, c=1: p50 latency ms", call_off["p50_1"], call_on["p50_1"], "{:.2f}"),
        ("serve: tools/call, c=1: server CPU µs/call", call_off["cpu_1"], call_on["cpu_1"], "{:,.0f}"),
        ("serve: tools/call over SSE, c=16: calls/s", call_off["rps_16"], call_on["rps_16"], "{:,.0f}"),
        ("serve: tools/call, c=16: p50 latency ms", call_off["p50_16"], call_on["p50_16"], "{:.2f}"),
        ("serve: tools/call, c=16: p99 latency ms", call_off["p99_16"], call_on["p99_16"], "{:.2f}"),
        ("serve: tools/call, c=16: server CPU µs/call", call_off["cpu_16"], call_on["cpu_16"], "{:,.0f}"),
        ("serve: progress stream (`fetch`), events/s", call_off["events"], call_on["events"], "{:,.0f}"),
        ("serve: progress stream, server CPU µs/event", call_off["cpu_event"], call_on["cpu_event"], "{:.1f}"),
    ]
    for label, before, after, form in rows:
        lines.append(f"| {label} | {form.format(before)} | {form.format(after)} | {after / before:.2f}x |")
    lines += [
        "",
        "Where the cost comes from: with `wait_replicas=1` every write pipeline (a batch of up to 32 appends, a",
        "stream record, a session) ends with `WAIT`, which answers once the replica reported holding the",
        "primary's replication offset: one more round trip, primary → replica → primary, before what the",
        "pipeline wrote may be used or published. Awaited one by one, each append pays it; queued, one batch",
        "pays it once, and with 16 streams writing, the batches fill and it is shared further. A `tools/call`",
        "waits for at least two (its stream record before the priming event's id, then its answer). The",
        "server's own CPU grows by the `WAIT` each pipeline sends and parses; redis-server's CPU is not in",
        "these figures.",
    ]
    lines.append("")
    return lines


async def run(args: argparse.Namespace, binary: str, version: str) -> None:
    n, rounds, resumes = (1_600, 2, 50) if args.quick else (10_000, 10, 500)
    ack_reps, call_reps = (1, 1) if args.quick else (3, 3)
    started = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    load = os.getloadavg()[0]
    commit = git("rev-parse", "--short", "HEAD") + (" with uncommitted changes" if git("status", "--porcelain") else "")
    with tempfile.TemporaryDirectory(prefix="mcpl-bench-stores-") as tmp:
        work = Path(tmp)
        servers = {policy: RedisServer(binary, work / policy, appendfsync=policy) for policy in ("everysec", "always")}
        for server in servers.values():
            server.directory.mkdir()
            server.start()
        try:

            def redis_store(policy: str) -> Callable[[], Awaitable[EventStore]]:
                async def make() -> EventStore:
                    store = RedisStore(servers[policy].url, prefix="tp", max_events_per_stream=None)
                    await store.open()
                    return store

                return make

            async def sqlite_store() -> EventStore:
                store = SqliteStore(str(work / "throughput.db"))
                await store.open()
                return store

            async def memory_store() -> EventStore:
                return MemoryStore()

            stores = {
                "redis (everysec)": redis_store("everysec"),
                "redis (always)": redis_store("always"),
                "sqlite": sqlite_store,
                "memory": memory_store,
            }
            results = {
                "started": started,
                "commit": commit,
                "quick": args.quick,
                "load": load,
                "resumes": resumes,
                "throughput": await throughput(stores, n, rounds),
                "memory": await redis_memory(servers["everysec"].url),
                "latency": await latencies(servers["everysec"].url, work, resumes),
            }
        finally:
            for server in servers.values():
                server.stop()
        load_before = os.getloadavg()[0]
        with primary_and_replica(binary, work / "replicated") as primary:
            results.update(ack_reps=ack_reps, call_reps=call_reps, events=n)
            results["appends_acknowledged"] = await acknowledged_appends(primary.url, n, ack_reps)
            results["calls_acknowledged"] = await acknowledged_calls(primary.url, work, call_reps, args.quick)
            with redis.Redis(host="127.0.0.1", port=primary.port) as direct:  # proof the setting took effect
                results["waits"] = direct.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        results["ack_load"] = (load_before, os.getloadavg()[0])
    text = render(results, args, f"redis-server {version.removeprefix('v=')} (appendfsync everysec unless noted)")
    if args.report.exists():  # sections other scripts write (benchmarks/store_commits.py) stay
        old = args.report.read_text()
        if KEPT in old:
            text += "\n" + old[old.index(KEPT) :]
    args.report.write_text(text)
    print(f"wrote {args.report}")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts: checks the script, not the stores")
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args()
    binary = redis_server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.split()[2]
    uvloop.run(run(args, binary, version))  # the loop `mcp-lossless serve` runs on


if __name__ == "__main__":
    main()
