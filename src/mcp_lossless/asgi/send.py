"""Writing a complete response through ASGI ``send``: the way out of every request answered in one piece."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from .types import Headers, Send


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
