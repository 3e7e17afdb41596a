"""The attack pass's availability findings (issue 11: H1, H2, H3, M1-M6, L1, L2), each against a real server on
loopback, bounded in time; writes ``benchmarks/RESULTS-abuse.md``.

    .venv/bin/python benchmarks/abuse.py                       # this checkout, every row
    .venv/bin/python benchmarks/abuse.py --repo /tmp/before    # another checkout's server (its own .venv)
    .venv/bin/python benchmarks/abuse.py --rows H3,M5 --out results/x.json

Each row starts a fresh ``mcp-lossless serve`` from ``--repo`` (memory store unless the row is about SQLite)
with three dev clients, ``a``, ``b`` and ``c`` (three principals), attacks it, measures, and stops it by its
PID. The client side is this checkout's Python. ``--merge BEFORE.json AFTER.json`` writes the report from two runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.mcp_http import Peer, call, dev_token  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

REPORT = ROOT / "benchmarks" / "RESULTS-abuse.md"
CLIENTS = {"a": "s1", "b": "s2", "c": "s3"}


# -- the server under attack -------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """The server's RSS every 100 ms in a thread: the peak of an attack, not only its end."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def server(repo: Path, store: str = "memory", extra: tuple[str, ...] = (), nofile: int | None = None) -> Iterator[Any]:
    """``mcp-lossless serve`` from ``repo``'s venv on a free port; yields (base URL, PID, working directory)."""
    port = free_port()
    python = str(repo / ".venv" / "bin" / "python")
    args = ["serve", "--store", store, "--port", str(port), *(f"--dev-client={c}:{s}" for c, s in CLIENTS.items())]
    command = [python, "-m", "mcp_lossless", *args, *extra]
    if nofile is not None:
        command = [
            python,
            "-c",
            f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
            "sys.argv = ['mcp-lossless', *sys.argv[1:]]; runpy.run_module('mcp_lossless', run_name='__main__')",
            *args,
            *extra,
        ]
    with tempfile.TemporaryDirectory(prefix="abuse-") as work:
        log = open(Path(work) / "server.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(command, cwd=work, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # readiness of another process (the old server logs before binding)
                if proc.poll() is not None:
                    raise RuntimeError((Path(work) / "server.log").read_text())
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/.well-known/oauth-protected-resource/mcp", timeout=1).status_code == 200:
                        break
                time.sleep(0.05)
            yield base, proc.pid, Path(work)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.close()


async def peer(http: httpx.AsyncClient, base: str, client: str = "a", version: str = "2025-11-25") -> Peer:
    token = await dev_token(http, base, f"{base}/mcp", client=(client, CLIENTS[client]))
    p = Peer(http, base, token, version)
    await p.initialize()
    return p


async def probe_pings(base: str, token: str, session_id: str, version: str) -> None:
    """The prober's own process (``--probe``): a ping every 20 ms, each latency (ms) and status on a line."""
    async with httpx.AsyncClient(timeout=60) as http:
        p = Peer(http, base, token, version)
        p.session_id = session_id
        n = 0
        while True:
            n += 1
            began = time.perf_counter()
            try:
                read = await p.post({"jsonrpc": "2.0", "id": f"probe-{n}", "method": "ping"})
                status = str(read.status)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            print(f"{(time.perf_counter() - began) * 1000:.3f} {status}", flush=True)
            await asyncio.sleep(0.02)


class Prober:
    """Another principal's ping, one after another, while an attack runs: the latencies it saw.

    The pings run in a process of their own, so that what the attacking client costs this process (reading a
    flood of events) is not counted as the server's latency. Entering waits for the first answer, so that an
    attack over in milliseconds (a refused batch) still has pings running beside it.
    """

    def __init__(self, p: Peer) -> None:
        self.peer = p
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._first = asyncio.Event()

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        async for line in self._proc.stdout:
            latency, status = line.decode().split()
            self.latencies.append(float(latency) / 1000)
            if status != "200":
                self.failures.append(status)
            self._first.set()
        self._first.set()  # the prober ended without a ping: summary() says so

    async def __aenter__(self) -> Prober:
        p = self.peer
        assert p.token is not None and p.session_id is not None
        # one JSON argument: a session id may begin with "-", which argparse would take for an option
        args = ["--probe", orjson.dumps([p.base, p.token, p.session_id, p.version]).decode()]
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE
        )
        self._reader = asyncio.get_running_loop().create_task(self._read())
        await asyncio.wait_for(self._first.wait(), 30)
        if not self.latencies:
            raise RuntimeError(f"the prober exited before its first ping (status {await self._proc.wait()})")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._proc is not None and self._reader is not None
        with contextlib.suppress(ProcessLookupError):  # it has exited already
            self._proc.terminate()
        await self._proc.wait()
        await self._reader

    def p99(self) -> float:
        ordered = sorted(self.latencies) or [float("nan")]
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def summary(self) -> str:
        if not self.latencies:
            return "no ping answered"
        ordered = sorted(self.latencies)
        p99 = self.p99()
        failed = f", {len(self.failures)} failed" if self.failures else ""
        worst = ordered[-1] * 1000
        return f"other client's ping: {len(ordered)} sent, p99 {p99 * 1000:.0f} ms, worst {worst:.0f} ms{failed}"


async def count_stream(p: Peer, payload: Any, limit_s: float) -> tuple[int, int, str]:
    """POST ``payload`` and count its SSE events without keeping them: (status, events, last message's outcome).

    The outcome also says whether the events' positions (``id: STREAM.SEQ.MAC``, SEQ in hex) came in order,
    each once: a silent truncation or a repeat shows as a gap."""
    events, last, seq, gaps = 0, b"", -1, 0  # the priming event names position 0
    async with p.http.stream("POST", p.url, headers=p.headers(), content=orjson.dumps(payload), timeout=limit_s) as r:
        buffer = b""
        async for chunk in r.aiter_bytes():
            buffer += chunk
            *blocks, buffer = buffer.split(b"\n\n")
            for block in blocks:
                if b"data: " in block:
                    events += 1
                    last = block
                    if block.startswith(b"id: "):
                        position = int(block[4 : block.index(b"\n")].split(b".")[1], 16)
                        gaps += position != seq + 1
                        seq = position
        status = r.status_code
    outcome = "result" if b'"result"' in last else "error: " + last[-160:].decode(errors="replace") if last else "none"
    order = "in order" if not gaps else f"{gaps} out of order"
    return status, events, f"{outcome} ({order})" if events else outcome


# -- the rows ------------------------------------------------------------------------------------------------


async def h1(repo: Path, quick: bool, store: str = "memory") -> str:
    steps = 200_000 if quick else 1_000_000
    with server(repo, store) as (base, pid, _):
        async with httpx.AsyncClient(timeout=120) as http:
            flooder, other = await peer(http, base, "a"), await peer(http, base, "b")
            async with Prober(other) as idle:  # the same pings with nothing else running: what the box allows
                await asyncio.sleep(3)
            before = rss_mib(pid)
            with Sampler(pid) as rss:
                async with Prober(other) as probe:
                    began = time.perf_counter()
                    flood = call(1, "search", "p", query="q", steps=steps, delay_ms=0)
                    try:
                        status, events, outcome = await asyncio.wait_for(count_stream(flooder, flood, 300), 310)
                    except (TimeoutError, httpx.HTTPError) as exc:
                        status, events, outcome = 0, 0, type(exc).__name__
                    took = time.perf_counter() - began
                    await asyncio.sleep(0.3)
            after = rss_mib(pid)
    kind = store.partition(":")[0]
    return (
        f"{kind}, {steps:,} progress steps, delay 0: HTTP {status}, {events:,} events in {took:.1f} s, "
        f"last: {outcome[:60]}; {probe.summary()} (idle: p99 {idle.p99() * 1000:.0f} ms); "
        f"RSS {before:.0f} → peak {rss.peak:.0f} → {after:.0f} MiB after"
    )


async def h1_sqlite(repo: Path, quick: bool) -> str:
    return await h1(repo, quick, "sqlite:abuse.db")


async def h1_redis(repo: Path, quick: bool) -> str:
    from tests.support.redis_server import redis_server

    with redis_server() as redis:
        return await h1(repo, quick, redis.url)


async def h2(repo: Path, quick: bool) -> str:
    with server(repo) as (base, _, _):
        async with httpx.AsyncClient(timeout=120) as http:
            batcher = await peer(http, base, "a", version="2025-03-26")
            other = await peer(http, base, "b")
            at_max = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(1000)]
            began = time.perf_counter()
            max_status, max_events, _ = await count_stream(batcher, at_max, 110)
            max_took = time.perf_counter() - began
            batch = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(20_000)]
            async with Prober(other) as probe:
                began = time.perf_counter()
                try:
                    status, events, _ = await asyncio.wait_for(count_stream(batcher, batch, 110), 120)
                except (TimeoutError, httpx.HTTPError) as exc:
                    status, events = 0, 0
                    print("h2:", type(exc).__name__)
                took = time.perf_counter() - began
                await asyncio.sleep(0.2)
    size = len(orjson.dumps(batch))
    answered = f"HTTP {status}, {events:,} answers in {took:.2f} s"
    at_max_answered = f"1,000 pings: HTTP {max_status}, {max_events:,} answers in {max_took:.2f} s"
    return f"{at_max_answered}; 20,000 pings ({size / 1e6:.2f} MB): {answered}; {probe.summary()}"


def h3(repo: Path, quick: bool) -> str:
    with server(repo) as (base, pid, _):
        port = int(base.rsplit(":", 1)[1])
        before = rss_mib(pid)
        outcomes: list[str] = []
        held: list[socket.socket] = []
        lock = threading.Lock()

        def flood() -> None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-big: ")
            chunk, sent = b"a" * 65536, 0
            try:
                while sent < 32 << 20:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass
            if sent >= 32 << 20:
                with lock:
                    outcomes.append("held 32 MB")
                    held.append(sock)
                return
            try:
                answer = sock.recv(64)
            except OSError:
                answer = b""
            sock.close()
            with lock:
                outcomes.append(answer[9:12].decode() if answer.startswith(b"HTTP/1.1") else "closed")

        with Sampler(pid) as rss:
            threads = [threading.Thread(target=flood) for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            time.sleep(1)  # the heads held open: what they cost while held
        for sock in held:
            sock.close()
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    return (
        f"16 x unfinished 32 MB head: {counts}; RSS {before:.0f} → peak {rss.peak:.0f} MiB (+{rss.peak - before:.0f})"
    )


async def m1(repo: Path, quick: bool) -> str:
    events = 100_000
    with server(repo) as (base, pid, _):
        async with httpx.AsyncClient(timeout=120) as http:
            p = await peer(http, base, "a")
            before = rss_mib(pid)
            await count_stream(p, call(1, "search", "p", query="q", steps=events, delay_ms=0), 110)
            await asyncio.sleep(0.5)
            after = rss_mib(pid)
    per = (after - before) * 1024 / events
    return f"{events:,} retained progress events (~150 B each): RSS +{after - before:.0f} MiB, {per:.2f} KiB per event"


async def m2(repo: Path, quick: bool) -> str:
    flood = 1_200_000
    with server(repo) as (base, _, _):
        async with httpx.AsyncClient(timeout=300) as http:
            victim, flooder = await peer(http, base, "b"), await peer(http, base, "a")
            read = await victim.post(call(1, "fetch", "v", url="u", steps=3, delay_ms=0))
            cursor = read.ids[1]
            status, _, _ = await count_stream(flooder, call(2, "search", "p", query="q", steps=flood, delay_ms=0), 280)
            again = await victim.resume(cursor)
    kept = "its events replayed (200)" if again.status == 200 else f"HTTP {again.status} {again.body[:60]!r}"
    return f"principal a wrote {flood:,} events (flood HTTP {status}); principal b's resume: {kept}"


async def m3(repo: Path, quick: bool) -> str:
    parts = []
    with server(repo) as (base, _, _):
        async with httpx.AsyncClient(timeout=60) as http:
            token = await dev_token(http, base, f"{base}/mcp", client=("a", CLIENTS["a"]))
            other = await peer(http, base, "b")
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
            headers = Peer(http, base, token).headers()
            opened, refusals, began = 0, [], time.perf_counter()

            async def opener() -> None:  # 16 at once: the loop one token can run
                nonlocal opened
                while opened < 12_000 and not refusals and time.perf_counter() - began < 60:
                    r = await http.post(f"{base}/mcp", content=orjson.dumps(init), headers=headers)
                    if r.status_code != 200:
                        refusals.append(f"{r.status_code}, Retry-After {r.headers.get('retry-after')}, {r.text[:90]}")
                        return
                    opened += 1

            await asyncio.gather(*(opener() for _ in range(16)))
            refused = refusals[0] if refusals else None
            ping = await other.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
            parts.append(
                f"sessions: {opened:,} opened in {time.perf_counter() - began:.1f} s, then "
                f"{refused or 'none refused'}; other principal's ping meanwhile HTTP {ping.status}"
            )
            p = await peer(http, base, "c", version="2025-03-26")  # a third principal: a holds its session cap
            started, refused, n = 0, None, 0
            while started < 3000:
                batch = [call(n + i, "search", query="q", steps=1, delay_ms=600_000) for i in range(250)]
                n += 250
                try:
                    async with http.stream(
                        "POST", p.url, headers=p.headers(), content=orjson.dumps(batch), timeout=5
                    ) as r:
                        if r.status_code != 200:
                            refused = f"{r.status_code}, Retry-After {r.headers.get('retry-after')}"
                            break
                except httpx.HTTPError:
                    break
                started += 250
            call_other = await other.post(call(99, "search", query="q", steps=1, delay_ms=0))
            parts.append(
                f"calls left running after hanging up: {started:,}, then {refused or 'none refused'}; "
                f"other principal's call HTTP {call_other.status}"
            )
    return "; ".join(parts)


async def m4(repo: Path, quick: bool) -> str:
    with server(repo, store="sqlite:abuse.db") as (base, _, work):
        async with httpx.AsyncClient(timeout=60) as http:
            p = await peer(http, base, "a")

            def size() -> float:
                return sum(f.stat().st_size for f in work.glob("abuse.db*")) / 1e6

            before = size()
            text = "x" * 900_000
            began = time.perf_counter()
            for i in range(100):
                await p.post(call(i, "search", query=text, steps=1, delay_ms=0))
            took = time.perf_counter() - began
            grown = size()
            await http.delete(p.url, headers=p.headers())
            deleted_at = time.perf_counter()
            await asyncio.sleep(1)
            deleted = size()
            settled, last = deleted, -1.0
            while settled != last and time.perf_counter() - deleted_at < 10:  # the server gives pages back in steps
                await asyncio.sleep(0.5)
                last, settled = settled, size()
            waited = time.perf_counter() - deleted_at
    return (
        f"100 calls of 0.9 MB in {took:.1f} s: DB+WAL {before:.0f} → {grown:.0f} MB "
        f"({(grown - before) / took:.0f} MB/s); after DELETE of the session: {deleted:.0f} MB, "
        f"{settled:.0f} MB after {waited:.1f} s"
    )


def m5(repo: Path, quick: bool) -> str:
    with server(repo, extra=("--auth", "none"), nofile=1024) as (base, _, _):
        port = int(base.rsplit(":", 1)[1])
        slow, failed_to_open = [], 0
        for _ in range(1100):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: ")
                slow.append(sock)
            except OSError:
                failed_to_open += 1
        latencies, failures = [], []
        with httpx.Client(timeout=5) as client:
            began = time.monotonic()
            while time.monotonic() - began < 10 and len(latencies) + len(failures) < 30:
                t = time.perf_counter()
                try:
                    r = client.get(f"{base}/.well-known/oauth-protected-resource/mcp", headers={"connection": "close"})
                    (latencies if r.status_code == 200 else failures).append(time.perf_counter() - t)
                except httpx.HTTPError as exc:
                    failures.append(type(exc).__name__)
                for sock in slow[:50]:  # slowloris trickles a byte now and then
                    with contextlib.suppress(OSError):
                        sock.send(b"a")
        closed = 0
        for sock in slow:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            sock.close()
    ordered = sorted(latencies)
    p99 = (
        f"p99 {ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000:.0f} ms" if ordered else "none answered"
    )
    return (
        f"1,100 slow heads under ulimit -n 1024 ({failed_to_open} failed to open, {closed} closed by the server): "
        f"honest requests {len(latencies)}/{len(latencies) + len(failures)} answered, {p99}"
    )


class ChunkedSse:
    """The SSE events of one raw HTTP/1.1 chunked response, decoded as its bytes arrive."""

    def __init__(self) -> None:
        self.raw = b""
        self.body = b""
        self.head_done = False
        self.positions: list[int] = []

    def feed(self, data: bytes) -> None:
        self.raw += data
        if not self.head_done:
            if b"\r\n\r\n" not in self.raw:
                return
            self.raw = self.raw.split(b"\r\n\r\n", 1)[1]
            self.head_done = True
        while b"\r\n" in self.raw:
            line, rest = self.raw.split(b"\r\n", 1)
            size = int(line, 16)
            if len(rest) < size + 2:
                break
            self.body += rest[:size]
            self.raw = rest[size + 2 :]
        *blocks, self.body = self.body.split(b"\n\n")
        for block in blocks:
            if block.startswith(b"id: ") and b"data: " in block:
                self.positions.append(int(block[4 : block.index(b"\n")].split(b".")[1], 16))


async def m6(repo: Path, quick: bool) -> str:
    """Ten calls whose clients send the request and read nothing for ``seconds``: the server's RSS meanwhile.
    Then each client reads for a few seconds: its events must come in order from the priming event (position 0)
    on, each once."""
    seconds = 10 if quick else 20
    with server(repo) as (base, pid, _):
        async with httpx.AsyncClient(timeout=60) as http:
            peers = [await peer(http, base, "a") for _ in range(10)]
            port = int(base.rsplit(":", 1)[1])
            socks = []
            for i, p in enumerate(peers):  # a call with progress every 1 ms, then never read a byte
                body = orjson.dumps(call(i, "search", "p", query="q", steps=1_000_000, delay_ms=1))
                head = "".join(f"{k}: {v}\r\n" for k, v in p.headers().items())
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                sock.sendall(
                    f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n{head}content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                socks.append(sock)
            await asyncio.sleep(5)  # the tools fill the connections' buffers and their backlogs (~3 s at 1 ms)
            samples = [rss_mib(pid)]
            for _ in range(seconds):
                await asyncio.sleep(1)
                samples.append(rss_mib(pid))
            loop = asyncio.get_running_loop()
            streams = [ChunkedSse() for _ in socks]

            async def read(sock: socket.socket, stream: ChunkedSse) -> None:
                sock.setblocking(False)
                deadline = time.monotonic() + 3
                with contextlib.suppress(TimeoutError):
                    while (left := deadline - time.monotonic()) > 0:
                        data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), left)
                        if not data:
                            return
                        stream.feed(data)

            await asyncio.gather(*(read(sock, stream) for sock, stream in zip(socks, streams, strict=True)))
            for sock in socks:
                sock.close()
    growth = (samples[-1] - samples[0]) / seconds
    spread = max(samples) - min(samples)
    got = [len(stream.positions) for stream in streams]
    in_order = sum(stream.positions == list(range(len(stream.positions))) for stream in streams)  # priming: 0
    return (
        f"10 clients not reading for {seconds} s: RSS {samples[0]:.0f} → {samples[-1]:.0f} MiB ({growth:+.1f} MiB/s, "
        f"range {spread:.0f} MiB); then reading for 3 s: {min(got):,}-{max(got):,} events each, "
        f"{in_order}/10 in order from the priming event on, each once"
    )


async def l1(repo: Path, quick: bool) -> str:
    with server(repo) as (base, _, _):
        async with httpx.AsyncClient(timeout=30) as http:
            p = await peer(http, base, "a")
            statuses = []
            for body in ({"jsonrpc": "2.0", "id": [1], "result": {}}, {"jsonrpc": "2.0", "id": {"a": 1}, "error": {}}):
                r = await http.post(p.url, content=orjson.dumps(body), headers=p.headers())
                statuses.append(f"{r.status_code} {r.text[:70]}")
    return "response with an array / object id: " + " | ".join(statuses)


async def l2(repo: Path, quick: bool) -> str:
    with server(repo) as (base, _, _):
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.get(f"{base}/metrics", headers={"host": "evil.example", "origin": "http://evil.example"})
    return f"/metrics with Host and Origin evil.example: HTTP {r.status_code} ({len(r.content)} bytes)"


ROWS: dict[str, tuple[str, Callable[[Path, bool], Awaitable[str] | str]]] = {
    "H1": ("a tool reporting progress without awaiting", h1),
    "H1s": ("the same, SQLite store", h1_sqlite),
    "H1r": ("the same, Redis store", h1_redis),
    "H2": ("a 2025-03-26 batch of 20,000 pings", h2),
    "H3": ("16 unfinished 32 MB headers, unauthenticated", h3),
    "M1": ("the memory store's cost per kept event", m1),
    "M2": ("one principal floods the shared memory store", m2),
    "M3": ("one token: sessions, running calls", m3),
    "M4": ("one client writing events with SQLite", m4),
    "M5": ("slowloris: 1,100 slow heads, open-file limit 1,024", m5),
    "M6": ("10 clients that never read their streams", m6),
    "L1": ("a JSON-RPC response whose id is an array or object", l1),
    "L2": ("/metrics from another Host/Origin", l2),
}


def run_row(name: str, repo: Path, quick: bool) -> str:
    _, fn = ROWS[name]
    began = time.perf_counter()
    try:
        outcome = fn(repo, quick)
        text = asyncio.run(outcome) if asyncio.iscoroutine(outcome) else outcome
    except Exception as exc:
        text = f"row failed: {type(exc).__name__}: {str(exc)[:200]}"
    assert isinstance(text, str)
    print(f"{name} ({time.perf_counter() - began:.0f} s): {text}", flush=True)
    return text


def commit_of(repo: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()[:90]


def write_report(before: dict[str, Any], after: dict[str, Any]) -> None:
    lines = [
        "# Abuse rows: before and after",
        "",
        "`benchmarks/abuse.py` reproduces each availability finding of the attack pass (issue 11) against a real",
        "server on loopback, one fresh `serve` per row (memory store unless the row is about SQLite; three dev",
        "clients `a`, `b` and `c`: three principals), each row bounded in time. Generated by",
        "`benchmarks/abuse.py --merge BEFORE.json AFTER.json`.",
        "",
        f"- before: `{before['commit']}` ({before['when']})",
        f"- after: `{after['commit']}` ({after['when']})",
        f"- machine: {after['machine']}",
        "",
        "| # | attack | before | after |",
        "|---|---|---|---|",
    ]
    for name, (what, _) in ROWS.items():
        b = before["rows"].get(name, "not run").replace("|", "\\|")
        a = after["rows"].get(name, "not run").replace("|", "\\|")
        lines.append(f"| {name} | {what} | {b} | {a} |")
    REPORT.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=ROOT, help="checkout whose server is attacked (default: this)")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    parser.add_argument("--full", action="store_true", help="H1 at 1,000,000 steps and M6 for 20 s (default: smaller)")
    parser.add_argument("--out", type=Path, help="write this run's rows as JSON here")
    parser.add_argument(
        "--merge", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="write the report from two runs"
    )
    parser.add_argument("--probe", metavar="[BASE, TOKEN, SESSION, VERSION]", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(probe_pings(*orjson.loads(args.probe)))
        return
    if args.merge:
        write_report(*(orjson.loads(p.read_bytes()) for p in args.merge))
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:  # the attacking side holds 1,100 sockets (M5)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    rows = {name: run_row(name, args.repo.resolve(), not args.full) for name in args.rows.split(",")}
    result = {
        "commit": commit_of(args.repo),
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "rows": rows,
    }
    if args.out:
        args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
