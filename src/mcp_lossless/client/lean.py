"""A lean HTTP/1.1 connection pool for a client's hot path: httpcore's pool without httpx's client layers.

A gateway sends every call of every client upstream; there httpx's request path (URL merging, cookies, the
auth and redirect generators, the response's decoder chain) cost as much CPU as the upstream call's own MCP
work. :class:`LeanHttp` sends a request with httpcore (the HTTP engine underneath httpx) and offers what the
clients read of a response — ``status_code``, ``headers.get``, ``aread``, ``aiter_bytes`` — with httpcore's
errors raised as their httpx equivalents, so the callers' handling (a refused connection is
``httpx.ConnectError``, a broken one another ``httpx.TransportError``) is unchanged. No redirects, no
cookies, no content decoding: MCP endpoints need none. Anything else (OAuth discovery and token requests)
keeps using an ``httpx.AsyncClient``.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Protocol

import anyio
import certifi
import httpcore
import httpx

_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.TimeoutException, httpx.TimeoutException),
)


@contextmanager
def _as_httpx() -> Iterator[None]:
    try:
        yield
    except httpcore.TimeoutException as exc:
        raise _mapped(exc) from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, httpcore.ProxyError) as exc:
        raise _mapped(exc) from exc


def _mapped(exc: Exception) -> httpx.TransportError:
    for source, target in _ERRORS:
        if isinstance(exc, source):
            return target(str(exc) or type(exc).__name__)
    return httpx.TransportError(str(exc) or type(exc).__name__)


class Response(Protocol):
    """What the clients read of an HTTP response (an ``httpx.Response`` is one)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    async def aread(self) -> bytes: ...
    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


class LeanResponse:
    """A streamed response: headers by lower-case name (the last one of a repeated name)."""

    __slots__ = ("_body", "headers", "status_code")

    def __init__(self, raw: httpcore.Response) -> None:
        self.status_code = raw.status
        self.headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw.headers}
        self._body = raw

    async def aread(self) -> bytes:
        with _as_httpx():
            return await self._body.aread()

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        with _as_httpx():
            async for chunk in self._body.aiter_stream():
                yield chunk


def _parsed(url: str) -> tuple[httpcore.URL, bytes]:
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url}")
    default = {"http": 80, "https": 443}[parsed.scheme]
    host = parsed.raw_host + (b"" if parsed.port in (None, default) else f":{parsed.port}".encode())
    return httpcore.URL(url), host


class LeanHttp:
    """Keep-alive HTTP/1.1 connections to MCP endpoints; ``async with`` closes them.

    Its own pool of httpcore HTTP/1.1 connections (``httpcore.AsyncHTTP11Connection``), not httpcore's
    ``AsyncConnectionPool``: that one scans every connection it holds on each request, asking each idle one
    whether the server closed it (a readability poll each), which at a gateway's 16 concurrent calls was half
    of the gateway's CPU per call; and each of its layers takes an anyio lock, whose every acquisition yields
    to the event loop. Here a request takes the most recently used idle connection to its origin and checks
    that one only (or connects a new one); a connection goes back after its response was read to the end and
    closed (one that was not is closed: it cannot carry another request). At most ``max_connections``
    requests are in flight (more wait), at most ``max_keepalive_connections`` idle connections are kept, none
    idle longer than ``keepalive_expiry`` (below the servers' own keep-alive timeout: uvicorn's is 5 s).
    Sockets are httpcore's anyio backend unless ``network_backend`` says otherwise (the gateway's is asyncio's).
    """

    def __init__(
        self,
        *,
        max_connections: int = 64,
        max_keepalive_connections: int = 16,
        keepalive_expiry: float = 4.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self._max = max_connections
        self._in_flight = 0
        self._waiting: deque[anyio.Event] = deque()
        self._keep = max_keepalive_connections
        self._expiry = keepalive_expiry
        self._connect_timeout = connect_timeout
        self._idle: dict[tuple[bytes, bytes, int], list[httpcore.AsyncHTTP11Connection]] = {}
        """Idle connections by origin (scheme, host, port), the most recently used last."""
        self._busy: set[httpcore.AsyncHTTP11Connection] = set()
        self._urls: dict[str, tuple[httpcore.URL, bytes]] = {}
        """Each URL parsed once, with its ``Host`` header."""
        self._backend = network_backend or httpcore.AnyIOBackend()
        self._ssl: ssl.SSLContext | None = None
        self._timeouts = {"connect": connect_timeout, "read": read_timeout, "write": connect_timeout, "pool": None}

    async def __aenter__(self) -> LeanHttp:
        return self

    async def __aexit__(self, *_: object) -> None:
        connections = [c for idle in self._idle.values() for c in idle] + list(self._busy)
        self._idle.clear()
        self._busy.clear()
        for connection in connections:
            await connection.aclose()

    @asynccontextmanager
    async def stream(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> AsyncIterator[LeanResponse]:
        """Send the request; the response is open for reading inside the block (closed after it)."""
        known = self._urls.get(url)
        if known is None:
            known = self._urls.setdefault(url, _parsed(url))
        target, host = known
        wire = [(b"host", host)]
        wire += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        if content is not None:
            wire.append((b"content-length", str(len(content)).encode()))
        extensions = {"timeout": self._timeouts}
        request = httpcore.Request(method, target, headers=wire, content=content, extensions=extensions)
        while self._in_flight >= self._max:  # no lock: a free slot is taken without yielding to the loop
            waiter = anyio.Event()
            self._waiting.append(waiter)
            try:
                await waiter.wait()
            except BaseException:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                elif self._waiting:  # it was woken for a free slot it will not take: pass the slot on
                    self._waiting.popleft().set()
                raise
        self._in_flight += 1
        try:
            with _as_httpx():
                connection = await self._take(target.origin)
            self._busy.add(connection)
            try:
                with _as_httpx():
                    raw = await connection.handle_async_request(request)
                try:
                    yield LeanResponse(raw)
                finally:
                    with _as_httpx():
                        await raw.aclose()
            finally:
                self._busy.discard(connection)
                await self._give_back(target.origin, connection)
        finally:
            self._in_flight -= 1
            if self._waiting:
                self._waiting.popleft().set()

    async def _take(self, origin: httpcore.Origin) -> httpcore.AsyncHTTP11Connection:
        idle = self._idle.get((origin.scheme, origin.host, origin.port))
        while idle:
            connection = idle.pop()
            if connection.is_idle() and not connection.has_expired():
                return connection
            await connection.aclose()  # the server closed it, or it idled past the expiry
        stream = await self._backend.connect_tcp(origin.host.decode("ascii"), origin.port, self._connect_timeout)
        if origin.scheme == b"https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context(cafile=certifi.where())
                self._ssl.set_alpn_protocols(["http/1.1"])
            try:
                stream = await stream.start_tls(self._ssl, origin.host.decode("ascii"), self._connect_timeout)
            except BaseException:
                await stream.aclose()
                raise
        return httpcore.AsyncHTTP11Connection(origin, stream, keepalive_expiry=self._expiry)

    async def _give_back(self, origin: httpcore.Origin, connection: httpcore.AsyncHTTP11Connection) -> None:
        idle = self._idle.setdefault((origin.scheme, origin.host, origin.port), [])
        if connection.is_idle() and len(idle) < self._keep:
            idle.append(connection)
        else:
            await connection.aclose()
