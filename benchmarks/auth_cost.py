"""What per-event authorization costs on replay, measured on the server's own replay path.

The GET + Last-Event-ID handler of a real app (memory store, 10,000 stored events, resumed from the middle) is
driven in process, so only server work is timed. It runs once as shipped and once with the two authorization
steps (`plan_replay` before commit, `DeliveryGate.admit` per write) replaced by pass-throughs; the difference,
as a share of the shipped replay time, is the cost of authorizing every event. Writes
`benchmarks/RESULTS-auth-cost.md`.

    .venv/bin/python benchmarks/auth_cost.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from mcp_lossless.core import replay  # noqa: E402
from mcp_lossless.core import resume as resume_module  # noqa: E402
from mcp_lossless.server import ServerConfig, create_app  # noqa: E402

HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"accept", b"application/json, text/event-stream"),
    (b"content-type", b"application/json"),
    (b"mcp-protocol-version", b"2025-11-25"),
]


async def request(app: Any, method: str, body: bytes, extra: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": "/mcp", "headers": HEADERS + extra}, receive, send)
    gone.set()
    return sent


def body_bytes(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def measure(rounds: int) -> dict[str, Any]:
    app = create_app(ServerConfig(store="memory", issuer=None))
    await app.startup()  # what a lifespan does: the app serves only once started
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    sent = await request(app, "POST", orjson.dumps(init), [])
    session = [(b"mcp-session-id", dict(sent[0]["headers"])[b"mcp-session-id"])]
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "fetch",
            "arguments": {"url": "u", "steps": 9999, "delay_ms": 0},
            "_meta": {"progressToken": "p"},
        },
    }
    ids = [
        line[4:]
        for line in body_bytes(await request(app, "POST", orjson.dumps(call), session)).split(b"\n")
        if line.startswith(b"id: ")
    ]
    cursor = [(b"last-event-id", ids[len(ids) // 2])]
    expected = len(ids) - len(ids) // 2 - 1

    async def replay_once() -> float:
        start = time.process_time()
        out = body_bytes(await request(app, "GET", b"", session + cursor))
        elapsed = time.process_time() - start
        assert out.count(b"\nid: ") + out.startswith(b"id: ") >= expected - 1, "replay incomplete"
        return elapsed

    shipped_plan, shipped_admit = replay.plan_replay, replay.DeliveryGate.admit

    def plan_nothing(events: Any, grant: Any, policy: Any, cursor: str, tags: Any = None) -> None:
        return None

    def admit_all(self: replay.DeliveryGate, events: Any, now: float) -> tuple[int, None]:
        return len(events), None

    timings: dict[str, list[float]] = {"authorized": [], "unauthorized": []}
    for _ in range(rounds):  # interleaved, so drift hits both alike
        timings["authorized"].append(await replay_once())
        resume_module.plan_replay = plan_nothing  # type: ignore[assignment]
        replay.DeliveryGate.admit = admit_all  # type: ignore[method-assign]
        timings["unauthorized"].append(await replay_once())
        resume_module.plan_replay = shipped_plan
        replay.DeliveryGate.admit = shipped_admit  # type: ignore[method-assign]
    events = await app.state.store.read_after(ids[0].decode().split(".")[0], len(ids) // 2)
    grant = app.state.anonymous
    scan = []
    for _ in range(rounds):
        start = time.process_time()
        replay.plan_replay(events, grant, app.state.policy, "cursor")  # event by event: no stream tags given
        scan.append(time.process_time() - start)
    with_auth = statistics.median(timings["authorized"])
    without = statistics.median(timings["unauthorized"])
    return {
        "scan_ns": statistics.median(scan) * 1e9 / len(events),
        "events": expected,
        "with_ms": with_auth * 1e3,
        "without_ms": without * 1e3,
        "share": (with_auth - without) / with_auth,
        "rounds": rounds,
    }


def main() -> None:
    result = asyncio.run(measure(rounds=41))
    per_event_with = result["with_ms"] * 1e6 / result["events"]
    per_event_without = result["without_ms"] * 1e6 / result["events"]
    text = f"""# Per-event authorization cost on replay

Command: `.venv/bin/python benchmarks/auth_cost.py` ({time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}).

The server's own replay path (GET + `Last-Event-ID`, memory store, resumed from the middle of a 10,000-event
stream: {result["events"]:,} events), driven in process and timed in process CPU; medians of {result["rounds"]}
interleaved rounds of each variant.

| variant | server CPU per replay | per event |
|---|---|---|
| as shipped (plan + per-write admission) | {result["with_ms"]:.2f} ms | {per_event_with:.0f} ns |
| authorization replaced by pass-throughs | {result["without_ms"]:.2f} ms | {per_event_without:.0f} ns |

**Per-event authorization: {result["share"] * 100:.1f} % of replay time** (target ≤ 5 %).

Why it is nearly free: every event carries its request's resource tags (enforced where events are appended),
so a stream's events can only carry the tag sets of its requests. When the resuming token covers all of them,
every buffered and every future event of the stream is covered, decided once; only expiry is checked per write.
When it does not, the planner goes event by event to name the first offending event and every missing resource:
that scan costs **{result["scan_ns"]:.0f} ns per event** (measured on the same {result["events"]:,} events), and
it only runs on the way to a refusal.
"""
    (ROOT / "benchmarks" / "RESULTS-auth-cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
