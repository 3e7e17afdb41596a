"""What an idempotency key costs a `tools/call` (issue 28, acceptance 5): keyed and unkeyed calls side by side.

    .venv/bin/python benchmarks/keys.py                      # 5 interleaved reps of 8 s per variant and concurrency
    .venv/bin/python benchmarks/keys.py --reps 1 --seconds 2  # smoke run

One `mcp-lossless serve` on the SQLite default store (a fresh file; bounds raised, see :data:`KEY_CAP`), pinned to
CPU 0, this generator on CPU 1, as `run.py` does. Each window is a closed loop of `search(steps=0, delay_ms=0)` on
`concurrency` sessions; the keyed variant gives every call a fresh UUID 4 `idempotencyKey` (a first use each time:
the key's row is written in the stream record's transaction, and the call waits for that commit before its tool
runs, ADR 0029). Windows alternate unkeyed / keyed within each rep on the same server, so drift on this shared box
hits both alike. Reports the server CPU per call (`/proc/<pid>/task/*/schedstat`), its ratio keyed/unkeyed (the
bound is 1.10), and the p50 latency each adds; writes `benchmarks/RESULTS-keys.md` and the raw windows to
`benchmarks/results/keys-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import uvloop

import loadgen
import run

CONCURRENCIES = (1, 16)
KEY_CAP = 100_000_000
"""The server's `idempotency_keys_per_principal` and `stored_bytes_per_principal` here: every keyed call is a
first use whose stream is kept as long as its key (24 h), so one principal passes both defaults within a run. Also
each session's count of completed streams: a session here makes tens of thousands of calls, and retention deleting
the unkeyed ones while it must keep the keyed ones (ADR 0029) would charge a window with work a call leaves for
later; so no window deletes, and each measures what its calls cost when they run."""


def _body(request_id: int, keyed: bool) -> bytes:
    params: dict[str, Any] = {"name": "search", "arguments": {"query": "q", "steps": 0, "delay_ms": 0}}
    if keyed:
        params["idempotencyKey"] = str(uuid.uuid4())
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


async def window(target: loadgen.Target, pid: int, concurrency: int, keyed: bool, seconds: float) -> dict[str, Any]:
    """A closed loop of calls for ``seconds`` after a one-second warm-up: calls, p50, server CPU per call."""
    sessions = await loadgen.open_sessions(target, concurrency, parallel=concurrency)
    meter = loadgen.CpuMeter(pid)
    start = time.perf_counter() + 1.0
    end = start + seconds
    latencies: list[float] = []
    expected = b"search results for 'q'"

    async def worker(session: loadgen.Session) -> None:
        connection, path, head = session.connection, session.connection.target.path, session.post_head
        while (began := time.perf_counter()) < end:
            response = await asyncio.wait_for(
                connection.request("POST", path, head, _body(session.take_id(), keyed)), loadgen.REQUEST_TIMEOUT_S
            )
            if response.status != 200 or expected not in response.body:
                raise loadgen.BenchError(f"HTTP {response.status}: {response.body[:300]!r}")
            done = time.perf_counter()
            if start <= done <= end:
                latencies.append(done - began)

    async def sample() -> dict[str, float]:
        await asyncio.sleep(start - time.perf_counter())
        meter.start()
        await asyncio.sleep(end - time.perf_counter())
        return meter.stop()

    cpu_task = asyncio.create_task(sample())
    await asyncio.gather(*(worker(session) for session in sessions))
    cpu = await cpu_task
    loadgen.close_all(sessions)
    latencies.sort()
    return {
        "concurrency": concurrency,
        "keyed": keyed,
        "calls": len(latencies),
        "rps": len(latencies) / seconds,
        "p50_ms": 1000 * loadgen.percentile(latencies, 0.50),
        "server_cpu_us_per_call": 1e6 * cpu["server_cpu_s"] / max(1, len(latencies)),
        "other_pct": cpu["other_pct"],
    }


async def measure(reps: int, seconds: float, workdir: Path) -> list[dict[str, Any]]:
    config = run.Config(
        lambda port, directory: run._ours(
            port, "--store", f"sqlite:{directory}/keys-{port}.db?max_completed_streams_per_session={KEY_CAP}",
            "--auth", "none",
            "--idempotency-keys-per-principal", str(KEY_CAP), "--stored-bytes-per-principal", str(KEY_CAP * 100),
        )
    )  # fmt: skip
    windows = []
    async with run.running(config, workdir) as (pid, target):
        for rep in range(reps):
            for concurrency in CONCURRENCIES:
                for keyed in (False, True) if rep % 2 == 0 else (True, False):  # alternate which goes first
                    result = await window(target, pid, concurrency, keyed, seconds)
                    windows.append({"rep": rep, **result})
                    print(json.dumps(windows[-1]), flush=True)
    return windows


def summarize(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for concurrency in CONCURRENCIES:
        cells = {}
        for keyed in (False, True):
            mine = [w for w in windows if w["concurrency"] == concurrency and w["keyed"] is keyed]
            cells[keyed] = {
                "cpu": statistics.median(w["server_cpu_us_per_call"] for w in mine),
                "p50": statistics.median(w["p50_ms"] for w in mine),
                "rps": statistics.median(w["rps"] for w in mine),
            }
        ratios = [
            k["server_cpu_us_per_call"] / u["server_cpu_us_per_call"]
            for u, k in zip(
                (w for w in windows if w["concurrency"] == concurrency and not w["keyed"]),
                (w for w in windows if w["concurrency"] == concurrency and w["keyed"]),
                strict=True,
            )
        ]
        rows.append({"concurrency": concurrency, "unkeyed": cells[False], "keyed": cells[True], "ratios": ratios})
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# An idempotency key's cost per `tools/call` (issue 28, acceptance 5)",
        "",
        f"`{meta['command']}`, {meta['started_utc']}; {meta['machine']}. {meta['reps']} interleaved reps of "
        f"{meta['seconds']:g} s per variant, the SQLite default store, one server for every window, server on "
        "CPU 0 and generator on CPU 1. Medians over the reps; the ratio column is the median of each rep's own "
        f"keyed/unkeyed ratio (per rep: {{ratios}}). Raw windows: `{meta['json']}`.",
        "",
        "| concurrency | unkeyed CPU µs/call | keyed CPU µs/call | keyed / unkeyed | unkeyed p50 ms | keyed p50 ms |"
        " added p50 ms | unkeyed calls/s | keyed calls/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    footer = [
        "",
        "The bound is 1.10. Where the rest goes, and what would bring it down: ADR 0029 (docs/decisions).",
    ]
    for row in rows:
        u, k = row["unkeyed"], row["keyed"]
        ratio = statistics.median(row["ratios"])
        lines.append(
            f"| {row['concurrency']} | {u['cpu']:.0f} | {k['cpu']:.0f} | **{ratio:.3f}** | {u['p50']:.2f} |"
            f" {k['p50']:.2f} | {k['p50'] - u['p50']:+.2f} | {u['rps']:.0f} | {k['rps']:.0f} |"
        )
    lines[2] = lines[2].replace(
        "{ratios}", "; ".join(f"c={r['concurrency']}: " + ", ".join(f"{x:.3f}" for x in r["ratios"]) for r in rows)
    )
    return "\n".join(lines + footer) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--report", type=Path, default=run.BENCH_DIR / "RESULTS-keys.md")
    args = parser.parse_args()
    if run.CAN_PIN:
        os.sched_setaffinity(0, {1})
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="mcp-lossless-keys-") as directory:
        windows = uvloop.run(measure(args.reps, args.seconds, Path(directory)))
    results = run.BENCH_DIR / "results"
    results.mkdir(exist_ok=True)
    json_path = results / f"keys-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    json_path.write_text(json.dumps(windows, indent=1))
    machine = run.machine_info()
    meta = {
        "command": f".venv/bin/python benchmarks/keys.py --reps {args.reps} --seconds {args.seconds:g}",
        "started_utc": started.isoformat(timespec="seconds"),
        "machine": f"{machine['cpu']}, {machine['cpus']} CPUs",
        "reps": args.reps,
        "seconds": args.seconds,
        "json": os.path.relpath(json_path, run.ROOT),
    }
    args.report.write_text(markdown(summarize(windows), meta))
    print(args.report.read_text())


if __name__ == "__main__":
    main()
