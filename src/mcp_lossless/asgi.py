"""The few raw-ASGI helpers every adapter shares: read a bounded body, send a complete response."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


def headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by lowercase name, indexed once per request under an extension key of the scope
    (a request is asked for half a dozen of them)."""
    index: dict[bytes, bytes] | None = scope.get("mcp_lossless.headers")
    if index is None:
        index = scope["mcp_lossless.headers"] = dict(scope["headers"])
    return index


def header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lowercase bytes), decoded as latin-1."""
    value = headers(scope).get(name)
    return None if value is None else value.decode("latin-1")


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return b"".join((*chunks, chunk)) if chunks else chunk
        chunks.append(chunk)


async def disconnected(receive: Receive) -> None:
    """Returns when the client has gone (ASGI ``http.disconnect``); whatever else it reads is dropped. The one
    watcher every response that outlives its request body runs beside its work (both eras, task streams)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: bytes | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    out: Headers = list(headers)
    if content_type is not None:
        out.append((b"content-type", content_type))
    out.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, value: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await respond(send, status, orjson.dumps(value), b"application/json", headers)


async def run_lifespan(
    receive: Receive,
    send: Send,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
    explained: tuple[type[Exception], ...] = (),
) -> None:
    """Answer an ASGI lifespan scope: ``startup`` on start (a failure is reported, and logged), ``shutdown`` on stop.

    A failure of an ``explained`` kind (a store that cannot open, an issuer without metadata) is one the
    operator fixes from its message alone: it is logged without a traceback. Any other keeps its traceback.
    """
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await startup()
            except Exception as exc:
                log = logging.getLogger("mcp_lossless")
                if isinstance(exc, explained):
                    log.error("startup failed: %s", exc)
                else:
                    log.exception("startup failed")
                await send({"type": "lifespan.startup.failed"})  # no message: the server would log it again
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
