"""Raw MCP over HTTP for tests that must see every byte: tokens, initialize, streams dropped on purpose."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson

ACCEPT_BOTH = "application/json, text/event-stream"


@dataclass
class Event:
    id: str | None
    data: str
    retry: int | None = None

    @property
    def message(self) -> dict[str, Any] | None:
        return orjson.loads(self.data) if self.data else None


def parse_sse(text: str) -> list[Event]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event_id, data, retry = None, [], None
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                event_id = value
            elif name == "data":
                data.append(value)
            elif name == "retry":
                retry = int(value)
        events.append(Event(event_id, "\n".join(data), retry))
    return events


@dataclass
class StreamRead:
    status: int
    events: list[Event] = field(default_factory=list)
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    body: bytes = b""

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events if e.id is not None]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for e in self.events if (m := e.message) is not None]

    def json(self) -> Any:
        return orjson.loads(self.body)


class Peer:
    """One MCP client identity over raw HTTP (httpx), speaking exactly what the test says."""

    def __init__(self, http: httpx.AsyncClient, base: str, token: str | None = None, version: str = "2025-11-25"):
        self.http = http
        self.base = base
        self.url = f"{base}/mcp"
        self.token = token
        self.version = version
        self.session_id: str | None = None

    def headers(self, token: str | None = None, **extra: str) -> dict[str, str]:
        out = {"accept": ACCEPT_BOTH, "content-type": "application/json", "mcp-protocol-version": self.version}
        tok = token or self.token
        if tok:
            out["authorization"] = f"Bearer {tok}"
        if self.session_id:
            out["mcp-session-id"] = self.session_id
        out.update(extra)
        return out

    async def initialize(self) -> dict[str, Any]:
        message = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": self.version,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        }
        response = await self.http.post(self.url, content=orjson.dumps(message), headers=self.headers())
        assert response.status_code == 200, response.text
        self.session_id = response.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        ack = await self.http.post(self.url, content=orjson.dumps(note), headers=self.headers())
        assert ack.status_code == 202
        result: dict[str, Any] = response.json()["result"]
        return result

    async def post(self, payload: Any, *, token: str | None = None, stop_after: int | None = None) -> StreamRead:
        """POST ``payload``; read the SSE answer, or drop the connection after ``stop_after`` id-carrying events."""
        return await self._read("POST", self.headers(token), orjson.dumps(payload), stop_after)

    async def resume(
        self, last_event_id: str, *, token: str | None = None, stop_after: int | None = None
    ) -> StreamRead:
        headers = self.headers(token, **{"last-event-id": last_event_id, "accept": "text/event-stream"})
        headers.pop("content-type")
        return await self._read("GET", headers, None, stop_after)

    async def _read(
        self, method: str, headers: dict[str, str], body: bytes | None, stop_after: int | None
    ) -> StreamRead:
        async with self.http.stream(method, self.url, headers=headers, content=body) as response:
            read = StreamRead(response.status_code, headers=response.headers)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                read.body = await response.aread()
                return read
            if stop_after is not None:
                await read_events(response, read, lambda read: len(read.ids) >= stop_after)
            else:
                await read_events(response, read)
            return read  # leaving the block before the stream's end closes the connection mid-stream


async def read_events(
    response: httpx.Response, read: StreamRead, after_block: Callable[[StreamRead], bool | None] = lambda _read: None
) -> None:
    """``response``'s SSE events into ``read.events`` as each block arrives, to the stream's end; ``after_block``
    looks at ``read`` after each block (to act at a given event), and stops the reading when it returns true."""
    buffer = ""
    async for chunk in response.aiter_text():
        buffer += chunk
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            read.events.extend(parse_sse(block + "\n\n"))
            if after_block(read):
                return


async def dev_token(
    http: httpx.AsyncClient,
    base: str,
    *resources: str,
    client: tuple[str, str] = ("dev-client", "dev-secret"),
    scope: str = "",
) -> str:
    """A real signed JWT of the dev AS at ``base`` (client credentials) for ``resources``, with ``scope`` if given."""
    form = [("grant_type", "client_credentials"), ("client_id", client[0]), ("client_secret", client[1])]
    form += [("resource", r) for r in resources]
    form += [("scope", scope)] if scope else []
    response = await http.post(
        f"{base}/dev-as/token", content=urlencode(form), headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert response.status_code == 200, response.text
    token: str = response.json()["access_token"]
    return token


def call(request_id: int | str, tool: str, progress: str | None = None, **arguments: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if progress is not None:
        params["_meta"] = {"progressToken": progress}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
