"""Instructions the real ``mcp-lossless serve`` spends per call and per event over loopback, under callgrind.

Wall-clock figures on a shared 2-core box spread by 20-40 % between reps; an instruction count of the server
process does not depend on what else runs, so it decides whether a change made the per-request path dearer::

    .venv/bin/python benchmarks/instructions_serve.py                          # every workload, this checkout
    .venv/bin/python benchmarks/instructions_serve.py --baseline ../base739    # the same, beside another checkout
    .venv/bin/python benchmarks/instructions_serve.py --only echo16,stream --no-write   # a quick look, no files

Each (checkout, workload) gets a fresh ``serve --store memory --auth none`` (that checkout's ``.venv``; with
``--store sqlite``, a fresh SQLite file each, its writer thread counted with the rest of the process) under
``valgrind --tool=callgrind --instr-atstart=no`` with ``PYTHONHASHSEED=0``. The generator (``loadgen``, the same
for both checkouts) opens the sessions and warms the path up while nothing is counted, switches counting on with
``callgrind_control -i on`` only around the measured requests, and divides the server's total by the units:

- ``echo16``, ``echo64``: ``tools/call`` of ``search`` with ``steps=0`` from 16 / 64 sessions, each on its own
  keep-alive connection, all in flight at once; unit: one call.
- ``keyed16``: ``echo16`` with a fresh ``idempotencyKey`` (SEP-3182, a first use) on every call: beside ``echo16``
  on ``--store sqlite``, what a key costs a call (issue 28 acceptance 5, ADR 0029); unit: one call.
- ``stream``: one call of ``search`` with 1000 progress steps (1001 SSE events, the result included), twice;
  unit: one event.
- ``replay``: a resume (GET + ``Last-Event-ID``) after message 2000 of a finished 5000-step call, twice;
  unit: one replayed event.
- ``modern16``: stateless 2026-07-28 ``tools/call`` of ``search`` (``benchmarks/modern.py``'s ``call``) from 16
  keep-alive connections, 50 calls each, all in flight at once; unit: one call.
- ``modernkeyed16``: ``modern16`` with a fresh ``idempotencyKey`` on every call (the 2026-07-28 keyed path,
  ``server/modern/keyed.py``); unit: one call.
- ``tasks16``: 2026-07-28 task create + poll to completion (``benchmarks/modern.py``'s ``tasks``: ``tools/call``
  of ``fetch`` with ``steps=0`` declaring the tasks extension, answered ``CreateTaskResult`` once the task is stored,
  then ``tasks/get`` until ``completed``) from 16 keep-alive connections, 25 tasks each, all in flight at once;
  unit: one task. The polls a task takes depend on timing (at full speed one); the run prints them per task.

The counts are deterministic to well under 1 % from run to run. Writes the figures to
``benchmarks/results/instructions-serve-<timestamp>.json`` and the table to ``benchmarks/RESULTS-instructions.md``
(``--no-write``: print only). ``--keep DIR`` keeps each server's callgrind output there, for ``callgrind_annotate``.
``--cache-sim`` also simulates the caches (about twice as slow) and reports first-level and last-level misses per
unit (instruction and data together): what instruction counts cannot see, such as a working set that grows with the
number of connections. ``--syscalls`` runs each server once more without valgrind and counts its system calls per
unit with ``strace -c`` attached around the measured requests (callgrind counts none of them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

import loadgen
import modern

HOST = "127.0.0.1"
BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
STARTUP_TIMEOUT_S = 600.0
ARGUMENTS = {"query": "q", "steps": 0, "delay_ms": 0}


@dataclass(frozen=True)
class Workload:
    """A driver that counts only what it measures (``counting(True/False)``) and returns the units measured."""

    unit: str
    drive: Callable[[loadgen.Target, Callable[[bool], None]], Awaitable[int]]


async def _keyed_call(session: loadgen.Session) -> dict[str, Any]:
    """``session.call("search", ARGUMENTS)`` with a fresh idempotency key in its params (a UUID 4, as a client
    makes one)."""
    request_id = session.take_id()
    params = {"name": "search", "arguments": ARGUMENTS, "idempotencyKey": str(uuid.uuid4())}
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
    response = await session.connection.request("POST", session.connection.target.path, session.post_head, body)
    return loadgen.final_message(response, request_id)


def _echo(
    sessions: int, calls_each: int, keyed: bool = False
) -> Callable[[loadgen.Target, Callable[[bool], None]], Awaitable[int]]:
    """``keyed``: each call carries a fresh idempotency key (:func:`_keyed_call`)."""

    async def drive(target: loadgen.Target, counting: Callable[[bool], None]) -> int:
        opened = await loadgen.open_sessions(target, sessions, parallel=sessions)

        async def worker(session: loadgen.Session, calls: int) -> None:
            for _ in range(calls):
                answer = await (_keyed_call(session) if keyed else session.call("search", ARGUMENTS))
                if "result" not in answer:
                    raise loadgen.BenchError(f"tools/call answered {answer}")

        await asyncio.gather(*(worker(s, 5) for s in opened))
        counting(True)
        await asyncio.gather(*(worker(s, calls_each) for s in opened))
        counting(False)
        loadgen.close_all(opened)
        return sessions * calls_each

    return drive


async def _stream(target: loadgen.Target, counting: Callable[[bool], None]) -> int:
    session = await loadgen.Session.start(target)
    await loadgen._stream_call(session, 100)
    counting(True)
    events = 0
    for _ in range(2):
        progress, tail = await loadgen._stream_call(session, 1000)
        if progress != 1000 or b"contents of https://example.com/doc" not in tail:
            raise loadgen.BenchError(f"{progress} progress events of 1000; tail {tail[-300:]!r}")
        events += progress + 1
    counting(False)
    session.connection.close()
    return events


async def _replay(target: loadgen.Target, counting: Callable[[bool], None]) -> int:
    session = await loadgen.Session.start(target)
    request_id, events, _ = await loadgen._record_stream(session, 4999)
    messages = [raw for raw in events if loadgen.is_message(raw)]
    cut = loadgen.message_id(messages[1999])
    if cut is None:
        raise loadgen.BenchError("the recorded stream's events carry no id")
    await loadgen._resume(session, cut, request_id)
    counting(True)
    replayed = 0
    for _ in range(2):
        replayed += len((await loadgen._resume(session, cut, request_id)).ids)
    counting(False)
    session.connection.close()
    return replayed


def _stateless(
    connections: int, calls_each: int, keyed: bool = False
) -> Callable[[loadgen.Target, Callable[[bool], None]], Awaitable[int]]:
    """2026-07-28 stateless ``tools/call`` (``benchmarks/modern.py``'s request: no session, ``_meta`` and mirrored
    headers on every POST), one keep-alive connection per client, all in flight at once; ``keyed``: each with a
    fresh idempotency key."""

    async def drive(target: loadgen.Target, counting: Callable[[bool], None]) -> int:
        clients = [modern.ModernClient(await loadgen.Connection.open(target), False) for _ in range(connections)]

        async def worker(client: modern.ModernClient, calls: int) -> None:
            for _ in range(calls):
                await (_modern_keyed_call(client) if keyed else modern.one_call(client))

        await asyncio.gather(*(worker(c, 5) for c in clients))
        counting(True)
        await asyncio.gather(*(worker(c, calls_each) for c in clients))
        counting(False)
        for client in clients:
            client.connection.close()
        return connections * calls_each

    return drive


async def _modern_keyed_call(client: modern.ModernClient) -> None:
    result = await client.request("tools/call", "search", {**modern.SEARCH, "idempotencyKey": str(uuid.uuid4())})
    content = result.get("content")
    if result.get("resultType") != "complete" or not content or modern.EXPECTED not in str(content[0].get("text")):
        raise loadgen.BenchError(f"unexpected keyed tools/call result: {str(result)[:300]}")


def _tasks(connections: int, tasks_each: int) -> Callable[[loadgen.Target, Callable[[bool], None]], Awaitable[int]]:
    """2026-07-28 task create + poll until completed (``benchmarks/modern.py``'s ``one_task``), one keep-alive
    connection per client, all in flight at once; the SQLite writer thread is counted with the rest."""

    async def drive(target: loadgen.Target, counting: Callable[[bool], None]) -> int:
        clients = [modern.ModernClient(await loadgen.Connection.open(target), True) for _ in range(connections)]

        async def worker(client: modern.ModernClient, tasks: int) -> int:
            return sum([await modern.one_task(client) for _ in range(tasks)])

        await asyncio.gather(*(worker(c, 5) for c in clients))
        counting(True)
        requests = sum(await asyncio.gather(*(worker(c, tasks_each) for c in clients)))
        counting(False)
        for client in clients:
            client.connection.close()
        units = connections * tasks_each
        print(f"  tasks16: {requests / units - 1:.2f} polls per task", flush=True)
        return units

    return drive


WORKLOADS = {
    "echo16": Workload("call", _echo(16, 50)),
    "echo64": Workload("call", _echo(64, 25)),
    "keyed16": Workload("call", _echo(16, 50, keyed=True)),
    "stream": Workload("event", _stream),
    "replay": Workload("event", _replay),
    "modern16": Workload("call", _stateless(16, 50)),
    "modernkeyed16": Workload("call", _stateless(16, 50, keyed=True)),
    "tasks16": Workload("task", _tasks(16, 25)),
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_listening(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}:\n{log.read_text()[-2000:]}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server did not listen on port {port} within {STARTUP_TIMEOUT_S:.0f} s")


def _totals(callgrind_out: Path) -> dict[str, int]:
    """The run's total of each event callgrind counted (``Ir``; with the cache simulation, ``D1mr`` and so on)."""
    events: list[str] = []
    for line in callgrind_out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            return dict(zip(events, map(int, line.split()[1:]), strict=True))
    raise SystemExit(f"{callgrind_out}: no totals line")


def _drive(
    checkout: Path,
    name: str,
    log: Path,
    wrapper: list[str],
    switch: Callable[[int], Callable[[bool], None]],
    store: str = "memory",
) -> int:
    """A fresh server of ``checkout`` (under ``wrapper``) driven through workload ``name``; ``switch(pid)`` turns
    the count on and off around the measured requests. ``store``: ``memory``, or ``sqlite`` on a fresh file beside
    ``log``. Returns the units measured."""
    binary = checkout / ".venv" / "bin" / "mcp-lossless"
    if not binary.is_file():
        raise SystemExit(f"no {binary} (run `make install` in that checkout)")
    port = _free_port()
    command = [
        *wrapper,
        str(binary),
        *("serve", "--host", HOST, "--port", str(port), "--log-level", "warning", "--store", _store_spec(store, log)),
        *("--auth", "none"),
    ]
    environment = {**os.environ, "PYTHONHASHSEED": "0"}
    environment.pop("PYTHONPATH", None)
    with log.open("wb") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=environment)
    try:
        _wait_listening(port, server, log)
        return asyncio.run(WORKLOADS[name].drive(loadgen.Target(HOST, port), switch(server.pid)))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _store_spec(store: str, log: Path) -> str:
    if store == "memory":
        return "memory"
    database = log.with_suffix(".db")
    for stale in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
        stale.unlink(missing_ok=True)
    return f"sqlite:{database}"


def measure(checkout: Path, name: str, workdir: Path, cache_sim: bool = False, store: str = "memory") -> dict[str, Any]:
    """Instructions (and with ``cache_sim``, cache misses) of one fresh server under callgrind, per unit."""
    out = workdir / f"{checkout.name}-{name}.callgrind"
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]

    def switch(pid: int) -> Callable[[bool], None]:
        def counting(on: bool) -> None:
            command = ["callgrind_control", "-i", "on" if on else "off", str(pid)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        return counting

    log = workdir / f"{checkout.name}-{name}.log"
    units = _drive(checkout, name, log, [*wrapper, *(["--cache-sim=yes"] if cache_sim else [])], switch, store)
    totals = _totals(out)
    row: dict[str, Any] = {"instructions": totals["Ir"], "units": units, "per_unit": totals["Ir"] / units}
    if cache_sim:
        l1 = totals["I1mr"] + totals["D1mr"] + totals["D1mw"]
        last_level = totals["ILmr"] + totals["DLmr"] + totals["DLmw"]
        row |= {"l1_misses_per_unit": l1 / units, "ll_misses_per_unit": last_level / units}
    return row


def count_syscalls(checkout: Path, name: str, workdir: Path, store: str = "memory") -> dict[str, float]:
    """System calls of one fresh server (no valgrind) per unit, by name, from ``strace -c`` attached around the
    measured requests: a call per event that an instruction count does not show (``getpid`` is one)."""
    out = workdir / f"{checkout.name}-{name}.strace"
    tracer: list[subprocess.Popen[bytes]] = []

    def switch(pid: int) -> Callable[[bool], None]:
        def counting(on: bool) -> None:
            if on:
                command = ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)]
                tracer.append(subprocess.Popen(command, stderr=subprocess.PIPE))
                assert tracer[0].stderr is not None
                tracer[0].stderr.readline()  # "strace: Process N attached ...": counting from here
            else:
                tracer[0].send_signal(signal.SIGINT)
                tracer[0].communicate(timeout=60)

        return counting

    units = _drive(checkout, name, workdir / f"{checkout.name}-{name}-strace.log", [], switch, store)
    counts: dict[str, float] = {}
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3]) / units
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def _commit(checkout: Path) -> str:
    described = subprocess.run(
        ["git", "-C", str(checkout), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    )
    return described.stdout.strip() or "unknown"


def render(results: dict[str, Any]) -> str:
    base = results.get("baseline")
    lines = [
        "# Instructions per call and per event: the real server under callgrind",
        "",
        f"Run {results['started']} (UTC), command: `{results['command']}`.",
        "",
        f"This checkout: `{results['commit']}`"
        + (f"; baseline `{base['path']}` at `{base['commit']}`." if base else "."),
        f"Machine: {results['machine']}; {results['valgrind']}. The server: `serve --store"
        f" {results.get('store', 'memory')} --auth none`,"
        " `PYTHONHASHSEED=0`, counted only while the measured requests run (`callgrind_control -i on/off`);"
        " the generator is `benchmarks/loadgen.py` (not counted). See the docstring of"
        " `benchmarks/instructions_serve.py` for the workloads.",
        "",
        "Under callgrind the server runs some 50 times slower, so work done once per millisecond or per timer tick"
        " (a stream key's time stamp, uvicorn's date header, the connection sweep) falls on fewer calls than at full"
        " speed; system calls are not counted at all (`strace -c -p` shows those).",
        "",
    ]
    header = "| workload | unit | instructions per unit |"
    rule = "|---|---|---|"
    if base:
        header += " baseline | ours / baseline |"
        rule += "---|---|"
    lines += [header, rule]
    for name, row in results["workloads"].items():
        ours = row["ours"]["per_unit"]
        line = f"| {name} | {row['unit']} | {ours / 1000:,.1f}k |"
        if base:
            theirs = row["baseline"]["per_unit"]
            line += f" {theirs / 1000:,.1f}k | {ours / theirs:.3f} |"
        lines.append(line)
    if any("l1_misses_per_unit" in row["ours"] for row in results["workloads"].values()):
        lines += ["", "Cache misses per unit (simulated; first level · last level):", ""]
        lines += [
            "| workload | this checkout |" + (" baseline |" if base else ""),
            "|---|---|" + ("---|" if base else ""),
        ]
        for name, row in results["workloads"].items():
            cells = [row["ours"]] + ([row["baseline"]] if base else [])
            shown = " | ".join(f"{c['l1_misses_per_unit']:,.0f} · {c['ll_misses_per_unit']:,.0f}" for c in cells)
            lines.append(f"| {name} | {shown} |")
    if any("syscalls_per_unit" in row["ours"] for row in results["workloads"].values()):
        lines += ["", "System calls per unit (`strace -c`, without valgrind): all, then the most frequent:", ""]
        lines.append("| workload | this checkout |" + (" baseline |" if base else ""))
        lines.append("|---|---|" + ("---|" if base else ""))
        for name, row in results["workloads"].items():
            cells = [row["ours"]["syscalls_per_unit"]] + ([row["baseline"]["syscalls_per_unit"]] if base else [])
            shown = " | ".join(
                f"{sum(c.values()):.2f} ({', '.join(f'{call} {n:.2f}' for call, n in list(c.items())[:4])})"
                for c in cells
            )
            lines.append(f"| {name} | {shown} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", help=f"comma-separated workloads (of {', '.join(WORKLOADS)})")
    parser.add_argument("--baseline", type=Path, help="another checkout (with its own .venv) measured beside this one")
    parser.add_argument("--no-write", action="store_true", help="print the table; write no result files")
    parser.add_argument("--keep", type=Path, help="a directory to keep the callgrind outputs and server logs in")
    parser.add_argument("--cache-sim", action="store_true", help="also count cache misses (about twice as slow)")
    parser.add_argument("--syscalls", action="store_true", help="also count system calls (strace -c, no valgrind)")
    parser.add_argument(
        "--store", choices=("memory", "sqlite"), default="memory", help="the server's store (sqlite: a fresh file each)"
    )
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    started = datetime.datetime.now(datetime.UTC)
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "command": shlex.join(["benchmarks/instructions_serve.py", *sys.argv[1:]]),
        "commit": _commit(ROOT),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "valgrind": valgrind,
        "store": args.store,
        "workloads": {},
    }
    if args.baseline:
        results["baseline"] = {"path": str(args.baseline), "commit": _commit(args.baseline)}
    with tempfile.TemporaryDirectory(prefix="instructions-serve-") as scratch:
        workdir = args.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            ours = measure(ROOT, name, workdir, args.cache_sim, args.store)
            row: dict[str, Any] = {"unit": WORKLOADS[name].unit, "ours": ours}
            if args.baseline:
                row["baseline"] = measure(args.baseline.resolve(), name, workdir, args.cache_sim, args.store)
            if args.syscalls:
                row["ours"]["syscalls_per_unit"] = count_syscalls(ROOT, name, workdir, args.store)
                if args.baseline:
                    baseline = args.baseline.resolve()
                    row["baseline"]["syscalls_per_unit"] = count_syscalls(baseline, name, workdir, args.store)
            results["workloads"][name] = row
            summary = f"{name}: {row['ours']['per_unit'] / 1000:,.1f}k per {row['unit']}"
            if args.baseline:
                summary += f" (baseline {row['baseline']['per_unit'] / 1000:,.1f}k)"
            print(summary, flush=True)
    table = render(results)
    print(table)
    if not args.no_write:
        stamp = started.strftime("%Y%m%dT%H%M%SZ")
        (BENCH_DIR / "results" / f"instructions-serve-{stamp}.json").write_text(json.dumps(results, indent=2) + "\n")
        (BENCH_DIR / "RESULTS-instructions.md").write_text(table)


if __name__ == "__main__":
    main()
