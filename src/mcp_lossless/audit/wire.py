"""Raw MCP Streamable HTTP with byte-level control: what the audit sends is exactly what each check needs.

A stock client would hide the behaviours the audit looks for (it reconnects, overwrites ids, times out),
so this speaks the transport directly: it can drop a stream after a chosen event, resume from any
``Last-Event-ID`` with any token on any session, and read a stream for at most a given time. Every
exchange is kept, with its token replaced by a label, as evidence.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx
import orjson

from ..core import protocol
from ..core.protocol import ACCEPT_POST, STATELESS
from ..core.sse import SseDecoder, SseTooLarge
from ..core.tasks import EXTENSION

KEPT_RESPONSE_HEADERS = ("content-type", "mcp-session-id", "www-authenticate", "retry-after", "location")

End = Literal["closed", "dropped", "deadline", "error"]
"""How a read ended: the server closed it, the audit dropped it on purpose, it was still open when the
audit stopped waiting, or the connection failed."""


@dataclass(frozen=True, slots=True)
class Credential:
    """A bearer token and the name it goes by in evidence (``wide``, ``narrowed``, …)."""

    label: str
    token: str


@dataclass(frozen=True, slots=True)
class WireEvent:
    id: str | None
    """The last event id as of this event (WHATWG: an id persists until the server sets another)."""
    event: str
    data: str
    at: float
    """Seconds since the request was sent."""

    def messages(self) -> list[dict[str, Any]]:
        return _messages(self.data)


def _messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages in an SSE ``data`` field or a JSON body (one object or a batch array)."""
    if not text.strip():
        return []
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    items = parsed if isinstance(parsed, list) else [parsed]
    return [m for m in items if isinstance(m, dict)]


@dataclass(slots=True)
class Exchange:
    """One HTTP request of the audit and everything that came back."""

    label: str
    method: str
    url: str
    request_headers: dict[str, str]
    request_body: str | None
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    events: list[WireEvent] = field(default_factory=list)
    end: End = "closed"
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def is_sse(self) -> bool:
        return self.response_headers.get("content-type", "").startswith("text/event-stream")

    @property
    def last_event_id(self) -> str | None:
        return next((e.id for e in reversed(self.events) if e.id is not None), None)

    def messages(self) -> list[dict[str, Any]]:
        if self.events:
            return [m for e in self.events for m in e.messages()]
        return _messages(self.body)

    def terminal_for(self, request_id: object) -> dict[str, Any] | None:
        """The response or error this exchange delivered for ``request_id``, if any."""
        return next(
            (m for m in self.messages() if m.get("id") == request_id and ("result" in m or "error" in m)),
            None,
        )

    def body_json(self) -> Any:
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            return None


Stop = Callable[[Exchange], bool]
"""Asked after every event: ``True`` ends the read (the connection is dropped if still open)."""


@dataclass(slots=True)
class WireSession:
    """A session the audit opened on the target: its id, the negotiated revision, and the exchange that made it."""

    id: str | None
    version: str
    credential: Credential | None
    initialize: Exchange


class HandshakeFailed(Exception):
    """``initialize`` did not produce a session; carries the exchange as evidence."""

    def __init__(self, exchange: Exchange) -> None:
        status = exchange.status if exchange.status is not None else exchange.error
        super().__init__(f"initialize answered {status}")
        self.exchange = exchange


def call_message(request_id: int, tool: str, arguments: dict[str, Any], progress_token: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": {"progressToken": progress_token}},
    }


class Wire:
    """Raw MCP requests to one endpoint, each returned as an :class:`Exchange` for the evidence."""

    def __init__(self, http: httpx.AsyncClient, url: str, *, read_seconds: float) -> None:
        self.http = http
        self.url = url
        self.read_seconds = read_seconds
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    @staticmethod
    def progress_token() -> str:
        return f"audit-{secrets.token_hex(6)}"

    def _headers(self, credential: Credential | None, session: WireSession | None, version: str) -> dict[str, str]:
        headers = {"accept": ACCEPT_POST, "content-type": "application/json", "mcp-protocol-version": version}
        if credential is not None:
            headers["authorization"] = f"Bearer {credential.token}"
        if session is not None and session.id is not None:
            headers["mcp-session-id"] = session.id
        return headers

    async def open_session(self, credential: Credential | None, version: str, label: str) -> WireSession:
        """``initialize`` + ``notifications/initialized``; raises :class:`HandshakeFailed` without a session."""
        message = {
            "jsonrpc": "2.0",
            "id": self.next_id(),
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "mcp-lossless-audit", "version": "1"},
            },
        }
        headers = self._headers(credential, None, version)
        exchange = await self.send("POST", headers, message, label=label, stop=all_answered(message["id"]))
        answer = exchange.terminal_for(message["id"])
        if not exchange.ok or answer is None or "result" not in answer:
            raise HandshakeFailed(exchange)
        negotiated = answer["result"].get("protocolVersion", version)
        session = WireSession(exchange.response_headers.get("mcp-session-id"), str(negotiated), credential, exchange)
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await self.send("POST", self._headers(credential, session, session.version), note, label=f"{label} (ack)")
        return session

    async def modern(
        self,
        method: str,
        params: dict[str, Any],
        *,
        credential: Credential | None,
        label: str,
        request_id: int | None = None,
        until: Stop | None = None,
        tasks: bool = True,
        progress_token: str | None = None,
    ) -> Exchange:
        """One stateless 2026-07-28 request (no session), declaring the tasks extension unless ``tasks`` is false
        (a call then runs within its request); read to its answer, or until ``until`` says so (the connection is
        then dropped: a cut).

        ``Mcp-Name`` carries the named parameter as is: the audit only sends plain ASCII names and task ids.
        """
        rid = self.next_id() if request_id is None else request_id
        meta: dict[str, Any] = {
            protocol.VERSION_META_KEY: STATELESS,
            protocol.CAPABILITIES_META_KEY: {"extensions": {EXTENSION: {}}} if tasks else {},
            protocol.CLIENT_INFO_META_KEY: {"name": "mcp-lossless-audit", "version": "1"},
        }
        if progress_token is not None:
            meta["progressToken"] = progress_token
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta}}
        headers = self._headers(credential, None, STATELESS)
        headers["mcp-method"] = method
        if (field_name := protocol.NAME_PARAMS.get(method)) is not None:
            headers["mcp-name"] = str(params[field_name])
        answered = all_answered(rid)
        stop = answered if until is None else lambda exchange: answered(exchange) or until(exchange)
        return await self.send("POST", headers, message, label=label, stop=stop)

    async def post(
        self,
        session: WireSession,
        payload: Any,
        *,
        label: str,
        credential: Credential | None = None,
        stop: Stop | None = None,
        seconds: float | None = None,
    ) -> Exchange:
        """POST ``payload`` on ``session`` (its own token unless ``credential`` is given)."""
        headers = self._headers(credential or session.credential, session, session.version)
        return await self.send("POST", headers, payload, label=label, stop=stop, seconds=seconds)

    async def resume(
        self,
        session: WireSession,
        last_event_id: str,
        *,
        label: str,
        credential: Credential | None = None,
        stop: Stop | None = None,
        seconds: float | None = None,
    ) -> Exchange:
        """GET with ``Last-Event-ID`` on ``session`` (its own token unless ``credential`` is given)."""
        headers = self._headers(credential or session.credential, session, session.version)
        headers.pop("content-type")
        headers["accept"] = "text/event-stream"
        headers["last-event-id"] = last_event_id
        return await self.send("GET", headers, None, label=label, stop=stop, seconds=seconds)

    async def send(
        self,
        method: str,
        headers: dict[str, str],
        payload: Any,
        *,
        label: str,
        stop: Stop | None = None,
        seconds: float | None = None,
    ) -> Exchange:
        """One request; an SSE answer is read until ``stop`` says so, the server ends it, or ``seconds`` pass."""
        body = orjson.dumps(payload) if payload is not None else None
        exchange = Exchange(label, method, self.url, dict(headers), body.decode() if body is not None else None)
        started = time.monotonic()
        exchange.end = "deadline"
        with anyio.move_on_after(self.read_seconds if seconds is None else seconds):
            exchange.end = await self._read(exchange, headers, body, stop, started)
        exchange.seconds = round(time.monotonic() - started, 3)
        return exchange

    async def _read(
        self, exchange: Exchange, headers: dict[str, str], body: bytes | None, stop: Stop | None, started: float
    ) -> End:
        try:
            async with self.http.stream(exchange.method, self.url, headers=headers, content=body) as response:
                exchange.status = response.status_code
                exchange.response_headers = {
                    k: response.headers[k] for k in KEPT_RESPONSE_HEADERS if k in response.headers
                }
                if not exchange.is_sse:
                    exchange.body = (await response.aread()).decode("utf-8", errors="replace")
                    return "closed"
                decoder = SseDecoder()
                async for chunk in response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        at = round(time.monotonic() - started, 3)
                        exchange.events.append(WireEvent(event.id, event.event, event.data, at))
                        if stop is not None and stop(exchange):
                            return "dropped"  # leaving the block closes the connection mid-stream
                return "closed"
        except (httpx.HTTPError, SseTooLarge) as exc:
            exchange.error = f"{type(exc).__name__}: {exc}"
            return "error"


def all_answered(*request_ids: object) -> Stop:
    """Stop once every one of ``request_ids`` has its response or error."""
    return lambda exchange: all(exchange.terminal_for(i) is not None for i in request_ids)


def progressed(tokens: Sequence[str]) -> Stop:
    """Stop right after the first id-carrying progress event for one of ``tokens``: the drop point."""

    def stop(exchange: Exchange) -> bool:
        last = exchange.events[-1]
        return last.id is not None and any(
            m.get("method") == "notifications/progress" and m.get("params", {}).get("progressToken") in tokens
            for m in last.messages()
        )

    return stop
