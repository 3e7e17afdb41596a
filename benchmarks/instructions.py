"""Instructions per in-process ``tools/call``: a measure of the hot path that the load of a shared box cannot blur.

The real app (memory store, no auth, the demo ``search`` tool answering at once) is driven through raw ASGI
``N`` times after one ``initialize``; nothing else runs. Under callgrind the instruction count is deterministic
for a given ``PYTHONHASHSEED``, so two runs with different ``N`` give the cost of one call without the start-up::

    for n in 100 400; do
      PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n .venv/bin/python \\
        benchmarks/instructions.py $n 2>&1 | grep -o 'Collected : [0-9]*'
    done
    # per call = (Collected(400) - Collected(100)) / 300

``benchmarks/instructions.py N modern`` drives the 2026-07-28 leg instead: no ``initialize``, every call a
stateless ``tools/call`` with its ``_meta`` and mirrored headers.

Without valgrind it runs as a quick smoke of the same path.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from mcp_lossless.asgi import Message  # noqa: E402
from mcp_lossless.server import ServerConfig, create_app  # noqa: E402
from mcp_lossless.server.app import LosslessApp  # noqa: E402

HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"accept", b"application/json, text/event-stream"),
    (b"content-type", b"application/json"),
]


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "b", "version": "1"},
}
MODERN_HEADERS = [(b"mcp-protocol-version", b"2026-07-28"), (b"mcp-method", b"tools/call"), (b"mcp-name", b"search")]


async def post(
    app: LosslessApp, body: bytes, session: bytes | None = None, extra: list[tuple[bytes, bytes]] | None = None
) -> list[Message]:
    headers = [*HEADERS, *(extra or ())]
    if session is not None:
        headers += [(b"mcp-session-id", session), (b"mcp-protocol-version", b"2025-11-25")]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    sent: list[Message] = []
    done = asyncio.Event()
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    done.set()
    return sent


async def main(calls: int, modern: bool) -> None:
    app = create_app(ServerConfig(issuer=None, store="memory"))
    await app.startup()
    if modern:
        for i in range(calls):
            arguments = {"query": "q", "steps": 0, "delay_ms": 0}
            params = {"name": "search", "arguments": arguments, "_meta": MODERN_META}
            call = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": params}
            out = await post(app, orjson.dumps(call), extra=MODERN_HEADERS)
            if out[0]["status"] != 200 or b"search results" not in b"".join(m.get("body", b"") for m in out[1:]):
                raise SystemExit(f"call {i + 1} failed: {out}")
        await app.shutdown()
        return
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}},
    }
    answer = await post(app, orjson.dumps(hello))
    session = dict(answer[0]["headers"])[b"mcp-session-id"]
    for i in range(calls):
        call = {
            "jsonrpc": "2.0",
            "id": i + 1,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "q", "steps": 0, "delay_ms": 0}},
        }
        out = await post(app, orjson.dumps(call), session)
        if out[0]["status"] != 200 or b"search results" not in b"".join(m.get("body", b"") for m in out[1:]):
            raise SystemExit(f"call {i + 1} failed: {out}")
    await app.shutdown()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100, sys.argv[2:3] == ["modern"]))
