"""mcp-lossless vs the official `mcp` SDK server, side by side in one run.

    .venv/bin/python benchmarks/run.py            # full run: 3 interleaved reps (15-25 min on a shared box)
    .venv/bin/python benchmarks/run.py --quick    # smoke run: a few seconds per workload, 1 rep
    .venv/bin/python benchmarks/run.py --only sdk-sse,ours-none --reps 5
    .venv/bin/python benchmarks/run.py --render benchmarks/results/<timestamp>.json   # report only
    .venv/bin/python benchmarks/run.py --baseline ../old   # adds base-none, base-sqlite: that checkout's server

`--baseline` measures a regression where it can be seen: an older checkout (with its own `.venv`) runs as
`base-none` and `base-sqlite`, interleaved with this one in the same run, so both face the same box.

`floor` (`bare_server.py`) is the physical floor: a bare ASGI app on the same uvicorn stack, echo and sessions
only. Each (config, rep) window gets a fresh server for echo/stream/replay and another fresh one for the idle
sessions workload. Reps are interleaved (rep 1 of every config, then rep 2, ...) so drift on this shared
box hits every config alike. The server runs pinned to CPU 0 (`taskset`), this generator to CPU 1, and
each window records the CPU used by the server, the generator and everything else ("other"). Writes the
raw results to `benchmarks/results/<timestamp>.json` and the tables to `benchmarks/RESULTS.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

import loadgen
import report

HOST = "127.0.0.1"
BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
OURS = str(ROOT / ".venv" / "bin" / "mcp-lossless")
SDK_SERVER = [sys.executable, str(BENCH_DIR / "sdk_server.py")]
FLOOR_SERVER = [sys.executable, str(BENCH_DIR / "bare_server.py")]
DEV_CLIENT, DEV_SECRET = "bench", "bench-secret"


@dataclass(frozen=True)
class Config:
    """A server under test. `command(port, workdir)` starts it on loopback as one process."""

    command: Callable[[int, Path], list[str]]
    sse: bool = True  # False: echo and sessions only (JSON replies drop progress; the floor has no progress/replay)
    dev_auth: bool = False  # needs a bearer token from the embedded dev authorization server


def _ours(port: int, *extra: str, binary: str = OURS) -> list[str]:
    """`--log-level warning` matches the SDK server's `log_level="WARNING"` (both log each session at info)."""
    return [binary, "serve", "--host", HOST, "--port", str(port), "--log-level", "warning", *extra]


def _sdk(port: int, *extra: str) -> list[str]:
    return [*SDK_SERVER, "--host", HOST, "--port", str(port), *extra]


CONFIGS: dict[str, Config] = {
    "ours-none": Config(lambda port, _: _ours(port, "--store", "memory", "--auth", "none")),
    "ours-jwt": Config(
        lambda port, _: _ours(port, "--store", "memory", "--dev-client", f"{DEV_CLIENT}:{DEV_SECRET}"),
        dev_auth=True,
    ),
    "ours-sqlite": Config(
        lambda port, workdir: _ours(port, "--store", f"sqlite:{workdir}/store-{port}.db", "--auth", "none")
    ),
    "sdk-sse": Config(lambda port, _: _sdk(port)),
    "sdk-json": Config(lambda port, _: _sdk(port, "--json-response"), sse=False),
    "floor": Config(lambda port, _: [*FLOOR_SERVER, "--host", HOST, "--port", str(port)], sse=False),
}


def add_baseline(checkout: Path) -> None:
    """Register `base-none` and `base-sqlite`: ours-none and ours-sqlite served by another checkout's install."""
    binary = str(checkout.resolve() / ".venv" / "bin" / "mcp-lossless")
    if not Path(binary).is_file():
        raise SystemExit(f"--baseline: no {binary} (run `make install` in that checkout)")
    CONFIGS["base-none"] = Config(lambda port, _: _ours(port, "--store", "memory", "--auth", "none", binary=binary))
    CONFIGS["base-sqlite"] = Config(
        lambda port, workdir: _ours(
            port, "--store", f"sqlite:{workdir}/base-{port}.db", "--auth", "none", binary=binary
        )
    )


@dataclass(frozen=True)
class Plan:
    reps: int
    concurrency: tuple[int, ...] = (1, 16, 64)
    warmup_s: float = 1.0
    duration_s: float = 5.0
    stream_steps: int = 1000
    stream_calls: int = 5
    replay_steps: int = 9999
    resume_after: int = 5000
    replays: int = 5
    sessions: int = 1000
    settle_s: float = 2.0
    max_other_pct: float = 30.0  # before each measured phase, wait for the rest of the box to go quiet ...
    max_wait_s: float = 10.0  # ... but not longer than this; the "other" CPU actually seen is recorded


QUICK = Plan(reps=1, warmup_s=0.3, duration_s=1.5, stream_calls=2, replays=2, sessions=200, settle_s=0.5, max_wait_s=0)
FULL = Plan(reps=3)
START_TIMEOUT_S = 20.0


class ServerFailed(Exception):
    """The server did not start, or died; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


# Decided once, before this process pins itself to CPU 1: asked afterwards, its own affinity says one CPU.
CAN_PIN = len(os.sched_getaffinity(0)) > 1 and shutil.which("taskset") is not None


def pinned(command: list[str], cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if CAN_PIN else command


@contextlib.asynccontextmanager
async def running(config: Config, workdir: Path) -> AsyncIterator[tuple[int, loadgen.Target]]:
    """Start a fresh server, wait until it accepts connections, yield (pid, target); stop it after."""
    port = free_port()
    log_path = workdir / f"server-{port}.log"
    with log_path.open("wb") as log:
        command = pinned(config.command(port, workdir), 0)
        process = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.returncode is not None:
                raise ServerFailed(f"exited with {process.returncode}: {_tail(log_path)}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(HOST, port)
                writer.close()
                break
            if time.monotonic() > deadline:
                raise ServerFailed(f"not listening after {START_TIMEOUT_S:.0f} s: {_tail(log_path)}")
            await asyncio.sleep(0.05)
        target = loadgen.Target(HOST, port)
        if config.dev_auth:
            token = await loadgen.fetch_dev_token(HOST, port, DEV_CLIENT, DEV_SECRET, target.url)
            target = loadgen.Target(HOST, port, token=token)
        if CAN_PIN and os.sched_getaffinity(process.pid) & os.sched_getaffinity(0):
            raise ServerFailed(f"server shares the generator's CPU: {sorted(os.sched_getaffinity(process.pid))}")
        yield process.pid, target
        if process.returncode is not None:
            raise ServerFailed(f"died during the window with {process.returncode}: {_tail(log_path)}")
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-1500:].strip() or "(empty log)"


async def wait_for_quiet(pid: int, plan: Plan, waits: list[float]) -> None:
    """Wait until other processes use at most `max_other_pct` of a core, for up to `max_wait_s`."""
    started = time.monotonic()
    while time.monotonic() - started < plan.max_wait_s:
        meter = loadgen.CpuMeter(pid)
        meter.start()
        await asyncio.sleep(0.5)
        if meter.stop()["other_pct"] <= plan.max_other_pct:
            break
    waits.append(round(time.monotonic() - started, 1))


async def run_window(name: str, config: Config, plan: Plan, workdir: Path) -> dict[str, Any]:
    """All workloads of one config once: echo/stream/replay on one server, sessions on a fresh one."""
    window: dict[str, Any] = {"config": name, "quiet_waits_s": []}
    waits = window["quiet_waits_s"]
    try:
        async with running(config, workdir) as (pid, target):
            window["echo"] = []
            for concurrency in plan.concurrency:
                await wait_for_quiet(pid, plan, waits)
                result = await loadgen.echo(target, pid, concurrency, plan.warmup_s, plan.duration_s)
                window["echo"].append(result)
            if config.sse:
                await wait_for_quiet(pid, plan, waits)
                window["stream"] = await loadgen.stream(target, pid, plan.stream_steps, plan.stream_calls)
                await wait_for_quiet(pid, plan, waits)
                window["replay"] = await loadgen.replay(target, pid, plan.replay_steps, plan.resume_after, plan.replays)
            window["rss_end_kb"] = loadgen.rss_kb(pid)
        async with running(config, workdir) as (pid, target):
            await wait_for_quiet(pid, plan, waits)
            window["sessions"] = await loadgen.sessions(target, pid, plan.sessions, plan.settle_s)
    except (ServerFailed, *loadgen.FAILURES) as error:
        window["failed"] = f"{type(error).__name__}: {error}"
    return window


def _display(config: Config) -> str:
    """The server command as a reader would type it: relative paths, P for the free port chosen per run."""
    command = shlex.join(config.command(0, Path("/tmp/mcp-bench-XXXX")))
    return command.replace(f"{ROOT}/", "").replace("--port 0", "--port P").replace("store-0.db", "store-P.db")


def machine_info() -> dict[str, Any]:
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    packages = [
        "mcp",
        "mcp-lossless",
        "uvicorn",
        "uvloop",
        "httptools",
        "h11",
        "starlette",
        "sse-starlette",
        "anyio",
        "pydantic",
        "orjson",
    ]
    versions = {}
    for package in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return {
        "cpu": cpu_model,
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
        "git_commit": git.stdout.strip() if git.returncode == 0 else "no commit yet",
    }


async def run_all(names: list[str], plan: Plan) -> list[dict[str, Any]]:
    """Interleaved: rep 1 of every config, then rep 2, ..."""
    windows = []
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as workdir:
        for rep in range(1, plan.reps + 1):
            for name in names:
                print(f"[rep {rep}/{plan.reps}] {name} ...", flush=True)
                window = await run_window(name, CONFIGS[name], plan, Path(workdir))
                window["rep"] = rep
                print(f"    {report.window_line(window)}", flush=True)
                windows.append(window)
    return windows


def render(results: Path, report_path: Path) -> None:
    """Rewrite the report from a results file, e.g. after the report format changed."""
    document = json.loads(results.read_text())
    document["summary"] = report.summarize(document["windows"], list(document["configs"]))
    report_path.write_text(report.markdown(document, results))
    print(f"wrote {report_path} from {results}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run: a few seconds per workload")
    parser.add_argument("--reps", type=int, help="interleaved repetitions (default: 3, quick: 1)")
    parser.add_argument("--only", default="", help=f"comma-separated config names or prefixes of {list(CONFIGS)}")
    parser.add_argument("--max-wait", type=float, help="seconds to wait for a quiet box before each phase")
    parser.add_argument("--render", type=Path, help="only rewrite the report from an earlier results JSON")
    parser.add_argument("--baseline", type=Path, help="another checkout to run as base-none and base-sqlite")
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--report", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = parser.parse_args()
    if args.render:
        render(args.render, args.report)
        return

    if args.baseline:
        add_baseline(args.baseline)
    plan = QUICK if args.quick else FULL
    if args.reps:
        plan = dataclasses.replace(plan, reps=args.reps)
    if args.max_wait is not None:
        plan = dataclasses.replace(plan, max_wait_s=args.max_wait)
    prefixes = [p for p in args.only.split(",") if p]
    names = [n for n in CONFIGS if not prefixes or any(n.startswith(p) for p in prefixes)]
    if not names:
        parser.error(f"--only {args.only!r} matches none of {list(CONFIGS)}")

    pinning = "server on CPU 0 (taskset), generator on CPU 1 (sched_setaffinity)"
    if CAN_PIN:
        os.sched_setaffinity(0, {1})
    else:
        pinning = "none (fewer than 2 CPUs or no taskset)"
    command = shlex.join([os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT), *sys.argv[1:]])

    started = datetime.datetime.now(datetime.UTC)
    windows = uvloop.run(run_all(names, plan))  # the generator's own CPU per request is what caps it at high rates
    document: dict[str, Any] = {
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "quick": args.quick,
        "plan": dataclasses.asdict(plan),
        "pinning": pinning,
        "machine": machine_info(),
        "configs": {name: _display(CONFIGS[name]) for name in names},
        "windows": windows,
        "summary": report.summarize(windows, names),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.results_dir / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    json_path.write_text(json.dumps(document, indent=1))
    args.report.write_text(report.markdown(document, json_path))
    print(f"wrote {json_path} and {args.report}")


if __name__ == "__main__":
    main()
