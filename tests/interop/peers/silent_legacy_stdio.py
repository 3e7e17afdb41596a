"""A legacy stdio server that answers nothing before ``initialize``: the 2026-07-28 stdio binding names such
servers (an unknown pre-``initialize`` request gets "implementation-defined errors ... or not at all"), and
none of the installed SDKs is one (mcp 2.3 and server-everything answer the probe), so this is it, by hand.

    python -m tests.interop.peers.silent_legacy_stdio [keyed]

Serves one tool, ``echo`` (its ``text`` back, and a second text ``idempotencyKey <key>`` when the call carried
one), with the 2025-11-25 handshake; every request before ``initialize``, ``server/discover`` included, is dropped
without an answer. ``keyed``: its ``initialize`` declares ``tools.idempotency`` (SEP-3182), so a gateway sends it
keys (it records none: it only shows what arrived).
"""

from __future__ import annotations

import json
import sys
from typing import Any

ECHO = {"name": "echo", "description": "Its text back.", "inputSchema": {"type": "object"}}


def answer(message: dict[str, Any], initialized: bool, keyed: bool) -> dict[str, Any] | None:
    method, rid = message.get("method"), message.get("id")
    if rid is None:
        return None
    if method == "initialize":
        info = {"name": "silent-legacy", "version": "1"}
        tools: dict[str, Any] = {"idempotency": {}} if keyed else {}
        result: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": tools}, "serverInfo": info}
    elif not initialized:
        return None  # the point of this server: silence before the handshake
    elif method == "tools/list":
        result = {"tools": [ECHO]}
    elif method == "tools/call":
        params = message.get("params", {})
        content = [{"type": "text", "text": str(params.get("arguments", {}).get("text", ""))}]
        if "idempotencyKey" in params:
            content.append({"type": "text", "text": f"idempotencyKey {params['idempotencyKey']}"})
        result = {"content": content}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def main() -> None:
    keyed = sys.argv[1:] == ["keyed"]
    initialized = False
    for line in sys.stdin:
        message = json.loads(line)
        reply = answer(message, initialized, keyed)
        initialized = initialized or message.get("method") == "initialize"
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
