"""Streamable HTTP mechanics over httpx: headers, POST/GET/DELETE, bounded bodies, SSE decoding.

This module knows the wire, not the calls: what a response *means* for the pending calls is decided
by the ledger (see :mod:`mcp_lossless.client.session`).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from ..core.protocol import ACCEPT_POST
from ..core.sse import DEFAULT_MAX_EVENT_BYTES, SseDecoder, SseEvent

ACCEPT_SSE = "text/event-stream"
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class Response(Protocol):
    """What the clients read of an HTTP response (an ``httpx.Response`` is one)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    async def aread(self) -> bytes: ...
    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


class HttpPool(Protocol):
    """Where a client sends its MCP requests instead of its ``httpx.AsyncClient``, when given one (the gateway's
    upstream connections, :mod:`mcp_lossless.gateway.pool`). Failures are raised as httpx's: a connection that
    could not be made is ``httpx.ConnectError``, any other breakage another ``httpx.TransportError``."""

    def stream(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[Response]:
        """Send the request; the response is open for reading inside the block."""
        ...


class ResponseTooLarge(Exception):
    """A response body exceeded the bound: the server is misbehaving or hostile (a request's is ``BodyTooLarge``)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Reconnect delays: the server's ``retry:`` first (the spec says MUST respect it), then exponential.

    The first try after a stream ends waits exactly ``retry`` (or ``initial``); every further fruitless
    try doubles that, capped, and spreads by up to ``jitter`` so many clients do not reconnect in step.
    """

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 10.0
    jitter: float = 0.25

    def delay(self, attempt: int, retry_ms: int | None, rand: float) -> float:
        """Seconds to wait before try number ``attempt`` (0-based); ``rand`` is uniform in [0, 1)."""
        base = retry_ms / 1000 if retry_ms is not None else self.initial
        if attempt == 0:
            return base
        grown = min(self.maximum, base * self.factor**attempt)
        return max(base, grown * (1 - self.jitter * rand))


REISSUE_BACKOFF = Backoff(initial=0.1, maximum=2.0)
"""Waits between re-issues of a call whose server stopped listening after answering: short at first (a gateway
restarts in about a second), then every 2 s, so a restarted server is found soon after it listens."""
RECONNECT_WINDOW = 10.0
"""Seconds of waiting, in all, for a server that answered a call and then stopped listening: long enough to ride
out a restart of a server or gateway (a few seconds, e.g. a SIGKILLed SQLite gateway started again), short enough
that a call to a server that is gone for good still ends soon with its outcome (may have run, or unreachable)."""


@dataclass(slots=True)
class ReconnectWindow:
    """The waits before each re-issue that finds no server listening, jittered by ``backoff`` with ``rng``, until
    ``window`` seconds of waiting are spent; :meth:`reset` once a try reaches the server again."""

    backoff: Backoff
    rng: random.Random
    window: float = RECONNECT_WINDOW
    waited: float = 0.0
    failures: int = 0

    def next_wait(self, left: float) -> float | None:
        """Seconds to wait before the next try, or ``None`` to give up now: the window is spent, or the call's
        deadline (``left`` seconds away) would pass during the wait, which would end the call as a deadline rather
        than with what it is known of it."""
        delay = min(self.backoff.delay(self.failures, None, self.rng.random()), self.window - self.waited)
        if delay <= 0 or delay >= left:
            return None
        self.failures += 1
        self.waited += delay
        return delay

    def reset(self) -> None:
        self.waited, self.failures = 0.0, 0


def media_type(response: Response) -> str:
    return str(response.headers.get("content-type", "")).split(";", 1)[0].strip().lower()


class HttpTransport:
    """One MCP endpoint: the session id and protocol version every request after ``initialize`` carries."""

    def __init__(
        self,
        url: str,
        http: httpx.AsyncClient,
        *,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        pool: HttpPool | None = None,
        auth: httpx.Auth | None = None,
    ) -> None:
        self.url = url
        self.http = http
        self.pool = pool
        self.auth = auth
        """Added to every request sent with ``http`` (DPoP proofs: resumes and the DELETE need them as well)."""
        """Where POSTs and GETs go when given (a gateway's pool); ``http`` serves the rest."""
        self.max_event_bytes = max_event_bytes
        self.max_body_bytes = max_body_bytes
        self.session_id: str | None = None
        self.protocol_version: str | None = None

    def headers(self, token: str | None, accept: str, last_event_id: str | None = None) -> dict[str, str]:
        headers = {"Accept": accept}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if self.session_id is not None:
            headers[SESSION_HEADER] = self.session_id
        if self.protocol_version is not None:
            headers[VERSION_HEADER] = self.protocol_version
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        return headers

    @asynccontextmanager
    async def post(
        self, message: Mapping[str, Any] | Sequence[Mapping[str, Any]], token: str | None
    ) -> AsyncIterator[Response]:
        """POST one JSON-RPC message (or a batch: a list); the response is open for streaming inside the block."""
        headers = self.headers(token, ACCEPT_POST)
        headers["Content-Type"] = "application/json"
        async with self._stream("POST", headers, orjson.dumps(message)) as response:
            yield response

    @asynccontextmanager
    async def resume(self, last_event_id: str, token: str | None) -> AsyncIterator[Response]:
        """GET the stream again from ``last_event_id`` (resumption is always a GET)."""
        async with self._stream("GET", self.headers(token, ACCEPT_SSE, last_event_id)) as response:
            yield response

    @asynccontextmanager
    async def listen(self, token: str | None) -> AsyncIterator[Response]:
        """GET the session's standalone stream: server messages that belong to no request (``list_changed``)."""
        async with self._stream("GET", self.headers(token, ACCEPT_SSE)) as response:
            yield response

    def _stream(
        self, method: str, headers: dict[str, str], content: bytes | None = None
    ) -> AbstractAsyncContextManager[Response]:
        if self.pool is not None:
            return self.pool.stream(method, self.url, content=content, headers=headers)
        if self.auth is not None:
            return self.http.stream(method, self.url, content=content, headers=headers, auth=self.auth)
        return self.http.stream(method, self.url, content=content, headers=headers)

    async def delete(self, token: str | None) -> int:
        """End the session on the server; returns the status (405: the server does not allow it)."""
        headers = self.headers(token, ACCEPT_POST)
        if self.auth is not None:
            return (await self.http.delete(self.url, headers=headers, auth=self.auth)).status_code
        return (await self.http.delete(self.url, headers=headers)).status_code

    async def body(self, response: Response) -> bytes:
        """The whole body, refusing to buffer more than the bound."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ResponseTooLarge(f"response body exceeds {self.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def events(self, response: Response) -> AsyncIterator[tuple[list[SseEvent], str | None, int | None]]:
        """Decoded events per received chunk, with the id buffer and the reconnection time after them (a fresh
        decoder per connection): an id or a ``retry:`` in a block that dispatches no event counts too."""
        decoder = SseDecoder(self.max_event_bytes)
        async for chunk in response.aiter_bytes():
            before = decoder.last_event_id, decoder.reconnection_ms
            events = decoder.feed(chunk)
            if events or (decoder.last_event_id, decoder.reconnection_ms) != before:
                yield events, decoder.last_event_id, decoder.reconnection_ms
