"""The physical floor: a bare ASGI app on uvicorn + uvloop + httptools, served exactly like mcp-lossless.

What any MCP server on this stack pays per request on this box before doing any MCP work (the role of the
usual `bare-asgi-uvloop` baseline): uvicorn's HTTP parsing and event loop, one orjson parse of the body,
and the MCP Streamable HTTP 2025-11-25 reply shapes the `echo` and `sessions` workloads of `loadgen.py`
check. No framework, no state, no sessions kept, no validation beyond not crashing:

- `initialize` -> 200 `application/json` result with a fresh `Mcp-Session-Id`;
- a notification (no id) -> 202, empty;
- any other request (`tools/call`, `ping`) -> 200 `text/event-stream`: a priming event, then the result,
  sent as one body (`search` answers `search results for '<query>': 3 documents`, anything else `{}`).

    python benchmarks/bare_server.py --port 8000
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import uvicorn

PROTOCOL_VERSION = "2025-11-25"
SERVER_INFO = {"name": "bare-floor", "version": "1"}
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
PARSE_ERROR = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]


def result(message: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC result of a request other than `initialize`."""
    if message.get("method") != "tools/call":
        return {}
    params = message.get("params") or {}
    query = (params.get("arguments") or {}).get("query", "")
    text = f"search results for {query!r}: 3 documents"
    return {"content": [{"type": "text", "text": text}], "isError": False}


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    try:
        message = orjson.loads(await read_body(receive))
    except orjson.JSONDecodeError:
        message = None
    if not isinstance(message, dict):
        await respond(send, 400, json_headers(PARSE_ERROR), PARSE_ERROR)
        return
    request_id = message.get("id")
    if request_id is None:
        await respond(send, 202, [(b"content-length", b"0")], b"")
        return
    if message.get("method") == "initialize":
        init = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}}, "serverInfo": SERVER_INFO}
        body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": init})
        headers = [*json_headers(body), (b"mcp-session-id", secrets.token_urlsafe(32).encode())]
        await respond(send, 200, headers, body)
        return
    event_id = str(request_id).encode()
    data = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result(message)})
    body = b"id: %s\nretry: 1000\ndata: \n\nid: %s\ndata: %s\n\n" % (event_id, event_id, data)
    await respond(send, 200, SSE_HEADERS, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        server_header=False,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
