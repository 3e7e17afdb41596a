"""Reading a request's body from ASGI ``receive``: bounded, and telling a client that left from one that sent."""

from __future__ import annotations

from .types import Receive


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


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
