"""Raw 2026-07-28 requests for tests that must see every byte: per-request ``_meta``, mirrored headers."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import orjson

from tests.support.mcp_http import ACCEPT_BOTH, StreamRead, parse_sse

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
NAMED = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name", "tasks/get": "taskId"}
NAMED |= {"tasks/update": "taskId", "tasks/cancel": "taskId", "tasks/stream": "taskId"}
_ids = itertools.count(1)


def meta(tasks: bool = True, version: str = MODERN) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    return {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
    }


class ModernPeer:
    """One stateless client identity: each request a POST of its own, carrying its version and capabilities."""

    def __init__(self, http: httpx.AsyncClient, base: str, token: str | None = None, *, tasks: bool = True) -> None:
        self.http = http
        self.url = f"{base}/mcp"
        self.token = token
        self.tasks = tasks

    def message(
        self, method: str, params: dict[str, Any] | None = None, request_id: int | None = None
    ) -> dict[str, Any]:
        body = dict(params or {})
        body["_meta"] = {**meta(self.tasks), **body.get("_meta", {})}
        return {
            "jsonrpc": "2.0",
            "id": next(_ids) if request_id is None else request_id,
            "method": method,
            "params": body,
        }

    def headers(self, message: dict[str, Any], token: str | None = None) -> dict[str, str]:
        out = {"accept": ACCEPT_BOTH, "content-type": "application/json", "mcp-protocol-version": MODERN}
        out["mcp-method"] = message["method"]
        field = NAMED.get(message["method"])
        if field is not None and field in message["params"]:  # a test of a request without it sends neither
            out["mcp-name"] = str(message["params"][field])
        tok = token or self.token
        if tok:
            out["authorization"] = f"Bearer {tok}"
        return out

    async def send(
        self, message: dict[str, Any], *, token: str | None = None, headers: Mapping[str, str | None] | None = None
    ) -> StreamRead:
        sent = self.headers(message, token)
        for name, value in (headers or {}).items():
            if value is None:
                sent.pop(name, None)
            else:
                sent[name] = value
        response = await self.http.post(self.url, content=orjson.dumps(message), headers=sent)
        read = StreamRead(response.status_code, headers=response.headers, body=response.content)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            read.events = parse_sse(response.text)
        return read

    async def request(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> StreamRead:
        return await self.send(self.message(method, params), **kwargs)

    async def call(self, tool: str, token: str | None = None, **arguments: Any) -> StreamRead:
        return await self.request("tools/call", {"name": tool, "arguments": arguments}, token=token)

    async def task(self, method: str, task_id: str, token: str | None = None) -> StreamRead:
        return await self.request(method, {"taskId": task_id}, token=token)


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """The JSON-RPC error response expected byte for byte (``data`` only when given)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def rpc_result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def json_of(read: Any) -> Any:
    """A response's body, which must have come as plain JSON (not SSE)."""
    assert read.headers["content-type"] == "application/json", read.headers
    return orjson.loads(read.body)


def assert_replacement_envelope(envelope: dict[str, Any], *, resources: list[str], scopes: list[str]) -> None:
    """The SEP-2643 authorization envelope of a denial the client can remedy: a replacement token granting
    ``resources`` and ``scopes``, under a context id of its own."""
    context = envelope.pop("authorizationContextId")
    assert isinstance(context, str) and context
    assert envelope == {
        "reason": "insufficient_authorization",
        "remediation": "available",
        "credentialDisposition": "replacement",
        "remediationHints": [{"type": "io.github.mcp-lossless/oauth-grant", "resources": resources, "scopes": scopes}],
    }


def answer(read: StreamRead) -> dict[str, Any]:
    """The JSON-RPC response of a modern request, whether it came as JSON or as the last SSE message."""
    message = read.messages[-1] if read.events else read.json()
    assert isinstance(message, dict)
    return message


async def poll_until_settled(peer: ModernPeer, task_id: str) -> dict[str, Any]:
    """``tasks/get`` at the server's ``pollIntervalMs`` until the task leaves ``working`` (the protocol's wait)."""
    with anyio.fail_after(30):
        while True:
            result: dict[str, Any] = answer(await peer.task("tasks/get", task_id))["result"]
            if result["status"] != "working":
                return result
            await anyio.sleep(result["pollIntervalMs"] / 1000)
