"""The 2026-07-28 leg: mcp-lossless against the official `mcp` SDK server's modern leg, side by side in one run.

    .venv/bin/python benchmarks/modern.py --quick                  # smoke run, 1 rep, a second or two per workload
    flock /work/wt/bench.lock .venv/bin/python benchmarks/modern.py --reps 3
    .venv/bin/python benchmarks/modern.py --render benchmarks/results/modern-<timestamp>.json
    .venv/bin/python benchmarks/modern.py --baseline ../old   # adds base-none, base-sqlite: that checkout's server

`--baseline` runs an older checkout (with its own `.venv`) as `base-none` and `base-sqlite` (`run.py`'s), interleaved
with this one in the same reps, tasks included, and reports ours over it: a regression of this leg where it shows.

Workloads, each on a fresh server started by `run.py`'s harness (same configs, same CPU pinning, same wait for
a quiet box), reps interleaved:

- `call`: stateless `tools/call search(steps=0)` as 2026-07-28 defines it (no `initialize`, no session: every
  POST carries `_meta` protocol version and capabilities and the `MCP-Protocol-Version`, `Mcp-Method` and
  `Mcp-Name` headers), a closed loop per keep-alive connection at each concurrency; requests/s and server CPU
  per call. The SDK serves this on the same `streamable_http_app` as its sessions (it is dual-era).
- `floor` (`bare_server.py`, the same uvicorn stack answering with no MCP work at all) for context: what any
  server on this stack pays per request on this box.
- `tasks` (ours only: the SDK has no tasks runtime): `tools/call fetch(steps=0)` declaring the tasks extension,
  answered `CreateTaskResult` once the task is stored, then `tasks/get` until `completed`, in a closed loop;
  tasks/s, polls per task, server CPU per task. Memory and SQLite stores.

Writes `benchmarks/results/modern-<timestamp>.json` and `benchmarks/RESULTS-modern.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop

import loadgen
import run as harness

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
NAMES = ("ours-none", "ours-sqlite", "sdk-sse", "floor")
BASELINE = {"base-none": "ours-none", "base-sqlite": "ours-sqlite"}
"""With ``--baseline``: the older checkout's configs, each with the config of this checkout it is compared with."""
TASK_CONFIGS = ("ours-none", "ours-sqlite", *BASELINE)
BENCH_DIR = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Plan:
    reps: int
    concurrency: tuple[int, ...] = (1, 16, 64)
    task_concurrency: int = 16
    warmup_s: float = 1.0
    duration_s: float = 5.0
    max_other_pct: float = 30.0
    max_wait_s: float = 10.0


QUICK = Plan(reps=1, warmup_s=0.3, duration_s=1.5, max_wait_s=0)
FULL = Plan(reps=3)


class ModernClient:
    """One keep-alive connection speaking 2026-07-28: a fresh id per request, `_meta` and mirrored headers."""

    def __init__(self, connection: loadgen.Connection, tasks: bool) -> None:
        self.connection = connection
        self.path = connection.target.path
        capabilities = {"extensions": {TASKS: {}}} if tasks else {}
        self._meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": {"name": "modern-bench", "version": "1"},
        }
        self._next_id = 0
        self._heads: dict[tuple[str, str], bytes] = {}

    def _head(self, method: str, name: str) -> bytes:
        key = (method, name)
        head = self._heads.get(key)
        if head is None:
            pairs = [("Content-Type", "application/json"), ("Accept", loadgen.ACCEPT)]
            pairs += [("MCP-Protocol-Version", MODERN), ("Mcp-Method", method), ("Mcp-Name", name)]
            head = loadgen.header_block(self.connection.target, *pairs)
            if method == "tools/call":
                self._heads[key] = head  # a task id names one task: its head is not worth keeping
        return head

    async def request(self, method: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        request_id = self._next_id
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": self._meta}}
        )
        exchange = self.connection.request("POST", self.path, self._head(method, name), body)
        response = await asyncio.wait_for(exchange, loadgen.REQUEST_TIMEOUT_S)
        if response.status != 200:
            raise loadgen.BenchError(f"{method}: HTTP {response.status}: {response.body[:300]!r}")
        message = loadgen.final_message(response, request_id)
        result = message.get("result")
        if not isinstance(result, dict):
            raise loadgen.BenchError(f"{method}: no result: {response.body[:300]!r}")
        return result


async def _closed_loop(
    target: loadgen.Target,
    server_pid: int,
    concurrency: int,
    plan: Plan,
    tasks: bool,
    once: Callable[[ModernClient], Awaitable[int]],
) -> dict[str, Any]:
    """`concurrency` workers, one connection each, running `once` (which returns its request count) in a loop;
    only operations that end inside the measured window count."""
    clients = [ModernClient(await loadgen.Connection.open(target), tasks) for _ in range(concurrency)]
    meter = loadgen.CpuMeter(server_pid)
    start = time.perf_counter()
    window_start, window_end = start + plan.warmup_s, start + plan.warmup_s + plan.duration_s
    latencies: list[float] = []
    requests = 0
    failures = loadgen.Failures()

    async def worker(client: ModernClient) -> None:
        nonlocal requests
        while (started := time.perf_counter()) < window_end:
            try:
                count = await once(client)
            except loadgen.FAILURES as error:
                failures.add(error)
                return
            finished = time.perf_counter()
            if window_start <= finished <= window_end:
                latencies.append(finished - started)
                requests += count

    async def sample_cpu() -> dict[str, float]:
        await asyncio.sleep(window_start - time.perf_counter())
        meter.start()
        await asyncio.sleep(window_end - time.perf_counter())
        return meter.stop()

    cpu_task = asyncio.create_task(sample_cpu())
    await asyncio.gather(*(worker(client) for client in clients))
    cpu = await cpu_task
    for client in clients:
        client.connection.close()
    latencies.sort()
    done = len(latencies)
    return {
        "concurrency": concurrency,
        "operations": done,
        "ops_per_s": done / plan.duration_s,
        "requests": requests,
        "p50_ms": 1000 * loadgen.percentile(latencies, 0.50),
        "p99_ms": 1000 * loadgen.percentile(latencies, 0.99),
        "server_cpu_us_per_op": 1e6 * cpu["server_cpu_s"] / max(1, done),
        "errors": failures.count,
        "error_samples": failures.samples,
        "cpu": cpu,
    }


SEARCH = {"name": "search", "arguments": {"query": "q", "steps": 0, "delay_ms": 0}}
EXPECTED = "search results for 'q'"


async def one_call(client: ModernClient) -> int:
    result = await client.request("tools/call", "search", SEARCH)
    content = result.get("content")
    if result.get("resultType") != "complete" or not content or EXPECTED not in str(content[0].get("text")):
        raise loadgen.BenchError(f"unexpected tools/call result: {str(result)[:300]}")
    return 1


async def one_floor_call(client: ModernClient) -> int:
    """The floor (`bare_server.py`) answers any call with the search text and no ``resultType``: it checks
    nothing, validates nothing, keeps nothing; what uvicorn, httptools and one orjson parse cost."""
    result = await client.request("tools/call", "search", SEARCH)
    content = result.get("content")
    if not content or EXPECTED not in str(content[0].get("text")):
        raise loadgen.BenchError(f"unexpected floor result: {str(result)[:300]}")
    return 1


FETCH = {"name": "fetch", "arguments": {"url": "https://example.com/t", "steps": 0, "delay_ms": 0}}


async def one_task(client: ModernClient) -> int:
    """Create a task, then poll it without pause until it is completed: the rate a fast poller can drive."""
    created = await client.request("tools/call", "fetch", FETCH)
    if created.get("resultType") != "task":
        raise loadgen.BenchError(f"fetch did not create a task: {str(created)[:300]}")
    task_id = created["taskId"]
    requests = 1
    while True:
        polled = await client.request("tasks/get", task_id, {"taskId": task_id})
        requests += 1
        if polled.get("status") == "completed":
            return requests
        if polled.get("status") != "working":
            raise loadgen.BenchError(f"task ended {polled.get('status')}: {str(polled)[:300]}")


async def run_window(name: str, plan: Plan, workdir: Path) -> dict[str, Any]:
    window: dict[str, Any] = {"config": name, "quiet_waits_s": [], "call": []}
    quiet = harness.Plan(reps=1, max_other_pct=plan.max_other_pct, max_wait_s=plan.max_wait_s)
    try:
        async with harness.running(harness.CONFIGS[name], workdir) as (pid, target):
            for concurrency in plan.concurrency:
                await harness.wait_for_quiet(pid, quiet, window["quiet_waits_s"])
                once = one_floor_call if name == "floor" else one_call
                window["call"].append(await _closed_loop(target, pid, concurrency, plan, False, once))
            if name in TASK_CONFIGS:
                await harness.wait_for_quiet(pid, quiet, window["quiet_waits_s"])
                window["tasks"] = await _closed_loop(target, pid, plan.task_concurrency, plan, True, one_task)
            window["rss_end_kb"] = loadgen.rss_kb(pid)
    except (harness.ServerFailed, *loadgen.FAILURES) as error:
        window["failed"] = f"{type(error).__name__}: {error}"
    return window


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(windows: list[dict[str, Any]], plan: dict[str, Any]) -> dict[str, Any]:
    calls: dict[str, dict[int, dict[str, float]]] = {}
    run = {w["config"] for w in windows}
    for name in [*NAMES, *(b for b in BASELINE if b in run)]:
        mine = [w for w in windows if w["config"] == name and "failed" not in w]
        calls[name] = {}
        for concurrency in plan["concurrency"]:
            rows = [r for w in mine for r in w["call"] if r["concurrency"] == concurrency and not r["errors"]]
            calls[name][concurrency] = {
                "rps": _median([r["ops_per_s"] for r in rows]),
                "cpu_us": _median([r["server_cpu_us_per_op"] for r in rows]),
                "p50_ms": _median([r["p50_ms"] for r in rows]),
                "p99_ms": _median([r["p99_ms"] for r in rows]),
                "reps": len(rows),
            }
    tasks = {}
    for name in (t for t in TASK_CONFIGS if t in run or t in NAMES):
        rows = [w["tasks"] for w in windows if w["config"] == name and "tasks" in w and not w["tasks"]["errors"]]
        tasks[name] = {
            "tasks_per_s": _median([r["ops_per_s"] for r in rows]),
            "requests_per_s": _median([r["requests"] / plan["duration_s"] for r in rows]),
            "polls_per_task": _median([r["requests"] / max(1, r["operations"]) - 1 for r in rows]),
            "cpu_us_per_task": _median([r["server_cpu_us_per_op"] for r in rows]),
            "p50_ms": _median([r["p50_ms"] for r in rows]),
            "reps": len(rows),
        }
    return {"call": calls, "tasks": tasks}


GOAL = 10.0
"""Issue 13: stateless tools/call at least 10x the SDK's modern leg (server CPU per call, server saturated)."""


def _goal(calls: dict[str, dict[int, dict[str, float]]]) -> str:
    """The verdict on the goal: server CPU per call, SDK over ours, at c=16 and c=64 (the worse decides)."""
    sdk = calls["sdk-sse"]
    parts, worst = [], math.inf
    for name in ("ours-none", "ours-sqlite"):
        ratios = [_ratio(sdk[c]["cpu_us"], calls[name][c]["cpu_us"]) for c in (16, 64) if c in sdk]
        ratios = [r for r in ratios if not math.isnan(r)]
        if ratios:
            worst = min(worst, *ratios)
            parts.append(f"{name} {' / '.join(f'{r:.1f}x' for r in ratios)}")
    if not parts:
        return "**Goal** (>= 10x the SDK's server CPU per call): not measured in this run."
    verdict = "met" if worst >= GOAL else "**not met**"
    line = f"**Goal** (>= {GOAL:g}x the SDK's server CPU per call at c=16 / c=64): {verdict}: {'; '.join(parts)}."
    floor, ours = calls["floor"].get(16, {}).get("cpu_us", math.nan), calls["ours-none"][16]["cpu_us"]
    if not math.isnan(floor) and not math.isnan(ours):
        line += (
            f" At c=16 the bare stack (`floor`: uvicorn, httptools, one JSON parse) takes {floor:.0f} µs of the"
            f" {ours:.0f} µs ours-none spends per call, so the MCP work itself is {ours - floor:.0f} µs; 10x the"
            f" SDK ({sdk[16]['cpu_us']:.0f} µs) would leave {sdk[16]['cpu_us'] / GOAL - floor:.0f} µs for it."
        )
    return line


def _ratio(over: float, under: float) -> float:
    return over / under if under and not math.isnan(under) else float("nan")


def _f(value: float, digits: int = 0, unit: str = "") -> str:
    return "—" if math.isnan(value) else f"{value:,.{digits}f}{unit}"  # NaN: nothing measured


def markdown(document: dict[str, Any], json_path: Path) -> str:
    summary, plan, machine = document["summary"], document["plan"], document["machine"]
    calls, sdk = summary["call"], summary["call"]["sdk-sse"]
    lines = [
        "# The 2026-07-28 leg: mcp-lossless vs the official SDK's modern leg",
        "",
        f"Command: `{document['command']}` (under `flock /work/wt/bench.lock`), {document['started_utc']} to "
        f"{document['finished_utc']}; results `{os.path.relpath(json_path, BENCH_DIR.parent)}`.",
        f"Machine: {machine['cpu']}, {machine['cpus']} CPUs, Python {machine['python']}, "
        f"mcp {machine['packages'].get('mcp', '?')}, commit {machine['git_commit']}. {document['pinning']}.",
        f"Plan: {plan['reps']} interleaved rep(s), {plan['warmup_s']} s warm-up and {plan['duration_s']} s measured "
        "per workload; medians over reps. **The box is shared** with other helpers' work: each phase waits up to "
        f"{plan['max_wait_s']} s for the rest of the box to use under {plan['max_other_pct']:.0f}% of a core, and "
        "the CPU the rest used is in the JSON (`other_pct`).",
        "",
        "Servers: " + "; ".join(f"`{name}`: `{command}`" for name, command in document["configs"].items()) + ".",
        "",
        _goal(calls),
        "",
        "## Stateless `tools/call` (2026-07-28: no session, `_meta` and mirrored headers on every POST)",
        "",
        "| server | concurrency | calls/s | server CPU µs/call | p50 ms | p99 ms | vs SDK calls/s | vs SDK CPU/call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in document["configs"]:
        for concurrency, row in calls[name].items():
            base = sdk[concurrency]
            ratio_rps = _ratio(row["rps"], base["rps"])
            ratio_cpu = _ratio(base["cpu_us"], row["cpu_us"])
            lines.append(
                f"| {name} | {concurrency} | {_f(row['rps'])} | {_f(row['cpu_us'])} | {_f(row['p50_ms'], 2)} | "
                f"{_f(row['p99_ms'], 2)} | {_f(ratio_rps, 1, 'x')} | {_f(ratio_cpu, 1, 'x')} |"
            )
    lines += [
        "",
        "`vs SDK CPU/call` is the SDK's server CPU per call divided by ours (how many of our calls fit in the CPU one"
        " SDK call takes). The generator is pinned to its own CPU; at high rates it, not the server, can be the"
        " bound on calls/s: CPU per call is the figure that does not depend on it.",
        "",
        "## Tasks: create + poll until completed (ours only; the SDK ships no tasks runtime)",
        "",
        "| server | concurrency | tasks/s | requests/s | polls/task | server CPU µs/task | p50 ms/task |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in summary["tasks"].items():
        if name not in document["configs"]:
            continue
        lines.append(
            f"| {name} | {plan['task_concurrency']} | {_f(row['tasks_per_s'])} | {_f(row['requests_per_s'])} | "
            f"{_f(row['polls_per_task'], 1)} | {_f(row['cpu_us_per_task'])} | {_f(row['p50_ms'], 2)} |"
        )
    lines += [
        "",
        "A task is `tools/call fetch(steps=0)` with the tasks extension declared (answered only once the task is"
        " stored), then `tasks/get` without pause until `completed`; each poll is authorized against its request's"
        " token like any (here `--auth none`: the anonymous principal).",
        "",
    ]
    lines += _against_baseline(document)
    failed = [f"{w['config']} rep {w['rep']}: {w['failed']}" for w in document["windows"] if "failed" in w]
    errors = [
        f"{w['config']} rep {w['rep']} c={r['concurrency']}: {r['error_samples']}"
        for w in document["windows"]
        for r in [*w.get("call", []), *([w["tasks"]] if "tasks" in w else [])]
        if r["errors"]
    ]
    if failed or errors:
        lines += ["## Failures", "", *(f"- {line}" for line in failed + errors), ""]
    return "\n".join(lines)


def _against_baseline(document: dict[str, Any]) -> list[str]:
    """With ``--baseline``: this checkout's server CPU per call and per task over the older one's, medians of each
    side over the same interleaved reps, and each side's spread over reps (min to max), which is the noise."""
    summary, windows = document["summary"], document["windows"]
    pairs = [(base, ours) for base, ours in BASELINE.items() if base in document["configs"] and ours in summary["call"]]
    if not pairs:
        return []

    def spread(name: str, pick: Callable[[dict[str, Any]], float | None]) -> str:
        values = [v for w in windows if w["config"] == name and "failed" not in w for v in [pick(w)] if v is not None]
        return f"{min(values):,.0f}-{max(values):,.0f}" if values else "—"

    def call_cpu(concurrency: int) -> Callable[[dict[str, Any]], float | None]:
        def pick(window: dict[str, Any]) -> float | None:
            rows = [r for r in window["call"] if r["concurrency"] == concurrency and not r["errors"]]
            return rows[0]["server_cpu_us_per_op"] if rows else None

        return pick

    def task_cpu(window: dict[str, Any]) -> float | None:
        tasks = window.get("tasks")
        return tasks["server_cpu_us_per_op"] if tasks and not tasks["errors"] else None

    lines = [
        "## Against the baseline (`--baseline`): server CPU, this checkout over the older one",
        "",
        "| this | baseline | workload | this µs (reps) | baseline µs (reps) | this / baseline |",
        "|---|---|---|---|---|---|",
    ]
    for base, ours in pairs:
        for concurrency, row in summary["call"][ours].items():
            theirs = summary["call"][base][concurrency]["cpu_us"]
            pick = call_cpu(int(concurrency))  # a key from JSON (``--render``) is a string
            lines.append(
                f"| {ours} | {base} | tools/call c={concurrency}, per call | {_f(row['cpu_us'])}"
                f" ({spread(ours, pick)}) | {_f(theirs)} ({spread(base, pick)})"
                f" | {_f(_ratio(row['cpu_us'], theirs), 2)} |"
            )
        mine, older = summary["tasks"].get(ours), summary["tasks"].get(base)
        if mine and older:
            lines.append(
                f"| {ours} | {base} | task create + poll, per task | {_f(mine['cpu_us_per_task'])}"
                f" ({spread(ours, task_cpu)}) | {_f(older['cpu_us_per_task'])} ({spread(base, task_cpu)})"
                f" | {_f(_ratio(mine['cpu_us_per_task'], older['cpu_us_per_task']), 2)} |"
            )
    return [*lines, ""]


async def run_all(plan: Plan, names: list[str]) -> list[dict[str, Any]]:
    windows = []
    with tempfile.TemporaryDirectory(prefix="mcp-modern-bench-") as workdir:
        for rep in range(1, plan.reps + 1):
            for name in names:
                print(f"[rep {rep}/{plan.reps}] {name} ...", flush=True)
                window = await run_window(name, plan, Path(workdir))
                window["rep"] = rep
                calls = ", ".join(f"c={r['concurrency']} {r['ops_per_s']:.0f}/s" for r in window.get("call", []))
                tasks = f"; tasks {window['tasks']['ops_per_s']:.0f}/s" if "tasks" in window else ""
                print(f"    {window.get('failed', '')}{calls}{tasks}", flush=True)
                windows.append(window)
    return windows


def render(results: Path, report: Path) -> None:
    document = json.loads(results.read_text())
    document["summary"] = summarize(document["windows"], document["plan"])
    report.write_text(markdown(document, results))
    print(f"wrote {report} from {results}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--reps", type=int, help="interleaved repetitions (default 3, quick 1)")
    parser.add_argument("--only", default="", help=f"comma-separated names of {list(NAMES)}")
    parser.add_argument("--render", type=Path, help="only rewrite the report from an earlier results JSON")
    parser.add_argument("--baseline", type=Path, help="another checkout to run as base-none and base-sqlite")
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--report", type=Path, default=BENCH_DIR / "RESULTS-modern.md")
    args = parser.parse_args()
    if args.render:
        render(args.render, args.report)
        return
    if args.baseline:
        harness.add_baseline(args.baseline)
    plan = QUICK if args.quick else FULL
    if args.reps:
        plan = dataclasses.replace(plan, reps=args.reps)
    known = [*NAMES, *(BASELINE if args.baseline else ())]
    names = [n for n in known if not args.only or n in args.only.split(",")]
    if not names:
        parser.error(f"--only {args.only!r} names none of {list(NAMES)}")
    pinning = "server on CPU 0 (taskset), generator on CPU 1"
    if harness.CAN_PIN:
        os.sched_setaffinity(0, {1})
    else:
        pinning = "no pinning (fewer than 2 CPUs or no taskset)"
    command = shlex.join([os.path.relpath(sys.executable, harness.ROOT), os.path.relpath(__file__, harness.ROOT)])
    command = shlex.join([*shlex.split(command), *sys.argv[1:]])
    started = datetime.datetime.now(datetime.UTC)
    windows = uvloop.run(run_all(plan, names))
    document: dict[str, Any] = {
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "plan": dataclasses.asdict(plan),
        "pinning": pinning,
        "machine": harness.machine_info(),
        "configs": {name: harness._display(harness.CONFIGS[name]) for name in names},
        "windows": windows,
    }
    document["summary"] = summarize(windows, document["plan"])
    args.results_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.results_dir / f"modern-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    json_path.write_text(json.dumps(document, indent=1))
    args.report.write_text(markdown(document, json_path))
    print(f"wrote {json_path} and {args.report}")


if __name__ == "__main__":
    main()
