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

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Protocol

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


class LeanHttp:
    """Pooled keep-alive connections (HTTP/1.1) for requests to MCP endpoints; ``async with`` closes the pool."""

    def __init__(
        self,
        *,
        max_connections: int = 64,
        max_keepalive_connections: int = 16,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
    ) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=max_connections, max_keepalive_connections=max_keepalive_connections
        )
        self._timeouts = {"connect": connect_timeout, "read": read_timeout, "write": connect_timeout, "pool": None}

    async def __aenter__(self) -> LeanHttp:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._pool.aclose()

    @asynccontextmanager
    async def stream(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> AsyncIterator[LeanResponse]:
        """Send the request; the response is open for reading inside the block (closed after it)."""
        wire = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        with _as_httpx():
            async with self._pool.stream(
                method, url, headers=wire, content=content, extensions={"timeout": self._timeouts}
            ) as raw:
                yield LeanResponse(raw)
