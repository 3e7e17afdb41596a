"""Appends through the server's own path (``LiveStream.append``) per store: events/s, and how long the loop stalls.

    .venv/bin/python benchmarks/store_commits.py                  # SQLite and memory, 5 reps, medians
    .venv/bin/python benchmarks/store_commits.py --reps 3 --events 20000 --json out.json

What a tool reporting progress costs the server: each rep opens a fresh store, then appends ``--events``
progress events (150-byte notifications with a real HMAC event id) to one stream, then the same number
spread over 16 streams appended concurrently, each call followed by its answer. A ticker task records the
longest gap between its turns on the loop meanwhile: what another client's request would have waited.
A reader per stream takes and delivers what is published, as a writer does. Only APIs present since back-pressure
(ADR 0014) are used, so the same script measures any checkout since (run it with ``PYTHONPATH`` pointing at its
``src``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop

from mcp_lossless.core.eventids import EventIdCodec
from mcp_lossless.core.events import PendingRequest, StreamKind, StreamRecord
from mcp_lossless.server.streams import LiveStream
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.sqlite import SqliteStore

TAGS = frozenset({"http://127.0.0.1:8000/mcp/tools/search"})
REQUEST = PendingRequest(7, "tools/call", "search", TAGS)
SESSION = "b" * 43


def progress(n: int) -> bytes:
    params = {"progressToken": "tok-1", "progress": n, "total": 100000, "message": f"search step {n}"}
    return orjson.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


ANSWER = orjson.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "done"}]}})


async def read(live: LiveStream) -> int:
    """What a writer does with a stream: take the events published since the last it sent, in order, and tell the
    stream they are sent (``deliver``), until it ends. Without a reader a tool waits at its stream's backlog
    bound (ADR 0014), so past ~1,000 events this script waited for ever. Returns the last position read."""
    sent = 0
    while True:
        events = live.after(sent) or []
        if events:
            assert events[0].seq == sent + 1, "published in position order, none skipped"
            sent = events[-1].seq
            live.deliver(sent)
        elif live.done:
            return sent
        else:
            await live.waiter()


async def one_call(store: EventStore, codec: EventIdCodec, key: str, events: int) -> None:
    record = StreamRecord(SESSION, key, StreamKind.POST, "bench", (REQUEST,), 0)
    await store.open_stream(record)
    live = LiveStream(record, store, codec, lambda _seconds: None)
    reader = asyncio.create_task(read(live))
    for n in range(events):
        await live.append(progress(n), REQUEST)
    await live.append(ANSWER, REQUEST, terminal=True)
    assert live.done and await reader == events + 1


async def measured(work: Callable[[], Awaitable[None]]) -> tuple[float, float, float]:
    """Seconds ``work`` took, the process CPU seconds it used (every thread: the SQLite writer's too; on a
    shared box the steadier figure), and the longest the loop went without giving the ticker a turn."""
    worst = 0.0
    running = True

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0)
            now = time.perf_counter()
            worst = max(worst, now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started, cpu = time.perf_counter(), time.process_time()
    await work()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    running = False
    await tick
    return elapsed, cpu, worst


async def rep(kind: str, directory: Path, n: int, events: int) -> dict[str, float]:
    store: EventStore = MemoryStore() if kind == "memory" else SqliteStore(str(directory / f"rep-{n}.db"))
    await store.open()
    try:
        codec = EventIdCodec(await store.secret())
        one_s, one_cpu, one_stall = await measured(lambda: one_call(store, codec, f"one-{n}", events))
        per = events // 16

        async def sixteen() -> None:
            await asyncio.gather(*(one_call(store, codec, f"many-{n}-{k}", per) for k in range(16)))

        many_s, many_cpu, many_stall = await measured(sixteen)
    finally:
        await store.close()
    return {
        "one_stream_eps": (events + 1) / one_s,
        "sixteen_streams_eps": 16 * (per + 1) / many_s,
        "one_stream_cpu_us_per_event": one_cpu / (events + 1) * 1e6,
        "sixteen_streams_cpu_us_per_event": many_cpu / (16 * (per + 1)) * 1e6,
        "one_stream_worst_stall_ms": one_stall * 1000,
        "sixteen_streams_worst_stall_ms": many_stall * 1000,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mcpl-commits-") as tmp:
        reps: dict[str, list[dict[str, float]]] = {kind: [] for kind in args.stores}
        for n in range(args.reps):  # interleaved, so drift on a shared box hits every store alike
            for kind in args.stores:
                reps[kind].append(await rep(kind, Path(tmp), n, args.events))
        for kind, samples in reps.items():
            results[kind] = {
                name: {"median": statistics.median(s[name] for s in samples), "all": [s[name] for s in samples]}
                for name in samples[0]
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000, help="progress events per rep and layout")
    parser.add_argument("--stores", nargs="+", default=["sqlite", "memory"], choices=["sqlite", "memory"])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = uvloop.run(run(args))  # the loop `mcp-lossless serve` runs on
    for kind, metrics in results.items():
        row = "  ".join(f"{name} {value['median']:,.1f}" for name, value in metrics.items())
        print(f"{kind:7} {row}")
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))


if __name__ == "__main__":
    main()
