"""The gateway's connections to its HTTP upstreams: aiohttp's client behind the clients' ``HttpPool`` interface.

Every call of every client goes upstream, so the upstream request is the gateway's hot path. aiohttp parses
HTTP/1.1 in C (llhttp) and keeps its connections alive in a pool that hands out the most recent idle one
without polling the others; it cost a third to a half of the CPU per request of httpcore's pure-Python h11
(docs/decisions/0016). The gateway runs on asyncio (ADR 0009), as aiohttp does; the clients stay on anyio
and httpx, and only see :class:`~..client.transport.HttpPool`.

aiohttp's failures arrive as the httpx errors the clients handle: a connection that could not be made is
``httpx.ConnectError`` (the request never left: it may be sent again), anything that broke after is another
``httpx.TransportError`` (it may have run). A response not read to its end closes its connection (aiohttp
reuses only connections whose response is complete); redirects, cookies and content decoding are off: MCP
endpoints need none. Anything else (OAuth discovery and token requests) keeps using an ``httpx.AsyncClient``.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager

import aiohttp
import certifi
import httpx
from yarl import URL

from ..client.transport import Response

_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.ClientOSError, httpx.ReadError),
)
"""Most specific first: aiohttp's timeouts are also ``OSError``s, its connector errors ``ClientOSError``s."""


def _as_httpx(exc: aiohttp.ClientError) -> httpx.TransportError:
    for source, target in _ERRORS:
        if isinstance(exc, source):
            return target(str(exc) or type(exc).__name__)
    return httpx.TransportError(str(exc) or type(exc).__name__)


class PooledResponse:
    """A streamed response, as the clients read it (headers looked up case-insensitively)."""

    __slots__ = ("_raw", "headers", "status_code")

    def __init__(self, raw: aiohttp.ClientResponse) -> None:
        self.status_code = raw.status
        self.headers: Mapping[str, str] = raw.headers
        self._raw = raw

    async def aread(self) -> bytes:
        try:
            return await self._raw.read()
        except aiohttp.ClientError as exc:
            raise _as_httpx(exc) from exc

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._raw.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise _as_httpx(exc) from exc


def _parsed(url: str) -> URL:
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url}")
    return parsed


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to the upstreams; ``async with`` opens and closes them.

    At most ``max_connections`` requests are in flight (more wait for a connection); a connection idle
    for ``keepalive_expiry`` is closed (below the servers' own keep-alive timeout: uvicorn's is 5 s).
    """

    def __init__(
        self,
        *,
        max_connections: int = 64,
        keepalive_expiry: float = 4.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
    ) -> None:
        self._max = max_connections
        self._expiry = keepalive_expiry
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        """Each URL parsed once."""

    async def __aenter__(self) -> UpstreamPool:
        connector = aiohttp.TCPConnector(
            limit=self._max,
            limit_per_host=0,
            keepalive_timeout=self._expiry,
            ssl=ssl.create_default_context(cafile=certifi.where()),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def stream(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[Response]:
        """Send the request; the response is open for reading inside the block (released after it)."""
        assert self._session is not None, "use the pool inside 'async with'"
        target = self._urls.get(url)
        if target is None:
            target = self._urls.setdefault(url, _parsed(url))
        return _Exchange(self._session, method, target, content, headers)


class _Exchange:
    """One request and its response (a class, not a generator-based context manager: it is the hot path)."""

    __slots__ = ("_content", "_headers", "_method", "_raw", "_session", "_url")

    def __init__(
        self, session: aiohttp.ClientSession, method: str, url: URL, content: bytes | None, headers: Mapping[str, str]
    ) -> None:
        self._session, self._method, self._url, self._content, self._headers = session, method, url, content, headers
        self._raw: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> PooledResponse:
        try:
            self._raw = await self._session.request(
                self._method, self._url, data=self._content, headers=self._headers, allow_redirects=False
            )
        except aiohttp.ClientError as exc:
            raise _as_httpx(exc) from exc
        return PooledResponse(self._raw)

    async def __aexit__(self, *_: object) -> None:
        if self._raw is not None:
            self._raw.release()
