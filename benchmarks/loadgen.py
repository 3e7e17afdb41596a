"""Raw-socket MCP load generator: keep-alive HTTP/1.1 over asyncio streams, chunked SSE parsing.

httpx burns 2-4 ms of client CPU per request, about what the official SDK server spends, so it would hide
the difference between servers. This client spends a fraction of that; `CpuMeter` records how much, so a
saturated generator is visible in the results instead of being mistaken for a slow server.

Every workload speaks MCP 2025-11-25 Streamable HTTP: `initialize` -> `Mcp-Session-Id`, then
`notifications/initialized`, then `Mcp-Session-Id` + `MCP-Protocol-Version` on every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

PROTOCOL_VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"
PROGRESS = b"notifications/progress"
REQUEST_TIMEOUT_S = 60.0


class BenchError(Exception):
    """A server answered wrongly (status, body, count); the message says how, for the report."""


FAILURES = (BenchError, OSError, TimeoutError, asyncio.IncompleteReadError)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str = "/mcp"
    token: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""


class Connection:
    """One keep-alive HTTP/1.1 connection; requests are sent one at a time."""

    def __init__(self, target: Target, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.target = target
        self._reader = reader
        self._writer = writer
        self._host_line = f"Host: {target.host}:{target.port}\r\n".encode()

    @classmethod
    async def open(cls, target: Target) -> Connection:
        reader, writer = await asyncio.open_connection(target.host, target.port, limit=1 << 22)
        return cls(target, reader, writer)

    def close(self) -> None:
        self._writer.close()

    def send(self, method: str, path: str, head: bytes, body: bytes = b"") -> None:
        """`head` holds pre-encoded header lines (each ending in CRLF), built once per session."""
        length = b"Content-Length: %d\r\n" % len(body) if body or method == "POST" else b""
        self._writer.write(
            b"%s %s HTTP/1.1\r\n%s%s%s\r\n%s" % (method.encode(), path.encode(), self._host_line, head, length, body)
        )

    async def read_head(self) -> tuple[int, dict[str, str]]:
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return status, headers

    async def body_chunks(self, status: int, headers: dict[str, str]) -> AsyncGenerator[bytes, None]:
        """The body as the server framed it (one item per HTTP chunk), de-chunked."""
        reader = self._reader
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    return
                yield (await reader.readexactly(size + 2))[:-2]
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length:
                yield await reader.readexactly(length)
        elif status not in (204, 304):
            yield await reader.read()  # no framing: the body ends when the server closes

    async def request(self, method: str, path: str, head: bytes, body: bytes = b"") -> Response:
        self.send(method, path, head, body)
        status, headers = await self.read_head()
        chunks = [chunk async for chunk in self.body_chunks(status, headers)]
        return Response(status, headers, b"".join(chunks))


class SSEParser:
    """Incremental SSE framing: feed bytes, get complete raw events (LF line ends; CRLF is normalized)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        raw_events = buffer.split(b"\n\n")
        self._buffer = raw_events.pop()
        return [raw for raw in raw_events if raw]


def parse_event(raw: bytes) -> tuple[bytes | None, bytes]:
    """(id, data) of one raw event; the general, slower path."""
    event_id: bytes | None = None
    data: list[bytes] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"id:"):
            event_id = line[3:].removeprefix(b" ")
    return event_id, b"\n".join(data)


def is_message(raw: bytes) -> bool:
    """True for events carrying a JSON-RPC message; priming events have empty data."""
    return b"data: {" in raw or b"data:{" in raw


def message_id(raw: bytes) -> bytes | None:
    """The event's SSE id; fast path for the usual layout with `id:` on the first line."""
    if raw.startswith(b"id:"):
        end = raw.find(b"\n")
        return raw[3:end].strip() if end > 0 else raw[3:].strip()
    return parse_event(raw)[0]


def jsonrpc_messages(response: Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a reply, whether the server chose JSON or SSE."""
    if response.headers.get("content-type", "").startswith("application/json"):
        message = orjson.loads(response.body)
        return message if isinstance(message, list) else [message]
    events = SSEParser().feed(response.body + b"\n\n")
    return [orjson.loads(parse_event(raw)[1]) for raw in events if is_message(raw)]


def final_message(response: Response, request_id: int) -> dict[str, Any]:
    if response.status != 200:
        raise BenchError(f"HTTP {response.status}: {response.body[:300]!r}")
    for message in jsonrpc_messages(response):
        if message.get("id") == request_id and ("result" in message or "error" in message):
            return message
    raise BenchError(f"no JSON-RPC response with id {request_id} in body: {response.body[:300]!r}")


class Session:
    """One MCP session over its own connection."""

    def __init__(self, connection: Connection, session_id: str) -> None:
        self.connection = connection
        self.session_id = session_id
        self.next_id = 1
        self.post_head = header_block(
            connection.target,
            ("Content-Type", "application/json"),
            ("Accept", ACCEPT),
            ("Mcp-Session-Id", session_id),
            ("MCP-Protocol-Version", PROTOCOL_VERSION),
        )

    @classmethod
    async def start(cls, target: Target, connection: Connection | None = None) -> Session:
        connection = connection or await Connection.open(target)
        head = header_block(target, ("Content-Type", "application/json"), ("Accept", ACCEPT))
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "mcp-lossless-bench", "version": "1"},
            },
        }
        response = await connection.request("POST", target.path, head, orjson.dumps(init))
        final_message(response, 0)
        session_id = response.headers.get("mcp-session-id")
        if not session_id:
            raise BenchError("initialize reply carries no Mcp-Session-Id")
        session = cls(connection, session_id)
        note = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ack = await connection.request("POST", target.path, session.post_head, note)
        if ack.status != 202:
            raise BenchError(f"notifications/initialized answered HTTP {ack.status}: {ack.body[:200]!r}")
        return session

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def tool_call_body(self, request_id: int, tool: str, arguments: dict[str, Any], progress: bool) -> bytes:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if progress:
            params["_meta"] = {"progressToken": f"p{request_id}"}
        return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        request_id = self.take_id()
        body = self.tool_call_body(request_id, tool, arguments, progress=False)
        response = await self.connection.request("POST", self.connection.target.path, self.post_head, body)
        return final_message(response, request_id)

    async def ping(self) -> None:
        request_id = self.take_id()
        body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
        response = await self.connection.request("POST", self.connection.target.path, self.post_head, body)
        if "result" not in final_message(response, request_id):
            raise BenchError("ping answered with an error")


def header_block(target: Target, *pairs: tuple[str, str]) -> bytes:
    """Pre-encoded header lines, plus the bearer token when the target has one."""
    if target.token:
        pairs = (*pairs, ("Authorization", f"Bearer {target.token}"))
    return "".join(f"{name}: {value}\r\n" for name, value in pairs).encode("latin-1")


async def fetch_dev_token(host: str, port: int, client_id: str, secret: str, resource: str) -> str:
    """Client-credentials token from the embedded development authorization server."""
    connection = await Connection.open(Target(host, port))
    try:
        form = urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": client_id,
                "client_secret": secret,
                "resource": resource,
            }
        ).encode()
        response = await connection.request(
            "POST", "/dev-as/token", b"Content-Type: application/x-www-form-urlencoded\r\n", form
        )
    finally:
        connection.close()
    if response.status != 200:
        raise BenchError(f"dev token endpoint answered HTTP {response.status}: {response.body[:300]!r}")
    token = orjson.loads(response.body).get("access_token")
    if not isinstance(token, str):
        raise BenchError("dev token endpoint returned no access_token")
    return token


# --- CPU and memory accounting ------------------------------------------------------------------------


def _process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo.extend(int(child) for child in (task / "children").read_text().split())
    return pids


def process_cpu_seconds(pid: int) -> float:
    """CPU time of a process tree, all threads, from schedstat (nanoseconds, unlike 10 ms jiffies)."""
    total_ns = 0
    for member in _process_tree(pid):
        for task in Path(f"/proc/{member}/task").glob("*"):
            with contextlib.suppress(OSError):
                total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


def machine_busy_seconds() -> float:
    """CPU-seconds all cores spent busy (not idle or iowait) since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


@dataclass
class CpuMeter:
    """CPU used during a window by the server, by this generator, and by everything else on the box."""

    server_pid: int
    _start: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def _sample(self) -> tuple[float, float, float, float]:
        return (
            time.perf_counter(),
            process_cpu_seconds(self.server_pid),
            time.process_time(),
            machine_busy_seconds(),
        )

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        wall, server, generator, busy = (b - a for a, b in zip(self._start, self._sample(), strict=True))
        other = max(0.0, busy - server - generator)
        return {
            "wall_s": wall,
            "server_cpu_s": server,
            "server_pct": 100 * server / wall,
            "generator_pct": 100 * generator / wall,
            "other_pct": 100 * other / wall,
        }


# --- workloads -------------------------------------------------------------------------------------------


@dataclass
class Failures:
    """Counts errors and keeps the first few verbatim for the report."""

    count: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, error: BaseException) -> None:
        self.count += 1
        if len(self.samples) < 5:
            self.samples.append(f"{type(error).__name__}: {error}"[:500])


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def open_sessions(target: Target, count: int, parallel: int = 16) -> list[Session]:
    """`count` handshakes over `parallel` keep-alive connections (one each when count == parallel)."""
    connections = [await Connection.open(target) for _ in range(min(count, parallel))]
    shares = [range(index, count, len(connections)) for index in range(len(connections))]

    async def handshakes(connection: Connection, share: range) -> list[Session]:
        return [await asyncio.wait_for(Session.start(target, connection), REQUEST_TIMEOUT_S) for _ in share]

    batches = await asyncio.gather(*(handshakes(c, s) for c, s in zip(connections, shares, strict=True)))
    return [session for batch in batches for session in batch]


def close_all(sessions: list[Session]) -> None:
    for connection in {id(s.connection): s.connection for s in sessions}.values():
        connection.close()


async def end_sessions(sessions: list[Session]) -> None:
    """DELETE each session, as a client done with it should (after the measured window): what a server keeps for
    a session's completed calls is released, so one phase's ~50,000 calls under one principal do not count against
    the next phase's (mcp-lossless refuses a principal past ``stored_bytes_per_principal``, 64 MiB by default). A
    session whose connection failed, or a server that refuses, is left as it is."""

    async def end(session: Session) -> None:
        with contextlib.suppress(*FAILURES):
            request = session.connection.request("DELETE", session.connection.target.path, session.post_head)
            await asyncio.wait_for(request, REQUEST_TIMEOUT_S)

    await asyncio.gather(*(end(session) for session in sessions))


async def echo(target: Target, server_pid: int, concurrency: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """Closed loop of `search(steps=0, delay_ms=0)`; each worker owns one connection and one session."""
    sessions = await open_sessions(target, concurrency, parallel=concurrency)
    meter = CpuMeter(server_pid)
    loop_start = time.perf_counter()
    window_start, window_end = loop_start + warmup_s, loop_start + warmup_s + duration_s
    latencies: list[float] = []
    failures = Failures()
    content_types: set[str] = set()
    expected = b"search results for 'q'"
    arguments = {"query": "q", "steps": 0, "delay_ms": 0}

    async def worker(session: Session) -> None:
        connection, path, head = session.connection, session.connection.target.path, session.post_head
        while (started := time.perf_counter()) < window_end:
            request_id = session.take_id()
            body = session.tool_call_body(request_id, "search", arguments, progress=False)
            try:
                exchange = connection.request("POST", path, head, body)
                response = await asyncio.wait_for(exchange, REQUEST_TIMEOUT_S)
                if response.status != 200 or expected not in response.body:
                    raise BenchError(f"HTTP {response.status}: {response.body[:300]!r}")
            except FAILURES as error:
                failures.add(error)
                return  # the connection state is unknown after a failure
            finished = time.perf_counter()
            if window_start <= finished <= window_end:
                latencies.append(finished - started)
                content_types.add(response.headers.get("content-type", "").split(";")[0])

    async def sample_cpu() -> dict[str, float]:
        await asyncio.sleep(window_start - time.perf_counter())
        meter.start()
        await asyncio.sleep(window_end - time.perf_counter())
        return meter.stop()

    cpu_task = asyncio.create_task(sample_cpu())
    await asyncio.gather(*(worker(session) for session in sessions))
    cpu = await cpu_task
    await end_sessions(sessions)
    close_all(sessions)
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "rps": len(latencies) / duration_s,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p90_ms": 1000 * percentile(latencies, 0.90),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "server_cpu_us_per_request": 1e6 * cpu["server_cpu_s"] / max(1, len(latencies)),
        "content_types": sorted(content_types),
        "errors": failures.count,
        "error_samples": failures.samples,
        "cpu": cpu,
    }


async def _stream_call(session: Session, steps: int) -> tuple[int, bytes]:
    """One fetch with a progress token; counts progress events by pattern, returns (count, body tail)."""
    request_id = session.take_id()
    arguments = {"url": "https://example.com/doc", "steps": steps, "delay_ms": 0}
    body = session.tool_call_body(request_id, "fetch", arguments, progress=True)
    connection = session.connection
    connection.send("POST", connection.target.path, session.post_head, body)
    status, headers = await connection.read_head()
    progress, carry, tail = 0, b"", b""
    async for chunk in connection.body_chunks(status, headers):
        window = carry + chunk  # a pattern split across two chunks is counted exactly once
        progress += window.count(PROGRESS)
        carry = window[-(len(PROGRESS) - 1) :]
        tail = (tail + chunk)[-4096:]
    if status != 200:
        raise BenchError(f"HTTP {status}: {tail[:300]!r}")
    return progress, tail


async def stream(target: Target, server_pid: int, steps: int, calls: int) -> dict[str, Any]:
    """`fetch(steps, delay_ms=0)` with a progress token: how fast progress events reach the client."""
    session = await Session.start(target)
    meter = CpuMeter(server_pid)
    rates: list[float] = []
    failures = Failures()
    try:
        await asyncio.wait_for(_stream_call(session, steps), REQUEST_TIMEOUT_S)  # warm-up
        meter.start()
        for _ in range(calls):
            started = time.perf_counter()
            try:
                progress, tail = await asyncio.wait_for(_stream_call(session, steps), REQUEST_TIMEOUT_S)
                if progress != steps or b"contents of https://example.com/doc" not in tail:
                    raise BenchError(f"{progress} progress events of {steps}; tail {tail[-300:]!r}")
            except FAILURES as error:
                failures.add(error)
                break
            rates.append((steps + 1) / (time.perf_counter() - started))
        cpu = meter.stop()
    finally:
        session.connection.close()
    events = (steps + 1) * len(rates)
    return {
        "steps": steps,
        "calls": len(rates),
        "events_per_s": statistics.median(rates) if rates else float("nan"),
        "events_per_s_all": rates,
        "server_cpu_us_per_event": 1e6 * cpu["server_cpu_s"] / max(1, events),
        "errors": failures.count,
        "error_samples": failures.samples,
        "cpu": cpu,
    }


async def _record_stream(session: Session, steps: int) -> tuple[int, list[bytes], float]:
    """Read a whole fetch stream; returns its request id, every raw event in order, and the wall time."""
    request_id = session.take_id()
    arguments = {"url": "https://example.com/doc", "steps": steps, "delay_ms": 0}
    body = session.tool_call_body(request_id, "fetch", arguments, progress=True)
    connection = session.connection
    started = time.perf_counter()
    connection.send("POST", connection.target.path, session.post_head, body)
    status, headers = await connection.read_head()
    parser, events = SSEParser(), []
    async for chunk in connection.body_chunks(status, headers):
        events.extend(parser.feed(chunk))
    events.extend(parser.feed(b"\n\n"))
    if status != 200:
        raise BenchError(f"HTTP {status} on the recorded stream")
    return request_id, events, time.perf_counter() - started


def _is_final(raw: bytes, request_id: int) -> bool:
    if b'"result"' not in raw and b'"error"' not in raw:
        return False
    message = orjson.loads(parse_event(raw)[1])
    return bool(message.get("id") == request_id)


@dataclass
class Resumption:
    ids: list[bytes | None]
    total_s: float
    first_byte_s: float
    first_event_s: float


async def _resume(session: Session, last_event_id: bytes, request_id: int) -> Resumption:
    """GET + Last-Event-ID on a new connection until the call's final response (or the stream's end)."""
    target = session.connection.target
    connection = await Connection.open(target)
    head = header_block(
        target,
        ("Accept", "text/event-stream"),
        ("Mcp-Session-Id", session.session_id),
        ("MCP-Protocol-Version", PROTOCOL_VERSION),
        ("Last-Event-ID", last_event_id.decode("latin-1")),
    )
    parser, ids = SSEParser(), []
    first_byte = first_event = 0.0
    started = time.perf_counter()
    try:
        connection.send("GET", target.path, head)
        status, headers = await connection.read_head()
        if status != 200:
            refusal = b"".join([chunk async for chunk in connection.body_chunks(status, headers)])
            raise BenchError(f"replay GET answered HTTP {status}: {refusal[:300]!r}")
        chunks = connection.body_chunks(status, headers)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                first_byte = first_byte or time.perf_counter() - started
                messages = [raw for raw in parser.feed(chunk) if is_message(raw)]
                if not messages:
                    continue
                first_event = first_event or time.perf_counter() - started
                ids.extend([message_id(raw) for raw in messages])
                if _is_final(messages[-1], request_id):
                    break
        total = time.perf_counter() - started
    finally:
        connection.close()  # servers keep a resumed stream open for live messages
    return Resumption(ids, total, first_byte, first_event)


async def replay(target: Target, server_pid: int, steps: int, resume_after: int, replays: int) -> dict[str, Any]:
    """Record `fetch(steps)` fully, then resume `replays` times after message #`resume_after`.

    Each resumption must deliver exactly the recorded messages after the cut, with the same ids.
    """
    meter = CpuMeter(server_pid)
    runs: list[dict[str, Any]] = []
    failures = Failures()
    session = await Session.start(target)
    stream_s = float("nan")
    try:
        request_id, events, stream_s = await asyncio.wait_for(_record_stream(session, steps), REQUEST_TIMEOUT_S)
        messages = [raw for raw in events if is_message(raw)]
        if len(messages) != steps + 1 or not _is_final(messages[-1], request_id):
            raise BenchError(f"recorded {len(messages)} messages, expected {steps} progress + 1 result")
        cut_id = message_id(messages[resume_after - 1])
        if cut_id is None:
            raise BenchError(f"message #{resume_after} has no SSE id")
        expected_ids = [message_id(raw) for raw in messages[resume_after:]]
        for _ in range(replays):
            meter.start()
            resumed = await asyncio.wait_for(_resume(session, cut_id, request_id), REQUEST_TIMEOUT_S)
            cpu = meter.stop()
            if len(resumed.ids) != len(expected_ids):
                raise BenchError(f"replayed {len(resumed.ids)} messages, expected exactly {len(expected_ids)}")
            runs.append(
                {
                    "replayed": len(resumed.ids),
                    "expected": len(expected_ids),
                    "ids_match": resumed.ids == expected_ids,
                    "replay_ms": 1000 * resumed.total_s,
                    "first_byte_ms": 1000 * resumed.first_byte_s,
                    "first_event_ms": 1000 * resumed.first_event_s,
                    "replay_events_per_s": len(resumed.ids) / resumed.total_s,
                    "server_cpu_us_per_event": 1e6 * cpu["server_cpu_s"] / len(resumed.ids),
                    "cpu": cpu,
                }
            )
    except FAILURES as error:
        failures.add(error)
    finally:
        session.connection.close()
    return {
        "steps": steps,
        "resume_after": resume_after,
        "stream_wall_s": stream_s,
        "runs": runs,
        "attempts": replays,
        "errors": failures.count,
        "error_samples": failures.samples,
    }


async def sessions(target: Target, server_pid: int, count: int, settle_s: float) -> dict[str, Any]:
    """RSS growth for `count` initialized idle sessions (never deleted); samples a few stay alive."""
    warm = await open_sessions(target, 16)  # load lazily imported code paths before the baseline
    await asyncio.sleep(settle_s)
    before = rss_kb(server_pid)
    meter = CpuMeter(server_pid)
    meter.start()
    started = time.perf_counter()
    opened = await open_sessions(target, count)
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    close_all(opened + warm)  # an idle session needs no open connection
    await asyncio.sleep(settle_s)
    after = rss_kb(server_pid)
    probes = opened[:: max(1, count // 10)][:10]
    alive = 0
    for session in probes:
        probe = Session(await Connection.open(target), session.session_id)
        try:
            await asyncio.wait_for(probe.ping(), REQUEST_TIMEOUT_S)
            alive += 1
        except FAILURES:
            pass
        finally:
            probe.connection.close()
    return {
        "sessions": count,
        "rss_before_kb": before,
        "rss_after_kb": after,
        "kb_per_session": (after - before) / count,
        "handshakes_per_s": count / elapsed,
        "server_cpu_ms_per_handshake": 1000 * cpu["server_cpu_s"] / count,
        "pings_answered": alive,
        "pings_sent": len(probes),
        "cpu": cpu,
    }
