"""An httpx transport that records what the client sent and received, byte for byte, with which token.

It wraps the real transport (real sockets, nothing is faked): each exchange notes the request (method,
path, bearer token, ``Last-Event-ID``, body) and tees the response body as the client reads it, so a
test can tell which events reached the client over a connection authorized by which token.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from mcp_lossless.client.oauth import unverified_audience
from mcp_lossless.core.sse import SseDecoder


@dataclass
class Exchange:
    number: int
    method: str
    path: str
    token: str | None
    last_event_id: str | None
    protocol_version: str | None
    sent: bytes
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    received: bytearray = field(default_factory=bytearray)

    @property
    def audience(self) -> frozenset[str]:
        return (unverified_audience(self.token) if self.token else None) or frozenset()

    def sent_json(self) -> Any:
        try:
            return orjson.loads(self.sent) if self.sent else None
        except orjson.JSONDecodeError:
            return None

    def received_json(self) -> Any:
        try:
            return orjson.loads(bytes(self.received))
        except orjson.JSONDecodeError:
            return None

    def messages(self) -> list[dict[str, Any]]:
        """Every JSON-RPC message the client received in this exchange (SSE data or a JSON body)."""
        if self.headers.get("content-type", "").startswith("text/event-stream"):
            decoder = SseDecoder(1 << 24)
            out: list[dict[str, Any]] = []
            for event in decoder.feed(bytes(self.received) + b"\n\n"):
                try:
                    parsed = orjson.loads(event.data) if event.data else None
                except orjson.JSONDecodeError:
                    continue
                out += [m for m in (parsed if isinstance(parsed, list) else [parsed]) if isinstance(m, dict)]
            return out
        parsed = self.received_json()
        return [m for m in (parsed if isinstance(parsed, list) else [parsed]) if isinstance(m, dict)]


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, into: bytearray) -> None:
        self._inner = inner
        self._into = into

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._into.extend(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._lock = threading.Lock()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        authorization = request.headers.get("authorization", "")
        with self._lock:
            exchange = Exchange(
                len(self.exchanges),
                request.method,
                request.url.path,
                authorization.partition(" ")[2] if authorization.startswith(("Bearer ", "DPoP ")) else None,
                request.headers.get("last-event-id"),
                request.headers.get("mcp-protocol-version"),
                request.content,
            )
            self.exchanges.append(exchange)
        response = await self._inner.handle_async_request(request)
        exchange.status = response.status_code
        exchange.headers = {k.lower(): v for k, v in response.headers.items()}
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, exchange.received),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()

    def to(self, path: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.path == path]
